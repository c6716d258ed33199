"""Background processes (issue 46) as host tools of the session's registry, the program's own, as
box_files.py's: `process_start` (kind execute: a policy's rule on `shell`'s kind, or `tool =
"process_start"` with a `command_prefix`, decides it as it decides a command), `process_read`,
`process_wait` and `process_list` (kind read), `process_write` and `process_kill` (kind execute).
Each is one call of the session's pipeline: decided, hooked, recorded. The box's side is
sandbox_agent/processes.py (a keeper in the box is the processes' parent; each keeps its last MiB of
output; at most 16 run at once)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from sandbox_agent import limits

from ..protocol import BoxCall, BoxRule, ToolResult
from ..tools.catalog import PROCESS_TOOLS
from ..tools.registry import HostTools, OwnHostTools, PreparedCall
from ..tools.tooldef import Approval, BoxCaller, ToolDef

START, READ, WRITE, WAIT, KILL, LIST = PROCESS_TOOLS
ID = Field(min_length=1, max_length=40, pattern=r"^p[0-9]+$")
WAIT_MAX_S = 60


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StartArgs(_Args):
    command: str = Field(min_length=1, max_length=64 * 1024)


class ReadArgs(_Args):
    id: str = ID
    since: int = Field(default=0, ge=0)
    wait: int = Field(default=0, ge=0, le=WAIT_MAX_S)


class WriteArgs(_Args):
    id: str = ID
    data: str = Field(default="", max_length=(limits.BYTES_CHUNK // 3 + 1) * 4)  # base64
    close: bool = False


class WaitArgs(_Args):
    id: str = ID
    timeout: int = Field(default=0, ge=0, le=WAIT_MAX_S)


class KillArgs(_Args):
    id: str = ID


class ListArgs(_Args):
    pass


def _describe(verb: str) -> Callable[[Any], str]:
    return lambda args: f"{verb} background process {str(args.get('id'))[:40]}"


# side "sandbox": they act in the box (auto_approve covers them, as it covers shell)
SPECS: dict[str, tuple[ToolDef, str]] = {
    START: (
        ToolDef(
            START,
            "execute",
            "sandbox",
            StartArgs,
            title="Start a background process in the box",
            approval=Approval(
                describe=lambda args: f"start in the background: {str(args.get('command'))[:200]}",
                command_arg="command",
            ),
        ),
        "proc_start",
    ),
    READ: (
        ToolDef(READ, "read", "sandbox", ReadArgs, approval=Approval(describe=_describe("read the output of"))),
        "proc_read",
    ),
    WRITE: (
        ToolDef(WRITE, "execute", "sandbox", WriteArgs, approval=Approval(describe=_describe("write to the stdin of"))),
        "proc_write",
    ),
    WAIT: (ToolDef(WAIT, "read", "sandbox", WaitArgs, approval=Approval(describe=_describe("wait for"))), "proc_wait"),
    KILL: (ToolDef(KILL, "execute", "sandbox", KillArgs, approval=Approval(describe=_describe("kill"))), "proc_kill"),
    LIST: (
        ToolDef(
            LIST, "read", "sandbox", ListArgs, approval=Approval(describe=lambda args: "list the background processes")
        ),
        "proc_list",
    ),
}


# Each declaration carries the rule the agent's table states for its operation (table.RULES): a start
# spawns, so the box is known to hold processes a kill must end (sandbox/base.py kill_processes).
SPECS = {name: (replace(spec, box=BoxRule.of_agent(op)), op) for name, (spec, op) in SPECS.items()}


class BoxProcesses(OwnHostTools):
    """The process tools, in front of the host tools the session had (`inner`)."""

    DECLARED = tuple(spec for spec, _ in SPECS.values())  # their calls validated as any tool's (ToolDef.validate)
    LISTED = False

    def __init__(self, box: Callable[[], BoxCaller], issued: set[str], inner: HostTools | None = None) -> None:
        super().__init__(inner, issued)
        self.box = box

    def invoke_own(self, prepared: PreparedCall) -> ToolResult:
        op = SPECS[prepared.spec.name][1]
        return self.box().run(BoxCall(op, prepared.args.model_dump(), prepared.spec.box))
