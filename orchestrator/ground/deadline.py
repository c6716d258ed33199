"""A child process for work on box data whose cost no input bound can cap (a parse, a diff): its
input goes in on stdin, and it is killed when its deadline passes.

The child is a file of ours run with `python -I` (it imports nothing of ours: isolated mode puts no
directory of ours on its path), sets its own CPU and memory limits, and writes READY once its
interpreter and imports are done: on a loaded machine those alone took over 2 s, so the deadline's
clock starts at READY, not at the fork. Used by policy/safeparse.py and bounded_diff.py.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from enum import Enum

READY = b"R"


class Stopped(Enum):
    NOT_STARTED = "not_started"  # no READY within the start allowance
    TIMED_OUT = "timed_out"  # READY came, the answer did not within the deadline
    FAILED = "failed"  # it could not be started, or it died before reading its input


class ChildStopped(Exception):
    def __init__(self, how: Stopped, detail: str = "") -> None:
        super().__init__(detail or how.value)
        self.how, self.detail = how, detail


def run_with_deadline(
    script: str, args: list[str], payload: bytes, seconds: float, start_seconds: float
) -> tuple[int, bytes]:
    """(exit code, stdout after READY) of `python -I script args...` fed `payload`; ChildStopped
    when it did not start, passed `seconds` after starting, or failed. Never left running."""
    command = [sys.executable, "-I", script, *args]
    try:
        child = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={}, close_fds=True
        )
    except OSError as err:
        raise ChildStopped(Stopped.FAILED, err.strerror or str(err)) from None
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], start_seconds)
        if not ready or os.read(child.stdout.fileno(), 1) != READY:
            raise ChildStopped(Stopped.NOT_STARTED)
        out, _ = child.communicate(payload, timeout=seconds)
    except subprocess.TimeoutExpired:
        raise ChildStopped(Stopped.TIMED_OUT) from None
    except OSError as err:  # the child died before it read its input (EPIPE)
        raise ChildStopped(Stopped.FAILED, err.strerror or str(err)) from None
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    return child.returncode, out
