"""Red team (issue 10, finding 1 variants): the host git tool while the box still writes the workspace.

The git tool runs during the session, so the box can change the tree between the tool's own check
of a file and libgit2's use of it. Played here by a host thread doing what a box's background
process does (the files are the box's either way); the tool itself is the real one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers.host_git import init_repo

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def test_redteam_gitignore_swapped_for_a_link_to_a_fifo_never_hangs_the_host(tmp_path):
    """A .gitignore swapped, again and again, between a plain file (what the check
    sees) and a symlink to a FIFO (what libgit2 would open): status never blocks."""
    ws = tmp_path / "ws"
    init_repo(ws, {"app.py": "x\n", "sub/y.txt": "y\n"})
    (ws / "new.txt").write_text("untracked: status asks whether it is ignored\n")
    (ws / "sub" / "new.txt").write_text("untracked\n")
    os.mkfifo(ws / "pipe")
    stop = threading.Event()

    def swap(where):
        n = 0
        while not stop.is_set():
            n += 1
            link, plain = where / f".swap-l{n}", where / f".swap-p{n}"
            os.symlink(os.path.relpath(ws / "pipe", where), link)
            os.rename(link, where / ".gitignore")
            plain.write_text("*.log\n")
            os.rename(plain, where / ".gitignore")

    swappers = [threading.Thread(target=swap, args=(d,), daemon=True) for d in (ws, ws / "sub")]
    for t in swappers:
        t.start()
    child = subprocess.Popen(
        [sys.executable, "-c", STATUSES, str(ws)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        # In a child process: blocked in open() libgit2 holds the GIL, so a thread of this process
        # could not even notice the hang; the child is killed instead.
        out, _ = child.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        out = "the host git tool hung (the whole process: libgit2 blocked opening the FIFO)\n" + out
    finally:
        stop.set()
        for t in swappers:
            t.join(5)
    assert child.returncode == 0 and out.strip().endswith("300 ok"), out[-2000:]


STATUSES = """
import sys
from orchestrator.tools.host_git import HostRepo, parse_args
repo = HostRepo.open_at_start(sys.argv[1])
results = [repo.run(parse_args({"subcommand": "status"})) for _ in range(300)]
bad = [r for r in results if not r.ok]
print(bad[:3] if bad else "300 ok")
"""
