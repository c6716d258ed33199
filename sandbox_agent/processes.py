"""Background processes for the program's own API (Sandbox.start: issue 46), never a model's tool
(table.OPS): a command that outlives the call that started it (a server, a watcher), with its
output kept in a bounded ring, its stdin writable, waited for and killed by id.

Each runs `/bin/sh -c COMMAND` in a session of its own, started by the keeper (keeper.py, a child
subreaper of the agent), so it and everything it leaves behind stay under the keeper: the sweep
after each `shell` call kills every process of the box but the agent and the keeper's tree
(`sweep_except_kept`). At most limits.PROC_MAX run at once (RESOURCE_EXHAUSTED beyond); each keeps
the last limits.PROC_OUTPUT_BYTES of its output (stdout and stderr together), counting what it
dropped. They end with the box; a killed keeper leaves them lost (their processes are swept with
the next command), and the next start makes a new keeper.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from binascii import a2b_base64, b2a_base64

from . import limits, wire
from .shell import child_env
from .tools import ToolError, _arg

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Any

KEEPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keeper.py")
SPAWN_WAIT_S = 10.0
MAX_WAIT_S = 60  # one wait or read request blocks at most this long; the host asks again
DRAIN_S = 2.0  # after it exits, its output is awaited this long at most (what it started may hold the pipe)


class _Proc:
    def __init__(self, pid: int, command: str, out_fd: int, in_fd: int) -> None:
        self.pid, self.command, self.out_fd, self.in_fd = pid, command, out_fd, in_fd
        self.ring = bytearray()
        self.total = 0  # bytes of output ever (the ring holds the last PROC_OUTPUT_BYTES of them)
        self.code: int | None = None
        self.exited = False
        self.output_closed = False
        self.lost = False
        self.started = time.time()


class _Keeper:
    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", KEEPER, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                close_fds=True,
                env=child_env(),
            )
        finally:
            theirs.close()
        self.sock = mine
        self.answers: list[dict[str, Any]] = []
        self.alive = True
        threading.Thread(target=self._listen, name="oa-keeper-listener", daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                message = self.sock.recv(1 << 16)
            except OSError:
                message = b""
            if not message:
                break
            try:
                answer = wire.decode(message.decode("utf-8"))
            except (ValueError, UnicodeDecodeError):
                continue
            if not isinstance(answer, dict):
                continue
            with _changed:
                if "exit" in answer:
                    for proc in _procs.values():
                        if proc.pid == answer["exit"] and not proc.exited:
                            proc.exited, proc.code = True, answer.get("code")
                    for started in self.answers:  # ended before proc_start took its pid: kept with it
                        if started.get("pid") == answer["exit"]:
                            started["ended"] = answer.get("code")
                else:
                    self.answers.append(answer)
                _changed.notify_all()
        with _changed:  # the keeper is gone (killed from inside the box): its processes are lost
            self.alive = False
            for proc in _procs.values():
                if not proc.exited:
                    proc.exited, proc.lost = True, True
                    _kill_group(proc.pid)
            _changed.notify_all()
        try:
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - reaped by the shell's sweep
            pass


_changed = threading.Condition()
_one_start = threading.Lock()  # taken before _changed, never inside it
_procs: dict[str, _Proc] = {}
_keeper: _Keeper | None = None
_counter = 0


def keeper_pid() -> int | None:
    """The live keeper's pid (shell.py's sweep spares its tree), or None."""
    keeper = _keeper
    return keeper.proc.pid if keeper is not None and keeper.alive else None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _reader(proc: _Proc) -> None:
    while True:
        try:
            chunk = os.read(proc.out_fd, 65536)
        except OSError:
            chunk = b""
        with _changed:
            if not chunk:
                proc.output_closed = True
                os.close(proc.out_fd)
                _changed.notify_all()
                return
            proc.total += len(chunk)
            proc.ring += chunk
            if len(proc.ring) > limits.PROC_OUTPUT_BYTES:
                del proc.ring[: len(proc.ring) - limits.PROC_OUTPUT_BYTES]
            _changed.notify_all()


def _get(args: dict[str, Any]) -> _Proc:
    pid = _arg(args, "id", str, required=True)
    proc = _procs.get(pid)
    if proc is None:
        raise ToolError("invalid_arguments", f"no background process {pid[:40]!r} in this box")
    return proc


def _state(key: str, proc: _Proc) -> dict[str, Any]:
    return {
        "id": key,
        "pid": proc.pid,
        "running": not proc.exited,
        "exit_code": proc.code,
        "lost": proc.lost,
        "output_bytes": proc.total,
        "command": proc.command[:200],
    }


def proc_start(args: dict[str, Any]) -> dict[str, Any]:
    global _keeper, _counter
    command = _arg(args, "command", str, required=True)
    # one start at a time: the keeper answers in the order it was asked, and commands now run at once
    with _one_start, _changed:
        running = sum(1 for p in _procs.values() if not p.exited)
        if running >= limits.PROC_MAX:
            raise ToolError(
                "resource_exhausted",
                f"{running} background processes run in this box; at most {limits.PROC_MAX}: kill one first",
            )
        for key in [k for k, p in _procs.items() if p.exited and p.output_closed][
            : max(0, len(_procs) - 4 * limits.PROC_MAX)
        ]:
            del _procs[key]  # the oldest ended ones make room
        if _keeper is None or not _keeper.alive:
            try:
                _keeper = _Keeper()
            except OSError as err:
                raise ToolError(
                    "resource_exhausted", f"could not start the box's process keeper: {err.strerror or err}"
                ) from None
        keeper = _keeper
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            request = wire.encode({"argv": ["/bin/sh", "-c", command], "env": child_env()}).encode(
                "utf-8", "surrogatepass"
            )
            socket.send_fds(keeper.sock, [request], [in_r, out_w, out_w])
        except OSError as err:
            for fd in (in_r, in_w, out_r, out_w):
                os.close(fd)
            raise ToolError(
                "io_error", f"the box's process keeper did not take the command: {err.strerror or err}"
            ) from None
        os.close(in_r)
        os.close(out_w)
        deadline = time.monotonic() + SPAWN_WAIT_S
        while not keeper.answers and keeper.alive and time.monotonic() < deadline:
            _changed.wait(deadline - time.monotonic())
        answer = keeper.answers.pop(0) if keeper.answers else {"error": "the box's process keeper did not answer"}
        pid = answer.get("pid")
        if not isinstance(pid, int):
            os.close(in_w)
            os.close(out_r)
            raise ToolError("io_error", f"the command was not started: {str(answer.get('error'))[:300]}")
        _counter += 1
        key = f"p{_counter}"
        proc = _procs[key] = _Proc(pid, command, out_r, in_w)
        if "ended" in answer:  # the keeper's exit message came before this call took the lock again
            ended = answer["ended"]
            proc.exited, proc.code = True, ended if isinstance(ended, int) else None
    threading.Thread(target=_reader, args=(proc,), name=f"oa-proc-{key}", daemon=True).start()
    return {"output": f"started {key} (pid {proc.pid})", "meta": _state(key, proc)}


def proc_read(args: dict[str, Any]) -> dict[str, Any]:
    """Output from byte `since` (of all it ever printed) on, at most limits.BYTES_CHUNK; waits up to
    `wait` seconds for some when there is none yet and the process still runs."""
    proc = _get(args)
    key = args["id"]
    since = _arg(args, "since", int, 0)
    wait = min(max(_arg(args, "wait", int, 0), 0), MAX_WAIT_S)
    end = time.monotonic() + wait
    with _changed:
        while since >= proc.total and not proc.output_closed and time.monotonic() < end:
            _changed.wait(end - time.monotonic())
        first = proc.total - len(proc.ring)
        start = max(since, first)
        data = bytes(proc.ring[start - first : start - first + limits.BYTES_CHUNK])
        state = _state(key, proc)
        ended = proc.output_closed
    state.update(
        data=b2a_base64(data, newline=False).decode("ascii"),
        next=start + len(data),
        dropped=start - max(since, 0),
        output_ended=ended and start + len(data) >= proc.total,
    )
    return {"output": "", "meta": state}


def proc_write(args: dict[str, Any]) -> dict[str, Any]:
    proc = _get(args)
    data = a2b_base64(_arg(args, "data", str, ""))
    close = _arg(args, "close", bool, False)
    if proc.in_fd < 0:
        raise ToolError("invalid_arguments", "its stdin is closed")
    view, end = memoryview(data), time.monotonic() + MAX_WAIT_S
    poller = select.poll()
    poller.register(proc.in_fd, select.POLLOUT)
    try:
        while view:
            if not poller.poll(max(end - time.monotonic(), 0) * 1000):
                raise ToolError(
                    "timeout",
                    f"the process did not read its stdin ({len(data) - len(view)} of {len(data)} bytes taken)",
                )
            view = view[os.write(proc.in_fd, view) :]
    except BrokenPipeError:
        raise ToolError("io_error", "the process closed its stdin") from None
    finally:
        if close:
            os.close(proc.in_fd)
            proc.in_fd = -1
    return {"output": f"wrote {len(data)} bytes", "meta": {"bytes": len(data)}}


def proc_wait(args: dict[str, Any]) -> dict[str, Any]:
    proc = _get(args)
    timeout = min(max(_arg(args, "timeout", int, 0), 0), MAX_WAIT_S)
    end = time.monotonic() + timeout
    with _changed:
        while not proc.exited and time.monotonic() < end:
            _changed.wait(end - time.monotonic())
        # its output is read to its end before it is said to have ended (a read after wait() has all of
        # it), unless something it started holds the pipe open: then DRAIN_S at most
        drain = time.monotonic() + DRAIN_S
        while proc.exited and not proc.output_closed and time.monotonic() < drain:
            _changed.wait(drain - time.monotonic())
        return {"output": "", "meta": _state(args["id"], proc)}


def proc_kill(args: dict[str, Any]) -> dict[str, Any]:
    proc = _get(args)
    if not proc.exited:
        _kill_group(proc.pid)
        sweep_tree(proc.pid)
    with _changed:
        end = time.monotonic() + 5
        while not proc.exited and time.monotonic() < end:
            _changed.wait(end - time.monotonic())
        return {"output": "", "meta": _state(args["id"], proc)}


def proc_list(args: dict[str, Any]) -> dict[str, Any]:
    with _changed:
        return {"output": "", "meta": {"processes": [_state(k, p) for k, p in _procs.items()]}}


def _parents() -> dict[int, int]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                if fields[0] in (b"Z", b"X"):  # dead already: nothing to kill, only to reap
                    continue
                found[int(name)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    return found


def _tree(root: int, parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def sweep_tree(root: int) -> None:
    """SIGKILL to `root` and everything under it, until none is left (a fork during one pass is met by the next)."""
    end = time.monotonic() + 5
    while time.monotonic() < end:
        victims = _tree(root, _parents())
        alive = [pid for pid in victims if pid in _parents()]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


def sweep_except_kept(reap: Any) -> None:
    """The shell's sweep when background processes may run: SIGKILL to every process of the box but
    the agent and the keeper's tree, until none is left; `reap` collects the agent's own zombies."""
    me = os.getpid()
    end = time.monotonic() + 5
    while time.monotonic() < end:
        keeper = keeper_pid()
        parents = _parents()
        kept = _tree(keeper, parents) if keeper is not None else set()
        victims = [pid for pid in parents if pid not in kept and pid != me and pid != 1]
        if not victims:
            break
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        time.sleep(0.005)
    reap()


def proc_sweep(args: dict[str, Any]) -> dict[str, Any]:
    """A cancel's kill (the host's api/turns.py). With a `key`, the command the host named so: its
    process group, nothing else (other commands may run beside it; what it started outside its group
    goes with the sweep after the box's last running command). Without one, every process of the box
    but the agent and the keeper's tree, so a cancelled command ends and the background processes
    stay. The command's own thread reaps what it started."""
    key = args.get("key")
    if isinstance(key, str):
        from .shell import kill_command

        kill_command(key)
        return {"output": "", "meta": {"swept": True}}
    if os.getpid() != 1:
        return {"output": "", "meta": {"swept": False}}
    sweep_except_kept(lambda: None)
    return {"output": "", "meta": {"swept": True}}
