"""A /bin/sh started before the command it will run is known (issue 26).

Under gVisor starting a program costs 20-30 ms (posix_spawn of /bin/true: ~23 ms; fork alone ~30 ms)
while a started shell that is handed its command runs `true` and exits in ~1.4 ms; under runc the
same split is ~1.2 ms against ~0.4 ms. So after each `shell` call (its answer sent: shell.after_answer), and
once in the agent's warm-up before any command (server._warm_up), one fresh shell is started in the background,
and the next call hands it its command. While it is being started the agent's other threads wait (CPython holds
the GIL through vfork and exec: 6-7 ms under gVisor, measured), which is why it is started after the answer,
not before. A shell serves one command and is gone: no state passes from one call to the next.

The prepared shell is `/bin/sh -s`, reading its script from a pipe on its standard input, in a new
session, with the child environment, the workspace as its working directory and its output on one
pipe, as shell.py starts it. The script written to it is `exec </dev/null; set +s; ` and the command,
in one write of at most PIPE_BUF bytes: atomic, so dash's first read (8 KiB) takes all of it before
the first line turns its standard input into /dev/null. What the command sees is then what `sh -c`
gave it: $0, $-, line numbers and error messages ("/bin/sh: 1: ...") alike, standard input at end of
file, fds 0-2 only. A longer command, or one holding a NUL byte, is started the ordinary way.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable  # not typing's: importing typing costs the agent's start 10-25 ms

PREFIX = b"exec </dev/null; set +s; "
MAX_SCRIPT_BYTES = select.PIPE_BUF


def _spawn(popen: Callable[..., subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Started by shell.py's own Popen (a new session, the child environment, the workspace, fds
    closed, signals restored): posix_spawn would be cheaper but glibc's leaves its signals 32 and 33
    ignored in the child, and exec keeps that."""
    return popen(["/bin/sh", "-s"], stdin=subprocess.PIPE)


class Launcher:
    """One prepared shell at most, made by a long-lived thread (a thread started per call costs ~3 ms
    under gVisor). Commands run at once (shell._Commands), so a shell may be prepared while one runs,
    and the sweep after the box's last running command may kill it before it is taken: take() then
    finds it dead (its stdin pipe broken) and gives None, and the call starts its own shell. No sweep
    runs while a call takes one."""

    def __init__(self, popen: Callable[..., subprocess.Popen[bytes]]) -> None:
        self._popen = popen
        self._ready: subprocess.Popen[bytes] | None = None
        self._wanted = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def prepare(self) -> None:
        """Start making the next shell, unless one is ready."""
        with self._cond:
            if self._ready is not None or self._wanted:  # ready, or being made (two prepares in a row make one shell)
                return
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="oa-shell-launcher", daemon=True)
                # may fail (the box out of processes): then nothing is wanted, and take() waits for nothing
                thread.start()
                self._thread = thread
            self._wanted = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted:
                    self._cond.wait()
            try:
                ready: subprocess.Popen[bytes] | None = _spawn(self._popen)
            except Exception:  # out of processes or memory: the call starts its shell itself, and says why
                ready = None
            with self._cond:
                self._ready, self._wanted = ready, False
                self._cond.notify_all()

    def take(self, command: str) -> subprocess.Popen[bytes] | None:
        """The prepared shell, already running `command`; None when there is none or the command does
        not fit (the caller then starts /bin/sh -c as before)."""
        with self._cond:
            while self._wanted:  # being made: wait for it, it is sooner than starting another
                self._cond.wait()
            child, self._ready = self._ready, None
        if child is None:
            return None
        assert child.stdin is not None  # started with stdin=PIPE
        script = PREFIX + os.fsencode(command)
        if len(script) > MAX_SCRIPT_BYTES or b"\0" in script:  # gone now, not left to the sweep
            _discard(child)
            return None
        try:
            os.write(child.stdin.fileno(), script)
        except OSError:  # it died before its command came (killed from outside): not ours to run on
            _discard(child)
            return None
        finally:
            child.stdin.close()
        return child


def _discard(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()
    child.wait()
