"""One hook run: a host process started by the absolute paths resolved at the session's start
(programs/resolve.py), with a scrubbed environment and a PATH the box cannot write, an empty
private directory as its cwd (and as its HOME when the user's lies where the box writes), its
own process group, one JSON object on stdin, bounded reads of stdout and stderr, and the whole
group killed at its timeout (and after it exits: nothing it started is left running)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..programs.reach import reaches
from ..programs.resolve import SearchPath

STDOUT_CAP = 1024 * 1024  # read at most this much JSON; the rest is drained and the run is an error
STDERR_CAP = 64 * 1024
KEPT_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")


@dataclass
class Ran:
    exit_code: int | None  # None: killed at its timeout, or it could not start
    stdout: bytes
    stderr: bytes
    stdout_over: bool
    timed_out: bool
    problem: str  # why it could not start, else ""
    took_s: float


def base_environment(roots: list[Path], search: SearchPath) -> dict[str, str]:
    """The host's basics as they are at the session's start, with the hook's PATH (no entry the box
    can change) for the user's. A TMPDIR where the box writes is left out; so is a HOME there (git,
    npm, pip and Python read their dotfiles from it: each run gets its own empty directory as HOME,
    `run`, unless the hook lists HOME in `env`), and Python's user site-packages is kept off."""
    env = {name: os.environ[name] for name in KEPT_ENV if name in os.environ}
    env["PATH"] = search.value
    if "TMPDIR" in env and reaches(os.path.abspath(env["TMPDIR"]), roots):
        del env["TMPDIR"]
    if "HOME" in env and reaches(os.path.abspath(env["HOME"]), roots):
        del env["HOME"]
        env["PYTHONNOUSERSITE"] = "1"
    return env


def environment(
    base: dict[str, str], listed: list[str], secrets: set[str], withheld: set[str], extra: dict[str, str]
) -> dict[str, str]:
    """`base`, the variables the hook lists (never one in `withheld`: the model's key, an egress
    credential's variables), the secrets its own user or admin table names, and its OA_* variables.
    PATH stays the hook's own; nothing else is inherited (no PYTHON*, NODE_*, LD_*, ... unless listed)."""
    env = dict(base)
    for name in [*listed, *sorted(secrets)]:
        if name != "PATH" and name in os.environ and (name not in withheld or name in secrets):
            env[name] = os.environ[name]
    env.update(extra)
    return env


def _drain(stream: IO[bytes], cap: int, out: list[bytes]) -> None:
    """Keeps the first `cap` bytes; reads the rest and drops it (a hook blocked on a full pipe would only time out)."""
    kept = 0
    try:
        while True:
            chunk = stream.read(65536)
            if not chunk:
                return
            if kept < cap:
                out.append(chunk[: cap - kept])
                kept += len(out[-1])
    except (OSError, ValueError):
        return


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    argv: list[str], payload: dict[str, Any], env: dict[str, str], timeout: float, executable: str | None = None
) -> Ran:
    """Runs the hook in an empty private directory, never in the workspace: the box writes the
    workspace, and a program started there loads what lies there (python's `-c`/`-m` put the working
    directory first on sys.path; make, pytest, npm read their files from it). The workspace is in
    the payload's `cwd` and OA_PROJECT_DIR for a hook that chooses to look at it. That directory is
    its HOME too when `env` has none (base_environment left out a HOME where the box writes).
    `executable`: the real path the kernel is given (argv[0] stays as resolved: a venv's python and
    busybox read it)."""
    with tempfile.TemporaryDirectory(prefix="oa-hook-") as cwd:
        return _run(argv, payload, Path(cwd), {"HOME": cwd, **env, "PYTHONSAFEPATH": "1"}, timeout, executable)


def _run(
    argv: list[str], payload: dict[str, Any], cwd: Path, env: dict[str, str], timeout: float, executable: str | None
) -> Ran:
    started = time.monotonic()
    data = json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8", "replace")
    try:
        proc = subprocess.Popen(
            argv,
            executable=executable,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(cwd),
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except (OSError, ValueError) as err:
        return Ran(
            None,
            b"",
            b"",
            False,
            False,
            f"cannot start: {getattr(err, 'strerror', None) or err}",
            time.monotonic() - started,
        )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    outs: list[bytes] = []
    errs: list[bytes] = []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, STDOUT_CAP + 1, outs), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, STDERR_CAP, errs), daemon=True),
    ]
    for reader in readers:
        reader.start()

    def feed() -> None:
        try:
            proc.stdin.write(data)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _killpg(proc)  # at its timeout, or what it left behind when it exited
        proc.wait()
    for thread in (*readers, writer):
        thread.join(timeout=2.0)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            stream.close()
        except OSError:
            pass
    stdout = b"".join(outs)
    return Ran(
        None if timed_out else proc.returncode,
        stdout[:STDOUT_CAP],
        b"".join(errs)[:STDERR_CAP],
        len(stdout) > STDOUT_CAP,
        timed_out,
        "",
        round(time.monotonic() - started, 3),
    )
