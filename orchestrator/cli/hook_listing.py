"""The hooks in force for a workspace and where each came from (`oa-sandbox hooks`, `doctor`): what
each one runs, resolved as a session starting now would resolve it (hooks/engine.py plan), what the
user's PATH would have run from where the box writes instead, the secrets it is not given, and
whether its program can run (a missing or non-executable program would fail closed at its point)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..hooks.engine import plan, secrets_of
from ..hooks.wiring import secret_names
from ..policy import pins
from ..policy.hook_spec import HookSpec, box_words, in_force
from ..programs.resolve import Resolved, SearchPath


@dataclass
class Listing:
    hooks: list[
        tuple[HookSpec, Resolved | None]
    ]  # None: its program is a workspace file, run from a copy pinned at the start
    dropped: list[str]
    search: SearchPath
    withheld: set[str] = field(default_factory=set)
    box_files: dict[int, list[str]] = field(
        default_factory=dict
    )  # id(hook): its words naming workspace files (run from pinned copies)

    def withheld_from(self, hook: HookSpec) -> list[str]:
        """The variables the hook lists in `env` that it will not get (secrets its table does not name in `secrets`)."""
        passed = secrets_of(hook, None)
        return [name for name in hook.env if name in self.withheld and name not in passed]


def hooks_for(workspace: Path, policy_files: list[str], api_key_env: str | None = None) -> Listing:
    """As a session starting now would have them: in order, resolved, and one line for each left out."""
    from ..policy.load import load_session_policy

    policy = load_session_policy(workspace, policy_files)
    roots = pins.box_roots(workspace)
    specs, dropped = in_force(list(policy.hooks), policy.hooks_trusted, workspace, roots)
    words = {id(h): box_words(h, workspace, roots) for h in specs}
    pinned = {id(h) for h in specs if any(index == 0 for index, _ in words[id(h)])}
    planned, refused, search = plan([h for h in specs if id(h) not in pinned], workspace)
    resolved = {id(hook): r for hook, r in planned}
    hooks = [(hook, resolved.get(id(hook))) for hook in specs if id(hook) in pinned or id(hook) in resolved]
    return Listing(
        hooks,
        [*policy.hooks_dropped, *dropped, *refused],
        search,
        secret_names(policy.egress.credentials, api_key_env),
        {key: [str(path) for _, path in found] for key, found in words.items() if found},
    )


def problem(resolved: Resolved | None) -> str | None:
    """Why the hook's program cannot run, or None."""
    return (resolved.problem or None) if resolved is not None else None
