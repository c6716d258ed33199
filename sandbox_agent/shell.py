"""``shell``: /bin/sh -c with no standard input, a clamped timeout, capped output, and no survivors.

Several commands run at once (at most limits.SHELL_MAX_CONCURRENT), each in a process group of its
own (_Commands). When one ends its group is killed; what it started outside the group (setsid, a
daemon) lives no longer than the last command running beside it: once no command runs, the agent,
the container's PID 1, sends SIGKILL to every other process it may signal (``kill(-1)``, or every
one but the background processes' keeper tree), which reaches children that called setsid or
daemonized. The host does the same from outside if the agent does not answer. Before that, output
a stage passes on after the shell exits gets a short, bounded drain (_run).
"""

from __future__ import annotations

import os
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time

from . import limits
from .capped import STREAM_EVERY_S, CappedOutput
from .launcher import Launcher
from .paths import WORKSPACE
from .tools import ToolError, _arg

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any, Callable

# Variables that may carry credentials are never handed to the child, even if one reached the box.
# The host's transcript redactor uses the same pattern.
SECRET_NAME = re.compile(limits.SECRET_NAME_PATTERN, re.I)

DRAIN_S = 0.2  # after the shell exits, its output pipe is read until end of file or this long (see _run)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME.search(k)}
    env.setdefault("HOME", "/tmp")
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


class _Waiter(threading.Thread):
    """Where pidfd_open is missing (gVisor): one long-lived thread waits for a command's shell, when
    the call hands it one (a shell whose output has not ended within WATCH_AFTER_S, or ended before
    it exited: see _run), and writes a byte to that shell's own pipe when it has exited, so the caller
    can poll() for the exit and for output together. Started once: a thread per command, or
    Popen.wait(timeout)'s sleep loop (0.5, 1, 2 ms ...), was most of a short command's cost. Commands
    run at once in one box: a shell handed over while the thread waits for another's gets a thread of
    its own (a blocking waitpid is one shell's), and each caller reads only its own pipe."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="oa-shell-waiter")
        self._pids: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._busy = False
        self._busy_lock = threading.Lock()
        self.statuses: dict[int, int | None] = {}
        self.start()

    def watch(self, pid: int) -> int:
        """A descriptor that becomes readable once `pid` has exited (the caller's to read and close)."""
        ready_fd, notify_fd = os.pipe()
        with self._busy_lock:
            if not self._busy:
                self._busy = True
                self._pids.put((pid, notify_fd))
                return ready_fd
        try:
            threading.Thread(target=self._wait, args=(pid, notify_fd), daemon=True, name="oa-shell-waiter-1").start()
        except RuntimeError:  # no thread to be had: queued behind the other shell, told late but told
            self._pids.put((pid, notify_fd))
        return ready_fd

    def _wait(self, pid: int, notify_fd: int) -> None:
        try:
            _, status = os.waitpid(pid, 0)
            self.statuses[pid] = status
        except ChildProcessError:  # reaped by a sweep: no exit code wanted
            self.statuses[pid] = None
        os.write(notify_fd, b"x")
        os.close(notify_fd)

    def run(self) -> None:
        while True:
            pid, notify_fd = self._pids.get()
            self._wait(pid, notify_fd)
            with self._busy_lock:
                self._busy = not self._pids.empty()


def _pidfd_available() -> bool:
    """pidfd_open works here (Linux >= 5.3; not in gVisor, which answers ENOSYS)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):
        return False


def _not_dumpable() -> None:
    """A command running as our uid cannot ptrace the agent or read /proc/1/{environ,mem,fd}."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


# Done once, when this module is imported: at the first shell call, before its command starts (the
# agent imports a tool at its first call, server.TOOLS), so before anything but the agent has run in
# the box. The agent is made not dumpable, and the waiter thread, if needed, exists before any
# command runs, so a command that exhausts the box's processes or memory cannot stop it being made.
_not_dumpable()
_pidfd_works = _pidfd_available()
_waiter: _Waiter | None = None if _pidfd_works else _Waiter()


def _exit_fd(proc: subprocess.Popen[bytes]) -> tuple[int, bool]:
    """A descriptor that becomes readable when the shell exits (ours to close), and whether it is a pidfd."""
    global _pidfd_works, _waiter
    if _pidfd_works:
        try:
            return os.pidfd_open(proc.pid), True
        except OSError:
            _pidfd_works = False
    if _waiter is None:
        _waiter = _Waiter()
    return _waiter.watch(proc.pid), False


# Without pidfd (gVisor) the waiter thread is handed the shell only if its output has not ended
# within WATCH_AFTER_S, or ended without the shell exiting. A command that ends sooner closes the
# output pipe as it exits: the caller wakes on that end of file and reaps the shell itself, a
# wake-up in place of three (the waiter's waitpid, its write, the caller's poll), each a trip
# through gVisor's scheduler, the costlier the busier the machine.
WATCH_AFTER_S = 0.02
REAP_WITHIN_S, REAP_PAUSE_S = 0.005, 0.0001  # the shell closes its descriptors a little before it is a zombie


def _reaped(proc: subprocess.Popen[bytes], within: float = 0.0) -> bool:
    """Reap the shell if it has exited, asking again REAP_PAUSE_S apart for `within` seconds; True if it has."""
    deadline = time.monotonic() + within
    while True:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: no exit code to give
            proc.returncode = -signal.SIGKILL
            return True
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(REAP_PAUSE_S)


def _run(proc: subprocess.Popen[bytes], timeout: float, output: CappedOutput) -> bool:
    """Collect the command's output until its shell exits or the timeout passes, in this thread:
    one poll() over the output pipe and the exit descriptor. True when the timeout passed.

    When the shell exits first, the pipe is read on until end of file (every writer gone) or for
    DRAIN_S at most: a stage that passes output on after the shell ends (`exec > >(tee log)`, a
    background job finishing) is heard, and one holding the pipe open forever costs DRAIN_S, no
    more. Codex does the same after its child exits (codex-rs/core/src/exec.rs, IO_DRAIN_TIMEOUT_MS).
    Whatever is still running afterwards is killed by the caller: nothing outlives the call.
    Without pidfd the exit descriptor is asked for only when needed (WATCH_AFTER_S)."""
    assert proc.stdout is not None  # started with stdout=PIPE
    out_fd = proc.stdout.fileno()
    poller = select.poll()
    poller.register(out_fd, select.POLLIN)
    exit_fd: int | None = None
    is_pidfd = False
    if _pidfd_works:
        exit_fd, is_pidfd = _exit_fd(proc)
    if exit_fd is not None:
        poller.register(exit_fd, select.POLLIN)
    watch_at = time.monotonic() + WATCH_AFTER_S
    end = time.monotonic() + timeout
    exited = timed_out = False
    out_open = True
    try:
        while out_open or not exited:
            now = time.monotonic()
            if exit_fd is None and not exited and (not out_open or now >= watch_at):
                if _reaped(
                    proc, REAP_WITHIN_S if not out_open else 0.0
                ):  # the usual way out: it closed its output as it exited
                    exited = True
                    end = min(end, time.monotonic() + DRAIN_S)
                    continue
                exit_fd, is_pidfd = _exit_fd(proc)
                poller.register(exit_fd, select.POLLIN)
            left = end - now
            if left <= 0:
                timed_out = not exited
                break
            wait = min(left, STREAM_EVERY_S) if output.waiting else left
            if exit_fd is None and not exited:
                wait = min(wait, max(watch_at - now, 0.0))
            ready = poller.poll(wait * 1000)
            if not ready and output.waiting:
                output.stream(b"", flush=True)
            for fd, _ in ready:
                if fd == exit_fd:
                    exited = True
                    poller.unregister(exit_fd)
                    end = time.monotonic() + DRAIN_S
                elif not _read_into(out_fd, output):
                    poller.unregister(out_fd)
                    out_open = False
    finally:
        if is_pidfd and exit_fd is not None:
            os.close(exit_fd)
    if not exited:  # its own process group only: other commands may run beside it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    if is_pidfd:
        proc.wait()
    elif exit_fd is not None:  # the waiter was handed the shell: one byte on its own pipe, and its status
        if not exited:
            _wait_readable(exit_fd)
        os.read(exit_fd, 1)
        os.close(exit_fd)
        status = _waiter.statuses.pop(proc.pid, None) if _waiter else None
        proc.returncode = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
    elif (
        not exited
    ):  # timed out before the waiter was asked (a timeout under WATCH_AFTER_S: never, as timeouts are >= 1 s)
        proc.wait()
    return timed_out


def _wait_readable(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    poller.poll()


def _read_into(fd: int, output: CappedOutput) -> bool:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        return False
    if chunk:
        output.add(chunk)
    return bool(chunk)


def _drain(fd: int, output: CappedOutput, wait_s: float) -> None:
    """After the sweep every writer is dead, so this meets EOF at once; outside a box (not PID 1) a
    setsid'd survivor may hold the pipe: give it `wait_s`, as the reader thread's join did."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        if not poller.poll(left * 1000) or not _read_into(fd, output):
            return


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _sweep_all() -> None:
    """The sweep once the box's last running command has ended (no other command runs, and none
    starts until it is done: _Commands)."""
    if os.getpid() != 1:
        return
    kept = sys.modules.get(f"{__package__}.processes")
    if kept is not None and kept.keeper_pid() is not None:  # background processes run: their keeper's tree stays
        kept.sweep_except_kept(_reap)
        return
    # As PID 1 we see every process in the box: SIGKILL them all (setsid'd and double-forked ones
    # too) until none is left, reaping the orphans that were reparented to us. Repeat, because a
    # process that was forking during one kill(-1) can escape that one.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        except OSError:
            pass
        _reap()
        time.sleep(0.005)
    _reap()


class _Commands:
    """The commands running at once in this box (at most limits.SHELL_MAX_CONCURRENT), each in a
    process group of its own. A command that ends has its own group killed at once (what it left
    with `&` or nohup); what escaped its group (setsid, a double fork) is killed by the sweep of the
    whole box (_sweep_all), run when the last running command ends, with no command starting until it
    is done. So a finished command's leftovers never outlive the last command running beside it,
    and no sweep meets a running command. `kill(key)` ends one command's group (a cancel: proc_sweep)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running: dict[object, int | None] = {}  # a slot -> its shell's pid once started
        self._keys: dict[str, object] = {}
        self._doomed: dict[str, None] = {}  # keys cancelled before their command came (a cancel racing its call)
        self._sweeping = False

    def enter(self, key: str | None) -> object:
        slot = object()
        with self._cond:
            while self._sweeping:
                self._cond.wait()
            if key is not None and self._doomed.pop(key, 0) is None:
                raise ToolError("cancelled", "the call was cancelled before its command started")
            if len(self._running) >= limits.SHELL_MAX_CONCURRENT:
                raise ToolError(
                    "resource_exhausted",
                    f"{len(self._running)} commands run in this box; at most "
                    f"{limits.SHELL_MAX_CONCURRENT} run at once: wait for one to end",
                )
            self._running[slot] = None
            if key is not None:
                self._keys[key] = slot
        return slot

    def started(self, slot: object, key: str | None, pid: int) -> None:
        with self._cond:
            self._running[slot] = pid
            if key is not None and self._doomed.pop(key, 0) is None:  # cancelled while it was starting
                _kill_group(pid)

    def kill(self, key: str) -> bool:
        """Kill the process group of the command called `key`; False when none such runs."""
        with self._cond:
            slot = self._keys.get(key)
            if slot is None:  # not come yet (or over): it must not start
                self._doomed[key] = None
                while len(self._doomed) > 256:
                    del self._doomed[next(iter(self._doomed))]
                return False
            pid = self._running.get(slot)
            if pid is None:  # starting: killed as soon as it has a pid (started())
                self._doomed[key] = None
                return False
            _kill_group(pid)
            return True

    def leave(self, slot: object, key: str | None, pid: int | None) -> bool:
        """The command ended: its group killed, and the whole box swept if it was the last. True if it was."""
        with self._cond:
            if pid is not None:
                _kill_group(pid)
            del self._running[slot]
            if key is not None and self._keys.get(key) is slot:
                del self._keys[key]
            last = not self._running
            self._sweeping = last
        if not last:
            return False
        try:
            _sweep_all()
        finally:
            with self._cond:
                self._sweeping = False
                self._cond.notify_all()
        return True


_commands = _Commands()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _popen(argv: list[str], stdin: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=WORKSPACE if os.path.isdir(WORKSPACE) else None,
            env=child_env(),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as err:
        raise ToolError("io_error", f"could not start /bin/sh: {err.strerror}") from None


_launcher = Launcher(_popen)


def after_answer() -> None:
    """Start making the next call's shell (launcher.py), in the time the model takes to answer.

    Called by the server once a shell call's answer is sent, not before: CPython holds the GIL
    through the vfork and exec of the new shell (6-7 ms under gVisor, measured), and started while
    the answer was being encoded and written it could delay that answer. A shell prepared while
    another command runs may meet the sweep that follows the last command's end: it is then dead
    when taken, and the launcher says so (take() gives None: the call starts its own shell)."""
    try:
        _launcher.prepare()
    except Exception:  # no thread to start it (out of processes or memory): the next call starts its own shell
        pass


def kill_command(key: str) -> bool:
    """A cancel's kill of one command (processes.proc_sweep): its process group; False when it does not run."""
    return _commands.kill(key)


def shell(args: dict[str, Any], on_output: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`on_output(text)`, if given, receives the output while the command runs (see CappedOutput)."""
    command = _arg(args, "command", str, required=True)
    requested = _arg(args, "timeout", int, limits.SHELL_DEFAULT_TIMEOUT_S)
    if requested < 1:
        raise ToolError("invalid_arguments", "timeout must be at least 1 second")
    timeout = min(requested, limits.SHELL_MAX_TIMEOUT_S)
    key = args.get("key") if isinstance(args.get("key"), str) else None  # the host's name for the call (a cancel's)
    slot = _commands.enter(key)
    proc: subprocess.Popen[bytes] | None = None
    swept = False
    try:
        started = time.monotonic()
        proc = _launcher.take(command) or _popen(["/bin/sh", "-c", command])
        _commands.started(slot, key, proc.pid)
        captured = CappedOutput(on_output)
        timed_out = _run(proc, timeout, captured)
    finally:
        swept = _commands.leave(slot, key, proc.pid if proc is not None else None)
    assert proc.stdout is not None  # started with stdout=PIPE
    # After the sweep every writer is dead: end of file at once. While other commands run, something
    # this one started outside its group may hold the pipe until the last one ends: what it wrote by
    # then is read for DRAIN_S, no longer.
    _drain(proc.stdout.fileno(), captured, 2.0 if swept or os.getpid() != 1 else DRAIN_S)
    captured.stream(b"", final=True)
    proc.stdout.close()
    elapsed = time.monotonic() - started
    output, truncated = captured.text()
    meta = {
        "exit_code": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "timeout_s": timeout,
        "requested_timeout_s": requested,
        "clamped": requested != timeout,
        "output_bytes": captured.total,
        "output_lines": captured.lines,
        "output_truncated": truncated,
        "output_omitted_bytes": captured.omitted_bytes,
        "output_omitted_lines": captured.omitted_lines,
        "output_cap_bytes": limits.SHELL_OUTPUT_HEAD_BYTES + limits.SHELL_OUTPUT_TAIL_BYTES,
        "elapsed_s": round(elapsed, 3),
    }
    notes = []
    if requested != timeout:
        notes.append(f"[timeout {requested}s was clamped to the {limits.SHELL_MAX_TIMEOUT_S}s ceiling]")
    if truncated:
        notes.append(
            f"[output was {captured.total} bytes in {captured.lines} lines; {captured.omitted_bytes} "
            f"bytes ({captured.omitted_lines} lines) from the middle are left out where the marker "
            f"stands: at most the first {limits.SHELL_OUTPUT_HEAD_BYTES} and the last "
            f"{limits.SHELL_OUTPUT_TAIL_BYTES} bytes are kept, cut between lines where there are lines]"
        )
    if timed_out:
        notes.append(f"[timed out after {timeout}s; the command and everything it started were killed]")
        raise ToolError("timeout", "\n".join(notes), output=output, meta=meta)
    notes.append(f"[exit code {proc.returncode}]")
    return {"output": output, "note": "\n".join(notes), "meta": meta}
