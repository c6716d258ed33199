"""Batch throughput (issue 28): 20 short tasks (examples/calc fixed by the scripted model) run by
`oa-sandbox batch` against the same 20 run one by one with `oa-sandbox run`, on the local engine
and, with --ray, on a two-node Ray cluster on this machine (loopback only); and the host memory
per running task (the batch process's RSS while its sessions run, over the number running).
Printed as ratios against the one-by-one baseline of the same run; nothing is asserted.

    .venv/bin/python bench/batch.py [--tasks 20] [--concurrency N] [--ray]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
SCRIPT = ROOT / "examples" / "calc.jsonl"
POLICY = ROOT / "examples" / "policy.toml"


def env(state: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XDG_STATE_HOME": str(state),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def one_by_one(work: Path, n: int) -> float:
    began = time.monotonic()
    for i in range(n):
        subprocess.run(
            cli(
                "run",
                "--workspace",
                str(work / f"calc{i}"),
                "--workspace-mode",
                "copy",
                "--model",
                f"script:{SCRIPT}",
                "--policy",
                str(POLICY),
                "--non-interactive",
                "fix the bug",
            ),
            env=env(work / "state-serial"),
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
    return time.monotonic() - began


def batched(work: Path, n: int, extra: list[str], name: str) -> tuple[float, float, int]:
    """Wall time, peak batch-process RSS per running session (MiB), peak sessions running."""
    out = work / f"{name}.jsonl"
    state = work / f"state-{name}"
    began = time.monotonic()
    proc = subprocess.Popen(
        cli(
            "batch",
            str(work / "tasks.jsonl"),
            "--out",
            str(out),
            "--model",
            f"script:{SCRIPT}",
            "--policy",
            str(POLICY),
            *extra,
        ),
        env=env(state),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    idle = [0]
    peak: list[float] = [0.0, 0.0]

    def sample() -> None:
        while proc.poll() is None:
            running = sum(
                1
                for t in state.glob("openagents-sandbox/sessions/*/session.json")
                if '"status": "running"' in t.read_text()
            )
            kib = rss_kib(proc.pid)
            if not idle[0] and kib:
                idle[0] = kib
            if running:
                per = max(0, kib - idle[0]) / running / 1024
                if running > peak[1] or (running == peak[1] and per > peak[0]):
                    peak[0], peak[1] = per, running
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    _, err = proc.communicate()
    wall = time.monotonic() - began
    watcher.join()
    results = [json.loads(line) for line in out.read_text().splitlines()]
    bad = [r["id"] for r in results if r["status"] != "finished"]
    if proc.returncode or bad:
        raise SystemExit(f"{name}: exit {proc.returncode}, not finished: {bad}\n{err.decode()[-2000:]}")
    return wall, peak[0], int(peak[1])


def ray_cluster() -> object:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray.cluster_utils import Cluster

    node_env = {"PYTHONPATH": str(ROOT), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"oa_sandbox": 2},
            "include_dashboard": False,
            "node_ip_address": "127.0.0.1",
            "env_vars": node_env,
        },
    )
    cluster.add_node(num_cpus=2, resources={"oa_sandbox": 2}, node_ip_address="127.0.0.1", env_vars=node_env)
    cluster.wait_for_nodes()
    return cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=None, help="local engine (default: the batch's own default)")
    parser.add_argument("--ray", action="store_true", help="also on a two-node Ray cluster here (the ray extra)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oa-bench-batch-"))
    try:
        with open(work / "tasks.jsonl", "w") as f:
            for i in range(args.tasks):
                shutil.copytree(CALC, work / f"calc{i}")
                f.write(json.dumps({"id": f"t{i}", "workspace": f"calc{i}", "task": "fix the bug"}) + "\n")
        serial = one_by_one(work, args.tasks)
        print(
            f"{args.tasks} tasks one by one (`oa-sandbox run` each): {serial:.1f} s, {args.tasks / serial:.2f} tasks/s"
        )
        extra = ["--concurrency", str(args.concurrency)] if args.concurrency else []
        wall, per, running = batched(work, args.tasks, extra, "local")
        print(
            f"batch, local engine{' --concurrency ' + str(args.concurrency) if args.concurrency else ''}: "
            f"{wall:.1f} s, {args.tasks / wall:.2f} tasks/s: {serial / wall:.2f}x the one-by-one throughput; "
            f"host memory per running task {per:.1f} MiB of the batch process (at {running} running)"
        )
        if args.ray:
            cluster = ray_cluster()
            try:
                wall, _, _ = batched(work, args.tasks, ["--engine", "ray", "--ray-address", cluster.address], "ray")  # type: ignore[attr-defined]
                print(
                    f"batch, Ray two nodes x 2 slots (one machine): {wall:.1f} s, {args.tasks / wall:.2f} tasks/s: "
                    f"{serial / wall:.2f}x the one-by-one throughput"
                )
            finally:
                cluster.shutdown()  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
