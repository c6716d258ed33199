"""shell: one command with /bin/sh -c in the box (docs/tools.md#shell)."""

from __future__ import annotations

from pydantic import Field

from sandbox_agent import limits

from .. import network
from ..argbase import Args
from ..tooldef import J_BOOL, J_INT, J_NUM, Approval, McpFace, ToolDef


class ShellArgs(Args):
    command: str = Field(
        min_length=1, max_length=64 * 1024, description="Run with /bin/sh -c in the workspace, no standard input."
    )
    timeout: int = Field(
        default=limits.SHELL_DEFAULT_TIMEOUT_S,
        ge=1,
        le=1_000_000,
        description=f"Seconds; default {limits.SHELL_DEFAULT_TIMEOUT_S}, clamped to {limits.SHELL_MAX_TIMEOUT_S}.",
    )


TOOL = ToolDef(
    "shell",
    "execute",
    "sandbox",
    ShellArgs,
    order=60,
    title="Run a command in the sandbox",
    description=(
        "Run a command with /bin/sh -c in the workspace, with no standard input. Default timeout "
        f"{limits.SHELL_DEFAULT_TIMEOUT_S}s, at most {limits.SHELL_MAX_TIMEOUT_S}s; background "
        f"processes do not outlive the call. Output is capped (head and tail kept). {network.GENERIC}"
    ),
    mutates=True,
    reaches_network=True,
    bounds={
        "timeout_default_s": limits.SHELL_DEFAULT_TIMEOUT_S,
        "timeout_max_s": limits.SHELL_MAX_TIMEOUT_S,
        "output_head_bytes": limits.SHELL_OUTPUT_HEAD_BYTES,
        "output_tail_bytes": limits.SHELL_OUTPUT_TAIL_BYTES,
    },
    approval=Approval(
        describe=lambda args: f"Run in the sandbox: {str(args.get('command', ''))[:200]}", command_arg="command"
    ),
    mcp=McpFace(
        served=True,
        output_doc="The command's combined stdout and stderr (head and tail kept when it is long).",
        result_meta={
            "exit_code": {"type": ["integer", "null"], "description": "null when the command timed out"},
            "timed_out": J_BOOL,
            "timeout_s": J_NUM,
            "output_bytes": J_INT,
            "output_lines": J_INT,
            "output_truncated": J_BOOL,
            "elapsed_s": J_NUM,
        },
    ),
)
