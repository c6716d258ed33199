"""The agent's tool table: each tool's module and function (imported at its first call or in the warm-up, server.py)
and the bounds the agent enforces on a call of it, by name. The host declares the same tools with
the same bounds (orchestrator/tools/defs/, each ToolDef's `bounds`); tests/unit/test_tool_table.py holds
the two tables to each other, and runs the agent to see it keeps these bounds.

A leaf: it imports only limits and does nothing when imported, so the host may import it freely."""

from __future__ import annotations

from . import limits

TYPE_CHECKING = False  # not typing's: importing typing costs the agent's start 10-25 ms
if TYPE_CHECKING:
    from typing import Mapping

# name -> (module, function, bounds)
TOOLS: dict[str, tuple[str, str, Mapping[str, int]]] = {
    "read_file": (
        "reading",
        "read_file",
        {"read_cap_bytes": limits.READ_CAP_BYTES, "default_lines": limits.READ_DEFAULT_LIMIT_LINES},
    ),
    "list_files": ("listing", "list_files", {"max_entries": limits.LIST_MAX_ENTRIES}),
    "grep_files": (
        "search",
        "grep_files",
        {
            "max_lines": limits.GREP_MAX_LINES,
            "line_chars": limits.GREP_LINE_CHARS,
            "max_line_bytes": limits.GREP_MAX_LINE_BYTES,
            "timeout_s": limits.GREP_TIMEOUT_S,
        },
    ),
    "write_file": ("writing", "write_file", {"max_bytes": limits.WRITE_MAX_BYTES}),
    "edit_file": ("writing", "edit_file", {"max_file_bytes": limits.EDIT_MAX_FILE_BYTES}),
    "shell": (
        "shell",
        "shell",
        {
            "timeout_default_s": limits.SHELL_DEFAULT_TIMEOUT_S,
            "timeout_max_s": limits.SHELL_MAX_TIMEOUT_S,
            "output_head_bytes": limits.SHELL_OUTPUT_HEAD_BYTES,
            "output_tail_bytes": limits.SHELL_OUTPUT_TAIL_BYTES,
        },
    ),
}

# How the box runs a call of each tool, beyond the default (a short call, at the host's fixed per-call
# deadline, that starts nothing and writes nothing): the host's BoxRule (orchestrator/protocol.py) reads
# this, and so does the agent (server.py: a tool that `streams` gets its output sent while it runs).
# timeout_arg: the argument naming the call's own seconds (the bounds' timeout_default_s/timeout_max_s
# clamp it); exclusive: a command, named by a key so a cancel kills it alone; writes: may grow the
# workspace (the write quota is polled after it); spawns: may leave processes of its own in the box.
# The program's own operations (OPS below) have rules here too: a background process (proc_start) is
# one the box holds beside its agent, so a kill of what runs (a cancel, a rollback, the quota) ends it.
RULES: dict[str, Mapping[str, object]] = {
    "write_file": {"writes": True},
    "edit_file": {"writes": True},
    "shell": {"timeout_arg": "timeout", "exclusive": True, "streams": True, "writes": True, "spawns": True},
    "proc_start": {"spawns": True},
}

# The program's own operations (the Python API's bytes and processes: orchestrator/api/), never a
# model's tools: the host sends them only from its own calls' pipeline (api/box_files.py).
OPS: dict[str, tuple[str, str]] = {
    "bytes_read": ("transfer", "bytes_read"),
    "bytes_write": ("transfer", "bytes_write"),
    "bytes_abort": ("transfer", "bytes_abort"),
    "proc_start": ("processes", "proc_start"),
    "proc_read": ("processes", "proc_read"),
    "proc_write": ("processes", "proc_write"),
    "proc_wait": ("processes", "proc_wait"),
    "proc_kill": ("processes", "proc_kill"),
    "proc_list": ("processes", "proc_list"),
    "proc_sweep": ("processes", "proc_sweep"),
}
