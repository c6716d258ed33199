"""The session's hooks made at its start (session.py), and its life-cycle points: SessionStart once
it is open, SessionEnd once when it closes (after a final answer, Ctrl-C or a fatal error alike)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable

from .. import events as ev
from ..config import EgressCredential
from ..errors import ErrorType, OpenAgentsError
from ..policy import pins
from ..policy.hook_spec import Collected, HookSpec, box_words, in_force, with_argv
from ..protocol import Executor
from ..transcript import Transcript
from ..workspace.records import SessionRecord
from .engine import Hooks, clean


def pinned_argv(
    hook: HookSpec, workspace: Path, roots: list[Path], record: SessionRecord | None, resumed: bool
) -> list[str]:
    """The hook's command with each file where the box can write replaced by its copy pinned in
    `record` (pinned now, at a start; taken from the start's pins on resume); typed error if it cannot be."""
    argv = hook.argv
    for index, path in box_words(hook, workspace, roots):
        if record is None:
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{path}: no session to pin it in")
        argv[index] = str(pins.hook_script(record, workspace, path, resumed))
    return argv


def secret_names(credentials: Iterable[EgressCredential], model_key: str | None) -> set[str]:
    """What no hook gets unless its own (user or admin) table names it in `secrets`: the session's
    model key, every model dialect's key variable, and every variable an egress credential reads."""
    from ..models.dialects import DIALECTS

    return {
        *(d.key_variable for d in DIALECTS.values()),
        *([model_key] if model_key else []),
        *(name for credential in credentials for name in credential.variables),
    }


def make(
    collected: Collected,
    workspace: Path,
    transcript: Transcript,
    session_id: str,
    model_key: str | None,
    box_workspace: Path | None = None,
    record: SessionRecord | None = None,
    resumed: bool = False,
    withheld: Iterable[str] = (),
) -> Hooks | None:
    """The hooks in force (policy/hook_spec.py in_force), each resolved now to what it will run
    (engine.plan); each one left out or refused is recorded and said on stderr. A trusted hook's
    files where the box can write run from their copies pinned at the start (`record`). `withheld`:
    secrets beside the model's key (secret_names)."""
    roots = pins.box_roots(workspace)
    kept, dropped = in_force(collected.specs, collected.trusted, workspace, roots)
    specs: list[HookSpec] = []
    for hook in kept:
        try:
            argv = pinned_argv(hook, workspace, roots, record, resumed)
        except OpenAgentsError as err:
            dropped.append(f"{hook.label()}: {err.message}")
            continue
        specs.append(with_argv(hook, argv) if argv != hook.argv else hook)
    if record is not None:
        record.save()
    exempt = [record.dir / pins.PINS_DIR] if record is not None else []
    hooks = Hooks(specs, workspace, transcript, session_id, model_key, box_workspace, withheld, exempt)
    for line in [*collected.dropped, *dropped, *hooks.refused]:
        transcript.emit(ev.HookRan(executor=Executor.OPENAGENTS, outcome="not_in_force", reason=clean(line)))
        sys.stderr.write(clean(f"oa-sandbox: hook not in force: {line}") + "\n")
    for hook in hooks.specs:
        if hook.tier < 2 and (hook.secrets or hook.pass_model_key):
            sys.stderr.write(
                clean(
                    f"oa-sandbox: hook {hook.label()}: a workspace file's hook gets no secret (its `secrets` "
                    "is honoured only in your own or the admin's file)"
                )
                + "\n"
            )
    if not hooks.specs:
        return None
    return hooks


def session_start(hooks: Hooks | None, trigger: str, via: str) -> str:
    """SessionStart's hooks (advisory); the context they add, for the model's system prompt."""
    if hooks is None or not hooks.active("SessionStart"):
        return ""
    verdict = hooks.fire("SessionStart", {"source": trigger, "via": via}, trigger=trigger)
    return ("\n\nContext from the user's SessionStart hooks:\n" + verdict.context_text()) if verdict.context else ""


def session_end(hooks: Hooks | None, status: str, reason: str) -> None:
    if hooks is not None and hooks.active("SessionEnd"):
        hooks.fire("SessionEnd", {"reason": status, "detail": reason[:2000]}, trigger=status)
