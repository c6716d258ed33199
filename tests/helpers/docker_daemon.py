"""A second Docker daemon of the tests' own, to kill, freeze and restart (issue 16: daemon loss).

Never the machine's daemon: the tests point sessions at this one through DOCKER_HOST and do what they
like to it. Everything it has lives under one short directory (a unix socket path holds 108 bytes):

    docker.sock  its API (DOCKER_HOST=unix://...)     daemon.json  its whole configuration
    data/        --data-root                          exec/        --exec-root (its containerd's too)
    docker.pid   --pidfile                            dockerd.log  what it said

How it stays apart from the machine's:
- Its own network namespace. It runs with `bridge: none` and iptables off, which in the host's
  namespace would delete the machine daemon's docker0 and break every other container; in its own
  namespace there is nothing to touch. Boxes run with network none, so nothing else is needed.
- Its own mount namespace, with slave propagation (the host's unmounts reach it, none of its mounts
  reach the host), and fresh tmpfs over /run (containerd's shim sockets, runc's state, /run/docker),
  /etc/docker (daemon.json, key.json) and /var/lib/docker: a flag forgotten here could still not touch
  the machine daemon's state.
- Its own containerd: dockerd starts one (no --containerd) with its state under exec/ and data/; it
  dies with dockerd (dockerd gives it a parent-death signal), as on a real machine. The shims and
  the boxes outlive both, as they would there too.
- Its own cgroup parent, removed at the end.

A holder process keeps the two namespaces across restarts, so a restarted dockerd finds what the
killed one left (shims, boxes, mounts) on the same data root, as a restarted daemon would. The holder
and dockerd get a parent-death signal: if the test process dies, they go with it. `close()` kills
every process in the namespaces and every descendant of one (shims, boxes), waits for them, removes
the cgroups and the directory; `leftovers()` says what is still there (nothing, or the test fails).
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import docker

PR_SET_PDEATHSIG = 1
BUILTIN_RUNTIMES = frozenset({"runc", "io.containerd.runc.v2", "io.containerd.runtime.v1.linux"})
# Over the host's paths in the daemon's mount namespace only (each if the host has it: nothing is created on the host).
_PRIVATE_TMPFS = (("/run", "755"), ("/etc/docker", "700"), ("/var/lib/docker", "711"))


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process goes, whatever way it goes."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


class _Spawner:
    """Every Popen from one long-lived thread. A parent-death signal fires when the *thread* that forked
    the child ends, and a test may restart the daemon from a worker thread (asyncio.to_thread) that
    ends right after: dockerd would die with it."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[tuple[bool, Any]]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="own-dockerd-spawner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            work, answer = job
            try:
                answer.put((True, work()))
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                answer.put((False, err))

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        answer: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self._jobs.put((lambda: subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs), answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)


def extra_runtimes(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runtimes the machine's daemon registers beyond runc (scripts/setup's runsc and runsc-net), as
    daemon.json entries, so boxes on the own daemon get the same choice (runtimes.py)."""
    out = {}
    for name, entry in (info.get("Runtimes") or {}).items():
        if name in BUILTIN_RUNTIMES or not isinstance(entry, dict) or not entry.get("path"):
            continue
        out[name] = {
            "path": entry["path"],
            **({"runtimeArgs": list(entry["runtimeArgs"])} if entry.get("runtimeArgs") else {}),
        }
    return out


def save_image(tag: str, path: Path) -> Path:
    """`docker save` of the machine daemon's image (read only there), once per test session."""
    subprocess.run(["docker", "save", "--output", str(path), tag], check=True, capture_output=True, timeout=300)
    return path


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, comm) of every process now."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), fields[0], comm)
    return table


def _namespaces(pid: int) -> set[int]:
    try:
        return {os.stat(f"/proc/{pid}/ns/net").st_ino, os.stat(f"/proc/{pid}/ns/mnt").st_ino}
    except OSError:
        return set()


class OwnDockerDaemon:
    def __init__(self, runtimes: dict[str, dict[str, Any]] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="oa-dl-", dir="/tmp"))
        self.name = self.root.name
        self.socket = self.root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.pidfile = self.root / "docker.pid"
        self.log = self.root / "dockerd.log"
        (self.root / "data").mkdir()
        (self.root / "exec").mkdir()
        config = {
            "bridge": "none",
            "iptables": False,
            "ip6tables": False,
            "ip-masq": False,  # harmless only in its own netns
            "storage-driver": "overlay2" if "overlay" in Path("/proc/filesystems").read_text() else "vfs",
            "cgroup-parent": f"/{self.name}",
            "log-level": "warn",
            "runtimes": runtimes or {},
        }
        (self.root / "daemon.json").write_text(json.dumps(config, indent=1))
        self.holder: subprocess.Popen[bytes] | None = None
        self.dockerd: subprocess.Popen[bytes] | None = None
        self._ns: set[int] = set()
        self.frozen = False
        self._spawner = _Spawner()

    # -- life ----------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        """Start dockerd (the namespaces first, once) and wait until it answers."""
        if self.holder is None:
            self._start_holder()
        assert self.holder is not None
        self._forget_dead_containerd()
        log = open(self.log, "ab")
        try:
            self.dockerd = self._spawner.popen(
                [
                    "nsenter",
                    f"--target={self.holder.pid}",
                    "--net",
                    "--mount",
                    "--",
                    "dockerd",
                    "--config-file",
                    str(self.root / "daemon.json"),
                    "--host",
                    self.host,
                    "--data-root",
                    str(self.root / "data"),
                    "--exec-root",
                    str(self.root / "exec"),
                    "--pidfile",
                    str(self.pidfile),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self.answers():
            if self.dockerd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the test's dockerd did not come up (exit {self.dockerd.poll()}):\n{self.log_tail()}"
                )
            time.sleep(0.1)
        self.frozen = False

    def _forget_dead_containerd(self) -> None:
        """A restarted dockerd reuses the containerd its pidfile names while that pid exists. Ours died
        with the killed dockerd, but this machine's init reaps orphans late, and a zombie's pid still
        exists: dockerd would wait for a containerd that never answers. Where init reaps at once (a
        real machine), the pidfile names nothing and dockerd starts a fresh containerd; so here."""
        pidfile = self.root / "exec" / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        _, state, comm = _proc_table().get(pid, (0, "gone", ""))
        if state in ("Z", "gone") or comm != "containerd":  # dead, or its pid reused by another process
            pidfile.unlink()
        else:
            raise RuntimeError(f"the killed dockerd's containerd (pid {pid}) still runs ({state})")

    def _start_holder(self) -> None:
        mounts = " && ".join(
            f"{{ [ ! -d {path} ] || mount -t tmpfs -o mode={mode} oa-dl {path}; }}" for path, mode in _PRIVATE_TMPFS
        )
        self.holder = self._spawner.popen(
            [
                "unshare",
                "--net",
                "--mount",
                "--propagation",
                "slave",
                "--",
                "sh",
                "-c",
                f"{mounts} && ip link set lo up && echo ready && exec sleep infinity",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != b"ready":
            self.holder.kill()
            raise RuntimeError(
                "the namespaces for the test's dockerd could not be "
                f"made: {self.holder.communicate()[1].decode()[-2000:]}"
            )
        self._ns = _namespaces(self.holder.pid)
        assert self._ns and not self._ns & _namespaces(os.getpid()), "the holder shares a namespace with the host"

    @property
    def pid(self) -> int | None:
        return self.dockerd.pid if self.dockerd is not None and self.dockerd.poll() is None else None

    def answers(self, timeout: int = 2) -> bool:
        client = None
        try:
            client = docker.DockerClient(base_url=self.host, timeout=timeout, version="1.41")
            return bool(client.ping())
        except Exception:  # noqa: BLE001 - not up (yet)
            return False
        finally:
            if client is not None:
                client.close()

    def kill(self) -> None:
        """SIGKILL dockerd, as a crash would; its containerd goes with it, shims and boxes stay."""
        assert self.dockerd is not None and self.dockerd.poll() is None, "the test's dockerd is not running"
        self.dockerd.send_signal(signal.SIGKILL)
        self.dockerd.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(comm == "containerd" for comm, _ in self.processes().values()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def freeze(self) -> None:
        """SIGSTOP dockerd: connections are accepted by the kernel and never answered (as while a
        restarted daemon restores its containers, or a wedged one)."""
        assert self.dockerd is not None
        self.dockerd.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.dockerd is not None and self.dockerd.poll() is None:
            self.dockerd.send_signal(signal.SIGCONT)
        self.frozen = False

    def ensure_up(self) -> None:
        """Running and answering: thawed if frozen, started again on the same data root if killed."""
        if self.frozen:
            self.thaw()
        if self.pid is None:
            self.start()
        deadline = time.monotonic() + 30
        while not self.answers():
            assert time.monotonic() < deadline, f"the test's dockerd does not answer:\n{self.log_tail()}"
            time.sleep(0.1)

    def client(self, timeout: int = 60) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def load(self, tarball: Path) -> None:
        subprocess.run(
            ["docker", "--host", self.host, "load", "--input", str(tarball)],
            check=True,
            capture_output=True,
            timeout=300,
        )

    def remove_all_containers(self) -> None:
        """Every container of this daemon (all are the tests'): what one test left does not reach the next."""
        client = self.client()
        try:
            for container in client.containers.list(all=True):
                container.remove(force=True)
        finally:
            client.close()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- what is left ------------------------------------------------------------------------------
    def processes(self) -> dict[int, tuple[str, str]]:
        """pid -> (comm, state) of every process in its namespaces (holder, dockerd, containerd, shims),
        in its cgroups (the boxes), and every descendant of one. The namespaces count only while the
        holder keeps them: once they are gone, their inode numbers may name other namespaces."""
        table = _proc_table()
        ours = {pid for pid in self._cgroup_pids() if pid in table}
        if self._ns and self.holder is not None and self.holder.poll() is None:
            ours |= {pid for pid in table if _namespaces(pid) & self._ns}
        grew = True
        while grew:
            more = {pid for pid, (ppid, _, _) in table.items() if ppid in ours and pid not in ours}
            ours |= more
            grew = bool(more)
        return {pid: (table[pid][2], table[pid][1]) for pid in sorted(ours)}

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for top in self.cgroups():
            for dirpath, _, _ in os.walk(top):
                try:
                    pids |= {int(line) for line in Path(dirpath, "cgroup.procs").read_text().split()}
                except OSError:
                    pass
        return pids

    def cgroups(self) -> list[str]:
        return sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{self.name}"))

    def leftovers(self) -> list[str]:
        """Whatever of it is still there: processes (zombies waiting for init to reap them aside),
        cgroups, host mounts under its directory, the directory."""
        left = [f"process {pid} {comm} ({state})" for pid, (comm, state) in self.processes().items() if state != "Z"]
        for popen in (self.holder, self.dockerd):
            if popen is not None and popen.poll() is None:
                left.append(f"process {popen.pid} (ours)")
        left += [f"cgroup {path}" for path in self.cgroups()]
        with open("/proc/self/mountinfo") as mountinfo:
            left += [f"mount {line.split()[4]}" for line in mountinfo if str(self.root) in line]
        if self.root.exists():
            left.append(f"directory {self.root}")
        return left

    def close(self) -> None:
        """Kill everything it started, wait for it, remove its cgroups and its directory. The holder
        goes last: while it lives, its namespaces name what is ours and nothing else."""
        if self.frozen:
            self.thaw()
        holder = self.holder.pid if self.holder is not None else None
        deadline = time.monotonic() + 30
        while True:
            alive = [pid for pid, (_, state) in self.processes().items() if state != "Z" and pid != holder]
            if self.dockerd is not None:
                self.dockerd.poll()  # reap our own child
            if not alive:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of the test's dockerd survive SIGKILL: {alive}")
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for popen in (self.dockerd, self.holder):
            if popen is not None:
                if popen.poll() is None:
                    popen.kill()
                popen.wait(timeout=10)
                for pipe in (popen.stdout, popen.stderr):
                    if pipe is not None:
                        pipe.close()
        self._ns = set()
        self._spawner.close()
        self._remove_cgroups()
        shutil.rmtree(self.root, ignore_errors=True)

    def _remove_cgroups(self) -> None:
        deadline = time.monotonic() + 10
        for top in self.cgroups():
            for dirpath, _, _ in sorted(os.walk(top), key=lambda entry: -entry[0].count("/")):  # the deepest first
                while True:
                    try:
                        os.rmdir(dirpath)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:  # busy a moment longer while its last tasks exit
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
