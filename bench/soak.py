#!/usr/bin/env python3
"""A soak (not in CI): N sandboxes for M minutes, each looping a mix of calls that includes the hard
cases: a shell whose timeout expires, `kill 1` from the shell (the agent dies, the box is replaced),
outputs and files far over the caps, streamed output. One box (--egress-boxes) runs behind an egress
gate (its proxy and internal network), so the restarts keep a gate alive too.

    python bench/soak.py [--boxes 8] [--minutes 30] [--report-every 300] [--runtime runc]

It prints this process's RSS, open fds and threads, and our containers and networks at the start,
after a warm-up round (the baseline), every --report-every seconds and at the end. It fails (exit 1)
when RSS, fds or threads grew more than 10% over the baseline taken after the warm-up round (the
first round fills caches and pools that are meant to stay), when anything of ours is left in
Docker or a thread is left after the boxes are closed, or when a call failed in a way the mix does
not expect. The process is set up as `oa-sandbox` sets itself up (host_memory.py); docker-py's
idle API connections are closed before each sample (host.py says why). --tracemalloc shows where
Python's own memory grew, when RSS does.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.host import (  # noqa: E402
    HostSample,
    close_idle_api_connections,
    host_sample,
    mapping_growth,
    our_containers,
    our_networks,
    rss_by_mapping,
)
from orchestrator.config import DockerBackendConfig, EgressConfig, SandboxConfig  # noqa: E402
from orchestrator.errors import OpenAgentsError  # noqa: E402
from orchestrator.host_memory import tune_allocator  # noqa: E402
from orchestrator.sandbox.docker import DockerSandbox, docker_client  # noqa: E402
from orchestrator.sandbox.image import ensure_image  # noqa: E402

GROWTH_LIMIT = 0.10
KILL_EVERY = 5  # rounds: `kill 1` in one round of five
BIG_OUTPUT = "head -c 3000000 /dev/zero | tr '\\0' x; echo; seq 1 20000"  # ~3 MB of output; the caps keep 48 KiB


def make_workspace(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (root / "big.txt").write_text(("z" * 63 + "\n") * 60000)  # ~3.8 MB: over the read cap
    if os.geteuid() == 0:
        os.system(f"chown -R 1000:1000 {root}")
    return root


class Tally:
    """Calls, expected and unexpected outcomes, from every worker."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.outcomes: Counter[str] = Counter()
        self.unexpected: list[str] = []

    def add(self, what: str, ok: bool, detail: str = "") -> None:
        with self.lock:
            self.calls += 1
            self.outcomes[what if ok else f"{what}: UNEXPECTED"] += 1
            if not ok and len(self.unexpected) < 20:
                self.unexpected.append(f"{what}: {detail[:300]}")


def one_round(box: DockerSandbox, n: int, tally: Tally) -> None:
    """One pass of the mix; each outcome checked against what the call should give."""

    def check(what: str, result, expect_error: str | None = None, test=lambda r: True) -> None:
        if expect_error is None:
            good = result.ok and test(result)
        else:
            good = not result.ok and result.error is not None and result.error.type.value == expect_error
        tally.add(what, good, f"ok={result.ok} error={result.error} output={result.output[:120]!r}")

    content = f"round {n}\n" * 50
    check("write_file", box.call("write_file", {"path": "out.txt", "content": content}))
    check("read_file", box.call("read_file", {"path": "out.txt"}), test=lambda r: r.output == content)
    check("edit_file", box.call("edit_file", {"path": "notes.txt", "old_text": "beta", "new_text": "BETA"}))
    check("edit_file back", box.call("edit_file", {"path": "notes.txt", "old_text": "BETA", "new_text": "beta"}))
    check("grep_files", box.call("grep_files", {"pattern": "gamma"}), test=lambda r: "notes.txt" in r.output)
    check("list_files", box.call("list_files", {}))
    check(
        "read_file over the cap", box.call("read_file", {"path": "big.txt"}), test=lambda r: len(r.output) <= 64 * 1024
    )
    check("write_file 1 MiB", box.call("write_file", {"path": "mib.txt", "content": "m" * (1 << 20)}))
    chunks: list[str] = []
    check(
        "shell 3 MB output, streamed",
        box.call("shell", {"command": BIG_OUTPUT}, on_output=chunks.append),
        test=lambda r: len(r.output) <= 64 * 1024 and "20000" in r.output,
    )
    check("shell timeout", box.call("shell", {"command": "sleep 30", "timeout": 1}), expect_error="timeout")
    check("shell", box.call("shell", {"command": "echo hi; ls | wc -l"}), test=lambda r: r.output.startswith("hi\n"))
    if n % KILL_EVERY == 0:
        result = box.call("shell", {"command": "kill 1; sleep 5"})
        check("kill 1", result, expect_error="agent_lost")
        check(
            "after kill 1",
            box.call("read_file", {"path": "notes.txt"}),
            test=lambda r: r.output == "alpha\nbeta\ngamma\n",
        )


def print_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> None:
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    diffs = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "traceback")
    total = sum(d.size_diff for d in diffs)
    print(
        f"Python memory since the baseline: {total / 1048576:+.2f} MiB in "
        f"{sum(d.count_diff for d in diffs):+d} blocks; the largest growths:"
    )
    for diff in diffs[:8]:
        print(f"  {diff.size_diff / 1024:+9.1f} KiB {diff.count_diff:+7d} blocks")
        for line in diff.traceback.format(limit=4):
            print(f"      {line}")


def safe_round(box: DockerSandbox, n: int, tally: Tally) -> None:
    try:
        one_round(box, n, tally)
    except OpenAgentsError as err:  # a call that raised instead of returning a typed result
        tally.add("a call raised", False, f"{err.type.value}: {err.message}")


def report(
    label: str, sample: HostSample, client, egress_ids: set[str], tally: Tally, restarts: int, started: float
) -> None:
    containers, networks = len(our_containers(client, egress_ids)), len(our_networks(client, egress_ids))
    print(
        f"[{time.strftime('%H:%M:%S')} +{(time.monotonic() - started) / 60:5.1f} min] {label:<22} {sample.line()}  "
        f"containers {containers}  networks {networks}  calls {tally.calls}  restarts {restarts}  "
        f"unexpected {sum(v for k, v in tally.outcomes.items() if k.endswith('UNEXPECTED'))}",
        flush=True,
    )


def sample(client) -> HostSample:
    close_idle_api_connections(client)
    return host_sample()


def growth(now: HostSample, base: HostSample) -> dict[str, float]:
    return {
        "RSS": now.rss_mib / base.rss_mib - 1,
        "fds": now.fds / base.fds - 1,
        "threads": now.threads / base.threads - 1,
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boxes", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--report-every", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument(
        "--runtime", default=None, help="OCI runtime (default: the project's choice, gVisor where the daemon has it)"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="where Python memory grew between the baseline and the end (slower)"
    )
    parser.add_argument("--egress-boxes", type=int, default=1, help="how many of the boxes run behind an egress gate")
    args = parser.parse_args()
    # Each `kill 1` logs a warning ("sandbox agent lost"): expected here, counted in the outcomes instead.
    logging.basicConfig(level=logging.ERROR, format="soak: %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)  # stopped from outside: close the boxes, as on Ctrl-C
    tune_allocator()  # as `oa-sandbox` does (orchestrator/host_memory.py)

    started = time.monotonic()
    client = docker_client(timeout=600)
    config = SandboxConfig(backend=DockerBackendConfig(runtime=args.runtime))
    ensure_image(client, config.backend.image, progress=lambda m: print(m, file=sys.stderr))
    root = Path(tempfile.mkdtemp(prefix="oa-soak-"))
    tally = Tally()
    boxes: list[DockerSandbox] = []
    egress_ids: set[str] = set()
    status = 0
    end: HostSample | None = None
    baseline: HostSample | None = None
    peak: HostSample | None = None
    middle: HostSample | None = (
        None  # halfway: a leak grows as much again in the second half, a high-water mark does not
    )
    maps_at: dict[str, dict[str, int]] = {}  # resident KiB by mapping (bench/host.py), to tell where RSS grew
    try:
        first = sample(client)
        report("start", first, client, egress_ids, tally, 0, started)
        for i in range(args.boxes):
            box_config = config
            if (
                i < args.egress_boxes
            ):  # nothing in the box talks to the network: the gate is there to be kept and removed
                box_config = config.model_copy(update={"egress": EgressConfig(allow=["soak.invalid"])})
            boxes.append(DockerSandbox(make_workspace(root / f"w{i}"), box_config, client=client))
        starters = [threading.Thread(target=box.start) for box in boxes]
        for thread in starters:
            thread.start()
        for thread in starters:
            thread.join()
        egress_ids = {box.egress.id for box in boxes if box.egress is not None}
        print(
            f"runtime {boxes[0].runtime.name if boxes[0].runtime else '?'}, {args.boxes} boxes ({len(egress_ids)} "
            f"behind an egress gate), {args.minutes:g} minutes, start limit {config.start_concurrency}",
            flush=True,
        )

        warm = [threading.Thread(target=safe_round, args=(box, 0, tally)) for box in boxes]  # round 0 includes a kill 1
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        baseline = sample(client)
        maps_at["baseline"] = rss_by_mapping()
        traced = None
        if args.tracemalloc:
            tracemalloc.start(8)
            traced = tracemalloc.take_snapshot()
        report("baseline (after warm-up)", baseline, client, egress_ids, tally, sum(b.restarts for b in boxes), started)

        stop = threading.Event()
        deadline = time.monotonic() + args.minutes * 60

        def loop(box: DockerSandbox) -> None:
            for n in itertools.count(1):
                if stop.is_set() or time.monotonic() >= deadline:
                    return
                safe_round(box, n, tally)

        workers = [threading.Thread(target=loop, args=(box,), name=f"soak-{i}") for i, box in enumerate(boxes)]
        for thread in workers:
            thread.start()
        next_report = time.monotonic() + args.report_every
        peak = baseline
        halfway = time.monotonic() + args.minutes * 30
        while any(t.is_alive() for t in workers):
            time.sleep(1.0)
            if middle is None and time.monotonic() >= halfway:
                middle = sample(client)
                maps_at["halfway"] = rss_by_mapping()
            if time.monotonic() >= next_report:
                now = sample(client)
                peak = max(peak or now, now, key=lambda s: s.rss_mib)
                report("running", now, client, egress_ids, tally, sum(b.restarts for b in boxes), started)
                next_report += args.report_every
        for thread in workers:
            thread.join()
        end = sample(client)
        maps_at["end"] = rss_by_mapping()
        if traced is not None:
            print_growth(traced, tracemalloc.take_snapshot())
        report("end (boxes live)", end, client, egress_ids, tally, sum(b.restarts for b in boxes), started)
    except KeyboardInterrupt:
        print("interrupted: closing the boxes", flush=True)
        status = 1
        end = None
    finally:
        closers = [threading.Thread(target=box.close) for box in boxes]
        for thread in closers:
            thread.start()
        for thread in closers:
            thread.join()
        shutil.rmtree(root, ignore_errors=True)
    time.sleep(1.0)  # the channels' reader threads end as their sockets close
    closed = sample(client)
    leftover_containers = our_containers(client, egress_ids)
    leftover_networks = our_networks(client, egress_ids)
    report("after close", closed, client, egress_ids, tally, sum(b.restarts for b in boxes), started)

    print("\noutcomes:")
    for what, count in sorted(tally.outcomes.items()):
        print(f"  {count:7d}  {what}")
    failures = []
    if end is not None and baseline is not None:
        grew = growth(end, baseline)
        print(
            "growth over the baseline taken after the warm-up round: "
            + ", ".join(f"{k} {v:+.1%}" for k, v in grew.items())
            + (f" (highest RSS at a report: {peak.rss_mib:.1f} MiB)" if peak else "")
        )
        failures += [f"{k} grew {v:+.1%} (limit {GROWTH_LIMIT:.0%})" for k, v in grew.items() if v > GROWTH_LIMIT]
        if middle is not None:
            print("growth in the second half: " + ", ".join(f"{k} {v:+.1%}" for k, v in growth(end, middle).items()))
        for since in ("baseline", "halfway"):
            if since in maps_at and "end" in maps_at:
                print(f"resident MiB by mapping, {since} -> end: {mapping_growth(maps_at[since], maps_at['end'])}")
    if leftover_containers:
        failures.append(f"{len(leftover_containers)} containers left: {[c.id[:12] for c in leftover_containers]}")
    if leftover_networks:
        failures.append(f"{len(leftover_networks)} networks left: {[n.name for n in leftover_networks]}")
    if closed.threads > first.threads:
        failures.append(
            f"{closed.threads - first.threads} threads left after every box was closed: "
            f"{sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())}"
        )
    if tally.unexpected:
        failures.append(
            f"{sum(v for k, v in tally.outcomes.items() if k.endswith('UNEXPECTED'))} unexpected outcomes, e.g. "
            + " | ".join(tally.unexpected[:5])
        )
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures and status == 0:
        print("PASS")
    return 1 if failures or status else 0


if __name__ == "__main__":
    sys.exit(main())
