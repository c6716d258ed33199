"""What the tests share (issue 48: one place for it): workspaces owned as on a developer's machine, the
checked-in example, boxes shared by a module, the runtimes a box runs under. Fixtures live in
tests/conftest.py; everything a test imports lives here or in this package's modules.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from orchestrator.workspace.checkpoints import Checkpoint, CheckpointStore
SANDBOX_UID = 1000
CANARY = "host canary: must never change\n"  # a host file beside the attacks' victim workspace


def chown_tree(root: Path, uid: int = SANDBOX_UID) -> None:
    """Workspaces belong to an unprivileged user, as on a developer's machine."""
    if os.geteuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.lchown(dirpath, uid, uid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def make_workspace(root: Path, files: Mapping[str, str | bytes] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    chown_tree(root)
    return root


REPO = Path(__file__).resolve().parents[2]


def committed_example(dest: Path, name: str = "calc") -> Path:
    """examples/NAME as the repository's HEAD has it, at `dest` (owned by whoever runs the tests): never the
    working tree's, which the README's main job changes (it fixes examples/calc in the checkout, and
    `bash scripts/test` runs after it). Outside a git checkout (a source archive) the tree is as shipped."""
    import io
    import tarfile

    if not (REPO / ".git").exists():
        shutil.copytree(REPO / "examples" / name, dest)
    else:
        # safe.directory: a clone owned by another user than the one running the tests is still ours to read
        archive = subprocess.run(
            [
                "git",
                "-c",
                f"safe.directory={REPO}",
                "-C",
                str(REPO),
                "archive",
                "--format=tar",
                "HEAD",
                f"examples/{name}",
            ],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
        dest.mkdir(parents=True)
        prefix = f"examples/{name}/"
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                if member.name.startswith(prefix) and (member.isfile() or member.isdir()):
                    member.name = member.name[len(prefix) :]
                    tar.extract(member, dest, filter="data")
    return dest


def recorded(store: CheckpointStore, turn: int) -> Checkpoint:
    """The checkpoint of a record the test made after changing the workspace (or of turn 0): None,
    "nothing changed", would be a failure of its own, so it is not let through as a checkpoint."""
    cp = store.record(turn)
    assert cp is not None, f"turn {turn}: the store saw no change"
    return cp


def one_box_per_module(prefix: str):
    """Fixtures `box` (one sandbox for the whole module, under the default runtime) and `ws` (a fresh
    directory of its workspace per test): for modules of many small tool cases. Use as
    `box, ws = one_box_per_module("name")`."""
    from orchestrator.config import SandboxConfig
    from orchestrator.sandbox.docker import DockerSandbox

    @pytest.fixture(scope="module", name="box")
    def box_fixture(sandbox_image, docker_client, tmp_path_factory):
        root = tmp_path_factory.mktemp(prefix) / "ws"
        root.mkdir()
        chown_tree(root)
        with DockerSandbox(root, SandboxConfig(), client=docker_client) as sandbox:
            yield sandbox

    seq = itertools.count()

    @pytest.fixture(name="ws")
    def ws_fixture(box, request) -> Path:
        root = box.workspace / f"{request.node.originalname}-{next(seq)}"
        root.mkdir()
        chown_tree(root)
        return root

    return box_fixture, ws_fixture


def put(ws: Path, rel: str, content: str | bytes, mode: int | None = None) -> str:
    """Write a file into a per-test directory (as the sandbox's user); its path as a tool names it."""
    path = ws / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    chown_tree(ws)
    if mode is not None:
        path.chmod(mode)
    return f"{ws.name}/{rel}"


def error_of(result) -> str | None:
    return result.error.type.value if result.error else None


def run_busy_in_shell(
    tmp_path: Path, ws: Path, env: dict[str, str] | None = None, within: float = 90.0
) -> tuple[subprocess.Popen[bytes], Path]:
    """`oa-sandbox run` whose scripted model calls `sleep 60` under a policy that allows it; returns
    the process and its transcript once the call is executing in the box."""
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60"}}]}) + "\n")
    policy = tmp_path / "p.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    transcript = tmp_path / "t.jsonl"
    oa = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    proc = subprocess.Popen(
        [
            oa,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--policy",
            str(policy),
            "--non-interactive",
            "--transcript",
            str(transcript),
            "wait",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + within
    while not (transcript.exists() and '"executing"' in transcript.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the shell call never started"
        time.sleep(0.1)
    return proc, transcript


def live_processes(box) -> list[str]:
    """'PID comm' of every process in the box, less the listing's own sh and cat."""
    out = box.call(
        "shell", {"command": 'for p in /proc/[0-9]*; do echo "${p#/proc/} $(cat $p/comm 2>/dev/null)"; done'}
    ).output
    return [line for line in out.splitlines() if line.split()[-1:] not in (["sh"], ["cat"])]


# The tool tests and the attack battery run once per runtime (issue 15): parametrised here, not copied.
BOTH_RUNTIMES = ("runc", "runsc")


def require_runtime(name: str, docker_client) -> str:
    """`name`, when the daemon has a usable registration of it; else the test is skipped with the
    reason, or failed under OA_REQUIRE_RUNSC=1 (CI)."""
    from orchestrator.errors import OpenAgentsError
    from orchestrator.sandbox.runtimes import choose_runtime

    try:
        choose_runtime(name, False, docker_client)
    except OpenAgentsError as err:
        if os.environ.get("OA_REQUIRE_RUNSC") == "1":
            pytest.fail(f"OA_REQUIRE_RUNSC=1 but {err}")
        pytest.skip(str(err))
    return name


def sandbox_config(under: str | None, docker_client, **config):
    """The SandboxConfig of a test box under the runtime fixture's `under` (None: the default); a
    runtime the test names in `config` wins. An egress box under gVisor gets the registration with a
    network, as choose_runtime gives it."""
    from orchestrator.config import SandboxConfig
    from orchestrator.sandbox.runtimes import choose_runtime

    if under is not None and "runtime" not in config:
        config["runtime"] = choose_runtime(under, config.get("egress") is not None, docker_client).name
    return SandboxConfig(**config)
