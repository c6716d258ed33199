"""Which way imports go between the folders of orchestrator/ (issue 36), written once, here, as data.

LAYERS lists the parts of orchestrator/ from the ground up: a folder, or a module at the root. A
module may import a module of its own part, or of a part in a layer *below* its own; never one of
its own layer's other parts, never one above (imports inside functions count, and so do
`if TYPE_CHECKING:` blocks: the same reading as tests/architecture/test_layout.py). So no two folders import each other,
and a low part never climbs back to a high one. docs/architecture.md's map is checked against
this data (test_the_architecture_doc_follows_the_layers), so it cannot go stale.
"""

from __future__ import annotations

import re

from tests.helpers.layout import PACKAGE, ROOT, import_graph, knots

# Ground up. Each entry: the parts of one layer, and what they own (the doc's words).
LAYERS: list[dict[str, str]] = [
    {
        "ground": "leaf modules that import nothing of ours: text shown safely and JSON lines (text.py), "
        "a deadline in a child process (deadline.py), the command line's exit codes (exit_codes.py), "
        "how many forks one call may make (forks.py)",
        "errors": "the one error taxonomy: ErrorType (recoverable or fatal) and OpenAgentsError",
        "config": "the sandbox's configuration: limits, runtimes, egress rules",
        "host_memory": "the host process's allocator tuned so its memory follows the work",
    },
    {
        "protocol": "the wire messages between host and container agent, and ToolResult, every call's outcome",
        "state": "the state directory, where the host keeps what a session leaves behind (owned, never box-writable)",
    },
    {
        "boxfs": "the one safe-file layer: every read, walk, copy and restore of box-written files; "
        "host-owned files opened with no link followed (private.py) and written atomically (atomic.py)",
        "programs": "what the host starts for the user, kept out of the box's reach: whether the box "
        "can change what a path names (reach.py), hooks' and MCP servers' programs found "
        "once outside every box root (resolve.py), the system's own programs (system.py)",
    },
    {"events": "the typed events of a session (what the transcript records and front-ends show)"},
    {
        "terminal": "painting a session for a person or a machine (live view, machine lines)",
        "models": "the model clients: one dialect per family (models/dialects/), the one HTTP client, the "
        "model-neutral conversation and the call type (ToolCall) with the one argument parser",
    },
    {
        "tools": "the tools: one declaration per tool (defs/), the owner's actions as declarations (owner.py), "
        "the catalog, arguments, each family's declarations, the registry that runs them, host git, "
        "our MCP client (mcp/)"
    },
    {
        "budget": "a session's budgets: tokens, wall time, the context window and compaction",
        "workspace": "the user's workspace: copies, checkpoints, review and landing, forks, session records",
    },
    {
        "transcript": "the JSONL transcript: writing, reading back, resuming",
        "policy": "the policy value a session starts with (value.py: SessionPolicy) and its loading (load.py), "
        "the approval ladder, policy files and their [[hooks]] specs, pins",
    },
    {"sandbox": "the container: Docker/gVisor backends, egress proxy, pool, reaping, sweeps"},
    {"hooks": "running the user's hook programs at the loop's points"},
    {"pipeline": "the one call pipeline every action goes through: approval, hooks, execution, events"},
    {"loop": "the turn loop (TurnLoop) and the run summary it ends with"},
    {
        "session": "a session: its one options type (options.py: SandboxOptions), its assembly (assemble.py: "
        "open_session) and its open parts (opened.py: OpenSession)"
    },
    {"report": "the HTML report of a session"},
    {
        "api": "the public Python API (Sandbox, AsyncSandbox), what `import orchestrator` exports, and the "
        "methods a front-end drives a session with (driving.py)"
    },
    {"__init__": "`import orchestrator`: the public names, loaded from api/ on first use"},
    {
        "batch": "many tasks at once (local processes or Ray)",
        "mcp": "the MCP server: a session offered to other agents",
        "acp": "the ACP agent: a session inside an editor",
    },
    {"plugins": "harness plug-ins (Inspect AI, mini-swe-agent, SWE-ReX)", "cli": "the oa-sandbox command"},
]

PACKAGE_INIT = "__init__"  # orchestrator/__init__.py


def part_of(module: str) -> str:
    """The part a module belongs to: its folder under orchestrator/, or its own name at the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE_INIT


def rank() -> dict[str, int]:
    return {part: i for i, layer in enumerate(LAYERS) for part in layer}


def against(graph: dict[str, set[str]], ranks: dict[str, int]) -> list[str]:
    """Every import from a part to another part not in a lower layer."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = part_of(module), part_of(target)
            if a != b and ranks[b] >= ranks[a]:
                found.append(f"{module} -> {target}  ({a}, layer {ranks[a]}, imports {b}, layer {ranks[b]})")
    return found


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {part_of(m): set() for m in graph}
    for module, targets in graph.items():
        out[part_of(module)].update(part_of(t) for t in targets if part_of(t) != part_of(module))
    return out


def test_every_part_has_a_layer() -> None:
    """A new folder or root module gets a place in LAYERS (and so in docs/architecture.md)."""
    parts = {part_of(m) for m in import_graph()}
    listed = set(rank())
    assert parts - listed == set(), f"parts of orchestrator/ with no layer in LAYERS: {sorted(parts - listed)}"
    assert listed - parts == set(), f"LAYERS names parts that are not there: {sorted(listed - parts)}"


def test_imports_go_down_the_layers() -> None:
    found = against(import_graph(), rank())
    assert not found, "imports against the layers (tests/architecture/test_layering.py LAYERS):\n" + "\n".join(found)


def test_no_folder_circles() -> None:
    assert knots(folder_graph(import_graph())) == []


def test_the_ground_floor_imports_nothing_of_ours() -> None:
    graph = import_graph()
    ground = {m: t for m, t in graph.items() if part_of(m) == "ground"}
    assert len(ground) >= 3  # the check sees the ground floor
    assert all(not targets for targets in ground.values()), ground


def test_the_check_finds_a_climb_and_a_circle() -> None:
    """The checks above on graphs whose answer is known (a check that sees nothing would pass)."""
    ranks = {"low": 0, "mid": 1, "high": 2, "other": 1, PACKAGE_INIT: 3}
    graph = {
        "orchestrator.low.a": {"orchestrator.high.b"},
        "orchestrator.high.b": {"orchestrator.low.a"},
        "orchestrator.mid.c": {"orchestrator.other.d"},
        "orchestrator.other.d": set(),
    }
    assert against(graph, ranks) == [
        "orchestrator.low.a -> orchestrator.high.b  (low, layer 0, imports high, layer 2)",
        "orchestrator.mid.c -> orchestrator.other.d  (mid, layer 1, imports other, layer 1)",
    ]
    assert knots(folder_graph(graph)) == [["high", "low"]]


ARCHITECTURE = ROOT / "docs" / "architecture.md"


def architecture_table() -> str:
    """The map's table, as docs/architecture.md must hold it (top layer first, the way one reads down)."""
    rows = ["| Layer | Part | What it owns |", "|---|---|---|"]
    for i, layer in reversed(list(enumerate(LAYERS))):
        for part, owns in layer.items():
            kind = "folder" if (PACKAGE / part).is_dir() else "module"
            name = f"`{part}/`" if kind == "folder" else f"`{part}.py`"
            rows.append(f"| {i} | {name} | {owns} |")
    return "\n".join(rows)


def test_the_architecture_doc_follows_the_layers() -> None:
    """docs/architecture.md holds the table generated from LAYERS, between its markers; on a change of
    LAYERS, paste the printed table there."""
    text = ARCHITECTURE.read_text()
    match = re.search(r"<!-- layers: begin -->\n(.*?)\n<!-- layers: end -->", text, re.S)
    assert match, "docs/architecture.md has no <!-- layers: begin --> ... <!-- layers: end --> table"
    expected = architecture_table()
    assert match.group(1) == expected, "docs/architecture.md's layer table is stale; it should read:\n" + expected


if __name__ == "__main__":  # print the table for docs/architecture.md
    print(architecture_table())
