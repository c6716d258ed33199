#!/usr/bin/env python3
"""Issue 37: the cost of `oa-sandbox fork` against `cp -a` of the same tree, in the same run.

    python bench/fork.py [--mb 300] [--files 30000] [--forks 5] [--mode auto|copy]

A workspace of FILES files and MB of data is made, copied into a copy session (as `run
--workspace-mode copy` would), and that session is forked FORKS times, one fork at a time
(fork_session(ID, 1), the whole of it: the daemon asked whether a box still runs on the parent's
copy, record, copy through boxfs, manifest, pins, checkpoint store, transcript). Between forks `cp -a` of the
session's copy is timed the same number of times, the two alternating which goes first, each after a sync. Printed:
how forks are made (an overlay, where the host may mount: workspace/cow.py; else a data copy, cloned where the file
system clones), p50 per fork, p50 of `cp -a`, their ratio, host disk used per fork (allocated blocks of the fork's
directory, not counting what is mounted in it: an overlay's merged view is the layers' blocks) against the
workspace's, the first fork's time (it freezes the parent's copy into a layer), and the 1-minute load average.
`--mode copy` measures the data copy (OA_FORK_COW=copy). Everything made is unmounted and removed at the end.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def allocated(root: Path) -> int:
    """Blocks allocated under root, on root's own file system (a mount in it is not entered)."""
    dev = os.lstat(root).st_dev
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        for name in list(dirnames):
            st = os.lstat(os.path.join(dirpath, name))
            if st.st_dev != dev:
                dirnames.remove(name)
                continue
            total += st.st_blocks * 512
    return total


def reflinks_here(directory: Path) -> bool:
    a, b = directory / ".rl-a", directory / ".rl-b"
    a.write_bytes(b"x" * 4096)
    fin, fout = os.open(a, os.O_RDONLY), os.open(b, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.ioctl(fout, 0x40049409, fin)
        return True
    except OSError:
        return False
    finally:
        os.close(fin)
        os.close(fout)
        a.unlink()
        b.unlink()


def make_tree(root: Path, files: int, total_mb: int) -> None:
    size = max(1, (total_mb << 20) // files)
    block = os.urandom(size)
    for i in range(files):
        d = root / f"d{i // 300:03d}"
        if i % 300 == 0:
            d.mkdir(parents=True)
        (d / f"f{i:05d}.txt").write_bytes(block[i % 97 :] + block[: i % 97])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--files", type=int, default=30000)
    parser.add_argument("--forks", type=int, default=5)
    parser.add_argument(
        "--mode", choices=["auto", "copy"], default="auto", help="auto: an overlay where the host may mount"
    )
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    os.environ["OA_FORK_COW"] = args.mode
    top = Path(tempfile.mkdtemp(prefix="oa-bench-fork-", dir=os.environ.get("OA_BENCH_DIR")))
    os.environ["XDG_STATE_HOME"] = str(top / "state")
    from orchestrator.sandbox.docker import box_on_copy
    from orchestrator.workspace.fork import fork_session
    from orchestrator.workspace.overlay import mounts_under, unmount
    from orchestrator.workspace.records import WorkspaceMode, prepare

    try:
        ws = top / "ws"
        make_tree(ws, args.files, args.mb)
        record, _ = prepare(ws, WorkspaceMode.COPY, None)
        record.status, record.host_pid = "finished", 0
        record.save()
        ws_bytes = allocated(Path(record.box_workspace))
        forks, cps, disk = [], [], []
        started = time.perf_counter()
        first = fork_session(record.id, 1, box_on_copy=box_on_copy)[
            0
        ]  # warm: the first call's imports are not the fork's cost (it freezes the parent, too)
        first_s = time.perf_counter() - started
        for i in range(args.forks):
            for which in ("fork", "cp") if i % 2 else ("cp", "fork"):  # alternated: neither always reads a warm cache
                os.sync()  # the other's writes are not written back on this one's time
                started = time.perf_counter()
                if which == "fork":
                    made = fork_session(record.id, 1, box_on_copy=box_on_copy)[0]
                    forks.append(time.perf_counter() - started)
                    disk.append(allocated(made.dir))
                else:
                    subprocess.run(["cp", "-a", record.box_workspace, str(top / f"cp{i}")], check=True)
                    cps.append(time.perf_counter() - started)
                    shutil.rmtree(top / f"cp{i}")
        result = {
            "files": args.files,
            "mb": args.mb,
            "forks": args.forks,
            "reflinks": reflinks_here(top),
            "made_by": "overlay" if first.cow is not None else "copy",
            "first_fork_s": round(first_s, 3),
            "fork_p50_s": round(statistics.median(forks), 3),
            "cp_a_p50_s": round(statistics.median(cps), 3),
            "ratio_fork_vs_cp_a": round(statistics.median(forks) / statistics.median(cps), 4),
            "disk_per_fork_mib": round(statistics.median(disk) / (1 << 20), 1),
            "workspace_mib": round(ws_bytes / (1 << 20), 1),
            "disk_per_fork_fraction": round(statistics.median(disk) / ws_bytes, 4),
            "load_1m": round(os.getloadavg()[0], 1),
        }
    finally:
        for point in mounts_under(top):
            unmount(point)
        subprocess.run(["rm", "-rf", str(top)], check=False)
    print(
        f"fork of {args.files:,} files / {args.mb} MB by {result['made_by']} (reflinks: "
        f"{'yes' if result['reflinks'] else 'no'}), {args.forks} forks, load {result['load_1m']}"
    )
    print(
        f"  fork p50 {result['fork_p50_s']:.2f} s   cp -a p50 {result['cp_a_p50_s']:.2f} s   "
        f"ratio {result['ratio_fork_vs_cp_a']:.3f}x (target <= 0.2x)"
    )
    print(
        f"  disk per fork {result['disk_per_fork_mib']} MiB of the workspace's {result['workspace_mib']} MiB "
        f"({100 * result['disk_per_fork_fraction']:.1f}%, target <= 5%)"
    )
    print(f"  first fork (freezes the parent's copy) {result['first_fork_s']:.2f} s")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
