"""Many sessions on one workspace (issue 40.5): `oa-sandbox exec` called in parallel on the same
workspace under CPU load, the way a CI job or an agent harness does. Every call answers (exit 0 or
1), none fails to start, nothing is left running (containers, volumes, gates) and the workspace
holds nothing the sessions created (no `.git` mount point, no journal, no quarantine).

OA_LOAD_CALLS / OA_LOAD_CONCURRENCY change the size, OA_LOAD_RUNTIME the runtime (default 200 calls,
8 at once); the measured time and failures are printed (`-s`) so a before/after can be compared."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import pytest

from orchestrator.config import LABEL, SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from tests.helpers import chown_tree, make_workspace

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
CALLS = int(os.environ.get("OA_LOAD_CALLS", "200"))
CONCURRENCY = int(os.environ.get("OA_LOAD_CONCURRENCY", "8"))
RUNTIME = ["--runtime", os.environ["OA_LOAD_RUNTIME"]] if os.environ.get("OA_LOAD_RUNTIME") else []  # e.g. runsc


class CpuBurner:
    """One busy process per core, started and stopped by the test itself (never left behind)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> "CpuBurner":
        for _ in range(os.cpu_count() or 1):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def _one(ws: Path, mode: str, n: int, env: dict[str, str]) -> tuple[int, dict, str]:
    # a write, a read and a command that fails every third time: answers of both kinds (exit 0 and 1)
    command = f"echo {n} > out-{n % 4}.txt && cat a.txt" + (" && false" if n % 3 == 0 else "")
    proc = subprocess.run(
        [
            OA,
            "exec",
            "--workspace",
            str(ws),
            "--workspace-mode",
            mode,
            *RUNTIME,
            "shell",
            json.dumps({"command": command}),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = {}
    return proc.returncode, result, proc.stderr


def _left_running(client: docker.DockerClient, ws: Path) -> list[str]:
    left = [
        f"container {c['Id'][:12]}"
        for c in client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={ws}"})
    ]
    for volume in client.api.volumes().get("Volumes") or []:
        if str(ws) in str((volume.get("Options") or {}).get("device", "")):
            left.append(f"volume {volume['Name'][:12]}")
    # gates: an egress proxy or network started for these sessions (none asked for; none may exist)
    left += [f"network {n['Name']}" for n in client.api.networks(filters={"label": f"{LABEL}.workspace={ws}"})]
    return left


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(3600)  # 200 starts on a busy 2-core machine take minutes
@pytest.mark.parametrize("mode", ["bind", "copy"])
def test_many_exec_calls_on_one_workspace_under_load(mode, sandbox_image, docker_client, tmp_path, monkeypatch):
    state = tmp_path / "state"
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "src/b.py": "print(1)\n"})
    if mode == "bind":
        chown_tree(ws)  # bind mode on a workspace the box's user owns (not root's)
    before = sorted(p.name for p in ws.iterdir())
    started = time.monotonic()
    with CpuBurner(), ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(lambda n: _one(ws, mode, n, env), range(CALLS)))
    took = time.monotonic() - started
    failures = [
        (rc, (r.get("error") or {}).get("type"), str(r.get("error") or stderr)[-300:])
        for rc, r, stderr in answers
        if rc not in (0, 1) or r.get("error") is not None or not r
    ]
    exits = {rc: sum(1 for a in answers if a[0] == rc) for rc in {a[0] for a in answers}}
    kinds = Counter((rc, kind, re.sub(r"/tmp/\S+|[0-9a-f]{12,}", "…", why)[-160:]) for rc, kind, why in failures)
    print(
        f"\n{mode}: {CALLS} exec calls at concurrency {CONCURRENCY} under {os.cpu_count()} CPU burner(s): "
        f"{took:.1f} s, exits {exits}, {len(failures)} failure(s):"
        + "".join(f"\n  {n} x {k}" for k, n in kinds.most_common())
    )
    unreadable = [stderr for _, _, stderr in answers if "unreadable" in stderr or "left for a person" in stderr]
    assert not failures, failures[:10]
    assert not unreadable, unreadable[:3]
    assert _left_running(docker_client, ws) == []
    left = sorted(p.name for p in ws.iterdir())
    created = {f"out-{i}.txt" for i in range(4)} if mode == "bind" else set()
    assert set(left) - set(before) == created, (
        f"the sessions left {sorted(set(left) - set(before) - created)} in the workspace"
    )
    pending = state / "openagents-sandbox" / "pending-sweeps"
    assert not pending.exists() or not any(pending.iterdir()), sorted(p.name for p in pending.iterdir())


def test_bind_mode_mounts_nothing_at_the_top_and_decides_from_the_baseline(tmp_path):
    """Bind mode with no .git at the top creates no mount point in the workspace (it would be shared
    by every session on it); a .git that appears after the baseline (another session's box made it)
    changes no mount (issue 40: `Duplicate mount point`, `bind source path does not exist`)."""
    from orchestrator.sandbox.docker import git_mounts
    from orchestrator.sandbox.sweep_journal import capture_baseline

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "lib/.git/HEAD": "ref: refs/heads/main\n"})
    baseline = capture_baseline(ws)
    assert [m["Target"] for m in git_mounts(ws, baseline)] == ["/workspace/lib/.git"]
    (ws / ".git").mkdir()  # made by another session's box (or, on main, by another session's runtime)
    assert [m["Target"] for m in git_mounts(ws, baseline)] == ["/workspace/lib/.git"]
    (ws / ".git").rmdir()
    with_top = capture_baseline(make_workspace(tmp_path / "ws2", {".git/HEAD": "ref: refs/heads/main\n"}))
    assert [m["Target"] for m in git_mounts(tmp_path / "ws2", with_top)] == ["/workspace/.git"]
    shutil.rmtree(
        tmp_path / "ws2" / ".git"
    )  # gone before the start (another session's sweep): no mount of a missing source, no second one
    assert [m["Target"] for m in git_mounts(tmp_path / "ws2", with_top)] == []
    # copy mode: the workspace is the session's own copy, its top .git the real one's (or an empty one)
    assert [m["Target"] for m in git_mounts(ws, baseline, git_dir=tmp_path / "nothing")] == [
        "/workspace/lib/.git",
        "/workspace/.git",
    ]


def test_a_journal_finished_by_another_process_is_no_error(tmp_path, monkeypatch, caplog):
    """Journals are read by every command and removed by whoever finishes them: one that vanishes
    between the listing and the read is finished, not 'unreadable ... left for a person'."""
    from orchestrator.sandbox import sweep_journal

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    baseline = sweep_journal.capture_baseline(ws)
    stop = threading.Event()

    def churn() -> None:  # other sessions: journal, then finish, as fast as they can
        n = 0
        while not stop.is_set():
            n += 1
            sweep_journal.clear(sweep_journal.record(f"s{n}", ws, tmp_path / "q", False, baseline))

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        with caplog.at_level(logging.WARNING, logger="orchestrator.sandbox.sweep_journal"):
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                sweep_journal.pending()
    finally:
        stop.set()
        worker.join()
    assert [r.getMessage() for r in caplog.records] == []
    gone = sweep_journal.Pending(tmp_path / "state" / "nothing.json", ws, tmp_path / "q", False, baseline, None)
    (ws / ".git").mkdir()
    assert not sweep_journal.complete(gone) and (ws / ".git").is_dir(), (
        "a journal finished elsewhere is not swept again"
    )


def _repository_gone_at_start(monkeypatch, repo: Path, tries_failing: int) -> list[int]:
    """A real 5xx from the daemon at `start`: the read-only view of `repo` (a volume the daemon
    bind-mounts, mounts.py) is created while `repo` exists, and `repo` is gone when the container
    starts ("error while mounting volume ... no such file or directory"), for the first
    `tries_failing` creates; the daemon is the real one, only the directory moves in between."""
    from docker.models.containers import Container, ContainerCollection

    real_create, real_start = ContainerCollection.create, Container.start
    calls: list[int] = []

    def create(self, *args, **settings):
        container = real_create(self, *args, **settings)
        calls.append(1)
        if len(calls) <= tries_failing:
            shutil.rmtree(repo)
        return container

    def start(self, *args, **kwargs):
        try:
            return real_start(self, *args, **kwargs)
        finally:
            repo.mkdir(exist_ok=True)  # back for the next try's settings (a missing directory is a bind mount's 4xx)

    monkeypatch.setattr(ContainerCollection, "create", create)
    monkeypatch.setattr(Container, "start", start)
    return calls


@pytest.mark.docker
def test_a_transient_start_failure_is_retried(sandbox_image, docker_client, tmp_path, monkeypatch):
    """The daemon answers a start with a 5xx that the next try does not meet: the box starts after a
    bounded pause, and nothing of the failed try is left behind."""
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "lib/.git/HEAD": "ref: refs/heads/main\n"})
    box = DockerSandbox(ws, SandboxConfig(), client=docker_client)
    calls = _repository_gone_at_start(monkeypatch, ws / "lib" / ".git", tries_failing=1)
    try:
        box.start()
        assert box.call("shell", {"command": "cat a.txt"}).output == "a\n"
    finally:
        box.close()
    assert len(calls) == 2
    assert _left_running(docker_client, ws) == []


@pytest.mark.docker
def test_a_lasting_start_failure_is_reported_typed_after_bounded_tries(
    sandbox_image, docker_client, tmp_path, monkeypatch
):
    """A 5xx that every try meets is reported typed (sandbox_start_failed) after START_ATTEMPTS tries
    and a bounded backoff, and nothing is left behind."""
    from orchestrator.sandbox.docker import START_ATTEMPTS, DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "lib/.git/HEAD": "ref: refs/heads/main\n"})
    box = DockerSandbox(ws, SandboxConfig(), client=docker_client)
    calls = _repository_gone_at_start(monkeypatch, ws / "lib" / ".git", tries_failing=99)
    started = time.monotonic()
    with pytest.raises(OpenAgentsError) as err:
        box.start()
    took = time.monotonic() - started
    box.close()
    assert err.value.type is ErrorType.SANDBOX_START_FAILED and f"tried {START_ATTEMPTS} times" in err.value.message, (
        err.value.message
    )
    assert len(calls) == START_ATTEMPTS and took < 30, (calls, took)
    assert _left_running(docker_client, ws) == []


@pytest.mark.docker
def test_two_sessions_on_one_workspace_leave_nothing(sandbox_image, docker_client, tmp_path):
    """Two boxes on one workspace (bind mode, no .git): each starts, answers and ends, in the order
    that made one session's placeholder mount point the other's baseline repository on main; the
    workspace afterwards holds only what the boxes wrote."""
    from orchestrator.sandbox.docker import DockerSandbox

    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    chown_tree(ws)
    first = DockerSandbox(ws, SandboxConfig(), client=docker_client)
    first.start()
    try:
        second = DockerSandbox(ws, SandboxConfig(), client=docker_client)
        second.start()
        try:
            assert first.call("shell", {"command": "echo 1 > one.txt"}).ok
            first.close()
            assert second.call("shell", {"command": "cat one.txt; ls -a"}).output.split() == [
                "1",
                ".",
                "..",
                "a.txt",
                "one.txt",
            ]
        finally:
            second.close()
    finally:
        first.close()
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "one.txt"]
    assert _left_running(docker_client, ws) == []


def _fill(box: Any, tag: int, files: int = 100) -> tuple[Any, float]:
    started = time.monotonic()
    res = box.call(
        "shell",
        {
            "command": f"i=0; while [ $i -lt {files} ]; do head -c 8388608 /dev/zero "
            f"> f{tag}-$i || exit 1; i=$((i+1)); done; echo finished",
            "timeout": 300,
        },
    )
    return res, time.monotonic() - started


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", ["bind", "copy"])
def test_write_quota_with_two_writers_under_load(mode, sandbox_image, docker_client, tmp_path, monkeypatch):
    """What the write quota guarantees with two sessions writing as fast as they can, under a CPU
    burner (measured, printed with -s; the README's numbers come from here). Bind mode: both boxes
    write the one workspace, and each session's quota counts the workspace's whole growth since its
    own start, so the pair together is held to about one quota plus the overshoot. Copy mode: each
    session writes its own copy (in the state directory) and is held to its own quota plus the
    overshoot. Either way it is watched, not enforced by the file system: the bound is soft."""
    from orchestrator.sandbox.docker import DockerSandbox
    from orchestrator.workspace.records import WorkspaceMode, prepare

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    quota = 64 << 20
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    roots: list[Path] = []
    boxes: list[DockerSandbox] = []
    for _ in range(2):
        if mode == "copy":
            record, git_dir = prepare(ws, WorkspaceMode.COPY, None, kind="exec")
            root = Path(record.box_workspace)
            box = DockerSandbox(
                root,
                SandboxConfig(write_quota=quota, user=record.user),
                client=docker_client,
                state_dir=record.dir,
                git_dir=git_dir,
            )
        else:
            root = ws
            box = DockerSandbox(root, SandboxConfig(write_quota=quota), client=docker_client)
        roots.append(root)
        boxes.append(box)
    try:
        for box in boxes:
            box.start()
        with CpuBurner(), ThreadPoolExecutor(2) as pool:
            results = list(pool.map(_fill, boxes, range(len(boxes))))
    finally:
        for box in boxes:
            box.close()

    def written(root: Path) -> int:
        return sum(p.stat().st_size for p in root.glob("f*"))

    total = sum(written(r) for r in set(roots))
    lines = [
        f"{mode}: quota {quota >> 20} MiB per session, two writers under {os.cpu_count()} CPU burner(s): "
        f"{total >> 20} MiB written in all"
    ]
    for n, ((res, took), root) in enumerate(zip(results, roots, strict=True)):
        lines.append(
            f"  session {n}: {'stopped' if not res.ok else 'NOT stopped'} "
            f"({res.error.type.value if res.error else 'ok'}) after "
            f"{took:.2f} s; its root holds {written(root) >> 20} MiB"
        )
    print("\n" + "\n".join(lines))
    for res, _ in results:
        assert not res.ok and res.error.type.value == "workspace_quota_exceeded", res
    if mode == "bind":  # one workspace: each session's quota saw the other's writes too
        assert total < quota + (1 << 30)
    else:
        assert all(written(r) < quota + (1 << 30) for r in roots)
