"""What the orchestrator process itself costs: resident memory, open descriptors, threads; and
what of ours is left in Docker. Shared by the concurrency curve (run.py) and the soak (soak.py)."""

from __future__ import annotations

import os
import queue
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import LABEL
from orchestrator.host_memory import malloc_stats


@dataclass(frozen=True)
class HostSample:
    rss_mib: float
    fds: int
    threads: int
    load1: float
    heap_used_mib: float = 0.0  # malloc's blocks in use (glibc's mallinfo2; 0 elsewhere)
    heap_free_mib: float = 0.0  # held by malloc but free: fragmentation, or a high-water mark
    py_blocks: int = 0  # Python's allocated objects
    rss_file_mib: float = 0.0  # of RSS, pages of files (the interpreter, libraries, modules) as they are first touched

    def line(self) -> str:
        return (
            f"RSS {self.rss_mib:7.1f} MiB  fds {self.fds:4d}  threads {self.threads:4d}  load {self.load1:5.2f}  "
            f"heap used {self.heap_used_mib:5.1f} free {self.heap_free_mib:5.1f} MiB  "
            f"files {self.rss_file_mib:5.1f} MiB  py blocks {self.py_blocks}"
        )


def close_idle_api_connections(client) -> None:
    """The client keeps up to IDLE_CONNECTIONS idle connections to the daemon (daemon.py): a bounded
    cache whose size moves with how many requests last ran at once, which would hide a real
    descriptor leak in the count, or fake one. Closed before each sample; the pool itself stays open
    (closing it under a request in flight is the failure daemon.py's one pool avoids)."""
    for adapter in client.api.adapters.values():
        pools = getattr(adapter, "pools", None)
        if pools is None:
            continue
        for key in pools.keys():
            idle = getattr(
                pools.get(key), "pool", None
            )  # urllib3's queue: connections, and None for a slot not yet used
            if idle is not None:
                _close_idle(idle)


def _close_idle(idle: queue.Queue) -> None:
    taken = 0
    while True:
        try:
            conn = idle.get(block=False)
        except queue.Empty:
            break
        taken += 1
        if conn is not None:
            conn.close()
    for _ in range(taken):  # the slots go back, empty
        try:
            idle.put(None, block=False)
        except queue.Full:
            break


def host_sample() -> HostSample:
    """This process, from /proc (threads as the kernel counts them, not only Python's)."""
    rss_kib, file_kib, threads = 0, 0, 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
            elif line.startswith("RssFile:"):
                file_kib = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    used, free = malloc_stats() or (0, 0)
    return HostSample(
        rss_kib / 1024,
        len(os.listdir("/proc/self/fd")),
        threads,
        os.getloadavg()[0],
        used / 1048576,
        free / 1048576,
        sys.getallocatedblocks(),
        file_kib / 1024,
    )


def our_containers(client, egress_ids: frozenset[str] | set[str] = frozenset()) -> list:
    """Every container, running or exited, of this process: its sandboxes (their host-pid label) and
    the egress proxies of its gates (`egress_ids`: EgressGate.id of each)."""
    # sparse: no inspect per container, which fails for one removed between the listing and the inspect
    boxes = client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.host-pid={os.getpid()}"})
    proxies = [
        c
        for c in client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}=egress"})
        if (c.attrs.get("Labels") or {}).get(f"{LABEL}.egress-id") in egress_ids
    ]
    return boxes + proxies


def our_networks(client, egress_ids: set[str]) -> list:
    """The internal networks of this process's egress gates still there."""
    return [
        n
        for n in client.networks.list(filters={"label": f"{LABEL}=egress"})
        if (n.attrs.get("Labels") or {}).get(f"{LABEL}.egress-id") in egress_ids
    ]


def rss_by_mapping() -> dict[str, int]:
    """Resident KiB of this process by what is mapped: a file's path, [heap], [stack], or [anon] for
    anonymous mappings (malloc's other arenas and large blocks, Python's object arenas, thread stacks)."""
    totals: dict[str, int] = {}
    name = "[anon]"
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split(maxsplit=5)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                name = head[5].strip() if len(head) == 6 and head[5].strip() else "[anon]"
            elif head and head[0] == "Rss:":
                totals[name] = totals.get(name, 0) + int(head[1])
    return totals


def mapping_growth(before: dict[str, int], after: dict[str, int], top: int = 8) -> str:
    """The mappings whose resident size changed most between two rss_by_mapping() readings."""
    moved = sorted(
        ((after.get(k, 0) - before.get(k, 0), k) for k in before.keys() | after.keys()), key=lambda d: -abs(d[0])
    )
    return ", ".join(f"{Path(k).name or k} {kib / 1024:+.2f}" for kib, k in moved[:top] if kib)


def make_workspace(root: Path, files: int = 0) -> Path:
    """The benchmarks' workspace: one_kib.txt, big.txt and `files` small files, owned by the box's uid 1000."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "one_kib.txt").write_text(("x" * 63 + "\n") * 16)
    (root / "big.txt").write_text(("y" * 63 + "\n") * 2000)
    for i in range(files):
        sub = root / f"d{i // 1000:03}"
        if i % 1000 == 0:
            sub.mkdir(exist_ok=True)
        (sub / f"f{i:06}.txt").write_text(f"file {i}\nnothing to see\n" + ("needle\n" if i == files - 1 else ""))
    if os.geteuid() == 0:
        os.system(f"chown -R 1000:1000 {root}")
    return root
