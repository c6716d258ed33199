"""`oa-sandbox batch --engine ray` on a real two-node Ray cluster made here (ray.cluster_utils.Cluster,
both nodes on this machine, every process on 127.0.0.1): tasks land on both nodes, one node is
removed mid-batch and its tasks run again on the other (the results say so), and nothing is left
behind: no box, no raylet or GCS process of this cluster.

Needs the `ray` extra (scripts/test installs it); skipped with the reason without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import committed_example

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]' (scripts/test does)")

pytestmark = [pytest.mark.docker, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
SLOTS = 2  # boxes each node declares it holds (the oa_sandbox resource)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, sandbox_image):
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("ray")
    saved = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = (
        "0"  # without it the driver rewrites 127.0.0.1 and hangs (shared notes)
    )

    def node_env(name: str) -> dict[str, str]:
        # the workers run this checkout's code, and each node keeps its sessions in a state directory of its own
        return {
            "PYTHONPATH": str(ROOT),
            "XDG_STATE_HOME": str(base / f"state-{name}"),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    made = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"oa_sandbox": SLOTS, "node_a": 1},
            "include_dashboard": False,
            "node_ip_address": LOOPBACK,
            "env_vars": node_env("a"),
        },
    )
    worker = made.add_node(
        num_cpus=2, resources={"oa_sandbox": SLOTS, "node_b": 1}, node_ip_address=LOOPBACK, env_vars=node_env("b")
    )
    made.wait_for_nodes()
    pids = [p.process.pid for node in (made.head_node, worker) for procs in node.all_processes.values() for p in procs]
    made.base, made.worker, made.pids = base, worker, pids
    try:
        yield made
    finally:
        made.shutdown()
        if saved is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in pids if _alive(pid)]
        for pid in left:  # only the processes this test's cluster started
            os.kill(pid, 9)
        assert not left, f"Ray processes of the test's cluster still running after shutdown: {left}"


def driver_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "GEMINI_API_KEY")}
    env.update(
        PYTHONPATH=str(ROOT),
        XDG_STATE_HOME=str(tmp_path / "state-driver"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
    )
    return env


def our_boxes(docker_client, under: Path) -> list[str]:
    """Boxes that mount a copy under `under` (this test's state directories): other checkouts'
    boxes may share the image id, never these paths."""
    from orchestrator.config import LABEL

    return [
        c["Id"]
        for c in docker_client.api.containers(all=True, filters={"label": LABEL})  # one request, no inspect per box
        if any(str(m.get("Source", "")).startswith(str(under)) for m in c.get("Mounts") or [])
    ]


def executing_on(state: Path) -> int:
    return (
        sum('"executing"' in t.read_text() for t in state.glob("openagents-sandbox/sessions/*/transcript.jsonl"))
        if state.exists()
        else 0
    )


def test_tasks_land_on_both_nodes_and_a_lost_node_s_tasks_run_again_on_the_other(cluster, docker_client, tmp_path):
    script = tmp_path / "fix-then-wait.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(turn)
            for turn in [
                {
                    "tool_calls": [
                        {
                            "name": "edit_file",
                            "arguments": {
                                "path": "calc.py",
                                "old_text": "    return a - b",
                                "new_text": "    return a + b",
                            },
                        }
                    ]
                },
                {"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 4"}}]},
                {"text": "fixed"},
            ]
        )
        + "\n"
    )
    policy = tmp_path / "allow.toml"
    policy.write_text('[[rules]]\nkind = "edit"\ndecision = "allow"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    n = 2 * SLOTS
    for i in range(n):
        committed_example(tmp_path / f"calc{i}")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "workspace": f"calc{i}", "task": "fix the bug"}) + "\n" for i in range(n))
    )
    out = tmp_path / "results.jsonl"
    began = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "batch",
            str(tasks),
            "--out",
            str(out),
            "--engine",
            "ray",
            "--ray-address",
            cluster.address,
            "--model",
            f"script:{script}",
            "--policy",
            str(policy),
            "--max-retries",
            "2",
        ],
        env=driver_env(tmp_path),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while executing_on(cluster.base / "state-b") < 1:  # a session on node b is in its `sleep 4`
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no task reached node b"
            time.sleep(0.1)
        cluster.remove_node(cluster.worker)  # node b is lost mid-task
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    wall = time.monotonic() - began
    assert proc.returncode == 0, err + (out.read_text() if out.exists() else "")
    got = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(got) == {f"t{i}" for i in range(n)}
    node_a, node_b = cluster.head_node.node_id[:12], cluster.worker.node_id[:12]
    for r in got.values():
        assert r["status"] == "finished" and r["exit_code"] == 0, r
        assert "-    return a - b\n+    return a + b\n" in r["patch"]
        assert r["node"].endswith(node_a), r  # every task ended on the node that stayed
    retried = [r for r in got.values() if r["retried"]]
    assert retried, got  # the lost node's tasks ran again
    for r in retried:
        assert r["attempts"] == 2 and len(r["nodes_tried"]) == 1 and r["nodes_tried"][0].endswith(node_b), r
    firsts = {r["nodes_tried"][0][-12:] if r["retried"] else r["node"][-12:] for r in got.values()}
    assert firsts == {node_a, node_b}  # tasks landed on both nodes
    assert not [r for r in got.values() if not r["retried"] and r["attempts"] != 1]
    print(f"{n} tasks on 2 nodes, node b removed mid-task, {len(retried)} retried: {wall:.1f} s")

    deadline = time.monotonic() + 30
    while (
        our_boxes(docker_client, cluster.base) and time.monotonic() < deadline
    ):  # a lost worker's box goes with the next reap
        time.sleep(0.5)
    assert our_boxes(docker_client, cluster.base) == []


def test_a_cluster_with_no_node_offering_the_resource_is_a_typed_set_up_error(cluster, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    committed_example(tmp_path / "calc")
    tasks.write_text(json.dumps({"id": "t", "workspace": "calc", "task": "x"}) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "batch",
            str(tasks),
            "--out",
            str(tmp_path / "r.jsonl"),
            "--engine",
            "ray",
            "--ray-address",
            cluster.address,
            "--ray-resource",
            "gpu_box",
            "--model",
            "script:/dev/null",
        ],
        env=driver_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert "config_invalid" in proc.stderr and "gpu_box" in proc.stderr and "ray start --resources" in proc.stderr


@pytest.mark.slow
def test_30000_box_made_names_through_ray_leave_the_result_line_bounded(cluster, tmp_path):
    """Issue 41.3 through Ray on loopback: a task whose box makes 30,000 long-named absolute symlinks
    and 100 files comes back from its worker as one result line under 1 MiB, 1,000 names a list with
    the totals, and the full lists on the node that ran it; the driver's peak RSS is measured."""
    from orchestrator.terminal.machine import MAX_LINE_BYTES, MAX_LISTED
    from tests.helpers.names_in_output import _many, model, policy

    committed_example(tmp_path / "calc")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps(
            {
                "id": "many",
                "workspace": "calc",
                "task": "make names",
                "model": f"script:{model(tmp_path, _many(30_000))}",
                "policy": str(policy(tmp_path)),
            }
        )
        + "\n"
    )
    out, rss = tmp_path / "results.jsonl", tmp_path / "rss"
    began = time.monotonic()
    proc = subprocess.run(
        [
            "/usr/bin/time",
            "-o",
            str(rss),
            "-f",
            "%M",
            sys.executable,
            "-m",
            "orchestrator.cli",
            "batch",
            str(tasks),
            "--out",
            str(out),
            "--engine",
            "ray",
            "--ray-address",
            cluster.address,
        ],
        env=driver_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = out.read_bytes().splitlines()
    r = json.loads(line)
    print(
        f"\n30,000 names through Ray: result line {len(line)} bytes, driver peak RSS "
        f"{int(rss.read_text().split()[-1]) >> 10} MiB, {time.monotonic() - began:.0f} s"
    )
    assert len(line) <= MAX_LINE_BYTES and r["status"] == "finished"
    assert len(r["left_out"]) <= MAX_LISTED and r["left_out_total"] == 30_000 and r["files_changed_total"] == 30_100
    assert (
        len(Path(r["left_out_file"]).read_bytes().splitlines()) == 30_000
    )  # the node's state directory (both are this machine)
