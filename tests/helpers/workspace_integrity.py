"""What tests/attacks/test_workspace_integrity.py shares with other tests, kept here
(issue 48: helpers in one place, none imported from a test module)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HOSTILE_CONFIG = (
    '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch {marker}; false"\n[alias]\n\tst = !touch {marker}\n'
)


def user_git(cwd: Path) -> subprocess.CompletedProcess:
    """The user's own git, after the session, as they would run it. The tests run as root over
    workspaces owned by uid 1000, and git refuses a repository someone else owns ("dubious
    ownership") before reading its config, so without safe.directory this could never fire a
    planted fsmonitor and the scenarios could not fail; the user, who owns the workspace, has no
    such refusal."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
    }
    done = subprocess.run(["git", "status", "--short"], cwd=cwd, capture_output=True, text=True, env=env, timeout=30)
    assert "dubious ownership" not in done.stderr, done.stderr
    return done
