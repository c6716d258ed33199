#!/usr/bin/env python3
"""The command line as a user meets it (issue 50): `oa-sandbox --help`, a subcommand's `--help`,
`sessions`, and `oa-sandbox exec --workspace W read_file ...` on a small workspace, each a fresh
process as a shell runs it, against `docker run --rm --entrypoint true IMAGE` (the box that runs
nothing) under the same runtime in the same run (the ratio is what compares across machines).
exec runs in both workspace modes: copy (what `auto` gives a root-owned workspace) and bind.

    python bench/real_cli.py [--runtime runc --runtime runsc] [-n 5] [--json PATH]

What exec measures: a read tool, so its box has the workspace mounted read-only and its removal is
asked of the daemon and not waited for (orchestrator/sandbox/handoff.py); no box is pre-started, no
process is kept warm, and no box serves two execs. `docker run --rm` waits for its removal.

bench/run.py --quick runs it as its section 'real cli'. Targets: `--help` at most 0.3 s; exec at most
1.5x docker run on the same runtime.
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

ROOT = Path(__file__).resolve().parents[1]
OA = [sys.executable, "-m", "orchestrator.cli"]  # the installed entry point's own code, run from this checkout


def _timed(argv: list[str], n: int, env: dict[str, str], cwd: Path) -> float:
    """The median seconds of `argv` run n times (after one untimed run: the page cache warm)."""
    times = []
    for i in range(n + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=300)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"{argv[:6]} exited {done.returncode}: {done.stderr.decode(errors='replace')[-600:]}")
        if i:
            times.append(elapsed)
    return statistics.median(times)


def bench_real_cli(root: Path, runtime: str, image: str, n: int) -> dict:
    """Seconds (median of n) of each command line, and exec's ratio to `docker run --rm IMAGE true`."""
    ws = root / "cli-ws"
    if not ws.exists():
        ws.mkdir(parents=True)
        (ws / "a.txt").write_text("hello\n" * 10)
        (ws / "README.md").write_text("# a small workspace\n")
        if os.getuid() == 0:  # bind mode runs the box as the workspace's owner, never root
            for path in (ws, ws / "a.txt", ws / "README.md"):
                os.chown(path, 1000, 1000)
    state = root / "cli-state"
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(state),
        "XDG_CONFIG_HOME": str(root / "cli-config"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop(
        "PYTHONDONTWRITEBYTECODE", None
    )  # as a user runs it: compiled once (the untimed first run), then from __pycache__
    exec_args = ["exec", "--workspace", str(ws), "--runtime", runtime, "--image", image]
    read = ["read_file", json.dumps({"path": "a.txt"})]
    out: dict = {
        "cli_help_s": _timed([*OA, "--help"], n, env, root),
        "cli_sub_help_s": _timed([*OA, "exec", "--help"], n, env, root),
        "cli_python_s": _timed([sys.executable, "-c", "pass"], n, env, root),
        "cli_docker_run_s": _timed(
            ["docker", "run", "--rm", "--runtime", runtime, "--network", "none", "--entrypoint", "true", image],
            n,
            env,
            root,
        ),
        "cli_exec_copy_s": _timed([*OA, *exec_args, "--workspace-mode", "copy", *read], n, env, root),
        "cli_exec_bind_s": _timed([*OA, *exec_args, "--workspace-mode", "bind", *read], n, env, root),
    }
    out["cli_sessions_s"] = _timed([*OA, "sessions"], n, env, root)  # with the sessions exec just left
    out["cli_exec_copy_ratio_vs_docker_run"] = out["cli_exec_copy_s"] / out["cli_docker_run_s"]
    out["cli_exec_bind_ratio_vs_docker_run"] = out["cli_exec_bind_s"] / out["cli_docker_run_s"]
    out["cli_help_ratio_vs_python"] = out["cli_help_s"] / out["cli_python_s"]
    out["cli_load"] = os.getloadavg()[0]
    return out


def cli_rows(r: dict) -> list[tuple[str, str, str, str]]:
    """bench/run.py's table rows for this section (name, ours, baseline, verdict)."""
    if "cli_help_s" not in r:
        return []
    return [
        (
            "oa-sandbox --help",
            f"{r['cli_help_s'] * 1000:.0f} ms",
            f"python -c pass: {r['cli_python_s'] * 1000:.0f} ms",
            f"{'met' if r['cli_help_s'] <= 0.3 else 'NOT MET'} (target <= 300 ms)",
        ),
        (
            "oa-sandbox exec --help / sessions",
            f"{r['cli_sub_help_s'] * 1000:.0f} / {r['cli_sessions_s'] * 1000:.0f} ms",
            "",
            "",
        ),
        (
            "oa-sandbox exec read_file, copy mode",
            f"{r['cli_exec_copy_s']:.2f} s",
            f"docker run --rm IMAGE true: {r['cli_docker_run_s']:.2f} s",
            f"{r['cli_exec_copy_ratio_vs_docker_run']:.2f}x (target <= 1.5)",
        ),
        (
            "oa-sandbox exec read_file, bind mode",
            f"{r['cli_exec_bind_s']:.2f} s",
            "",
            f"{r['cli_exec_bind_ratio_vs_docker_run']:.2f}x (target <= 1.5)",
        ),
    ]


def _discard_sessions(state: Path) -> None:
    """Every session the execs left (copy mode keeps its copy, on a mounted quota file system, for
    review): discarded, so no mount or loop device outlives the bench."""
    from orchestrator.api import sessions

    before = os.environ.get("XDG_STATE_HOME")
    os.environ["XDG_STATE_HOME"] = str(state)
    try:
        for record in sessions.list_sessions():
            if record.mode.value == "copy" and not record.discarded:
                sessions.discard(record.id)
    finally:
        if before is None:
            os.environ.pop("XDG_STATE_HOME", None)
        else:
            os.environ["XDG_STATE_HOME"] = before


def main() -> int:
    from bench.run import print_report
    from orchestrator.config import DockerBackendConfig
    from orchestrator.sandbox.docker import docker_client
    from orchestrator.sandbox.image import ensure_image
    from orchestrator.sandbox.runtimes import available_runtimes, choose_runtime

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--runtime", action="append", help="OCI runtime (repeatable; default runc and runsc, those the daemon has)"
    )
    parser.add_argument("-n", type=int, default=5, help="timed runs per figure (their median)")
    parser.add_argument("--image", help="the sandbox image (default: the configured one, built if missing)")
    parser.add_argument("--json", dest="json_path", help="write the results as one JSON object")
    args = parser.parse_args()
    client = docker_client(timeout=600)
    image = args.image or ensure_image(
        client, DockerBackendConfig().image, progress=lambda m: print(m, file=sys.stderr)
    )
    offered = available_runtimes(client)
    results: dict = {"quick": True, "machine": {"cpus": os.cpu_count()}, "runtimes": {}}
    root = Path(tempfile.mkdtemp(prefix="oa-bench-cli-"))
    try:
        for runtime in args.runtime or [r for r in ("runc", "runsc") if r in offered]:
            name = choose_runtime(runtime, False, client).name
            results["runtimes"][runtime] = bench_real_cli(root, name, image, args.n)
            results["runtimes"][runtime]["load_real_cli"] = os.getloadavg()[0]
    finally:
        _discard_sessions(root / "cli-state")
        shutil.rmtree(root, ignore_errors=True)
    print_report(results)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
