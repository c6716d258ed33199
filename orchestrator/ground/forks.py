"""How many forks one call may make, and best-of-N's pick timeout, in a leaf module: `oa-sandbox fork
--help` and `run --help` show them without importing the copy machinery, and the fork's declaration
(tools/owner.py) bounds its `n` by it (workspace/fork_limits.py, fork.py and api/attempts.py name them too)."""

from __future__ import annotations

MAX_FORKS = 16  # forks made by one call; each is a full session's state (and, when run, a box)
PICK_TIMEOUT_S = 600  # best-of-N's pick command's shell timeout by default (clamped to the shell's own maximum)
