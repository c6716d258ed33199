#!/usr/bin/env python3
"""Opening a session on a real-sized tree (issue 50): the first answer on trees of about 10,000 and
40,000 files against a 10-file workspace, in bind and in copy mode, and a checkpoint after a
one-file turn, all in the same run, as ratios. The trees are copied from this interpreter's
site-packages (bench/real_search.py's make_tree: Python, compiled modules, data, licences), made
without network.

    python bench/real_repos.py [--sizes 10000,40000] [--mode bind --mode copy] [--runtime runc] [--json PATH]

The first answer: from `Sandbox(...).open()` to the answer of its first `read_file`, through the
public API, as every front-end opens a session. Turn 0 is recorded in the background since issue
50 (session.py); `turn0_s` is how long after the open it was complete (`checkpoints()` waits for
it; in bind mode a call that may change files waits for it too, in copy mode none does). Copy
mode's figure includes its copy: `session_copy_s` is the session's own (its manifest's took_s),
and beyond it the first answer is compared with the 10-file one's; `cp_a_s` is `cp -a` of the
same tree and `copy_s` workspace/copy.py's copy_workspace alone, timed against it in turns
(_copy_figures says why). bench/run.py --quick runs it as its section 'real repos'.
"""

from __future__ import annotations

import argparse
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

from bench.real_search import make_tree  # noqa: E402
from orchestrator.api import Sandbox, sessions  # noqa: E402
from orchestrator.boxfs import HostBudget  # noqa: E402
from orchestrator.workspace.checkpoints import CheckpointStore  # noqa: E402
from orchestrator.workspace.copy import CopyManifest, copy_workspace  # noqa: E402

SMALL_FILES = 10


def _small(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for i in range(SMALL_FILES):
        (dest / f"file{i}.py").write_text(f"value = {i}\n" * 20)
    if os.geteuid() == 0:
        os.system(f"chown -R 1000:1000 {dest}")
    return dest


def _first_answer(ws: Path, mode: str, runtime: str | None) -> dict:
    """One session: seconds to the first read_file's answer, then to turn 0's end (the first shell call's answer)."""
    started = time.perf_counter()
    box = Sandbox(
        ws, mode=mode, auto_approve=True, runtime=runtime, copy_max_entries=1_000_000, copy_max_bytes=8 << 30
    ).open()
    try:
        opened = time.perf_counter()
        result = box.read_file("file0.py" if (ws / "file0.py").exists() else "forty_kib.py")
        first = time.perf_counter()
        if not result.text:
            raise RuntimeError("the first read_file answered nothing")
        points = box.checkpoints()  # waits for turn 0 (a copy-mode shell call no longer does)
        turn0 = time.perf_counter()
        state = points[0].state if points else "none"
        record = box.record
        copy_s = CopyManifest.load(record.manifest_path).took_s if record.mode.value == "copy" else 0.0
    finally:
        box.close()
    closed = time.perf_counter()
    if record.mode.value == "copy":  # its copy's file system unmounted, its loop device freed: not left behind
        sessions.discard(record.id)
    return {
        "open_s": opened - started,
        "first_answer_s": first - started,
        "turn0_s": turn0 - started,
        "close_s": closed - turn0,
        "turn0_state": state,
        "session_copy_s": copy_s,  # copy mode: the session's own copy (its manifest's took_s)
    }


def _one_file_turn_ms(tree: Path, n: int) -> float:
    """A checkpoint after a one-file turn on `tree`: the median of n, in ms (the store's own, after
    its first record)."""
    store_dir = Path(tempfile.mkdtemp(prefix="oa-bench-store-"))
    try:
        with CheckpointStore(store_dir / "store", tree, budget_bytes=8 << 30) as store:
            store.record(0)
            out = []
            for i in range(n):
                (tree / "forty_kib.py").write_text(f"# turn {i}\n" + "x = 1\n" * 100)
                started = time.perf_counter()
                store.record(i + 1)
                out.append((time.perf_counter() - started) * 1000)
            store.restore(0)
        return statistics.median(out)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)


def _copy_figures(tree: Path, rounds: int = 2) -> tuple[float, float]:
    """`cp -a` of `tree` and copy mode's own copy of it (workspace/copy.py's copy_workspace, what
    the first answer in copy mode includes), each the median of 2 x `rounds`, taken in the order
    cp, ours, ours, cp (and again): on a file system without a journal, ext4 skips the inodes
    freed in the last minutes when it makes new ones, so the copy made right after another's
    removal pays for it. Every copy is kept until all are timed, then removed, so none follows
    another's removal and neither side always comes first."""
    where = Path(tempfile.mkdtemp(prefix="oa-bench-copy-"))
    cp_a: list[float] = []
    ours: list[float] = []
    try:
        for i in range(4 * rounds):
            dest = where / f"t{i}"
            started = time.perf_counter()
            if i % 4 in (0, 3):
                subprocess.run(["cp", "-a", str(tree), str(dest)], check=True)
                cp_a.append(time.perf_counter() - started)
            else:
                copy_workspace(tree, dest, 1000, 1000, HostBudget(max_bytes=8 << 30, max_entries=1_000_000))
                ours.append(time.perf_counter() - started)
        return statistics.median(cp_a), statistics.median(ours)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def bench_real_repos(
    root: Path, sizes: list[int], modes: list[str], runtime: str | None = None, repeats: int = 1, quick: bool = False
) -> dict:
    """The figures, each a median of `repeats` sessions, with the ratios against the 10-file workspace."""
    state = Path(tempfile.mkdtemp(prefix="oa-bench-state-"))
    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)  # copy mode's copies go here, removed at the end
    try:
        small = _small(root / "small")
        trees = {n: make_tree(root / f"tree{n}", n) for n in sizes}
        out: dict = {"load": os.getloadavg(), "modes": {}}
        for mode in modes:
            rows: dict = {}
            for label, ws in [("10_files", small), *((f"{n}_files", t) for n, t in trees.items())]:
                runs = [_first_answer(ws, mode, runtime) for _ in range(repeats)]
                rows[label] = {
                    key: statistics.median(r[key] for r in runs) if key != "turn0_state" else runs[-1][key]
                    for key in runs[0]
                }
                if mode == "copy":
                    rows[label]["cp_a_s"], rows[label]["copy_s"] = _copy_figures(ws, 1 if quick else 2)
            base = rows["10_files"]["first_answer_s"]
            for row in rows.values():
                row["first_answer_ratio"] = row["first_answer_s"] / base
                if "copy_s" in row:  # beyond the copy: the first answer less the session's own copy, against 10 files'
                    small = rows["10_files"]
                    row["beyond_copy_ratio"] = max(row["first_answer_s"] - row["session_copy_s"], 0.0) / max(
                        small["first_answer_s"] - small["session_copy_s"], 1e-3
                    )
                    row["first_answer_vs_cp_a"] = row["first_answer_s"] / row["cp_a_s"]
                    row["copy_ratio_vs_cp_a"] = row["copy_s"] / row["cp_a_s"]
            out["modes"][mode] = rows
        out["one_file_turn_checkpoint_ms"] = {f"{n}_files": _one_file_turn_ms(t, 5) for n, t in trees.items()}
        out["load_after"] = os.getloadavg()
        return out
    finally:
        if before is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = before
        shutil.rmtree(state, ignore_errors=True)


def section(root: Path, runtime: str | None, quick: bool) -> dict:
    """bench/run.py's section 'real repos' under one runtime: the figures flat, keyed repos_*."""
    r = bench_real_repos(root / "repos", [10_000, 40_000], ["bind", "copy"], runtime, 1 if quick else 3, quick)
    shutil.rmtree(root / "repos", ignore_errors=True)
    out: dict = {"repos_load": r["load"][0], "repos_load_after": r["load_after"][0]}
    for mode, rows in r["modes"].items():
        for label, row in rows.items():
            for key, value in row.items():
                out[f"repos_{mode}_{label}_{key}"] = value
    for label, ms in r["one_file_turn_checkpoint_ms"].items():
        out[f"repos_one_file_turn_{label}_ms"] = ms
    return out


def section_rows(r: dict) -> list[tuple[str, str, str, str]]:
    """bench/run.py's table rows for the section (name, ours, baseline, verdict)."""
    rows: list[tuple[str, str, str, str]] = []
    for mode in ("bind", "copy"):
        base = r.get(f"repos_{mode}_10_files_first_answer_s")
        if base is None:
            continue
        for n in ("10000", "40000"):
            key = f"repos_{mode}_{n}_files_"
            if key + "first_answer_s" not in r:
                continue
            verdict = f"{r[key + 'first_answer_ratio']:.2f}x of 10 files (target <= 3)"
            if key + "copy_s" in r:
                verdict = (
                    f"{r[key + 'first_answer_vs_cp_a']:.2f}x cp -a ({r[key + 'cp_a_s']:.1f} s); "
                    f"beyond its copy {r[key + 'beyond_copy_ratio']:.2f}x "
                    f"of 10 files (target <= 3); copy.py alone {r[key + 'copy_ratio_vs_cp_a']:.2f}x cp -a"
                )
            rows.append(
                (
                    f"{mode}: first answer, {n} files",
                    f"{r[key + 'first_answer_s']:.2f} s (turn 0 at {r[key + 'turn0_s']:.1f} s)",
                    f"10 files: {base:.2f} s",
                    verdict,
                )
            )
    for n in ("10000", "40000"):
        if f"repos_one_file_turn_{n}_files_ms" in r:
            rows.append(
                (
                    f"checkpoint after a one-file turn, {n} files",
                    f"{r[f'repos_one_file_turn_{n}_files_ms']:.1f} ms",
                    "",
                    "target < 50 ms",
                )
            )
    if rows:
        rows.append(
            ("load average (real repos: start, end)", f"{r['repos_load']:.2f}, {r['repos_load_after']:.2f}", "", "")
        )
    return rows


def repo_rows(r: dict) -> list[str]:
    lines = [f"load {r['load'][0]:.2f} -> {r['load_after'][0]:.2f}"]
    for mode, rows in r["modes"].items():
        for label, row in rows.items():
            extra = (
                f", its copy {row['session_copy_s']:.2f} s, beyond it {row['beyond_copy_ratio']:.2f}x; "
                f"copy.py alone {row['copy_ratio_vs_cp_a']:.2f}x cp -a ({row['cp_a_s']:.2f} s)"
                if "copy_s" in row
                else ""
            )
            lines.append(
                f"{mode:4} {label:>12}: first answer {row['first_answer_s']:.2f} s "
                f"({row['first_answer_ratio']:.2f}x the 10-file one), "
                f"turn 0 done at {row['turn0_s']:.2f} s ({row['turn0_state']}), close {row['close_s']:.2f} s{extra}"
            )
    for label, ms in r["one_file_turn_checkpoint_ms"].items():
        lines.append(f"checkpoint after a one-file turn, {label}: {ms:.1f} ms")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,40000", help="tree sizes in files, comma-separated")
    parser.add_argument("--mode", action="append", choices=["bind", "copy"], help="default: both")
    parser.add_argument("--runtime", help="runc or runsc (default: the sandbox's default)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="oa-bench-repos-"))
    try:
        result = bench_real_repos(
            root,
            [int(s) for s in args.sizes.split(",") if s],
            args.mode or ["bind", "copy"],
            args.runtime,
            args.repeats,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n".join(repo_rows(result)))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
