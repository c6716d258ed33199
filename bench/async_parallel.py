#!/usr/bin/env python3
"""Issue 46: N AsyncSandboxes each running `sleep S` at once, against one such call, in the same run.

    python bench/async_parallel.py [--boxes 8] [--sleep 4]

N boxes are opened (each on its own empty workspace), then one box runs `sleep S` alone (the
baseline), then all N run it together (asyncio.gather). Printed: the baseline, the N together,
their ratio (1.0: fully parallel; N: serialised), the loop's default executor size (which must not
matter: each AsyncSandbox runs its calls on threads of its own), and the 1-minute load average.
Target: the ratio under 1.5 (8 boxes x `sleep 4` under 6 s; 8.85 s when calls ran on the loop's
default executor, 6 threads on 2 cores). Every box is closed and every workspace removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def measure(boxes: int, seconds: int) -> dict[str, float]:
    from orchestrator import AsyncSandbox

    loop = asyncio.get_running_loop()
    default = ThreadPoolExecutor()  # what asyncio makes by default: min(32, cpus + 4) threads
    loop.set_default_executor(default)
    roots = [Path(tempfile.mkdtemp(prefix="oa-bench-async-")) for _ in range(boxes)]
    for root in roots:
        if os.geteuid() == 0:
            os.chown(root, 1000, 1000)
    sandboxes = [AsyncSandbox(root) for root in roots]
    try:
        for box in sandboxes:
            await box.open()
        started = time.monotonic()
        await sandboxes[0].shell(f"sleep {seconds}")
        single = time.monotonic() - started
        started = time.monotonic()
        await asyncio.gather(*(box.shell(f"sleep {seconds}") for box in sandboxes))
        together = time.monotonic() - started
    finally:
        for box in sandboxes:
            await box.close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "boxes": boxes,
        "sleep_s": seconds,
        "single_s": round(single, 2),
        "together_s": round(together, 2),
        "ratio": round(together / single, 2),
        "default_executor_threads": default._max_workers,
        "load_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, default=8)
    parser.add_argument("--sleep", type=int, default=4)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.boxes, args.sleep))))


if __name__ == "__main__":
    main()
