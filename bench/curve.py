"""The concurrency curve (bench/run.py, section `concurrency`): N sandboxes started together from one
process, each from its own thread, through the process's start gate (orchestrator/sandbox/starts.py);
then every box makes write_file + shell calls at once. Per point: cold start (thread start to the
first answered call, the wait in line included) p50/p95 and how long the starts waited in line,
call p50/p95, errors, and what the orchestrator process pays per live box (RSS, fds, threads)."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from bench.host import host_sample, our_containers
from orchestrator.config import SandboxConfig
from orchestrator.sandbox.docker import DockerSandbox
from orchestrator.sandbox.starts import START_GATE, StartQueued


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _together(n: int, target, abort: threading.Event | None = None) -> None:
    """`target(i)` in n threads released at once; returns when all are done. Ctrl-C sets `abort`
    (the targets stop at their next step), waits for the threads and is raised again."""
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        barrier.wait()
        target(i)

    threads = [threading.Thread(target=run, args=(i,), name=f"bench-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
    except KeyboardInterrupt:
        if abort is not None:
            abort.set()
        print("interrupted: waiting for the starts under way, then closing every box", flush=True)
        for thread in threads:
            thread.join()
        raise


class _Aborted(Exception):
    pass


def concurrency_point(client, workspaces: list[Path], calls: int, config: SandboxConfig) -> dict:
    n = len(workspaces)
    before = host_sample()
    boxes = [DockerSandbox(ws, config, client=client) for ws in workspaces]
    started_ms: list[float | None] = [None] * n
    in_line_s = [0.0] * n
    start_errors: list[str] = []
    abort = threading.Event()

    def start(i: int) -> None:
        box = boxes[i]

        def queued(progress: StartQueued) -> None:
            if abort.is_set():
                raise KeyboardInterrupt  # leaves the start line (starts.py lets a BaseException through)
            if progress.slot_taken:
                in_line_s[i] = progress.waited_s

        box.on_start_queue = queued
        t0 = time.perf_counter()
        try:
            if abort.is_set():
                raise _Aborted
            box.start()
            result = box.call("read_file", {"path": "one_kib.txt"})
            if not result.ok:
                raise RuntimeError(result.error)
            started_ms[i] = (time.perf_counter() - t0) * 1000
        except _Aborted:
            pass
        except KeyboardInterrupt:
            pass
        except Exception as err:  # noqa: BLE001 - counted and shown, the curve goes on
            start_errors.append(f"{type(err).__name__}: {str(err)[:200]}")

    closed = False
    try:
        START_GATE.reset_counters()
        t0 = time.perf_counter()
        _together(n, start, abort)
        all_started_s = time.perf_counter() - t0
        gate = START_GATE.counters()
        live = [box for box, ms in zip(boxes, started_ms, strict=True) if ms is not None]
        idle = host_sample()

        latencies: list[list[float]] = [[] for _ in range(n)]
        call_errors: list[str] = []

        def work(i: int) -> None:
            box = boxes[i]
            if started_ms[i] is None:
                return
            for k in range(calls):
                if abort.is_set():
                    return
                tool, args = (
                    ("write_file", {"path": "out.txt", "content": f"call {k}\n"})
                    if k % 2 == 0
                    else ("shell", {"command": "cat out.txt"})
                )
                t = time.perf_counter()
                result = box.call(tool, args)
                latencies[i].append((time.perf_counter() - t) * 1000)
                if not result.ok:
                    call_errors.append(f"{tool}: {result.error}")

        t0 = time.perf_counter()
        _together(n, work, abort)
        calls_wall_s = time.perf_counter() - t0
        busy = host_sample()

        t0 = time.perf_counter()
        _together(n, lambda i: boxes[i].close())
        close_s = time.perf_counter() - t0
        after = host_sample()
        leftover = len(our_containers(client))
        closed = True
    finally:
        if not closed:  # Ctrl-C or a failure mid-point: the boxes go all the same
            _together(n, lambda i: boxes[i].close())
    flat = [ms for per_box in latencies for ms in per_box]
    cold = [ms for ms in started_ms if ms is not None]
    per_box = max(len(live), 1)
    return {
        "sandboxes": n,
        "start_limit": config.start_concurrency,
        "start_errors": len(start_errors),
        "start_error_samples": start_errors[:3],
        "cold_start_p50_ms": statistics.median(cold) if cold else float("nan"),
        "cold_start_p95_ms": pct(cold, 0.95),
        "in_line_p50_s": statistics.median(in_line_s),
        "in_line_max_s": max(in_line_s),
        "all_started_s": all_started_s,
        "gate_peak_in_flight": gate.peak_in_flight,
        "gate_started": gate.started,
        "calls": len(flat),
        "call_errors": len(call_errors),
        "call_error_samples": call_errors[:3],
        "call_p50_ms": statistics.median(flat) if flat else float("nan"),
        "call_p95_ms": pct(flat, 0.95),
        "calls_per_s": len(flat) / calls_wall_s if calls_wall_s else 0.0,
        "rss_per_box_mib": (idle.rss_mib - before.rss_mib) / per_box,
        "rss_per_box_busy_mib": (busy.rss_mib - before.rss_mib) / per_box,
        "fds_per_box": (idle.fds - before.fds) / per_box,
        "threads_per_box": (idle.threads - before.threads) / per_box,
        "rss_mib": busy.rss_mib,
        "fds": idle.fds,
        "threads": idle.threads,
        "fds_after_close": after.fds,
        "threads_after_close": after.threads,
        "close_all_s": close_s,
        "leftover_containers": leftover,
        "load_average": busy.load1,
        "load_average_after_close": after.load1,
    }


def concurrency_curve(
    client, make_workspace, root: Path, sizes: list[int], calls: int, config: SandboxConfig, cool_down_s: float = 20.0
) -> dict:
    """Each point with fresh workspaces; between points the machine is left `cool_down_s` to settle."""
    out: dict = {"curve_sizes": sizes, "curve_calls_per_box": calls}
    for index, n in enumerate(sizes):
        if index:
            time.sleep(cool_down_s)
        workspaces = [make_workspace(root / f"curve{n}" / f"w{i}") for i in range(n)]
        point = concurrency_point(client, workspaces, calls, config)
        for key, value in point.items():
            out[f"curve_{n}_{key}"] = value
        print(
            f"[concurrency {n}: start p50 {point['cold_start_p50_ms']:.0f} ms, "
            f"calls p50 {point['call_p50_ms']:.1f} ms, {point['start_errors'] + point['call_errors']} errors, "
            f"load {point['load_average']:.1f}]",
            flush=True,
        )
    return out


def curve_rows(r: dict) -> list[str]:
    """The curve as a table, one row per size, and each size's start and call p50 against the first."""
    sizes = r.get("curve_sizes") or []
    if not sizes:
        return []
    head = (
        f"{'boxes':>5} {'start p50/p95 (s)':>18} {'in line p50':>11} {'calls p50/p95 (ms)':>19} {'errors':>6} "
        f"{'RSS/box MiB':>11} {'fds':>5} {'threads':>7} {'load':>5} {'vs ' + str(sizes[0]) + ': start, calls':>20}"
    )
    rows = [
        "concurrency curve: boxes started together through the start gate (limit "
        f"{r[f'curve_{sizes[0]}_start_limit']}), then {r['curve_calls_per_box']} write_file+shell calls each",
        head,
    ]
    first = sizes[0]
    for n in sizes:
        k = f"curve_{n}_"
        errors = r[k + "start_errors"] + r[k + "call_errors"]
        ratio = (
            f"{r[k + 'cold_start_p50_ms'] / r[f'curve_{first}_cold_start_p50_ms']:.1f}x, "
            f"{r[k + 'call_p50_ms'] / r[f'curve_{first}_call_p50_ms']:.1f}x"
        )
        rows.append(
            f"{n:>5} {r[k + 'cold_start_p50_ms'] / 1000:>8.2f} / {r[k + 'cold_start_p95_ms'] / 1000:<7.2f} "
            f"{r[k + 'in_line_p50_s']:>10.2f}s {r[k + 'call_p50_ms']:>9.1f} / {r[k + 'call_p95_ms']:<7.1f} "
            f"{errors:>6} {r[k + 'rss_per_box_mib']:>11.2f} {r[k + 'fds']:>5} {r[k + 'threads']:>7} "
            f"{r[k + 'load_average']:>5.1f} {ratio:>20}"
        )
        for sample in r[k + "start_error_samples"] + r[k + "call_error_samples"]:
            rows.append(f"      error: {sample}")
    return rows
