"""What a program's `env=` and `cwd=` become in the box (issue 46).

What a program passes explicitly reaches the box's commands, whatever its name:
- `shell(..., env=..., cwd=...)`: the command is sent as `export NAME='value'` lines and a
  `cd -- 'dir' || exit 1` line before the command itself, each value quoted for /bin/sh (the shell
  tool's arguments are the command and its timeout; the agent runs every command in /workspace).
  The policy, the hooks and the transcript see that whole command.
- `SandboxOptions(env=...)`: the box's environment. The agent's shell leaves out of a command's
  environment every name that looks secret (sandbox_agent/limits.py SECRET_NAME_PATTERN: AUTH,
  TOKEN, KEY ... so GIT_AUTHOR_NAME and MAX_TOKENS too), so the sandbox exports those names to each
  command itself (api/turns.py), below the pipeline: the command recorded is the one given.
Values of names that look secret are redacted in the transcript (the session's redactor holds them).

What never enters the box, whatever a program passes: the host's model keys (every model family's
key variable and `api_key_env`) and the variables an egress credential is made from (the gate
injects those on the host side). A name among them, or a value equal to one of them, is left out
with a warning naming the variable (`EnvWarning`).
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from typing import TYPE_CHECKING, Any, Mapping

from ..config import EgressConfig
from ..errors import ErrorType
from ..models.dialects import DIALECTS
from ..transcript import SECRET_NAME
from .results import ToolError

if TYPE_CHECKING:
    from .options import SandboxOptions

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class EnvWarning(UserWarning):
    """A variable a program passed that never enters the box (a model key, an egress credential's)."""


def never_passed(options: SandboxOptions) -> dict[str, str]:
    """The host variables whose name or value never enters the box -> what each is."""
    out = {dialect.key_variable: "a model key" for dialect in DIALECTS.values() if dialect.key_variable}
    if options.api_key_env:
        out[options.api_key_env] = "the model's key (api_key_env)"
    egress = options.config.egress if options.config is not None else options.egress
    if isinstance(egress, EgressConfig):
        for credential in egress.credentials:
            for name in credential.variables:
                out[name] = (
                    f"an egress credential's (the gate adds it to requests to {credential.host} on the host side)"
                )
    return out


def checked(where: str, env: Any) -> dict[str, str]:
    """`env` as a dict of variable names to str values; a typed error for anything else."""
    if not isinstance(env, Mapping):
        raise ToolError(
            ErrorType.INVALID_ARGUMENTS, f"{where}: env must be a dict of str to str, not {type(env).__name__}"
        )
    for name, value in env.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{where}: env: {name!r} is not a variable name"[:200])
        if not isinstance(value, str) or "\0" in value:
            raise ToolError(ErrorType.INVALID_ARGUMENTS, f"{where}: env: the value of {name} must be a str without NUL")
    return dict(env)


def screened(where: str, env: Mapping[str, str], never: Mapping[str, str]) -> dict[str, str]:
    """`env` without what never enters the box, each left out with an EnvWarning naming the variable."""
    kept = {}
    for name, value in env.items():
        why = f"{name} is {never[name]}" if name in never else None
        for variable, what in never.items():
            if why is None and value and os.environ.get(variable) == value:
                why = f"its value is that of {variable}, {what}"
        if why is None:
            kept[name] = value
        else:
            warnings.warn(
                f"{where}: {name} is not passed into the box: {why}, which never enters the box",
                EnvWarning,
                stacklevel=4,
            )
    return kept


def looks_secret(name: str) -> bool:
    """A name the agent's shell leaves out of a command's environment, and whose value the transcript redacts."""
    return SECRET_NAME.search(name) is not None


def exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def command_with(command: str, cwd: str | None, env: Mapping[str, str]) -> str:
    """The command as sent: `env`'s exports, then a `cd` into `cwd` (relative to /workspace, or
    absolute) that ends the command with exit 1 if it fails, then the command itself."""
    enter = f"cd -- {shlex.quote(cwd)} || exit 1\n" if cwd is not None else ""
    return exports(env) + enter + command
