"""The approval ladder (docs/tools.md#approvals: automatic / ask once / ask every time / refuse) and policy files.

Policy tiers, lowest to highest: default < workspace < user < admin. The highest tier with a
matching rule decides; within a tier the strictest rule wins, so an admin can forbid anything.
A workspace policy comes from the repository, which may be hostile: it can only tighten.
Nothing here may be named like /bypass/i: such a file is refused when it loads.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails

from ..boxfs import read_workspace_file
from ..config import EgressCredential, EgressRule
from ..errors import ErrorType, OpenAgentsError
from ..tools import catalog
from ..tools.catalog import (
    CHANGES_ACTION,
    CHANGES_TOOL,
    FORK_ACTION,
    FORK_TOOL,
    LAND_ACTION,
    LAND_KIND,
    LAND_TOOL,
    PROCESS_TOOLS,
    READ_BYTES_TOOL,
    ROLLBACK_ACTION,
    ROLLBACK_TOOL,
    WRITE_BYTES_TOOL,
)
from ..tools.mcp import names as mcp_names
from .hook_spec import HookSpec, means_every
from .prefix import shell_prefix
from .safeparse import Refused, parse_data, parse_data_bounded

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


class Access(str, Enum):
    """`workspace_access` in a policy file: what the session may do to the real workspace.
    read-write: today's (bind mode edits it, copy mode lands through the sanitiser); copy-only: the
    session works on a copy whatever --workspace-mode says and nothing ever lands; read-only: the
    workspace is mounted read-only, every edit (write_file, edit_file, git commit) and every landing
    refused. The most restrictive level of all the files in force wins, whatever their tiers."""

    READ_WRITE = "read-write"
    COPY_ONLY = "copy-only"
    READ_ONLY = "read-only"


_ACCESS_ORDER = [Access.READ_WRITE, Access.COPY_ONLY, Access.READ_ONLY]

# The ladder's defaults, by ACP kind (docs/tools.md#approvals). A tool with several actions (git) gives each
# action its kind (its ToolDef), so git status/diff/log are read (automatic) and git commit is edit (ask once).
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


def known_tools() -> list[str]:
    return sorted(
        {
            *catalog.TOOLS,
            LAND_TOOL,
            CHANGES_TOOL,
            ROLLBACK_TOOL,
            FORK_TOOL,
            READ_BYTES_TOOL,
            WRITE_BYTES_TOOL,
            *PROCESS_TOOLS,
        }
    )  # the built-in tools' names and the host-side ones' are what a rule can match


def known_actions() -> list[str]:
    return sorted(
        {
            *catalog.actions(),
            LAND_TOOL,
            LAND_ACTION,
            CHANGES_ACTION,
            ROLLBACK_ACTION,
            FORK_ACTION,
            READ_BYTES_TOOL,
            WRITE_BYTES_TOOL,
            *PROCESS_TOOLS,
        }
    )


def rule_value(key: str, value: str | None) -> str | None:
    """The one reading of a rule's `tool`, `kind`, `action` or `command_prefix`, which the loader
    checks and `PolicyRule.matches` then compares: None (every one) for the key left out, empty or
    "*" (hook_spec.means_every, as in a hook's filters); else the value, which must be one a call
    can have: a built-in tool, kind or action, an MCP server's tool or server as the MCP client
    names them (tools/mcp/names.py; no glob: a rule compares whole names); a command_prefix is
    any other text. ValueError (never quoting the value, only the allowed words) otherwise: a
    rule that could match nothing is refused at load."""
    if means_every(value):
        return None
    assert value is not None
    if key == "command_prefix":
        return value
    allowed, mcp_form, open_words = {
        "kind": (sorted(DEFAULT_BY_KIND), None, ""),
        "tool": (
            known_tools(),
            mcp_names.could_be_tool_name,
            ", or an MCP tool's whole name (mcp__<server>__<tool>: letters, digits, _ and -)",
        ),
        "action": (known_actions(), mcp_names.could_be_action, ", or 'mcp <server>' for every tool of one MCP server"),
    }[key]
    if value in allowed or (mcp_form is not None and mcp_form(value)):
        return value
    hint = (
        "; a rule names one whole name, no pattern (leave the key out, or write '*', for every one)"
        if any(c in value for c in "*?[")
        else ""
    )
    raise ValueError(f"unknown {key}{did_you_mean(value, allowed)}; allowed: {', '.join(allowed)}{open_words}{hint}")


class PolicyRule(BaseModel):
    """Strings are bounded: a rule's id ends up in every decision's label (terminal, transcript, editor).
    `tool`, `kind`, `action` and `command_prefix` are read by rule_value, the loader and the matcher alike."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(default=None, max_length=200)
    tool: str | None = Field(default=None, max_length=100, description="Tool name, e.g. shell.")
    kind: str | None = Field(default=None, max_length=100, description="ACP kind, e.g. edit.")
    action: str | None = Field(default=None, max_length=200, description="Finest key, e.g. 'git commit'.")
    command_prefix: str | None = Field(
        default=None, max_length=4096, description="For shell: the command must start with this."
    )
    decision: Decision
    tier: Tier = Tier.USER

    @field_validator("tool", "kind", "action", "command_prefix")
    @classmethod
    def _one_reading(cls, value: str | None, info: ValidationInfo) -> str | None:
        return rule_value(str(info.field_name), value)

    def matches(self, tool: str, kind: str, action: str, command: str | None) -> bool:
        if self.tool is not None and self.tool != tool:
            return False
        if self.kind is not None and self.kind != kind:
            return False
        if self.action is not None and self.action != action:
            return False
        if self.command_prefix is not None:
            if command is None:
                return False
            if self.decision == Decision.DENY:  # fails closed: wherever the denied program may run
                return deny_prefix_matches(self.command_prefix, command)
            # An allow or ask prefix never matches a compound command: `pytest; curl evil` is not `pytest`.
            if not command.startswith(self.command_prefix) or re.search(r"[;&|`$<>()\n]", command):
                return False
        return True

    @property
    def specificity(self) -> int:
        return sum(x is not None for x in (self.tool, self.kind, self.action, self.command_prefix))


_WORD = re.compile(r"[^\s;&|`$<>(){}'\"\\=]+")


def deny_prefix_matches(prefix: str, command: str) -> bool:
    """A deny rule's prefix fails closed. A plain command (one program found on PATH, no shell
    syntax, no wrapper: what `A` could approve, policy/prefix.py) is matched by its words as
    written. Any other command is matched when the prefix's first word stands in it as a word
    anywhere, by its last path part: `true; rm x`, `sh -c 'rm x'`, `env rm x`, `/bin/rm x`, `$(rm x)`,
    `git -C d push` are all refused by a deny of `rm` or `git push`. A shell command cannot be proven
    not to run a program it names, so a deny refuses more rather than less; what no command line
    shows (a program a script runs) is for egress rules and hooks."""
    words = command.split()
    if shell_prefix(command) is not None:
        return " ".join(words).startswith(" ".join(prefix.split()))
    head = prefix.split(maxsplit=1)[0] if prefix.strip() else ""
    return bool(head) and any(word.rsplit("/", 1)[-1] == head for word in _WORD.findall(command))


class EgressPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")
    allow: list[str] = Field(default_factory=list, description="Hosts the egress proxy may reach.")
    allow_cidrs: list[str] = Field(
        default_factory=list, description="Admin only: private networks the proxy may reach."
    )
    rules: list[EgressRule] = Field(
        default_factory=list, description="[[egress.rules]]: by host, port, method and path; first match wins."
    )
    credentials: list[EgressCredential] = Field(
        default_factory=list, description="[[egress.credentials]]: injected by the gate (user or admin)."
    )
    upstream_ca: str | None = Field(
        default=None, description="Admin only: a PEM file the gate also trusts for re-originated TLS."
    )


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tier: str = "user"
    workspace_access: Access | None = Field(
        default=None, description="read-write | copy-only | read-only: the most restrictive in force wins."
    )
    rules: list[PolicyRule] = Field(default_factory=list)
    egress: EgressPolicy | None = None
    hooks: list[HookSpec] = Field(
        default_factory=list,
        max_length=100,
        description="[[hooks]]: the user's programs at the loop's points (docs/hooks.md).",
    )
    trust_workspace_hooks: bool = Field(
        default=False, description="User or admin only: a workspace file's hooks may run on the host."
    )


@dataclass(frozen=True)
class AccessPin:
    """A `workspace_access` level one policy file set, and the label its refusals give (naming the
    file). It holds over every tier's rules: copy-only refuses landing, read-only every edit (landing
    is one). Made only from a file's `workspace_access` (access_pin), never from a rule."""

    level: Access
    label: str

    def refuses(self, tool: str, kind: str, action: str) -> bool:
        return kind == LAND_KIND if self.level == Access.READ_ONLY else action == LAND_ACTION


def access_pin(policy: PolicyFile, where: str) -> AccessPin | None:
    """The pin a parsed policy's workspace_access stands for (None for none, or read-write); `where`
    names the file as parse_policy was told it."""
    level = policy.workspace_access
    if level is None or level == Access.READ_WRITE:
        return None
    return AccessPin(level, f"workspace_access = {level.value} ({policy.tier} policy {where})")


def access_level(pins: Iterable[AccessPin]) -> Access:
    """The workspace access level in force: the most restrictive any policy file set (read-write if none did)."""
    return max((pin.level for pin in pins), key=_ACCESS_ORDER.index, default=Access.READ_WRITE)


POLICY_CAP = 64 * 1024  # bytes; a real policy is a few hundred
POLICY_NAMES = ("policy.toml", "policy.yaml", "policy.yml")
_KNOWN_KEYS = (
    frozenset(PolicyFile.model_fields)
    | frozenset(PolicyRule.model_fields)
    | frozenset(EgressPolicy.model_fields)
    | frozenset(EgressRule.model_fields)
    | frozenset(EgressCredential.model_fields)
    | frozenset(HookSpec.model_fields)
)


def _invalid(where: str, problem: str) -> OpenAgentsError:
    """One readable line naming the file and the problem, never the file's content."""
    return OpenAgentsError(ErrorType.CONFIG_INVALID, f"policy {where}: {problem}")


def _loc(parts: tuple[Any, ...]) -> str:
    """A location like rules[0].decision; keys the models do not know are the file's words, not shown."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + (part if part in _KNOWN_KEYS else "<key>")
    return out or "the top level"


def _check_names(value: Any, where: str, loc: tuple[Any, ...] = ()) -> None:
    """Any option or rule whose id, name, kind or key matches /bypass/i is refused at load time."""
    if isinstance(value, dict):
        for key, item in value.items():
            if FORBIDDEN_NAME.search(str(key)):
                raise _invalid(
                    where, f"an option at {_loc((*loc, key))} is refused: no option may be named like 'bypass'"
                )
            if (
                key in ("id", "name", "kind", "tool", "action", "decision", "tier")
                and isinstance(item, str)
                and FORBIDDEN_NAME.search(item)
            ):
                raise _invalid(where, f"{_loc((*loc, key))} is refused: nothing may be named like 'bypass'")
            _check_names(item, where, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_names(item, where, (*loc, index))


def did_you_mean(word: str, allowed: list[str] | tuple[str, ...] | frozenset[str]) -> str:
    """' (did you mean 'x'?)' for the closest allowed word, or ''."""
    close = difflib.get_close_matches(word.lower(), sorted(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


_MODEL_OF_PLACE: dict[str, type[BaseModel]] = {"rules": PolicyRule, "egress": EgressPolicy, "hooks": HookSpec}
_EGRESS_PLACES: dict[str, type[BaseModel]] = {"rules": EgressRule, "credentials": EgressCredential}
_TYPE_WORDS = {
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a table",
    "model_type": "must be a table",
    "int_type": "must be a whole number",
    "bool_type": "must be true or false",
}


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    place = next((p for p in reversed(loc[:-1]) if isinstance(p, str)), None)
    model = _MODEL_OF_PLACE.get(place or "", PolicyFile)
    if loc[:1] == ("egress",) and place in _EGRESS_PLACES:  # [[egress.rules]] are not [[rules]]
        model = _EGRESS_PLACES[place]
    return [k for k in model.model_fields if k != "tier" or model is PolicyFile]


def _problem(e: ErrorDetails) -> str:
    """One error, readable: the location, what is wrong, what is allowed. pydantic's own text
    quotes input values; this never shows one, only known keys and suggestions."""
    loc = tuple(e["loc"])
    kind = e["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc)
        where = _loc(loc[:-1])
        return f"{where}: unknown key{did_you_mean(str(loc[-1]), allowed)}; allowed keys: {', '.join(allowed)}"
    if kind == "missing":
        return f"{_loc(loc)}: missing (required)"
    if kind == "enum" and loc[-1:] == ("decision",):
        return f"{_loc(loc)}: must be one of allow, ask, deny"
    if kind == "enum" and loc[-1:] == ("workspace_access",):
        return f"{_loc(loc)}: must be one of read-write, copy-only, read-only"
    if kind == "string_too_long":
        return f"{_loc(loc)}: string_too_long (over the length this key allows)"
    if kind == "value_error" and (loc[:1], loc[-1:]) in _OWN_WORDS:
        return f"{_loc(loc)}: {_validator_words(e)}"  # these validators never quote the value
    if kind == "value_error" and loc[:1] == ("egress",) and loc[-1] in _EGRESS_VALUES:
        return f"{_loc(loc)}: {_EGRESS_VALUES[str(loc[-1])]}"
    return f"{_loc(loc)}: {_TYPE_WORDS.get(kind, kind)}"


# What each egress key must be (the validators' own messages quote the value: never shown here).
_EGRESS_VALUES = {
    "value": "must name a host variable, e.g. 'Bearer ${GITHUB_TOKEN}', on one line",
    "host": "must be an exact host (credentials), or an exact host, *.suffix or * (rules)",
    "header": "must be a header name the gate may set (not Host, Content-Length, Transfer-Encoding, Connection)",
    "path": "must be a glob starting with / (visible ASCII)",
    "path_prefix": "must start with / (visible ASCII)",
    "methods": 'must be a list of HTTP method names, or ["*"]',
}


_OWN_WORDS = {(("hooks",), (key,)) for key in HookSpec.model_fields} | {
    (("rules",), (key,)) for key in ("tool", "kind", "action", "command_prefix")
}


def _validator_words(e: ErrorDetails) -> str:
    """What a validator of ours said (its ValueError's message), without pydantic's prefix."""
    return str(e["msg"]).removeprefix("Value error, ")


def _validation_problem(err: ValidationError) -> str:
    problems = err.errors(include_url=False, include_context=False, include_input=False)
    problems.sort(key=lambda e: e["type"] != "extra_forbidden")  # a misspelt key first: it explains the missing one
    shown = "; ".join(_problem(e) for e in problems[:3])
    return shown + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")


def load_policy(path: str | Path, tier: Tier | None = None) -> list[PolicyRule]:
    return load_policy_file(path, tier).rules


def load_policy_file(path: str | Path, tier: Tier | None = None) -> PolicyFile:
    """Load a TOML or YAML policy file the user named (user or admin tier): a trusted path, so it is
    opened normally (process substitution works), but read with the same cap and parsed as strictly
    as a workspace file. The file's own `tier` is used unless the caller fixes one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(POLICY_CAP + 1)
    except OSError as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"cannot read policy {path}: {err.strerror}") from None
    return parse_policy(raw, str(path), path.suffix, tier)


def load_workspace_policy(workspace: Path, rel: str) -> PolicyFile:
    """The workspace's own policy, WORKSPACE/rel: the box may have written it, so it is read only
    through boxfs (no symlink followed, regular files only, capped) and can only tighten."""
    raw = read_workspace_file(workspace, rel, POLICY_CAP)
    return parse_policy(raw, rel, Path(rel).suffix, Tier.WORKSPACE, untrusted=True)


def parse_policy(raw: bytes, where: str, suffix: str, tier: Tier | None = None, untrusted: bool = False) -> PolicyFile:
    """Bytes to a checked PolicyFile. `where` names the file in errors; `suffix` picks TOML or YAML;
    `untrusted` (the box may have written it) parses in a child process with a hard time limit."""
    if len(raw) > POLICY_CAP:
        raise _invalid(where, f"{len(raw)} bytes, over the {POLICY_CAP}-byte cap")
    try:
        data = parse_data_bounded(raw, suffix) if untrusted else parse_data(raw, suffix)
    except Refused as err:
        raise _invalid(where, str(err)) from None
    data = data if data is not None else {}
    if not isinstance(data, dict):
        raise _invalid(where, "the top level must be a table (mapping)")
    _check_names(data, where)
    try:
        policy = PolicyFile.model_validate(data)
    except ValidationError as err:
        raise _invalid(where, f"not valid: {_validation_problem(err)}") from None
    try:
        file_tier = tier if tier is not None else Tier[policy.tier.upper()]
    except KeyError:
        raise _invalid(where, "not valid: tier must be one of default, workspace, user, admin") from None
    rules = [rule.model_copy(update={"tier": file_tier}) for rule in policy.rules]
    if file_tier == Tier.WORKSPACE:
        loose = [i for i, r in enumerate(rules) if r.decision == Decision.ALLOW]
        if loose or policy.egress:
            what = f"rules[{loose[0]}] allows" if loose else "it opens egress"
            raise _invalid(where, f"a workspace policy can only ask or deny, never allow ({what})")
    if policy.trust_workspace_hooks and file_tier <= Tier.WORKSPACE:
        raise _invalid(where, "trust_workspace_hooks is the user's word: a workspace policy cannot trust itself")
    hooks = [hook.placed(int(file_tier), where, index) for index, hook in enumerate(policy.hooks)]
    if policy.egress and policy.egress.allow_cidrs and file_tier != Tier.ADMIN:
        raise _invalid(where, "egress allow_cidrs is admin-only (OA_ADMIN_POLICY)")
    if policy.egress and policy.egress.upstream_ca and file_tier != Tier.ADMIN:
        raise _invalid(where, "egress upstream_ca is admin-only (OA_ADMIN_POLICY)")
    return policy.model_copy(update={"rules": rules, "hooks": hooks, "tier": file_tier.name.lower()})


class Ladder:
    """Maps one prepared call to its rung, given the policy rules in force and the workspace_access
    pins (which hold over every rule, whatever its tier)."""

    def __init__(self, rules: Sequence[PolicyRule] | None = None, access: Sequence[AccessPin] = ()) -> None:
        self.rules = list(rules or [])
        self.access = tuple(access)

    def level(self, tool: str, kind: str, action: str, command: str | None = None) -> tuple[Level, str]:
        """Landing (LAND_TOOL, kind edit, LAND_ACTION) has no question of its own by default: the
        front-end's landing is the request (a command, a flag, the client's call, copy mode's end
        of an ACP turn); a rule that names it (or every edit) decides it like an edit."""
        pinned = next((pin for pin in self.access if pin.refuses(tool, kind, action)), None)
        if pinned is not None:  # a workspace_access level: no rule of any tier widens it
            return Level.REFUSE, pinned.label
        matching = [r for r in self.rules if r.matches(tool, kind, action, command)]
        landing = (tool, kind, action) == (LAND_TOOL, LAND_KIND, LAND_ACTION)
        default = Level.AUTOMATIC if landing else DEFAULT_BY_KIND.get(kind, Level.ASK_EVERY_TIME)
        if not matching:
            return default, f"default ladder: {'land' if landing else kind}"
        top = max(r.tier for r in matching)
        chosen = max((r for r in matching if r.tier == top), key=lambda r: (_STRICTNESS[r.decision], r.specificity))
        label = (
            f"{chosen.tier.name.lower()} policy rule "
            f"{chosen.id or json.dumps(chosen.model_dump(exclude_none=True, exclude={'tier'}))}"
        )
        if chosen.decision == Decision.DENY:
            return Level.REFUSE, label
        if chosen.decision == Decision.ALLOW:
            return Level.AUTOMATIC, label
        return (
            default
            if default in (Level.ASK_ONCE, Level.ASK_EVERY_TIME)
            else Level.ASK_ONCE
            if landing
            else Level.ASK_EVERY_TIME
        ), label
