"""The public API's options: SandboxOptions (session/options.py, the one options type) and how a
set-up error names what a program passed: its Python keyword, where the CLI's message names a flag.
"""

from __future__ import annotations

import re

from ..errors import OpenAgentsError
from ..session.options import SandboxOptions

# The front-ends whose users typed the CLI's flags: their errors keep naming them. Any other kind (a
# program's `api`, a plug-in's) gets the Python keywords instead (in_keywords).
CLI_KINDS = frozenset({"run", "exec", "mcp", "acp", "batch"})
# A CLI flag a set-up error may name -> the SandboxOptions field a program passes instead.
FLAG_FIELDS = {
    "workspace-mode": "mode",
    "copy-max-entries": "copy_max_entries",
    "copy-max-bytes": "copy_max_bytes",
    "runtime": "runtime",
    "engine": "engine",
    "image": "image",
    "memory": "memory",
    "cpus": "cpus",
    "pids": "pids",
    "user": "user",
    "env": "env",
    "egress": "egress",
    "write-quota": "write_quota",
    "entry-quota": "entry_quota",
    "start-concurrency": "start_concurrency",
    "policy": "policy_files",
    "auto-approve": "auto_approve",
    "non-interactive": "approve",
    "resume": "resume",
    "transcript": "transcript",
    "model": "model",
    "base-url": "base_url",
    "api-key-env": "api_key_env",
    "max-turns": "max_turns",
    "max-tokens": "max_tokens",
    "max-wall": "max_wall_s",
    "model-timeout": "model_timeout_s",
    "context-window": "context_window",
    "disable": "disabled_tools",
    "no-git": "git",
}
_FLAG = re.compile(
    r"--([a-z][a-z0-9-]*)(?: ([A-Z][A-Z0-9_:]*\b|[0-9][0-9.:]*\b|bind\b|copy\b|auto\b|runc\b|runsc\b|[^\s:'\"]+(?=:)))?"
)


def in_keywords(err: OpenAgentsError) -> OpenAgentsError:
    """The same error, its message naming the keyword a program passed where it named a CLI flag
    (`--copy-max-entries N` -> `copy_max_entries=N`, `--workspace-mode copy` -> `mode="copy"`)."""

    def keyword(match: re.Match[str]) -> str:
        field = FLAG_FIELDS.get(match.group(1))
        if field is None:
            return match.group(0)
        value = match.group(2)
        if value is None:
            return f"{field}="
        return f"{field}={value}" if value[0].isdigit() or value.isupper() else f'{field}="{value}"'

    said = _FLAG.sub(keyword, err.message)
    if said != err.message:
        err.message, err.args = said, (said,)
    return err


__all__ = ["CLI_KINDS", "FLAG_FIELDS", "SandboxOptions", "in_keywords"]
