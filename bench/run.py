#!/usr/bin/env python3
"""Benchmarks: our sandbox against the baselines a user would reach for, in the same run, on the
same machine, under each OCI runtime side by side (runc and gVisor's runsc where the daemon has it;
docker exec and docker run are measured under the same runtime). Absolute numbers vary by machine;
only the ratios compare.

    python bench/run.py [--quick] [--json PATH] [--runtime runc
    --runtime runsc] [--baseline-image TAG] [--sizes 10,50,100]

--sizes: the points of the concurrency curve (section 'concurrency', bench/curve.py): that many
sandboxes started together from this process through its start gate, then calls in all of them.
Default 10,50,100 (--quick: 10). A hundred gVisor boxes is more than a 2-core machine carries:
watch `uptime`, and give --runtime runc to measure the gate and the daemon alone.

--baseline-image: also time read_file and shell `true` on another build of the agent (e.g. the
image before a change), in the same run, box by box with ours.
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
import threading
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.curve import concurrency_curve, curve_rows  # noqa: E402
from bench.host import make_workspace  # noqa: E402
from bench.real_cli import bench_real_cli, cli_rows  # noqa: E402
from bench.real_repos import section as bench_real_repos  # noqa: E402
from bench.real_repos import section_rows as repos_rows  # noqa: E402
from bench.real_search import bench_real_search, real_rows  # noqa: E402
from orchestrator.config import DockerBackendConfig, SandboxConfig  # noqa: E402
from orchestrator.host_memory import tune_allocator  # noqa: E402
from orchestrator.sandbox.docker import DockerSandbox, docker_client  # noqa: E402
from orchestrator.sandbox.image import ensure_image  # noqa: E402
from orchestrator.sandbox.pool import SandboxPool  # noqa: E402
from orchestrator.sandbox.runtimes import available_runtimes, choose_runtime  # noqa: E402
from orchestrator.sandbox.sweep_journal import capture_baseline
from orchestrator.workspace.checkpoints import CheckpointStore  # noqa: E402
from orchestrator.workspace.copy import copy_workspace  # noqa: E402
from orchestrator.workspace.integrity import Sweeper  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


# The agent starts the next call's /bin/sh once a call is over (sandbox_agent/launcher.py), in the
# time a model takes to answer: seconds. `shell` is timed with this pause (not counted) between calls,
# and back to back too ("burst"), where each call waits for the shell being made; shell / read_file
# compares both timed with the pause.
SHELL_PAUSE_S = 0.05


def paced(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        time.sleep(SHELL_PAUSE_S)
        out += timed(fn, 1)
    return out


def must(result):
    if not result.ok:
        raise RuntimeError(f"benchmark call failed: {result.error}")
    return result


def warmed(box) -> None:
    """Until the agent's warm-up (after its first tool answer: sandbox_agent/server.py) is over, so
    that the figures timed next are not those of an agent importing its tools at the same time."""
    deadline = time.monotonic() + 60
    while not box.call("hello", {}).meta.get("warm") and time.monotonic() < deadline:
        time.sleep(0.05)


def bench_calls(client, ws: Path, n_ours: int, n_exec: int, config: SandboxConfig) -> dict:
    with DockerSandbox(ws, config, client=client) as box:
        for _ in range(20):
            must(box.call("read_file", {"path": "one_kib.txt"}))
        warmed(box)
        ours = timed(lambda: must(box.call("read_file", {"path": "one_kib.txt"})), n_ours)
        shell_burst = timed(lambda: must(box.call("shell", {"command": "true"})), max(n_ours // 4, 20))
        shell = paced(lambda: must(box.call("shell", {"command": "true"})), max(n_ours // 4, 20))
        read_paced = paced(lambda: must(box.call("read_file", {"path": "one_kib.txt"})), max(n_ours // 4, 20))
        container = box.container
        container.exec_run(["cat", "/workspace/one_kib.txt"], user=box.user)
        exec_cat = timed(lambda: container.exec_run(["cat", "/workspace/one_kib.txt"], user=box.user), n_exec)
        exec_true = timed(lambda: container.exec_run(["true"], user=box.user), n_exec)
        rss_idle = box.call("hello", {}).meta["rss_kib"] / 1024
        must(box.call("read_file", {"path": "big.txt"}))
        rss_read = box.call("hello", {}).meta["rss_kib"] / 1024
    return {
        "tool_call_p50_ms": statistics.median(ours),
        "tool_call_p95_ms": pct(ours, 0.95),
        "docker_exec_p50_ms": statistics.median(exec_cat),
        "docker_exec_p95_ms": pct(exec_cat, 0.95),
        "tool_call_speedup_vs_docker_exec": statistics.median(exec_cat) / statistics.median(ours),
        "shell_p50_ms": statistics.median(shell),
        "shell_burst_p50_ms": statistics.median(shell_burst),
        "read_paced_p50_ms": statistics.median(read_paced),
        # both with the pause: after one, a call pays the wake-up of every process on its path (~1 ms here)
        "shell_ratio_vs_read": statistics.median(shell) / statistics.median(read_paced),
        "docker_exec_true_p50_ms": statistics.median(exec_true),
        "shell_speedup_vs_docker_exec": statistics.median(exec_true) / statistics.median(shell),
        "agent_rss_idle_mib": rss_idle,
        "agent_rss_mib": max(rss_idle, rss_read),
    }


def bench_agent_builds(client, ws: Path, n: int, config: SandboxConfig, baseline_image: str) -> dict:
    """read_file and shell `true` on the baseline image and on ours, alternating box by box, so both
    see the same machine load, both timed with the pause between calls (SHELL_PAUSE_S). Ratios: shell
    against read on each build, and ours against the baseline."""
    samples: dict[str, dict[str, list[float]]] = {
        "before": {"read": [], "shell": []},
        "after": {"read": [], "shell": []},
    }
    builds = {"before": config.model_copy(update={"image": baseline_image}), "after": config}
    for _ in range(4):
        for name, build in builds.items():
            with DockerSandbox(ws, build, client=client) as box:
                for _ in range(20):
                    must(box.call("shell", {"command": "true"}))
                samples[name]["read"] += paced(lambda: must(box.call("read_file", {"path": "one_kib.txt"})), n)
                samples[name]["shell"] += paced(lambda: must(box.call("shell", {"command": "true"})), n)
    out: dict = {"baseline_image": baseline_image}
    for name, got in samples.items():
        read, shell = statistics.median(got["read"]), statistics.median(got["shell"])
        out[f"{name}_read_p50_ms"], out[f"{name}_shell_p50_ms"], out[f"{name}_shell_ratio_vs_read"] = (
            read,
            shell,
            shell / read,
        )
    out["shell_after_vs_before"] = out["after_shell_p50_ms"] / out["before_shell_p50_ms"]
    return out


def bench_cold_start(client, ws: Path, image: str, n: int, config: SandboxConfig) -> dict:
    def ours():
        box = DockerSandbox(ws, config, client=client)
        started = time.perf_counter()
        box.start()
        must(box.call("read_file", {"path": "one_kib.txt"}))
        elapsed = (time.perf_counter() - started) * 1000
        box.close()
        return elapsed

    def docker_run():
        started = time.perf_counter()
        client.containers.run(
            image, entrypoint=["true"], network_mode="none", remove=True, runtime=config.backend.runtime
        )
        return (time.perf_counter() - started) * 1000

    ours(), docker_run()  # warm the daemon's caches for both
    cold = [ours() for _ in range(n)]
    run = [docker_run() for _ in range(n)]
    claims = []
    with SandboxPool(ws, config, size=2, client=client) as pool:
        time.sleep(2.0)  # the pool fills once, as it would while the editor starts
        for _ in range(n):
            started = time.perf_counter()
            box = pool.claim()
            must(box.call("read_file", {"path": "one_kib.txt"}))
            claims.append((time.perf_counter() - started) * 1000)
            box.close()
            time.sleep(1.0)  # let the pool refill, as between two real sessions
        burst_s = pool_burst(pool, 10)
    return {
        "pool_claim_p50_ms": statistics.median(claims),
        "pool_claim_p95_ms": pct(claims, 0.95),
        "pool_burst_10_s": burst_s,
        "pool_refill_per_s": 8 / burst_s,
        "cold_start_p50_ms": statistics.median(cold),
        "cold_start_p95_ms": pct(cold, 0.95),
        "docker_run_p50_ms": statistics.median(run),
        "docker_run_p95_ms": pct(run, 0.95),
        "cold_start_ratio_vs_docker_run": statistics.median(cold) / statistics.median(run),
        # The same question ("how soon does a new session's first call answer?") with a box the warm
        # pool started ahead (a pre-started agent): what `acp --pool N` and batch pay. Issue 37's cold
        # start target lets this be what is measured, named so (TARGETS, NOT_TARGETS).
        "pool_start_ratio_vs_docker_run": statistics.median(claims) / statistics.median(run),
    }


def pool_burst(pool: SandboxPool, claims: int) -> float:
    """Seconds until `claims` claims made at once on a full pool of 2 are all served: the pool's
    refill rate under a burst is (claims - 2) / that (sandbox/pool.py)."""
    while pool.counters().ready < pool.size:
        time.sleep(0.1)
    boxes: list = []
    started = time.perf_counter()
    threads = [threading.Thread(target=lambda: boxes.append(pool.claim(timeout=300))) for _ in range(claims)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    for box in boxes:
        box.close()
    return elapsed


def bench_scaling(client, root: Path, sizes: list[int], config: SandboxConfig) -> dict:
    out = {}
    for size in sizes:
        ws = make_workspace(root / f"s{size}", files=size)
        with DockerSandbox(ws, config, client=client) as box:
            must(box.call("list_files", {}))
            warmed(box)
            grep = timed(lambda: must(box.call("grep_files", {"pattern": "needle"})), 3)
            listing = timed(lambda: must(box.call("list_files", {})), 3)
        out[f"grep_{size}_files_ms"] = statistics.median(grep)
        out[f"list_{size}_files_ms"] = statistics.median(listing)
        shutil.rmtree(ws, ignore_errors=True)
    return out


def bench_workspace(root: Path, files: int, size: int, copies: int, checkpoints: int) -> dict:
    """Copy mode's copy against `cp -a` of the same tree, and a checkpoint after a one-file turn."""
    real = root / "ws-real"
    for i in range(files):
        sub = real / f"d{i // 1000:03}"
        if i % 1000 == 0:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:06}.txt").write_bytes(os.urandom(size // 2).hex().encode())
    ours, cp = [], []
    for n in range(copies + 1):  # the first of each warms the page cache and is dropped
        dest = root / f"copy{n}"
        started = time.perf_counter()
        copy_workspace(real, dest, 1000, 1000)
        if n:
            ours.append((time.perf_counter() - started) * 1000)
        shutil.rmtree(dest)
        started = time.perf_counter()
        subprocess.run(["cp", "-a", str(real), str(dest)], check=True)
        if n:
            cp.append((time.perf_counter() - started) * 1000)
        shutil.rmtree(dest)
    store = CheckpointStore(root / "state" / "checkpoints.git", real)
    started = time.perf_counter()
    store.record(0)
    first = (time.perf_counter() - started) * 1000
    target = real / "d005" / "f005000.txt"
    record = []
    for turn in range(1, checkpoints + 1):
        target.write_bytes(f"turn {turn}\n".encode())
        started = time.perf_counter()
        if store.record(turn) is None:
            raise RuntimeError("benchmark checkpoint saw no change")
        record.append((time.perf_counter() - started) * 1000)
    store.close()
    fresh = CheckpointStore(root / "state" / "checkpoints.git", real)
    target.write_bytes(b"a new process\n")
    started = time.perf_counter()
    fresh.record(checkpoints + 1)  # no hints yet: a full walk, every file read and hashed once
    full = (time.perf_counter() - started) * 1000
    fresh.close()
    baseline_ms, sweep_ms = [], []
    for n in range(3):  # the integrity sweep: a baseline at the start, a sweep at the end of every session
        started = time.perf_counter()
        baseline = capture_baseline(real)
        baseline_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        Sweeper(real, baseline, root / "state" / f"quarantine{n}").sweep()
        sweep_ms.append((time.perf_counter() - started) * 1000)
    return {
        "sweep_baseline_p50_ms": statistics.median(baseline_ms),
        "sweep_p50_ms": statistics.median(sweep_ms),
        "workspace_files": files,
        "workspace_mb": files * size / 1e6,
        "copy_p50_ms": statistics.median(ours),
        "cp_a_p50_ms": statistics.median(cp),
        "copy_ratio_vs_cp_a": statistics.median(ours) / statistics.median(cp),
        "checkpoint_first_ms": first,
        "checkpoint_p50_ms": statistics.median(record),
        "checkpoint_p95_ms": pct(record, 0.95),
        "checkpoint_full_walk_ms": full,
        "load_average": os.getloadavg()[0],
    }


SECTIONS = (
    "tool calls",
    "agent builds",
    "cold start",
    "concurrency",
    "scaling",
    "real search",
    "real cli",
    "real repos",
    "workspace",
)
BOX_SECTIONS = SECTIONS[:-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions; a few minutes per runtime")
    parser.add_argument("--json", dest="json_path", help="write the results as one JSON object")
    parser.add_argument("--section", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    parser.add_argument(
        "--runtime",
        action="append",
        help="OCI runtime to measure under (repeatable; default runc and runsc, those the daemon has)",
    )
    parser.add_argument(
        "--baseline-image",
        help="another agent build to compare read_file and shell `true` with (section 'agent builds')",
    )
    parser.add_argument(
        "--sizes", type=_sizes, help="the concurrency curve's points, e.g. 10,50,100 (the default; --quick: 10)"
    )
    parser.add_argument(
        "--plot",
        dest="plot_path",
        help="draw the scaling figures as a PNG (needs matplotlib: pip install -e '.[bench]')",
    )
    args = parser.parse_args()
    tune_allocator()  # as `oa-sandbox` does: the curve's RSS per box is the product's
    wanted = args.section or [s for s in SECTIONS if s != "agent builds" or args.baseline_image]
    if "agent builds" in wanted and not args.baseline_image:
        parser.error("the 'agent builds' section needs --baseline-image")
    quick = args.quick
    sizes = args.sizes or ([10] if quick else [10, 50, 100])
    results: dict = {"quick": quick, "machine": {"cpus": os.cpu_count()}, "runtimes": {}}
    root = Path(tempfile.mkdtemp(prefix="oa-bench-"))
    try:
        ws = make_workspace(root / "main")
        if set(wanted) & set(BOX_SECTIONS):
            client = docker_client(timeout=600)
            image = ensure_image(client, DockerBackendConfig().image, progress=lambda m: print(m, file=sys.stderr))
            offered = available_runtimes(client)
            runtimes = args.runtime or [r for r in ("runc", "runsc") if r in offered]
            for runtime in runtimes:
                config = SandboxConfig(backend=DockerBackendConfig(runtime=choose_runtime(runtime, False, client).name))
                # partial, not lambda: each step keeps this runtime's config, whenever it is called
                steps = [
                    (
                        "tool calls",
                        partial(bench_calls, client, ws, 300 if quick else 2000, 30 if quick else 200, config),
                    ),
                    (
                        "agent builds",
                        partial(bench_agent_builds, client, ws, 50 if quick else 250, config, args.baseline_image),
                    ),
                    ("cold start", partial(bench_cold_start, client, ws, image, 5 if quick else 20, config)),
                    (
                        "concurrency",
                        partial(concurrency_curve, client, make_workspace, root, sizes, 10 if quick else 20, config),
                    ),
                    (
                        "scaling",
                        partial(bench_scaling, client, root, [1000, 10000] if quick else [1000, 10000, 100000], config),
                    ),
                    (
                        "real search",
                        partial(
                            bench_real_search, client, root, config, 3 if quick else 5, 10_000, args.baseline_image
                        ),
                    ),
                    (
                        "real cli",
                        partial(bench_real_cli, root, config.backend.runtime or runtime, image, 3 if quick else 7),
                    ),
                    ("real repos", partial(bench_real_repos, root, config.backend.runtime, quick)),
                ]
                results["runtimes"][runtime] = _run_steps(steps, wanted, runtime)
        if "workspace" in wanted:
            results.update(
                _run_steps(
                    [
                        (
                            "workspace",
                            lambda: bench_workspace(root, 10_000, 10_000, 2 if quick else 5, 30 if quick else 200),
                        )
                    ],
                    wanted,
                    "host",
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_report(results)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    if args.plot_path:
        first: dict = next(iter(results["runtimes"].values()), {})
        plot_scaling(first, Path(args.plot_path))
    return 0


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers such as 10,50,100") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("each size is at least 1")
    return sizes


def _run_steps(steps, wanted: list[str], label: str) -> dict:
    out: dict = {}
    for name, step in steps:
        if name not in wanted:
            continue
        started = time.perf_counter()
        out.update(step())
        # the 1-minute load average as each section ends: a ratio is only as good as the machine was quiet
        out[f"load_{name.replace(' ', '_')}"] = os.getloadavg()[0]
        print(
            f"[{label}: {name}: {time.perf_counter() - started:.1f}s, load {os.getloadavg()[0]:.2f}]", file=sys.stderr
        )
    return out


def plot_scaling(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(int(k.split("_")[1]) for k in r if k.startswith("grep_"))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(sizes, [r[f"grep_{n}_files_ms"] for n in sizes], marker="o", label="grep_files (walks every file)")
    ax.plot(sizes, [r[f"list_{n}_files_ms"] for n in sizes], marker="s", label="list_files (stops at 500 entries)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("files in the workspace")
    ax.set_ylabel("time per call (ms, median of 3)")
    ax.set_title("Tool cost against workspace size (one sandbox, 1 CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"plot written to {path}", file=sys.stderr)


# (label, key, format) of the figures set side by side per runtime, with gVisor's cost against runc.
SIDE_BY_SIDE = [
    ("read_file 1 KiB p50 (ms)", "tool_call_p50_ms", "{:.2f}"),
    ("shell `true` p50 (ms)", "shell_p50_ms", "{:.2f}"),
    ("shell `true` back to back p50 (ms)", "shell_burst_p50_ms", "{:.2f}"),
    ("read_file with the pause p50 (ms)", "read_paced_p50_ms", "{:.2f}"),
    ("shell `true` / read_file", "shell_ratio_vs_read", "{:.2f}x"),
    ("docker exec cat p50 (ms)", "docker_exec_p50_ms", "{:.1f}"),
    ("read_file speed-up vs docker exec", "tool_call_speedup_vs_docker_exec", "{:.0f}x"),
    ("shell speed-up vs docker exec true", "shell_speedup_vs_docker_exec", "{:.1f}x"),
    ("cold start p50 (ms)", "cold_start_p50_ms", "{:.0f}"),
    ("cold start, no pool / docker run", "cold_start_ratio_vs_docker_run", "{:.2f}x"),
    ("pool claim p50 (ms)", "pool_claim_p50_ms", "{:.1f}"),
    ("cold start, warm pool / docker run", "pool_start_ratio_vs_docker_run", "{:.3f}x"),
    ("pool refill under a burst (boxes/s)", "pool_refill_per_s", "{:.1f}"),
    ("agent RSS (MiB)", "agent_rss_mib", "{:.1f}"),
    ("before: shell `true` / read_file", "before_shell_ratio_vs_read", "{:.2f}x"),
    ("after: shell `true` / read_file", "after_shell_ratio_vs_read", "{:.2f}x"),
    ("before: shell `true` p50 (ms)", "before_shell_p50_ms", "{:.2f}"),
    ("after: shell `true` p50 (ms)", "after_shell_p50_ms", "{:.2f}"),
    ("shell after / before", "shell_after_vs_before", "{:.2f}x"),
]


CURVE_SIDE_BY_SIDE = [
    ("start p50 (ms)", "cold_start_p50_ms", "{:.0f}"),
    ("calls p50 (ms)", "call_p50_ms", "{:.1f}"),
    ("errors", "call_errors", "{:d}"),
    ("RSS per box (MiB)", "rss_per_box_mib", "{:.2f}"),
]


# Issues 26 and 37: the targets (runtime kind, label, function of (this runtime's results, runc's), limit, "min"/"max",
# section). gVisor's calls are held against `docker exec` under runc: what a user would otherwise reach for.
TARGETS = [
    (
        "gvisor",
        "read_file vs docker exec cat under runc",
        lambda r, c: c["docker_exec_p50_ms"] / r["tool_call_p50_ms"],
        10.0,
        "min",
        "tool_calls",
    ),
    (
        "gvisor",
        "shell `true` vs docker exec true under runc",
        lambda r, c: c["docker_exec_true_p50_ms"] / r["shell_p50_ms"],
        10.0,
        "min",
        "tool_calls",
    ),
    (
        "gvisor",
        "10 boxes at once: call p50 / runc's",
        lambda r, c: r["curve_10_call_p50_ms"] / c["curve_10_call_p50_ms"],
        2.0,
        "max",
        "concurrency",
    ),
    (
        "gvisor",
        "cold start, warm pool / docker run (same rt)",
        lambda r, c: r["pool_start_ratio_vs_docker_run"],
        1.0,
        "max",
        "cold_start",
    ),
    ("runc", "shell `true` / read_file", lambda r, c: r["shell_ratio_vs_read"], 2.0, "max", "tool_calls"),
    (
        "runc",
        "cold start, warm pool / docker run",
        lambda r, c: r["pool_start_ratio_vs_docker_run"],
        1.0,
        "max",
        "cold_start",
    ),
    # issue 50: grep_files with no match over a 10k-file tree against grep -rn in the same box
    (
        "runc",
        "grep_files 10k files / grep -rn",
        lambda r, c: r["real_grep_ratio_vs_grep_rn"],
        1.5,
        "max",
        "real_search",
    ),
    (
        "gvisor",
        "grep_files 10k files / grep -rn",
        lambda r, c: r["real_grep_ratio_vs_grep_rn"],
        1.5,
        "max",
        "real_search",
    ),
    # issue 50: `oa-sandbox exec --workspace W read_file` (a fresh
    # process, a small workspace) against `docker run --rm IMAGE true`
    (
        "runc",
        "exec read_file (copy mode) / docker run",
        lambda r, c: r["cli_exec_copy_ratio_vs_docker_run"],
        1.5,
        "max",
        "real_cli",
    ),
    (
        "runc",
        "exec read_file (bind mode) / docker run",
        lambda r, c: r["cli_exec_bind_ratio_vs_docker_run"],
        1.5,
        "max",
        "real_cli",
    ),
    (
        "gvisor",
        "exec read_file (copy mode) / docker run",
        lambda r, c: r["cli_exec_copy_ratio_vs_docker_run"],
        1.5,
        "max",
        "real_cli",
    ),
    (
        "gvisor",
        "exec read_file (bind mode) / docker run",
        lambda r, c: r["cli_exec_bind_ratio_vs_docker_run"],
        1.5,
        "max",
        "real_cli",
    ),
]
# Issue 37's cold start target lets the warm pool or a pre-started agent be what is measured, if the
# bench says which: the target rows above are the warm pool's (a box started ahead, claimed, its first
# answer). The start with no box ahead is printed beside them, for what it is, not held to the target:
# it is bounded below by the agent's interpreter starting, which `docker run` of `true` never does.
NOT_TARGETS = [
    ("cold start, no pool / docker run", lambda r: r["cold_start_ratio_vs_docker_run"], "cold_start"),
]


def target_rows(runtimes: dict) -> list[str]:
    """Each target the run measured: its ratio, the limit, met or not, and the load average as its section ended."""
    runc = runtimes.get("runc", {})
    rows = []
    for name, r in runtimes.items():
        kind = "runc" if name == "runc" else "gvisor"
        for want, label, ratio, limit, sense, section in TARGETS:
            if want != kind:
                continue
            try:
                value = ratio(r, runc)
            except (KeyError, ZeroDivisionError):
                continue  # the section (or runc's, to compare with) did not run
            met = value >= limit if sense == "min" else value <= limit
            bound = f"{'>=' if sense == 'min' else '<='} {limit:g}x"
            load = r.get(f"load_{section}")
            load_text = f" load {load:.2f}" if load is not None else ""
            rows.append(
                f"{name:<16}{label:<46}{value:>8.2f}x  target {bound:<8} {'met' if met else 'NOT MET':<8}{load_text}"
            )
        for label, figure, section in NOT_TARGETS:
            try:
                value = figure(r)
            except (KeyError, ZeroDivisionError):
                continue
            load = r.get(f"load_{section}")
            load_text = f" load {load:.2f}" if load is not None else ""
            rows.append(f"{name:<16}{label:<46}{value:>8.2f}x  (beside the target, not held to it){load_text}")
    return rows


def print_report(results: dict) -> None:
    """Each runtime's full table, the headline figures side by side, then the targets."""
    runtimes = results["runtimes"]
    for runtime, r in runtimes.items():
        print(f"== {runtime}")
        print_table({**r, "machine": results["machine"]})
    if "copy_p50_ms" in results:
        print("== host (no box)")
        print_table(results)
    if len(runtimes) < 1:
        return
    names = list(runtimes)
    print("== side by side" + (f" (the last column: {names[-1]} / {names[0]})" if len(names) > 1 else ""))
    print(f"{'':<36}" + "".join(f"{n:>12}" for n in names) + (f"{'ratio':>10}" if len(names) > 1 else ""))
    sizes = sorted({n for r in runtimes.values() for n in r.get("curve_sizes", [])})
    curve = [(f"{n} boxes: {what}", f"curve_{n}_{key}", fmt) for n in sizes for what, key, fmt in CURVE_SIDE_BY_SIDE]
    for label, key, fmt in SIDE_BY_SIDE + curve:
        values = [runtimes[n].get(key) for n in names]
        if all(v is None for v in values):
            continue
        cells = "".join(f"{fmt.format(v) if v is not None else '-':>12}" for v in values)
        ratio = f"{values[-1] / values[0]:>9.2f}x" if len(names) > 1 and values[0] and values[-1] is not None else ""
        print(f"{label:<36}{cells}{ratio}")
    rows = target_rows(runtimes)
    if rows:
        print(
            f"== targets (issues 26 and 37; load average of {results['machine']['cpus']} CPUs as each section ended: "
            "on a loaded machine redo them on a quiet one)"
        )
        for row in rows:
            print(row)


def print_table(r: dict) -> None:
    candidates = [
        lambda: (
            "read_file 1 KiB (warm) p50 / p95",
            f"{r['tool_call_p50_ms']:.2f} / {r['tool_call_p95_ms']:.2f} ms",
            f"docker exec cat: {r['docker_exec_p50_ms']:.1f} / {r['docker_exec_p95_ms']:.1f} ms",
            f"{r['tool_call_speedup_vs_docker_exec']:.0f}x faster (target >= 20x)",
        ),
        lambda: (
            "shell `true` p50 (back to back)",
            f"{r['shell_p50_ms']:.2f} ms ({r.get('shell_burst_p50_ms', 0):.2f} ms)",
            f"docker exec true: {r['docker_exec_true_p50_ms']:.1f} ms",
            f"{r['shell_speedup_vs_docker_exec']:.1f}x faster",
        ),
        lambda: (
            "cold start, no pool: first answer p50/p95",
            f"{r['cold_start_p50_ms']:.0f} / {r['cold_start_p95_ms']:.0f} ms",
            f"docker run --rm true: {r['docker_run_p50_ms']:.0f} / {r['docker_run_p95_ms']:.0f} ms",
            f"{r['cold_start_ratio_vs_docker_run']:.2f}x of docker run (issue 26: <= 2.0)",
        ),
        lambda: (
            "cold start, warm pool: claim + answer p50/p95",
            f"{r['pool_claim_p50_ms']:.1f} / {r['pool_claim_p95_ms']:.1f} ms",
            f"docker run --rm true: {r['docker_run_p50_ms']:.0f} ms",
            f"{r['pool_start_ratio_vs_docker_run']:.3f}x of docker run (a box started ahead; target < 20 ms)",
        ),
        lambda: (
            "warm pool of 2: 10 claims at once",
            f"all served in {r['pool_burst_10_s']:.1f} s",
            f"refills {r['pool_refill_per_s']:.1f} boxes/s",
            "2 refill workers",
        ),
        lambda: (
            "agent RSS idle / after 48 KiB read",
            f"{r['agent_rss_idle_mib']:.1f} / {r['agent_rss_mib']:.1f} MiB",
            "",
            "target < 15 MiB",
        ),
    ]
    # a row is printed when the section that measures it ran
    needs = [
        "tool_call_p50_ms",
        "shell_p50_ms",
        "cold_start_p50_ms",
        "pool_claim_p50_ms",
        "pool_burst_10_s",
        "agent_rss_mib",
    ]
    rows = [row() for row, key in zip(candidates, needs, strict=True) if key in r]
    if "copy_p50_ms" in r:
        rows += [
            (
                f"copy mode: copy {r['workspace_files']} files / {r['workspace_mb']:.0f} MB p50",
                f"{r['copy_p50_ms']:.0f} ms",
                f"cp -a: {r['cp_a_p50_ms']:.0f} ms",
                f"{r['copy_ratio_vs_cp_a']:.2f}x of cp -a (target <= 2.0)",
            ),
            (
                "checkpoint after a one-file turn p50 / p95",
                f"{r['checkpoint_p50_ms']:.1f} / {r['checkpoint_p95_ms']:.1f} ms",
                f"first: {r['checkpoint_first_ms']:.0f} ms, full walk: {r['checkpoint_full_walk_ms']:.0f} ms",
                "target p50 < 50 ms",
            ),
            (
                f"integrity sweep of {r['workspace_files']} files p50",
                f"{r['sweep_p50_ms']:.0f} ms",
                f"baseline at start: {r['sweep_baseline_p50_ms']:.0f} ms",
                "once per session end and per replacement",
            ),
            ("load average during the run", f"{r['load_average']:.2f}", "", f"{r['machine']['cpus']} CPUs"),
        ]
    rows += real_rows(r)
    rows += cli_rows(r)
    rows += repos_rows(r)
    for key in sorted(k for k in r if k.startswith("grep_")):
        size = key.split("_")[1]
        rows.append((f"{size} files: grep / list", f"{r[key]:.0f} / {r[f'list_{size}_files_ms']:.0f} ms", "", ""))
    if "before_shell_p50_ms" in r:
        rows.append(
            (
                "shell `true` p50, baseline build -> ours",
                f"{r['before_shell_p50_ms']:.2f} -> {r['after_shell_p50_ms']:.2f} ms",
                f"read_file: {r['before_read_p50_ms']:.2f} -> {r['after_read_p50_ms']:.2f} ms",
                f"shell/read {r['before_shell_ratio_vs_read']:.2f}x -> "
                f"{r['after_shell_ratio_vs_read']:.2f}x (target <= 2)",
            )
        )
    if rows:
        width = max(len(row[0]) for row in rows)
        for name, ours, base, verdict in rows:
            print(f"{name:<{width}}  {ours:<28} {base:<36} {verdict}")
    for line in curve_rows(r):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
