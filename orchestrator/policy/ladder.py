"""The approval ladder of the spec (automatic / ask once / ask every time / refuse) and policy files.

Policy tiers, lowest to highest: default < workspace < user < admin. The highest tier with a
matching rule decides; within a tier the strictest rule wins, so an admin can forbid anything.
A workspace policy comes from the repository, which may be hostile: it can only tighten.
Nothing here may be named like /bypass/i: such a file is refused when it loads.
"""
from __future__ import annotations

import json
import re
import tomllib
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ErrorType, OpenAgentsError

FORBIDDEN_NAME = re.compile(r"bypass", re.IGNORECASE)


class Level(str, Enum):
    AUTOMATIC = "automatic"
    ASK_ONCE = "ask_once"
    ASK_EVERY_TIME = "ask_every_time"
    REFUSE = "refuse"


class Tier(IntEnum):
    DEFAULT = 0
    WORKSPACE = 1
    USER = 2
    ADMIN = 3


class Decision(str, Enum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


_STRICTNESS = {Decision.ALLOW: 0, Decision.ASK: 1, Decision.DENY: 2}

# The spec's ladder: actions first (git has several), then ACP kinds.
DEFAULT_BY_ACTION = {"git status": Level.AUTOMATIC, "git diff": Level.AUTOMATIC, "git log": Level.AUTOMATIC, "git commit": Level.ASK_ONCE, "git push": Level.ASK_EVERY_TIME}
DEFAULT_BY_KIND = {
    "read": Level.AUTOMATIC,
    "search": Level.AUTOMATIC,
    "think": Level.AUTOMATIC,
    "edit": Level.ASK_ONCE,
    "execute": Level.ASK_EVERY_TIME,
    "fetch": Level.ASK_EVERY_TIME,
    "delete": Level.ASK_EVERY_TIME,
    "move": Level.ASK_EVERY_TIME,
    "other": Level.ASK_EVERY_TIME,
}


class PolicyRule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    tool: str | None = Field(default=None, description="Tool name, e.g. shell.")
    kind: str | None = Field(default=None, description="ACP kind, e.g. edit.")
    action: str | None = Field(default=None, description="Finest key, e.g. 'git push'.")
    command_prefix: str | None = Field(default=None, description="For shell: the command must start with this.")
    decision: Decision
    tier: Tier = Tier.USER

    def matches(self, tool: str, kind: str, action: str, command: str | None) -> bool:
        if self.tool is not None and self.tool != tool:
            return False
        if self.kind is not None and self.kind != kind:
            return False
        if self.action is not None and self.action != action:
            return False
        if self.command_prefix is not None:
            # A prefix never matches a compound command: `pytest; curl evil` is not `pytest`.
            if command is None or not command.startswith(self.command_prefix) or re.search(r"[;&|`$<>()\n]", command):
                return False
        return True

    @property
    def specificity(self) -> int:
        return sum(x is not None for x in (self.tool, self.kind, self.action, self.command_prefix))


class EgressPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow: list[str] = Field(default_factory=list, description="Hosts the egress proxy may reach.")
    allow_cidrs: list[str] = Field(default_factory=list, description="Admin only: private networks the proxy may reach.")


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tier: str = "user"
    rules: list[PolicyRule] = Field(default_factory=list)
    egress: EgressPolicy | None = None


def _check_names(value: Any, where: str = "policy") -> None:
    """Any option or rule whose id, name, kind or key matches /bypass/i is refused at load time."""
    if isinstance(value, dict):
        for key, item in value.items():
            if FORBIDDEN_NAME.search(str(key)):
                raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{where}: the option {key!r} is refused: no option may be named like 'bypass'")
            if key in ("id", "name", "kind", "tool", "action", "decision", "tier") and isinstance(item, str) and FORBIDDEN_NAME.search(item):
                raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{where}: {key} {item!r} is refused: nothing may be named like 'bypass'")
            _check_names(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_names(item, where)


def load_policy(path: str | Path, tier: Tier | None = None) -> list[PolicyRule]:
    return load_policy_file(path, tier).rules


def load_policy_file(path: str | Path, tier: Tier | None = None) -> PolicyFile:
    """Load a TOML or YAML policy file. The file's own `tier` is used unless the caller fixes one."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"cannot read policy {path}: {err.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"policy {path} does not parse: {err}") from None
    data = data or {}
    _check_names(data, str(path))
    try:
        policy = PolicyFile.model_validate(data)
        file_tier = tier if tier is not None else Tier[policy.tier.upper()]
    except (ValidationError, KeyError) as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"policy {path} is not valid: {err}") from None
    rules = [rule.model_copy(update={"tier": file_tier}) for rule in policy.rules]
    if file_tier == Tier.WORKSPACE:
        loose = [r for r in rules if r.decision == Decision.ALLOW]
        if loose or policy.egress:
            what = f"rule {loose[0].id or loose[0].tool}" if loose else "egress"
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{path}: a workspace policy can only ask or deny, never allow ({what})")
    if policy.egress and policy.egress.allow_cidrs and file_tier != Tier.ADMIN:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"{path}: egress allow_cidrs is admin-only (OA_ADMIN_POLICY)")
    return policy.model_copy(update={"rules": rules})


class Ladder:
    """Maps one prepared call to its rung, given the policy rules in force."""

    def __init__(self, rules: list[PolicyRule] | None = None) -> None:
        self.rules = list(rules or [])

    def level(self, tool: str, kind: str, action: str, command: str | None = None) -> tuple[Level, str]:
        default = DEFAULT_BY_ACTION.get(action) or DEFAULT_BY_KIND.get(kind, Level.ASK_EVERY_TIME)
        matching = [r for r in self.rules if r.matches(tool, kind, action, command)]
        if not matching:
            return default, f"default ladder: {kind}"
        top = max(r.tier for r in matching)
        chosen = max((r for r in matching if r.tier == top), key=lambda r: (_STRICTNESS[r.decision], r.specificity))
        label = f"{chosen.tier.name.lower()} policy rule {chosen.id or json.dumps(chosen.model_dump(exclude_none=True, exclude={'tier'}))}"
        if chosen.decision == Decision.DENY:
            return Level.REFUSE, label
        if chosen.decision == Decision.ALLOW:
            return Level.AUTOMATIC, label
        return (default if default in (Level.ASK_ONCE, Level.ASK_EVERY_TIME) else Level.ASK_EVERY_TIME), label
