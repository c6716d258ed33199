"""One hook run: a host process with a scrubbed environment, the real workspace as its cwd, its own
process group, one JSON object on stdin, bounded reads of stdout and stderr, and the whole group
killed at its timeout (and after it exits: nothing it started is left running)."""
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


def environment(hook_env: list[str], model_key: str | None, pass_model_key: bool, extra: dict[str, str]) -> dict[str, str]:
    """The host's basics, the variables the hook names (never the model's key unless its own user
    or admin file says pass_model_key), and the hook's own OA_* variables."""
    env = {name: os.environ[name] for name in KEPT_ENV if name in os.environ}
    for name in hook_env:
        if name in os.environ and (name != model_key or pass_model_key):
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


def run(argv: list[str], payload: dict[str, Any], env: dict[str, str], timeout: float) -> Ran:
    """Runs the hook in an empty private directory, never in the workspace: the box writes the
    workspace, and a program started there loads what lies there (python's `-c`/`-m` put the working
    directory first on sys.path; make, pytest, npm read their files from it). The workspace is in
    the payload's `cwd` and OA_PROJECT_DIR for a hook that chooses to look at it."""
    with tempfile.TemporaryDirectory(prefix="oa-hook-") as cwd:
        return _run(argv, payload, Path(cwd), {**env, "PYTHONSAFEPATH": "1"}, timeout)


def _run(argv: list[str], payload: dict[str, Any], cwd: Path, env: dict[str, str], timeout: float) -> Ran:
    started = time.monotonic()
    data = json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8", "replace")
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(cwd), env=env,
                                start_new_session=True, close_fds=True)
    except (OSError, ValueError) as err:
        return Ran(None, b"", b"", False, False, f"cannot start: {getattr(err, 'strerror', None) or err}", time.monotonic() - started)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    outs: list[bytes] = []
    errs: list[bytes] = []
    readers = [threading.Thread(target=_drain, args=(proc.stdout, STDOUT_CAP + 1, outs), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, STDERR_CAP, errs), daemon=True)]
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
    return Ran(None if timed_out else proc.returncode, stdout[:STDOUT_CAP], b"".join(errs)[:STDERR_CAP], len(stdout) > STDOUT_CAP,
               timed_out, "", round(time.monotonic() - started, 3))
