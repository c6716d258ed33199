"""Pinned levels are floors (issue 49): on resume, what the authority pinned at a session's start
refused still refuses, unless the user's own explicit new policy says otherwise.

A resumed session (`run --resume`/`--continue`, ACP's session/load, the API's `resume=`, and
`oa-sandbox apply` on its copy) may be given other policy files than it started with. The files it
pinned and is no longer given are not forgotten: their `workspace_access` level and their deny rules
(the ladder's and the egress gate's) still hold, as floors. One is dropped only when a policy file
the user gives now, outside every box's reach, says so explicitly:

- a level, by a file that sets `workspace_access` itself (to any level: the user said which);
- a deny rule, by a rule naming the same tool, kind, action and command_prefix that allows or asks;
- an egress deny rule, by an egress rule of the same host, port, methods and path that allows.

The admin's pinned files are never dropped: whatever the admin file says today, or wherever
OA_ADMIN_POLICY points, its levels and denies as pinned at the start hold for the session's life.
Each floor kept, and each dropped, is said with the file it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import EgressRule
from ..workspace.records import Pin, SessionRecord
from . import pins
from .ladder import AccessPin, Decision, PolicyFile, PolicyRule, Tier, access_pin
from .pins import Source


def _rule_key(rule: PolicyRule) -> tuple[str | None, ...]:
    return (rule.tool, rule.kind, rule.action, rule.command_prefix)


def _egress_key(rule: EgressRule) -> tuple[object, ...]:
    return (rule.host, rule.port, tuple(rule.methods) if rule.methods is not None else None, rule.path)


def _level_word(policy: PolicyFile) -> str:
    return f"workspace_access = {policy.workspace_access.value}" if policy.workspace_access is not None else ""


class Floors:
    """The refusals pinned files still hold on a resume: `access` (their workspace_access levels) and
    `rules` for the ladder, `egress` (deny rules, before the policies' own) for the gate."""

    def __init__(self) -> None:
        self.access: list[AccessPin] = []
        self.rules: list[PolicyRule] = []
        self.egress: list[EgressRule] = []


def pinned_floors(
    resumed: SessionRecord | None,
    files: list[str],
    given: list[tuple[Source, PolicyFile]],
    admin_now: Source | None,
    say: Callable[[str], None] = pins.say_line,
) -> Floors:
    """`files`: the user's policy files named now; `given`: them as loaded (Source, PolicyFile);
    `admin_now`: the admin file read now (None: none). What the resumed session's pins still refuse."""
    floors = Floors()
    if resumed is None:
        return floors
    named = {str(Path(f).resolve()) for f in files}
    own = [
        (source, policy) for source, policy in given if not source.box_reach
    ]  # the user's own word, beyond the box's reach
    now_digest = pins.sha256(admin_now.raw) if admin_now is not None else None
    seen: set[tuple[str, str]] = set()
    for pin in resumed.pins:
        if (pin.role, pin.sha256) in seen:
            continue
        seen.add((pin.role, pin.sha256))
        if pin.role == "admin_policy" and pin.sha256 != now_digest:
            _admin_floor(resumed, pin, floors, say)
        elif pin.role == "policy" and pin.path not in named:
            _user_floor(resumed, pin, own, floors, say)
    return floors


def _parsed(resumed: SessionRecord, pin: Pin, tier: Tier | None) -> tuple[PolicyFile, AccessPin | None]:
    policy = pins.parse(Source(pin.role, Path(pin.path), pins.read_pin(resumed, pin), pin.box_reach, pinned=True), tier)
    return policy, access_pin(policy, str(pin.path))


def _held(policy: PolicyFile) -> tuple[list[PolicyRule], list[EgressRule]]:
    rules = [rule for rule in policy.rules if rule.decision == Decision.DENY]
    egress = [rule for rule in (policy.egress.rules if policy.egress else []) if rule.action == "deny"]
    return rules, egress


def _what(access: AccessPin | None, rules: list[PolicyRule], egress: list[EgressRule]) -> str:
    parts = [f"workspace_access = {access.level.value}"] if access is not None else []
    parts += [f"{len(rules)} deny rule{'s' if len(rules) != 1 else ''}"] if rules else []
    parts += [f"{len(egress)} egress deny rule{'s' if len(egress) != 1 else ''}"] if egress else []
    return ", ".join(parts)


def _admin_floor(resumed: SessionRecord, pin: Pin, floors: Floors, say: Callable[[str], None]) -> None:
    policy, access = _parsed(resumed, pin, Tier.ADMIN)
    rules, egress = _held(policy)
    if access is not None or rules or egress:
        floors.access += [access] if access is not None else []
        floors.rules += rules
        floors.egress += egress
        say(
            f"admin policy {pin.path} as pinned at session {resumed.id}'s start still holds on resume: "
            f"{_what(access, rules, egress)} "
            "(the admin's word is never dropped)"
        )


def _user_floor(
    resumed: SessionRecord, pin: Pin, own: list[tuple[Source, PolicyFile]], floors: Floors, say: Callable[[str], None]
) -> None:
    policy, access = _parsed(resumed, pin, None)
    rules, egress = _held(policy)
    setter = next(((s, p) for s, p in own if p.workspace_access is not None), None)
    kept_rules: list[PolicyRule] = []
    kept_egress: list[EgressRule] = []
    dropped: list[str] = []
    if access is not None and setter is not None:
        dropped.append(
            f"workspace_access = {access.level.value} (the policy {setter[0].path} sets {_level_word(setter[1])})"
        )
        access = None
    for rule in rules:
        lifting = next(
            (s for s, p in own for r in p.rules if r.decision != Decision.DENY and _rule_key(r) == _rule_key(rule)),
            None,
        )
        if lifting is not None:
            dropped.append(f"a deny rule (the policy {lifting.path} has a rule for the same call that does not deny)")
            continue
        kept_rules.append(rule)
    for egress_rule in egress:
        lifting = next(
            (
                s
                for s, p in own
                for r in (p.egress.rules if p.egress else [])
                if r.action == "allow" and _egress_key(r) == _egress_key(egress_rule)
            ),
            None,
        )
        if lifting is not None:
            dropped.append(f"an egress deny rule (the policy {lifting.path} allows the same requests)")
            continue
        kept_egress.append(egress_rule)
    floors.access += [access] if access is not None else []
    floors.rules += kept_rules
    floors.egress += kept_egress
    start = f"policy {pin.path}, pinned at session {resumed.id}'s start and not given now"
    if access is not None or kept_rules or kept_egress:
        say(
            f"{start}, still holds on resume: {_what(access, kept_rules, kept_egress)}; "
            "a policy file you give lifts it only by saying so "
            "(workspace_access itself; for a deny, a rule for the same tool, kind, action and command_prefix)"
        )
    for line in dropped:
        say(f"{start}: {line}: no longer applies")
