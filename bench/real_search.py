#!/usr/bin/env python3
"""Search, listing and reads on a real-sized tree (issue 50), against the tools people compare them
with, in the same box: `grep_files` with no match against `grep -rn` (and `grep -rnI`, which skips
binary files as grep_files does, and `rg` where the image has it), under each runtime. The tree is
about 10,000 files copied from this interpreter's site-packages (Python, compiled modules, data,
licences: sizes as a real dependency tree has them), made without network; a synthetic tree fills
in where the venv is smaller.

    python bench/real_search.py [--files 10000] [--runtime runc --runtime runsc] [--baseline-image TAG]

bench/run.py --quick runs it as its section 'real search'. --baseline-image: the same figures on
another build of the agent (e.g. the image before a change), box by box with ours.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.config import DockerBackendConfig, SandboxConfig  # noqa: E402
from orchestrator.sandbox.docker import DockerSandbox  # noqa: E402

NO_MATCH = "zq_no_such_name_xj"  # a literal: grep_files looks for it in each file's raw bytes
NO_MATCH_REGEX = r"zq[0-9]+x[jk]"  # no literal of 3 characters, and a repetition: every line matched, in the child
FORTY_KIB = "forty_kib.py"


def make_tree(dest: Path, files: int) -> Path:
    """`files` files: the first of site-packages in path order, then synthetic source files. Owned
    by the box's uid 1000 when we are root (the box reads them as that user)."""
    source = Path(sysconfig.get_paths()["purelib"])
    made = 0
    for dirpath, dirnames, names in os.walk(source):
        dirnames.sort()
        for name in sorted(names):
            path = Path(dirpath, name)
            if made >= files or path.is_symlink() or not path.is_file():
                continue
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            made += 1
        if made >= files:
            break
    for i in range(made, files):
        sub = dest / "synthetic" / f"pkg{i // 200:03}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i:05}.py").write_text(
            "".join(f"def function_{i}_{n}(value):\n    return value * {n}\n\n" for n in range(40 + i % 300))
        )
    (dest / FORTY_KIB).write_text(
        "".join(f"    result_{n} = compute(alpha, beta, gamma)  # line {n:05}\n" for n in range(640))
    )
    if os.geteuid() == 0:
        os.system(f"chown -R 1000:1000 {dest}")
    return dest


def _timed(fn, n: int) -> float:
    """The median of n calls, after one not counted (the box's caches warmed, as on a second search)."""
    fn()
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return statistics.median(out)


def _ok(result):
    if not result.ok:
        raise RuntimeError(f"benchmark call failed: {result.error}")
    return result


def _shell(box, command: str):
    return lambda: _ok(box.call("shell", {"command": f"{command} >/dev/null 2>&1; true", "timeout": 240}))


def measure(box, n: int) -> dict:
    """One box's figures, in ms; the tool calls timed from the host, as a user sees them."""
    out = {
        "grep_files_no_match_ms": _timed(lambda: _ok(box.call("grep_files", {"pattern": NO_MATCH})), n),
        "grep_rn_ms": _timed(_shell(box, f"grep -rn {NO_MATCH} ."), n),
        "grep_rnI_ms": _timed(_shell(box, f"grep -rnI {NO_MATCH} ."), n),
        "grep_files_regex_ms": _timed(lambda: _ok(box.call("grep_files", {"pattern": NO_MATCH_REGEX})), n),
        "grep_rnE_regex_ms": _timed(_shell(box, f"grep -rnE '{NO_MATCH_REGEX}' ."), n),
        "grep_files_ignore_case_ms": _timed(
            lambda: _ok(box.call("grep_files", {"pattern": NO_MATCH.upper(), "ignore_case": True})), n
        ),
        "grep_rni_ms": _timed(_shell(box, f"grep -rni {NO_MATCH} ."), n),
        "grep_files_200_hits_ms": _timed(lambda: _ok(box.call("grep_files", {"pattern": "import os"})), n),
        "list_files_ms": _timed(lambda: _ok(box.call("list_files", {})), n),
        "read_file_40kib_ms": _timed(lambda: _ok(box.call("read_file", {"path": FORTY_KIB})), max(n * 10, 20)),
    }
    has_rg = box.call("shell", {"command": "command -v rg"}).meta.get("exit_code") == 0
    if has_rg:
        out["rg_ms"] = _timed(_shell(box, f"rg -n {NO_MATCH} ."), n)
    out["grep_ratio_vs_grep_rn"] = out["grep_files_no_match_ms"] / out["grep_rn_ms"]
    out["regex_ratio_vs_grep_rnE"] = out["grep_files_regex_ms"] / out["grep_rnE_regex_ms"]
    out["ignore_case_ratio_vs_grep_rni"] = out["grep_files_ignore_case_ms"] / out["grep_rni_ms"]
    return out


def bench_real_search(
    client, root: Path, config: SandboxConfig, n: int, files: int = 10_000, baseline_image: str | None = None
) -> dict:
    tree = root / f"real-tree-{files}"
    if not tree.exists():
        make_tree(tree, files)
    builds = {"": config}
    if baseline_image:
        builds["before_"] = config.model_copy(update={"image": baseline_image})
    out: dict = {"real_files": files}
    for prefix, build in builds.items():
        with DockerSandbox(tree, build, client=client) as box:
            deadline = time.monotonic() + 60  # the agent's warm-up over (bench/run.py's warmed)
            while not box.call("hello", {}).meta.get("warm") and time.monotonic() < deadline:
                time.sleep(0.05)
            out.update({f"real_{prefix}{key}": value for key, value in measure(box, n).items()})
    out["real_load"] = os.getloadavg()[0]
    return out


def real_rows(r: dict) -> list[tuple[str, str, str, str]]:
    """bench/run.py's table rows for this section (name, ours, baseline, verdict)."""
    if "real_grep_files_no_match_ms" not in r:
        return []
    files = r["real_files"]
    rows = [
        (
            f"grep_files, no match, {files} files",
            f"{r['real_grep_files_no_match_ms']:.0f} ms",
            f"grep -rn: {r['real_grep_rn_ms']:.0f} ms (-rnI {r['real_grep_rnI_ms']:.0f})"
            + (f", rg {r['real_rg_ms']:.0f}" if "real_rg_ms" in r else ""),
            f"{r['real_grep_ratio_vs_grep_rn']:.2f}x of grep -rn (target <= 1.5)",
        ),
        (
            "grep_files, a regex with no literal",
            f"{r['real_grep_files_regex_ms']:.0f} ms",
            f"grep -rnE: {r['real_grep_rnE_regex_ms']:.0f} ms",
            f"{r['real_regex_ratio_vs_grep_rnE']:.2f}x",
        ),
        (
            "grep_files, ignore_case",
            f"{r['real_grep_files_ignore_case_ms']:.0f} ms",
            f"grep -rni: {r['real_grep_rni_ms']:.0f} ms",
            f"{r['real_ignore_case_ratio_vs_grep_rni']:.2f}x",
        ),
        (
            "grep_files, stops at 200 hits / list_files",
            f"{r['real_grep_files_200_hits_ms']:.0f} / {r['real_list_files_ms']:.0f} ms",
            "",
            "",
        ),
        (
            "read_file 40 KiB",
            f"{r['real_read_file_40kib_ms']:.2f} ms",
            f"baseline build: {r['real_before_read_file_40kib_ms']:.2f} ms"
            if "real_before_read_file_40kib_ms" in r
            else "",
            "no slower than before",
        ),
    ]
    if "real_before_grep_files_no_match_ms" in r:
        rows.append(
            (
                "grep_files no match, baseline build",
                f"{r['real_before_grep_files_no_match_ms']:.0f} ms",
                f"grep -rn: {r['real_before_grep_rn_ms']:.0f} ms",
                f"{r['real_before_grep_ratio_vs_grep_rn']:.2f}x of grep -rn",
            )
        )
    return rows


def main() -> int:
    from bench.run import print_report
    from orchestrator.sandbox.docker import docker_client
    from orchestrator.sandbox.image import ensure_image
    from orchestrator.sandbox.runtimes import available_runtimes, choose_runtime

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument(
        "--runtime", action="append", help="OCI runtime (repeatable; default runc and runsc, those the daemon has)"
    )
    parser.add_argument("--baseline-image", help="another agent build to measure on the same tree")
    parser.add_argument("-n", type=int, default=3, help="timed calls per figure (their median)")
    parser.add_argument("--json", dest="json_path", help="write the results as one JSON object")
    args = parser.parse_args()
    client = docker_client(timeout=600)
    ensure_image(client, DockerBackendConfig().image, progress=lambda m: print(m, file=sys.stderr))
    offered = available_runtimes(client)
    results: dict = {"quick": True, "machine": {"cpus": os.cpu_count()}, "runtimes": {}}
    root = Path(tempfile.mkdtemp(prefix="oa-bench-real-"))
    try:
        for runtime in args.runtime or [r for r in ("runc", "runsc") if r in offered]:
            config = SandboxConfig(backend=DockerBackendConfig(runtime=choose_runtime(runtime, False, client).name))
            results["runtimes"][runtime] = bench_real_search(
                client, root, config, args.n, args.files, args.baseline_image
            )
            results["runtimes"][runtime]["load_real_search"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_report(results)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
