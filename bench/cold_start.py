#!/usr/bin/env python3
"""Where a cold start's time goes above the `docker run` floor, step by step (issue 26).

    python bench/cold_start.py [--runtime runc --runtime runsc] [--n 10]

Times, per start, each step DockerSandbox.start() takes (wrapped here, in this process only: the
product's code is unchanged) and the first read_file after it, beside `docker run --rm true` and its
parts (create, start + wait, remove) under the same runtime, in alternation so both see the same load.
Steps that overlap (the daemon's work behind one API call) are not double-counted: "other" is the
start's total less the steps named.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from docker.models.containers import Container, ContainerCollection  # noqa: E402
from docker.models.images import ImageCollection  # noqa: E402

from bench.host import make_workspace  # noqa: E402
from orchestrator.config import DockerBackendConfig, SandboxConfig  # noqa: E402
from orchestrator.sandbox import base, daemon, sweep_journal  # noqa: E402
from orchestrator.sandbox import docker as docker_backend
from orchestrator.sandbox.docker import DockerSandbox, docker_client  # noqa: E402
from orchestrator.sandbox.image import ensure_image  # noqa: E402
from orchestrator.workspace.quota import WriteQuota  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)


def timing(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            SPENT[label] += (time.perf_counter() - started) * 1000

    setattr(owner, name, timed)


def instrument() -> None:
    timing(sweep_journal, "record", "sweep journal (before the box)")
    timing(WriteQuota, "start", "write quota's watcher")
    timing(daemon.DaemonWatch, "problem", "daemon ping")
    timing(docker_backend.DockerDeployment, "_remove_left_behind", "left-behind removal")
    timing(ImageCollection, "get", "image inspect")
    timing(docker_backend.DockerDeployment, "choose_runtime", "runtime choice (docker info)")
    timing(docker_backend, "seccomp_security_opt", "seccomp profile (JSON)")
    timing(docker_backend, "container_settings", "settings (mounts, labels, seccomp)")
    timing(ContainerCollection, "create", "docker create")
    timing(Container, "attach_socket", "attach")
    timing(Container, "start", "docker start")
    timing(base, "wait", "hello (the agent up, its first answer)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", action="append")
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args()
    client = docker_client(timeout=300)
    image = ensure_image(client, DockerBackendConfig().image, progress=lambda m: print(m, file=sys.stderr))
    instrument()
    with tempfile.TemporaryDirectory(prefix="oa-cold-start-") as tmp:
        ws = make_workspace(Path(tmp))
        for runtime in args.runtime or ["runc", "runsc"]:
            config = SandboxConfig(backend=DockerBackendConfig(runtime=runtime))
            rows: dict[str, list[float]] = defaultdict(list)
            for i in range(args.n + 1):
                box = DockerSandbox(ws, config, client=client)
                SPENT.clear()
                started = time.perf_counter()
                box.start()
                up = (time.perf_counter() - started) * 1000
                steps = dict(SPENT)
                result = box.call("read_file", {"path": "one_kib.txt"})
                total = (time.perf_counter() - started) * 1000
                assert result.ok, result.error
                box.close()
                started = time.perf_counter()
                made = client.containers.create(image, entrypoint=["true"], network_mode="none", runtime=runtime)
                created = time.perf_counter()
                made.start()
                made.wait()
                ran = time.perf_counter()
                made.remove()
                removed = time.perf_counter()
                if i == 0:
                    continue  # warms the daemon's caches for both
                for label, ms in steps.items():
                    rows[label].append(ms)
                named = sum(ms for label, ms in steps.items() if label not in NESTED)
                rows["other (start's total less the steps above)"].append(up - named)
                rows["first read_file"].append(total - up)
                rows["= cold start to first answer"].append(total)
                rows["docker run: create"].append((created - started) * 1000)
                rows["docker run: start + wait"].append((ran - created) * 1000)
                rows["docker run: remove"].append((removed - ran) * 1000)
                rows["= docker run --rm true"].append((removed - started) * 1000)
            print(f"== {runtime} (p50 of {args.n}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
            for label, values in rows.items():
                indent = "    " if label in NESTED else ""
                print(f"{indent + label:<56}{statistics.median(values):8.1f} ms")
            floor = statistics.median(rows["= docker run --rm true"])
            print(
                f"{'cold start / docker run':<56}"
                f"{statistics.median(rows['= cold start to first answer']) / floor:8.2f}x"
            )
    return 0


# Steps timed inside another timed step (shown indented, not added to the sum).
NESTED = {"seccomp profile (JSON)"}

if __name__ == "__main__":
    sys.exit(main())
