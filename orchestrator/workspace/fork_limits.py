"""How many forks one call may make, and best-of-N's pick timeout: ground/forks.py's, named here too
for the copy machinery's readers (fork.py, api/attempts.py, the command line)."""

from __future__ import annotations

from ..ground.forks import MAX_FORKS as MAX_FORKS
from ..ground.forks import PICK_TIMEOUT_S as PICK_TIMEOUT_S
