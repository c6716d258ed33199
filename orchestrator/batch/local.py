"""The local engine: tasks on a pool of threads of this process, each running one session.

At most `concurrency` sessions run at once, and every box they start goes through the process's
start gate (sandbox/starts.py: `start_concurrency` starts at a time, the others in line), so a
batch of a hundred neither starts a hundred boxes at once nor holds more than `concurrency`.

Ctrl-C (or SIGTERM, SIGHUP) stops the batch: tasks not started are dropped (not written, so a rerun
runs them), each running session is cancelled (its call killed, its box removed and confirmed
gone), their results are written as `cancelled`, and the batch exits 130. Further presses are
ignored until the boxes are gone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import IO, Callable

from .runner import BatchSettings, RunControl, run_task
from .tasks import BatchTask, ResultWriter, TaskResult

MAX_DEFAULT_CONCURRENCY = 64
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _bytes(size: str) -> int:
    text = size.strip().lower().removesuffix("b")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    try:
        return max(1, int(float(text[: len(text) - len(unit)]) * _UNITS[unit]))
    except ValueError:
        return 1 << 30


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_concurrency(memory: str, cpus: float) -> int:
    """Sessions at once when --concurrency is not given: two per core for each box's CPU share
    (a session spends much of its time waiting on the model, not running in its box), and no more
    boxes than the memory available now holds at each box's limit."""
    cores = os.cpu_count() or 1
    by_cpu = int(2 * cores / max(cpus, 0.1))
    by_memory = _available_memory() // _bytes(memory)
    return max(1, min(by_cpu, by_memory, MAX_DEFAULT_CONCURRENCY))


class Progress:
    """A progress line on stderr when it is a terminal (each finished task printed above it);
    nothing while the batch runs otherwise. The summary at the end is always said."""

    def __init__(self, total: int, skipped: int, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.total, self.skipped = total, skipped
        self.counts: dict[str, int] = {}
        self.running = 0
        self.began = time.monotonic()
        self._lock = threading.Lock()

    def _bar(self) -> str:
        done = sum(self.counts.values())
        width = 24
        filled = width * done // max(1, self.total)
        failed = self.total and done - self.counts.get("finished", 0)
        return (
            f"\r\x1b[2Kbatch [{'#' * filled}{'-' * (width - filled)}] {done}/{self.total} done, {self.running} running"
            + (f", {failed} not finished" if failed else "")
            + f"  {time.monotonic() - self.began:.0f} s"
        )

    def update(self, running: int) -> None:
        with self._lock:
            self.running = running
            if self.live:
                self.stream.write(self._bar())
                self.stream.flush()

    def finished(self, result: TaskResult) -> None:
        from ..ground.text import one_line

        with self._lock:
            self.counts[result.status] = self.counts.get(result.status, 0) + 1
            if self.live:
                mark = "✓" if result.status == "finished" else "✗"
                error = f" {result.error.type}" if result.error else ""
                self.stream.write(
                    "\r\x1b[2K"
                    + one_line(
                        f"{mark} {result.id}: {result.status}{error} "
                        f"({result.wall_s:.1f} s, {result.node or 'not run'})"
                    )
                    + "\n"
                )
                self.stream.write(self._bar())
                self.stream.flush()

    def close(self, out: str, interrupted: bool) -> None:
        from ..ground.text import one_line

        with self._lock:
            if self.live:
                self.stream.write("\r\x1b[2K")
            done = ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items())) or "none ended"
            skipped = f"; {self.skipped} skipped (already finished in {out})" if self.skipped else ""
            state = "interrupted" if interrupted else "done"
            self.stream.write(
                one_line(
                    f"batch {state}: {sum(self.counts.values())} of {self.total} tasks ended ({done}){skipped}; "
                    f"{time.monotonic() - self.began:.1f} s; results in {out}"
                )
                + "\n"
            )
            self.stream.flush()


_ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt_once() -> None:
    """The first Ctrl-C, SIGTERM or SIGHUP raises KeyboardInterrupt in the main thread; later ones
    are ignored, so the clean-up (every running session cancelled, every box removed) finishes."""

    def first(*_: object) -> None:
        ignore_interrupts()
        raise KeyboardInterrupt()

    for signum in _ENDING:
        signal.signal(signum, first)


def ignore_interrupts() -> None:
    for signum in _ENDING:
        signal.signal(signum, signal.SIG_IGN)


@dataclass
class Outcome:
    results: list[TaskResult] = field(default_factory=list)
    interrupted: bool = False


def run_local(
    tasks: list[BatchTask],
    settings: BatchSettings,
    writer: ResultWriter,
    concurrency: int,
    progress: Progress,
    run: Callable[[BatchTask, BatchSettings, RunControl], TaskResult] | None = None,
) -> Outcome:
    """Run `tasks`, `concurrency` at a time; each result is written as it ends. Call from the main
    thread with interrupt_once() in force."""
    runner = run or (lambda task, s, control: run_task(task, s, control))
    outcome = Outcome()
    controls: dict[Future[TaskResult], RunControl] = {}
    executor = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="oa-batch")

    recorded: set[Future[TaskResult]] = set()

    def record(future: Future[TaskResult]) -> None:
        recorded.add(future)
        result = future.result()
        writer.write(result)
        outcome.results.append(result)
        progress.finished(result)

    try:
        for task in tasks:
            control = RunControl()
            controls[executor.submit(runner, task, settings, control)] = control
        pending = set(controls)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                record(future)
            progress.update(sum(c.running for c in controls.values()))
    except KeyboardInterrupt:
        ignore_interrupts()
        outcome.interrupted = True
        # Every task not started is dropped first, while the running ones still hold their workers:
        # stopping a running one first frees its worker, which could take a queued task meanwhile.
        for future in controls:
            future.cancel()
        for future, control in controls.items():
            if not future.cancelled():
                control.stop()
        executor.shutdown(wait=True, cancel_futures=True)  # every running session ends, its box removed
        for future in controls:
            if future.done() and not future.cancelled() and future not in recorded:
                record(future)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return outcome
