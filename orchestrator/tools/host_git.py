"""The client-side git tool: runs on the host, never in the sandbox, with hooks and pagers off.

status, diff and log are read-only (automatic); commit asks once; push asks every time.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandbox_agent.paths import PathRefused, check_lexical

from ..errors import ErrorType, OpenAgentsError
from ..protocol import Executor, ToolResult

GIT_OUTPUT_CAP = 48 * 1024
READ_ONLY = ("status", "diff", "log")


class GitArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    subcommand: Literal["status", "diff", "log", "commit", "push"]
    message: str | None = Field(default=None, max_length=10_000, description="Commit message (commit only).")
    paths: list[str] = Field(default_factory=list, max_length=100, description="Workspace paths to limit diff, log or commit to.")

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        for path in value:
            try:
                check_lexical(path)
            except PathRefused as err:
                raise ValueError(str(err)) from None
            if path.startswith("-"):
                raise ValueError(f"a path may not start with '-': {path!r}")
        return value


def action(args: GitArgs) -> str:
    return f"git {args.subcommand}"


def run_git(workspace: Path, args: GitArgs, timeout_s: float = 120.0) -> ToolResult:
    base = ["git", "-C", str(workspace), "-c", "core.hooksPath=/dev/null", "-c", "core.pager=cat", "-c", "color.ui=false"]
    sub = args.subcommand
    if sub == "status":
        cmd = base + ["status", "--short", "--branch"]
    elif sub == "diff":
        cmd = base + ["diff", "--stat", "-p", "--"] + args.paths
    elif sub == "log":
        cmd = base + ["log", "--oneline", "-n", "30", "--"] + args.paths
    elif sub == "commit":
        if not args.message:
            return ToolResult.failure(OpenAgentsError(ErrorType.INVALID_ARGUMENTS, "commit needs a message"))
        add = subprocess.run(base + ["add", "--", *(args.paths or ["."])], capture_output=True, text=True, timeout=timeout_s, env=_git_env())
        if add.returncode != 0:
            return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, "git add failed"), output=add.stdout + add.stderr)
        cmd = base + ["commit", "-m", args.message]
    else:
        cmd = base + ["push"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=_git_env())
    except subprocess.TimeoutExpired:
        return ToolResult.failure(OpenAgentsError(ErrorType.TIMEOUT, f"git {sub} took longer than {timeout_s:.0f}s"))
    except FileNotFoundError:
        return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, "git is not installed on the host"))
    output = (proc.stdout + proc.stderr)[:GIT_OUTPUT_CAP]
    if proc.returncode != 0:
        return ToolResult.failure(OpenAgentsError(ErrorType.IO_ERROR, f"git {sub} exited {proc.returncode}"), output=output)
    return ToolResult(ok=True, output=output or "(no output)", executor=Executor.OPENAGENTS)


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "USER", "SSH_AUTH_SOCK", "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    return env
