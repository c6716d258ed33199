#!/usr/bin/env python3
"""Where a shell call's time goes, step by step, under each runtime (issue 26).

    python bench/shell_trace.py [--runtime runc --runtime runsc] [--n 100]

From the host: `hello` (the protocol's round trip: host -> attach stream -> agent -> back, no work),
read_file of 1 KiB, shell `true` back to back and 50 ms apart (the agent starts the next call's
/bin/sh after each call: sandbox_agent/launcher.py). Inside the box (timed there with perf_counter, so no protocol in
it): each step the agent's shell path adds in turn, from a bare posix_spawn of /bin/true up to the
agent's own Popen (sh, pipes, a new session, a clean environment) waited for the way it waits under
that kernel (pidfd where it exists, else a waiter thread and a pipe). The last column is each step's
increment over the one before; the load average is printed beside each runtime's figures.
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

IN_BOX = r"""
import json, os, select, subprocess, sys, threading, time
n = int(sys.argv[1])
def p50(fn):
    fn()
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append((time.perf_counter() - t) * 1000)
    out.sort(); return out[len(out) // 2]
def spawn():
    os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)
def popen_true():
    subprocess.Popen(["/bin/true"]).wait()
def popen_sh():
    subprocess.Popen(["/bin/sh", "-c", "true"]).wait()
def agent_popen():
    return subprocess.Popen(["/bin/sh", "-c", "true"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
                            start_new_session=True, close_fds=True)
def agent_pipes():
    p = agent_popen(); p.stdout.read(); p.wait(); p.stdout.close()
try:
    os.close(os.pidfd_open(os.getpid())); pidfd = True
except (OSError, AttributeError):
    pidfd = False
r, w = os.pipe()
pids = []
cv = threading.Condition()
def waiter():
    while True:
        with cv:
            while not pids:
                cv.wait()
            pid = pids.pop()
        os.waitpid(pid, 0); os.write(w, b"x")
threading.Thread(target=waiter, daemon=True).start()
def agent_wait():
    p = agent_popen()
    if pidfd:
        fd = os.pidfd_open(p.pid)
    else:
        with cv:
            pids.append(p.pid); cv.notify()
        fd = r
    poller = select.poll(); poller.register(p.stdout.fileno(), select.POLLIN); poller.register(fd, select.POLLIN)
    done = out = False
    while not (done and out):
        for f, _ in poller.poll():
            if f == fd:
                if pidfd:
                    p.wait(); os.close(fd)
                else:
                    os.read(r, 1); p.returncode = 0
                poller.unregister(fd); done = True
            elif not os.read(f, 65536):
                poller.unregister(f); out = True
    p.stdout.close()
steps = [("posix_spawn /bin/true + waitpid", spawn), ("Popen /bin/true + wait", popen_true),
         ("Popen sh -c true + wait (sh start-up)", popen_sh), ("+ pipes, new session, clean env", agent_pipes),
         ("+ the agent's wait (" + ("pidfd" if pidfd else "waiter thread + pipe") + ") and poll", agent_wait)]
print(json.dumps([(name, p50(fn)) for name, fn in steps]))
"""


def p50_call(box, tool: str, args: dict, n: int, pause_s: float = 0.0) -> float:
    out = []
    for _ in range(n):
        time.sleep(pause_s)
        started = time.perf_counter()
        result = box.call(tool, args)
        out.append((time.perf_counter() - started) * 1000)
        assert result.ok, result.error
    return statistics.median(out)


def trace(client, ws: Path, runtime: str, n: int) -> list[tuple[str, float]]:
    with DockerSandbox(ws, SandboxConfig(backend=DockerBackendConfig(runtime=runtime)), client=client) as box:
        for _ in range(10):
            box.call("shell", {"command": "true"})
        host = [
            ("host: hello round trip (protocol floor)", p50_call(box, "hello", {}, n)),
            ("host: read_file 1 KiB", p50_call(box, "read_file", {"path": "one_kib.txt"}, n)),
            (
                "host: shell `true` back to back (waits for the next /bin/sh)",
                p50_call(box, "shell", {"command": "true"}, n),
            ),
            ("host: read_file 1 KiB, 50 ms apart", p50_call(box, "read_file", {"path": "one_kib.txt"}, n, 0.05)),
            (
                "host: shell `true`, 50 ms apart (a prepared /bin/sh)",
                p50_call(box, "shell", {"command": "true"}, n, 0.05),
            ),
        ]
        (ws / "trace.py").write_text(IN_BOX)
        got = box.call("shell", {"command": f"python3 -I -S trace.py {n}", "timeout": 300})
        assert got.ok, got.error
        inside = [(f"box: {name}", ms) for name, ms in json.loads(got.output.strip().splitlines()[-1])]
    return host + inside


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", action="append")
    parser.add_argument("--n", type=int, default=100)
    args = parser.parse_args()
    client = docker_client(timeout=300)
    ensure_image(client, DockerBackendConfig().image, progress=lambda m: print(m, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="oa-shell-trace-") as tmp:
        ws = make_workspace(Path(tmp))
        for runtime in args.runtime or ["runc", "runsc"]:
            rows = trace(client, ws, runtime, args.n)
            print(f"== {runtime} (p50 of {args.n}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs)")
            before = None
            for name, ms in rows:
                step = f"{ms - before:+8.2f}" if before is not None and name.startswith("box: ") else ""
                print(f"{name:<64}{ms:8.2f} ms {step}")
                before = ms if name.startswith("box: ") else None
            (ws / "trace.py").unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
