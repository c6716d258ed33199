#!/usr/bin/env python3
"""How many idle boxes fit in a GiB, and how soon a warm pool of 20 or 50 answers a claim (issue 47).

    python bench/density.py [--engine docker --engine podman] [--runtime runc --runtime runsc] [--n 10]
                            [--by-process] [--env NAME=VALUE] [--pool 20 --pool 50 [--claims 20]]

Per engine and runtime: N boxes started and warmed (one shell call each), then every process of each
box's tree summed by PSS (/proc/PID/smaps_rollup: shared pages divided among their users, so boxes
sharing an image's pages are not counted N times): the tree of the process that holds the box's
init (containerd-shim under Docker, conmon under Podman; under gVisor the runsc sandbox, gofer and
the box's own processes are all in it). An address space is counted once: gVisor's systrap stub
processes share one (clone with CLONE_VM, not threads), and each of them reports that whole space's
PSS, so summing them counted the box's memory three times (kcmp tells). Also the drop in MemAvailable
across the N starts, which other work on the machine moves (said beside it, with the load): it also
holds what no box's tree shows (fuse-overlayfs's process per box, the daemons' bookkeeping).

--shared-usr measures a lever this bench found (not what boxes get today): on a daemon whose storage
driver is fuse-overlayfs (this machine's Docker), each box's mount of the image is its own FUSE file
system, so the pages of python3.11, libc and every other file the box maps are cached once *per box*
(Private_Clean in smaps: 5.5 MiB of the agent's 11 MiB under runc). With the image's /usr mounted
read-only from one named volume shared by every box (the daemon fills an empty volume from the image
on its first mount), those pages are cached once for all. Native overlay2 (Docker's default
elsewhere, and Podman's storage here) shares an image's pages between its containers already.

--pool N fills a warm pool of N boxes (orchestrator/sandbox/pool.py), waits until all N are ready,
then times --claims claims one after another, each with its first answer (read_file), as `acp --pool`
pays them; a claimed box is closed after its timing and the pool refills behind it, a second
between claims (as between two sessions; bench/run.py pauses the same).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from docker.types import Mount  # noqa: E402

from orchestrator.config import DEFAULT_IMAGE, SandboxConfig  # noqa: E402
from orchestrator.sandbox import docker as docker_backend  # noqa: E402
from orchestrator.sandbox.docker import DockerSandbox, docker_client  # noqa: E402
from orchestrator.sandbox.pool import SandboxPool  # noqa: E402

_SYS_KCMP = 312  # x86_64
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _subtree(root: int, tree: dict[int, list[int]]) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _same_vm(a: int, b: int) -> bool:
    return int(_libc.syscall(_SYS_KCMP, a, b, _KCMP_VM, 0, 0)) == 0


def _one_per_address_space(pids: list[int]) -> list[int]:
    """`pids` less those sharing an address space with one kept before them (gVisor's stubs)."""
    kept: list[int] = []
    for pid in pids:
        if not any(_same_vm(pid, other) for other in kept):
            kept.append(pid)
    return kept


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _name(pid: int) -> str:
    """The process's name, gVisor's told apart: its processes are all `exe` by comm, but runsc names
    its sandbox (the Sentry) and gofer in argv[0]; the box's own address spaces (systrap stubs) keep `exe`."""
    comm = _comm(pid)
    if comm != "exe":
        return comm
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        if argv0 == "runsc-sandbox" and _comm(_ppid(pid)) == "exe":
            return "the box's address space (stub)"  # forked by the Sentry, argv and all
        return argv0 or comm
    except OSError:
        return comm


def _holder(pid: int) -> int:
    """The box's keeper above its init: containerd-shim (Docker) or conmon (Podman); the init itself if none."""
    at = pid
    for _ in range(8):
        parent = _ppid(at)
        if parent <= 1:
            break
        comm = _comm(parent)
        if comm.startswith("containerd-shim") or comm == "conmon":
            return parent
        at = parent
    return pid


def _mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def _config(engine: str, runtime: str, env: dict[str, str]) -> SandboxConfig:
    return SandboxConfig.model_validate({"engine": engine, "runtime": runtime, "env": env})


def _workspace(tag: str) -> Path:
    ws = Path(tempfile.mkdtemp(prefix=f"density-{tag}-"))
    os.chown(ws, 1000, 1000)
    return ws


def share_usr(client: Any, image: str) -> str:
    """The experiment of --shared-usr: a named volume holding `image`'s /usr (filled by the daemon from
    the image on the first mount, by a container that only runs `true`), and over it a second volume
    the daemon binds read-only in the host's kernel (o=bind,ro, as mounts.py does: a plain read-only
    volume is truncated through by root in a runsc box with directfs, measured), mounted over /usr in
    every box this process starts from now on. Returns the read-only volume's name."""
    name = "oa-density-usr-" + client.images.get(image).id.split(":")[-1][:12]
    if not client.volumes.list(filters={"name": name + "-ro"}):
        filled = client.volumes.create(name, labels={"dev.openagents.sandbox.bench": "1"})
        client.containers.run(
            image, entrypoint=["true"], network_mode="none", remove=True, mounts=[Mount("/usr", name, "volume")]
        )
        opts = {"type": "none", "o": "bind,ro", "device": filled.attrs["Mountpoint"]}
        client.volumes.create(name + "-ro", driver="local", driver_opts=opts)
    made = docker_backend.container_settings

    def with_shared_usr(*args: Any, **kwargs: Any) -> dict[str, Any]:
        settings = made(*args, **kwargs)
        shared = Mount("/usr", name + "-ro", "volume", read_only=True, no_copy=True)
        settings["mounts"] = [*settings["mounts"], shared]
        return settings

    docker_backend.container_settings = with_shared_usr  # a bench's experiment only
    return name + "-ro"


def measure(engine: str, runtime: str, n: int, env: dict[str, str], by_process: dict[str, float]) -> dict[str, float]:
    """MiB of PSS per idle warm box, boxes per GiB, MemAvailable's drop per box; `by_process` is
    filled with each process name's MiB per box."""
    client = docker_client(timeout=300, engine=engine)
    boxes = []
    workspaces: list[Path] = []
    before = _mem_available_kib()
    try:
        for i in range(n):
            workspaces.append(_workspace(str(i)))
            box = DockerSandbox(workspaces[-1], _config(engine, runtime, env), client=client)
            box.start()
            assert box.call("shell", {"command": "true"}).ok
            boxes.append(box)
        time.sleep(2)  # let start-up's transient pages go
        tree = _children()
        total_kib = 0
        for box in boxes:
            init = int(client.api.inspect_container(box.container.id)["State"]["Pid"])
            for pid in _one_per_address_space(_subtree(_holder(init), tree)):
                kib = _pss_kib(pid)
                total_kib += kib
                name = _name(pid)
                by_process[name] = by_process.get(name, 0.0) + kib / n / 1024
        dropped = before - _mem_available_kib()
    finally:
        for box in boxes:
            box.close()
        for ws in workspaces:
            shutil.rmtree(ws, ignore_errors=True)
        client.close()
    per_box = total_kib / n / 1024
    return {"pss_mib": per_box, "per_gib": 1024 / per_box if per_box else 0, "avail_drop_mib": dropped / n / 1024}


def pool_claims(engine: str, runtime: str, size: int, claims: int, env: dict[str, str]) -> dict[str, float]:
    """Claim + first answer, p50 / p95 in ms, from a full warm pool of `size`, and the seconds it took to fill."""
    client = docker_client(timeout=300, engine=engine)
    ws = _workspace("pool")
    (ws / "one_kib.txt").write_text("x" * 1024)
    os.chown(ws / "one_kib.txt", 1000, 1000)
    timings: list[float] = []
    started = time.perf_counter()
    try:
        with SandboxPool(ws, _config(engine, runtime, env), size=size, client=client) as pool:
            while pool.counters().ready < size:
                if time.perf_counter() - started > 30 * size:
                    raise SystemExit(f"the pool of {size} did not fill: {pool.counters()}")
                time.sleep(0.2)
            filled_s = time.perf_counter() - started
            time.sleep(2)  # the last starts' work settles
            for _ in range(claims):
                at = time.perf_counter()
                box = pool.claim()
                assert box.call("read_file", {"path": "one_kib.txt"}).ok
                timings.append((time.perf_counter() - at) * 1000)
                box.close()
                time.sleep(1.0)  # the pool refills, as between two real sessions (bench/run.py's pause)
    finally:
        client.close()
        shutil.rmtree(ws, ignore_errors=True)
    timings.sort()
    return {
        "p50_ms": statistics.median(timings),
        "p95_ms": timings[min(len(timings) - 1, int(len(timings) * 0.95))],
        "fill_s": filled_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", choices=["docker", "podman"])
    parser.add_argument("--runtime", action="append")
    parser.add_argument("--n", type=int, default=10, help="idle boxes measured by PSS (0: none)")
    parser.add_argument("--by-process", action="store_true", help="each process name's share of a box")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE set in every box (experiments)")
    parser.add_argument("--pool", action="append", type=int, default=[], help="time claims from a full pool of N")
    parser.add_argument("--claims", type=int, default=20)
    parser.add_argument("--shared-usr", action="store_true", help="the experiment: /usr from one read-only volume")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    if args.shared_usr:
        client = docker_client(timeout=300)
        print(f"/usr of every box from the read-only volume {share_usr(client, DEFAULT_IMAGE)}")
        client.close()
    print(f"load {os.getloadavg()[0]:.1f}, {args.n} idle warm boxes each" + (f", env {env}" if env else ""))
    for engine in args.engine or ["docker"]:
        for runtime in args.runtime or ["runc", "runsc"]:
            if args.n > 0:
                by_process: dict[str, float] = {}
                found = measure(engine, runtime, args.n, env, by_process)
                print(
                    f"{engine:7} {runtime:6} PSS {found['pss_mib']:6.1f} MiB/box = {found['per_gib']:5.1f} "
                    f"boxes/GiB; MemAvailable dropped {found['avail_drop_mib']:6.1f} MiB/box "
                    f"(load {os.getloadavg()[0]:.1f})"
                )
                if args.by_process:
                    for name, mib in sorted(by_process.items(), key=lambda item: -item[1]):
                        print(f"        {name:24} {mib:6.2f} MiB/box")
            for size in args.pool:
                got = pool_claims(engine, runtime, size, args.claims, env)
                print(
                    f"{engine:7} {runtime:6} pool of {size}: claim + first answer p50 / p95 {got['p50_ms']:.1f} / "
                    f"{got['p95_ms']:.1f} ms ({args.claims} claims; filled in {got['fill_s']:.0f} s; "
                    f"load {os.getloadavg()[0]:.1f})"
                )


if __name__ == "__main__":
    main()
