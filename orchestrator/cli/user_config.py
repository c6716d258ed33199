"""The user's defaults: `$XDG_CONFIG_HOME/openagents-sandbox/config.toml` (~/.config/... without it).

Every key is a flag's default; a flag given on the command line wins. A typo is refused with one
line naming the file, the key and what is allowed, never silently ignored:

    model = "openai:gpt-4o-mini"
    base_url = "http://127.0.0.1:8080/v1"
    policy = ["~/policies/ci.toml"]
    max_turns = 50
    max_tokens = 200000
    start_concurrency = 4    # sandbox starts this process runs at once; the rest wait in line
    copy_max_bytes = "4g"    # copy mode's size guard (default 2g of data, 200000 entries)
    copy_max_entries = 400000
    host_code_read_only = true  # bind mode with oa-sandbox's own venv/clone in the workspace read-only in the box

    [[mcp_servers]]          # your own stdio MCP servers, started on the host for `run`
    name = "notes"
    command = "/usr/local/bin/notes-mcp"
    args = ["--stdio"]
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ErrorType, OpenAgentsError
from ..models.dialects import MODEL_FORMS
from ..policy.ladder import FORBIDDEN_NAME, did_you_mean
from ..state import config_path

CONFIG_CAP = 64 * 1024


class UserConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, description=f"{MODEL_FORMS}.")
    base_url: str | None = None
    api_key_env: str | None = None
    policy: list[str] = Field(
        default_factory=list, description="Policy files, applied as if each was given with --policy."
    )
    runtime: str | None = None
    engine: Literal["docker", "podman"] | None = Field(default=None, description="docker or podman (--engine).")
    image: str | None = None
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None
    start_concurrency: int | None = Field(
        default=None, ge=1, le=256, description="Sandbox starts one process runs at once (default 4)."
    )
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_tokens: int | None = Field(default=None, ge=1)
    max_wall: float | None = Field(default=None, gt=0, description="Seconds.")
    model_timeout: float | None = Field(
        default=None, gt=0, description="Seconds the model server may stay silent (--model-timeout; default 300)."
    )
    context_window: int | None = Field(default=None, ge=256)
    copy_max_bytes: str | int | None = Field(
        default=None, description="Copy mode's size guard: most data, e.g. 4g (default 2g)."
    )
    copy_max_entries: int | None = Field(
        default=None, ge=1, description="Copy mode's size guard: most entries (default 200000)."
    )
    host_code_read_only: bool | None = Field(
        default=None,
        description="Bind mode on a workspace holding what oa-sandbox itself runs or "
        "imports, with those entries read-only in the box (--host-code-read-only).",
    )
    mcp_servers: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        description="Your stdio MCP servers for `run`, started on the host: [[mcp_servers]] name, command, args, env.",
    )


# The file's keys for a session, as the one options type (api SandboxOptions) names them.
_SESSION_KEYS = {
    "model": "model",
    "base_url": "base_url",
    "api_key_env": "api_key_env",
    "policy": "policy_files",
    "max_turns": "max_turns",
    "max_tokens": "max_tokens",
    "max_wall": "max_wall_s",
    "model_timeout": "model_timeout_s",
    "context_window": "context_window",
}


def session_fields(config: UserConfig, **flags: Any) -> dict[str, Any]:
    """The SandboxOptions fields a session takes from the file (model, policy, budgets), each flag
    given winning (by the SandboxOptions name: `max_wall_s=`, `policy_files=`): the one conversion of
    the file's keys to the one options type, which validates them once. Unset ones are left out, so
    SandboxOptions' defaults (the CLI's) apply."""
    fields: dict[str, Any] = {}
    for key, field in _SESSION_KEYS.items():
        value = flags.get(field) or getattr(config, key)
        if field == "policy_files" and value:
            value = [Path(p) for p in value]
        if value is not None and value != []:
            fields[field] = value
    return fields


def load_user_config(path: Path | None = None) -> UserConfig:
    """The file's settings, or the defaults when there is no file; CONFIG_INVALID, one line per problem."""
    path = path or config_path()
    try:
        with open(path, "rb") as fh:
            raw = fh.read(CONFIG_CAP + 1)
    except FileNotFoundError:
        return UserConfig()
    except OSError as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"config {path}: cannot read it: {err.strerror}") from None
    if len(raw) > CONFIG_CAP:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"config {path}: over {CONFIG_CAP} bytes")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"config {path}: not TOML: {err}") from None
    if isinstance(data.get("policy"), str):
        data["policy"] = [data["policy"]]
    allowed = list(UserConfig.model_fields)
    problems = []
    for key in data:
        if FORBIDDEN_NAME.search(key):
            problems.append(f"{key}: refused: no option may be named like 'bypass'")
        elif key not in allowed:
            problems.append(f"{key}: unknown key{did_you_mean(key, allowed)}; allowed keys: {', '.join(allowed)}")
    if not problems:
        try:
            config = UserConfig.model_validate(data)
        except ValidationError as err:
            problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors(include_url=False)]
        else:
            config.policy = [str(Path(p).expanduser()) for p in config.policy]
            return config
    raise OpenAgentsError(ErrorType.CONFIG_INVALID, "\n".join(f"config {path}: {p}" for p in problems))
