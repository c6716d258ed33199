#!/usr/bin/env python3
"""How many idle boxes fit in a GiB (issue 47): the memory N warm, idle boxes hold, by PSS.

    python bench/density.py [--engine docker --engine podman] [--runtime runc --runtime runsc] [--n 10]

Per engine and runtime: N boxes started and warmed (one shell call each), then every process of each
box's tree summed by PSS (/proc/PID/smaps_rollup: shared pages divided among their users, so boxes
sharing an image's pages are not counted N times): the tree of the process that holds the box's
init (containerd-shim under Docker, conmon under Podman; under gVisor the runsc sandbox, gofer and
the box's own processes are all in it). Also the drop in MemAvailable across the N starts, which
other work on the machine moves (said beside it, with the load). Reports MiB per box and boxes per GiB.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.config import SandboxConfig  # noqa: E402
from orchestrator.sandbox.docker import DockerSandbox, docker_client  # noqa: E402


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


def _holder(pid: int) -> int:
    """The box's keeper above its init: containerd-shim (Docker) or conmon (Podman); the init itself if none."""
    at = pid
    for _ in range(8):
        parent = _ppid(at)
        if parent <= 1:
            break
        comm = Path(f"/proc/{parent}/comm").read_text().strip()
        if comm.startswith("containerd-shim") or comm == "conmon":
            return parent
        at = parent
    return pid


def _mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def measure(engine: str, runtime: str, n: int) -> dict[str, float]:
    client = docker_client(timeout=300, engine=engine)
    boxes = []
    before = _mem_available_kib()
    try:
        for i in range(n):
            ws = Path(tempfile.mkdtemp(prefix=f"density-{i}-"))
            os.chown(ws, 1000, 1000)
            config = SandboxConfig.model_validate({"engine": engine, "runtime": runtime})
            box = DockerSandbox(ws, config, client=client)
            box.start()
            assert box.call("shell", {"command": "true"}).ok
            boxes.append(box)
        time.sleep(2)  # let start-up's transient pages go
        tree = _children()
        total_kib = 0
        for box in boxes:
            init = int(client.api.inspect_container(box.container.id)["State"]["Pid"])
            total_kib += sum(_pss_kib(pid) for pid in _subtree(_holder(init), tree))
        dropped = before - _mem_available_kib()
    finally:
        for box in boxes:
            box.close()
        client.close()
    per_box = total_kib / n / 1024
    return {"pss_mib": per_box, "per_gib": 1024 / per_box if per_box else 0, "avail_drop_mib": dropped / n / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", choices=["docker", "podman"])
    parser.add_argument("--runtime", action="append")
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}, {args.n} idle warm boxes each")
    for engine in args.engine or ["docker"]:
        for runtime in args.runtime or ["runc", "runsc"]:
            found = measure(engine, runtime, args.n)
            print(
                f"{engine:7} {runtime:6} PSS {found['pss_mib']:6.1f} MiB/box = {found['per_gib']:5.1f} boxes/GiB; "
                f"MemAvailable dropped {found['avail_drop_mib']:6.1f} MiB/box (load {os.getloadavg()[0]:.1f})"
            )


if __name__ == "__main__":
    main()
