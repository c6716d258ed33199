"""Importing the host's code changes nothing about the host process (issue 36, point 5).

`sandbox_agent.shell` makes the process that imports it not dumpable (prctl PR_SET_DUMPABLE 0): right
for the agent in the box, wrong for the host, where it silently stops core dumps and a debugger
attaching. Every orchestrator module is imported in a fresh interpreter, and the process must still
be dumpable afterwards, and `sandbox_agent.shell` must not have been pulled in at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROBE = r"""
import ctypes, importlib, pkgutil, sys
import orchestrator
failed = []
for info in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as err:  # an optional extra not installed here: not this test's concern
        failed.append(f"{info.name}: {err}")
libc = ctypes.CDLL(None, use_errno=True)
print("dumpable", libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE = 3
print("shell", "sandbox_agent.shell" in sys.modules)
print("modules", sum(1 for m in sys.modules if m.startswith("orchestrator.")))
for line in failed:
    print("skipped", line)
"""


def test_importing_every_orchestrator_module_keeps_the_host_dumpable() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert int(lines["modules"]) > 50, done.stdout  # the walk really imported the tree
    assert lines["shell"] == "False", "an orchestrator module imports sandbox_agent.shell"
    assert lines["dumpable"] == "1", "importing the host's code made the host process not dumpable"
