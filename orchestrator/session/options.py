"""SandboxOptions: what a session is opened with, as one typed object, validated once (pydantic,
extra keys refused); the public API's `Sandbox(options, **settings)`, every front-end's flags, and
open_session all take this one type.

Every field is optional; unset ones take the CLI's defaults (the config file is not read: a
program says what it wants). A whole `SandboxConfig` (as the CLI's flags build it) may be given
as `config` instead of the box's fields, never both.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..budget import Budget
from ..config import DEFAULT_MAX_TURNS, EgressConfig, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from ..events import Event
from ..models.base import DEFAULT_MODEL_TIMEOUT_S
from ..policy.approvals import ApprovalRequest
from ..tools.registry import RegistryConfig
from ..workspace.copy import CopyLimits, CopyProgress
from ..workspace.records import WorkspaceMode

# Who answers the ladder's questions: True allows the call once, False refuses it; an Answer says more.
# An object with an `ask(request) -> Answer` method (policy.approvals.Approver: a front-end's) is used as it is.
ApproverCallback = Callable[[ApprovalRequest], Any]
_BOX_FIELDS = (
    "runtime",
    "engine",
    "image",
    "memory",
    "cpus",
    "pids",
    "user",
    "egress",
    "write_quota",
    "entry_quota",
    "start_concurrency",
    "host_code_read_only",
)

MAX_LABELS = 64
_LABEL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")


class SandboxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    mode: Literal["auto", "bind", "copy"] = Field(
        default="auto",
        description="bind: the box writes the workspace; copy: a private copy you "
        "review and apply; auto: copy for a root-owned workspace, else bind.",
    )
    # the box (as --runtime, --image, --memory, --cpus, --pids, --user, --env, --egress,
    # --write-quota, --entry-quota, --host-code-read-only)
    runtime: str | None = None
    engine: Literal["docker", "podman"] | None = None
    image: str | None = None
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None
    user: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    egress: list[str] | EgressConfig | None = Field(
        default=None,
        description="Hosts the box may reach through the egress gate, or a "
        "whole EgressConfig (rules, credentials); default: no network.",
    )
    write_quota: int | None = None
    entry_quota: int | None = None
    start_concurrency: int | None = None
    host_code_read_only: bool | None = Field(
        default=None,
        description="Bind mode on a workspace that holds what the host itself runs or "
        "imports (your program's virtualenv, an editable clone): those entries "
        "mounted read-only in the box. Without it such a workspace is a copy "
        "(mode 'auto') and mode='bind' is refused (--host-code-read-only).",
    )
    config: SandboxConfig | None = Field(
        default=None, description="A whole SandboxConfig instead of the box's fields above."
    )
    # copy mode's size guard (--copy-max-bytes, --copy-max-entries)
    copy_max_bytes: int | None = Field(default=None, ge=1)
    copy_max_entries: int | None = Field(default=None, ge=1)
    on_copy_progress: Callable[[CopyProgress], None] | None = Field(
        default=None, description="Told how a long copy goes (copy mode)."
    )
    # approvals (--policy, --auto-approve; an approver callback instead of a terminal)
    policy_files: list[Path] = Field(default_factory=list)
    auto_approve: bool = Field(
        default=False,
        description="Whatever would ask and runs inside the box proceeds without asking: the "
        "program's own calls and a model's in run() (as --auto-approve).",
    )
    approver: ApproverCallback | Any | None = None
    approve: Literal["program", "ask"] | None = Field(
        default=None,
        description=(
            "Who answers what the ladder would ask about the program's own calls. "
            "'program' (the default without an approver): "
            "they run, as `oa-sandbox exec`'s do (a deny still refuses). "
            "'ask' (the default with an approver): the approver is "
            "asked, and without one they are refused (as --non-interactive). "
            "A model's calls in run() are the approver's, or "
            "auto_approve's, either way."
        ),
    )
    # the record and the transcript
    transcript: Path | None = Field(
        default=None, description="Where the JSONL transcript goes (default: the session's state directory)."
    )
    on_event: Callable[[Event], None] | None = Field(
        default=None, description="Called with every typed event the transcript records."
    )
    on_record: Callable[[dict[str, Any]], None] | None = Field(
        default=None,
        description="Called with every transcript record as the JSON "
        "object written (what --output stream-json prints).",
    )
    resume: str | None = Field(
        default=None,
        description="The id of one of the caller's sessions to open again (`run --resume`'s): its "
        "workspace (its copy, in copy mode), its transcript appended to, its conversation "
        "for `model`. Without a model any session will do (an API session, a fork).",
    )
    labels: dict[str, str] | None = Field(
        default=None,
        description="The program's own names for the session, kept in its record (and a "
        "fork's): sessions.list_sessions(labels=...) finds it. On resume, "
        "None keeps the record's.",
    )
    # how long the box lives
    idle_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds without a call after which the sandbox closes itself "
        "(a call running, or a model's run, is not idleness).",
    )
    lifetime: float | None = Field(
        default=None,
        gt=0,
        description="Seconds after its open at which the sandbox closes itself, killing whatever runs.",
    )
    # the model (--model, --base-url, --api-key-env): run()'s when it names none;
    # given here, it is checked before the box starts
    model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    # the tools
    disabled_tools: frozenset[str] = frozenset()
    git: bool = Field(
        default=True, description="Offer the host-side git tool to a model run (as `run` does unless --no-git)."
    )
    host_tools: Any | None = Field(
        default=None,
        description="Host-side tools offered beside the six (tools.registry.HostTools: the user's "
        "MCP servers, started, as mcp.client.McpHost); their owner stops them.",
    )
    context_files: bool = True
    # an agent run's limits (run()): as --max-turns, --max-tokens, --max-wall, --model-timeout, --context-window
    max_turns: int = Field(default=DEFAULT_MAX_TURNS, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_wall_s: float | None = Field(default=None, gt=0)
    model_timeout_s: float = Field(default=DEFAULT_MODEL_TIMEOUT_S, gt=0)
    context_window: int | None = Field(default=None, ge=256)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels")
        for name, said in value.items():
            if not _LABEL_NAME.match(name):
                raise ValueError(f"{name!r} is not a label name (letters, digits, '_', '-', '.'; at most 64)"[:200])
            if len(said) > 256 or any(ord(c) < 32 or ord(c) == 127 for c in said):
                raise ValueError(
                    f"the label {name}'s value must be at most 256 characters, none of them a control character"
                )
        return value

    @classmethod
    def of(cls, options: "SandboxOptions | None", settings: dict[str, Any]) -> "SandboxOptions":
        """`options` with `settings` (keyword arguments) over it; a typed error for a wrong one."""
        if options is not None and not isinstance(options, SandboxOptions):
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"options must be a SandboxOptions, not {type(options).__name__}"
            )
        try:
            if options is None:
                return cls(**settings)
            given = {
                name: getattr(options, name) for name in options.model_fields_set
            }  # as given: objects stay themselves
            return cls(**{**given, **settings}) if settings else options
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in err.errors()[:5]
            )
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"sandbox options: {problems}") from None
        except TypeError as err:
            raise OpenAgentsError(ErrorType.INVALID_ARGUMENTS, f"sandbox options: {err}") from None

    def sandbox_config(self) -> SandboxConfig:
        given = {name: getattr(self, name) for name in _BOX_FIELDS if getattr(self, name) is not None}
        if self.config is not None:
            if given or self.env:
                raise OpenAgentsError(
                    ErrorType.INVALID_ARGUMENTS,
                    f"sandbox options: config and {', '.join(given) or 'env'} both given: say one",
                )
            return self.config
        try:
            if isinstance(given.get("egress"), list):
                given["egress"] = EgressConfig(allow=given["egress"])
            return SandboxConfig(**given, env=dict(self.env))
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise OpenAgentsError(
                ErrorType.INVALID_ARGUMENTS, f"sandbox options: {where + ': ' if where else ''}{first['msg']}"
            ) from None

    def workspace_mode(self) -> WorkspaceMode:
        return WorkspaceMode(self.mode)

    def copy_limits(self) -> CopyLimits:
        limits = CopyLimits()
        return CopyLimits(
            max_bytes=self.copy_max_bytes or limits.max_bytes,
            max_entries=self.copy_max_entries or limits.max_entries,
            progress=self.on_copy_progress,
        )

    def registry_config(self) -> RegistryConfig:
        """The tools offered (disabled_tools, git)."""
        return RegistryConfig(disabled=set(self.disabled_tools), git=self.git)

    def run_budget(self) -> Budget:
        """A model run's budgets (max_tokens, max_wall_s, context_window)."""
        return Budget(max_tokens=self.max_tokens, max_wall_s=self.max_wall_s, context_window=self.context_window)

    def with_model(self, model: str | None, base_url: str | None, api_key_env: str | None) -> "SandboxOptions":
        """These options with another model (the API's run(model=...))."""
        return self.model_copy(update={"model": model, "base_url": base_url, "api_key_env": api_key_env})
