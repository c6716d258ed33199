"""The keeper: the parent of every background process of the box (processes.py), run by the agent as
`python3 -I -S keeper.py` with one end of a SOCK_SEQPACKET socket pair as the descriptor its argument names.

It is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever a background process starts and leaves
behind (a double fork, a daemon) is re-parented to the keeper, not to the agent, so "the keeper and
everything under it" is a tree the agent's sweep after each command can leave alone while it kills
the rest (shell.py). No command can join that tree: only the keeper forks into it, and only when the
agent asks. It is not dumpable (no ptrace, no /proc/PID/mem from a command of the same uid) and dies
with the agent (PR_SET_PDEATHSIG). A command may still kill it (same uid): its processes are then
re-parented to the agent, swept with the next command, and the agent reports them lost.

Requests (one message each, JSON): {"argv": [...], "env": {...}, "cwd": "..."} with the child's
stdin, stdout and stderr as three descriptors (SCM_RIGHTS). Answers: {"pid": N} or {"error": "..."};
and, as children end, {"exit": PID, "code": N} (N < 0: killed by signal -N).
"""

import json
import os
import select
import signal
import socket
import sys


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except Exception:  # noqa: BLE001 - without it the keeper still works; orphans then go to the agent
        pass


def main() -> None:
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    _prctl(4, 0)  # PR_SET_DUMPABLE
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the agent
    line = int(sys.argv[1])
    os.set_inheritable(line, False)  # no background process holds the keeper's line to the agent
    sock = socket.socket(fileno=line)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd == wake_r:
                os.read(wake_r, 512)
                _reap(sock)
                continue
            try:
                message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            except OSError:
                os._exit(0)
            if not message:
                os._exit(0)  # the agent is gone
            _spawn(sock, message, fds)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _answer(sock: socket.socket, message: dict[str, object]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        os._exit(0)


def _spawn(sock: socket.socket, message: bytes, fds: list[int]) -> None:
    try:
        request = json.loads(message)
        if len(fds) != 3:
            raise ValueError("three descriptors expected")
        for fd in fds:
            os.set_inheritable(fd, False)  # the child has them as 0, 1 and 2 only
        pid = os.posix_spawn(
            request["argv"][0],
            request["argv"],
            request["env"],
            setsid=True,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, fds[0], 0),
                (os.POSIX_SPAWN_DUP2, fds[1], 1),
                (os.POSIX_SPAWN_DUP2, fds[2], 2),
            ],
        )
        _answer(sock, {"pid": pid})
    except Exception as err:  # noqa: BLE001 - the agent says what failed
        _answer(sock, {"error": f"{type(err).__name__}: {err}"[:500]})
    finally:
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main()
