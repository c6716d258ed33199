#!/usr/bin/env python3
"""gVisor registrations side by side: per call (read_file, shell `true`) and per start (ours and
`docker run` under the same registration), rounds interleaved so every candidate sees the same load.

    python bench/platforms.py [--rounds 3] [--calls 100] [--starts 3] RUNTIME...

RUNTIME: registrations in /etc/docker/daemon.json (e.g. runsc, runsc-ptrace, runsc-directfs, runc).
A registration that fails to start a box within --start-timeout is reported as not working here
(KVM where /dev/kvm exists without nested virtualisation hangs). Prints the load average beside
every figure: on a loaded machine only the ratios within one round compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.host import make_workspace  # noqa: E402
from orchestrator.config import DockerBackendConfig, SandboxConfig  # noqa: E402
from orchestrator.sandbox.docker import DockerSandbox, docker_client  # noqa: E402
from orchestrator.sandbox.image import ensure_image  # noqa: E402


def load() -> float:
    return os.getloadavg()[0]


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def one_round(client, ws: Path, image: str, runtime: str, calls: int, starts: int) -> dict:
    config = SandboxConfig(backend=DockerBackendConfig(runtime=runtime))
    cold, run = [], []
    for _ in range(starts):
        box = DockerSandbox(ws, config, client=client)
        started = time.perf_counter()
        box.start()
        box.call("read_file", {"path": "one_kib.txt"})
        cold.append(ms_since(started))
        box.close()
        started = time.perf_counter()
        client.containers.run(
            image,
            entrypoint=["true"],
            network_mode="none",
            remove=True,
            runtime=runtime,
            labels={"dev.openagents.sandbox.bench": "1"},
        )
        run.append(ms_since(started))
    read, shell = [], []
    with DockerSandbox(ws, config, client=client) as box:
        for _ in range(10):
            box.call("shell", {"command": "true"})
        for _ in range(calls):
            started = time.perf_counter()
            assert box.call("read_file", {"path": "one_kib.txt"}).ok
            read.append(ms_since(started))
        for _ in range(calls // 2):
            started = time.perf_counter()
            assert box.call("shell", {"command": "true"}).ok
            shell.append(ms_since(started))
    return {
        "read_p50_ms": statistics.median(read),
        "shell_p50_ms": statistics.median(shell),
        "cold_start_p50_ms": statistics.median(cold),
        "docker_run_p50_ms": statistics.median(run),
        "load": load(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runtimes", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    client = docker_client(timeout=120)
    image = ensure_image(client, DockerBackendConfig().image, progress=lambda m: print(m, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="oa-platforms-") as tmp:
        ws = make_workspace(Path(tmp))
        results: dict[str, list[dict]] = {r: [] for r in args.runtimes}
        for n in range(args.rounds):
            for runtime in args.runtimes:
                got = one_round(client, ws, image, runtime, args.calls, args.starts)
                results[runtime].append(got)
                print(
                    f"round {n + 1} {runtime:<24} read {got['read_p50_ms']:6.2f} ms  shell "
                    f"{got['shell_p50_ms']:6.2f} ms  start {got['cold_start_p50_ms']:5.0f} ms  "
                    f"docker run {got['docker_run_p50_ms']:5.0f} ms  load {got['load']:.2f}",
                    flush=True,
                )
    first = args.runtimes[0]
    print(f"== median over rounds (ratio: against {first} in the same rounds)")
    for runtime, rounds in results.items():
        cells = []
        for key in ("read_p50_ms", "shell_p50_ms", "cold_start_p50_ms", "docker_run_p50_ms"):
            value = statistics.median(r[key] for r in rounds)
            ratio = value / statistics.median(r[key] for r in results[first])
            cells.append(f"{key[:-7]} {value:7.2f} ms ({ratio:.2f}x)")
        print(f"{runtime:<24} " + "  ".join(cells) + f"  load {statistics.median(r['load'] for r in rounds):.2f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
