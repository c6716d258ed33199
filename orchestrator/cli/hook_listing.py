"""The hooks in force for a workspace and where each came from (`oa-sandbox hooks`), and whether
each one's program can run (a missing or non-executable program would fail closed at its point)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..policy import pins
from ..policy.hook_spec import Collected, HookSpec, in_force


def hooks_for(workspace: Path, policy_files: list[str]) -> tuple[list[HookSpec], list[str]]:
    """As a session starting now would have them: in order, and one line for each left out."""
    from ..session import load_policies

    collected = Collected()
    load_policies(workspace, policy_files, hooks=collected)
    specs, dropped = in_force(collected.specs, collected.trusted, workspace, pins.box_roots(workspace))
    return specs, [*collected.dropped, *dropped]


def problem(hook: HookSpec, workspace: Path) -> str | None:
    """Why the hook's program cannot run, or None."""
    program = hook.argv[0]
    if "/" not in program:
        found = shutil.which(program)
        return None if found else f"{program!r} is not on PATH"
    path = Path(program) if os.path.isabs(program) else workspace / program
    if not path.is_file():
        return f"{program} is not a file"
    if not os.access(path, os.X_OK):
        return f"{program} is not executable (chmod +x)"
    return None
