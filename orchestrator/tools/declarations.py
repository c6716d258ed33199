"""What each model family sees of a tool: name, description, JSON schema. Data only, resolved from a
base plus per-family overrides, so the exact declaration a family receives is testable alone
(tests/snapshots/). Invocation lives elsewhere (registry.py)."""
from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from sandbox_agent import limits

from .args import ARGS_MODELS
from .host_git import GitArgs

FAMILIES = ("openai", "gemini", "anthropic")

BASE_DESCRIPTIONS: dict[str, str] = {
    "read_file": (
        f"Read a text file in the workspace. Returns at most {limits.READ_CAP_BYTES // 1024} KiB; when cut, the result says "
        "which line to read on from (pass it as offset). The result shows the file's sha256: pass it to edit_file as "
        "expected_sha256 so the edit is refused if the file changed meanwhile."
    ),
    "list_files": f"List files and directories under a workspace path (at most {limits.LIST_MAX_ENTRIES} entries; .git, node_modules, target and dist are skipped). Directories end with '/'.",
    "grep_files": f"Search file contents with a regular expression; returns path:line:text, at most {limits.GREP_MAX_LINES} matching lines.",
    "write_file": "Create or replace a whole file in the workspace (never under .git). Parent directories are created. The write is atomic.",
    "edit_file": (
        "Replace an exact piece of text in a file. old_text must match exactly and once, unless allow_multiple is true. "
        "Line endings and a byte-order mark are kept. Prefer this to write_file for changes to existing files."
    ),
    "shell": (
        f"Run a command with /bin/sh -c in the workspace, with no standard input and no network. Default timeout "
        f"{limits.SHELL_DEFAULT_TIMEOUT_S}s, at most {limits.SHELL_MAX_TIMEOUT_S}s; background processes do not outlive the call. "
        "Output is capped (head and tail kept)."
    ),
    "git": (
        "Git on the host for the workspace's repository (no git program runs; hooks, filters and nested repositories are "
        "never used): status and log run at once; diff shows what commit would record (HEAD to the working tree, new files "
        "included; large or binary files summarised); commit records all changes, or the given paths, and asks the user. "
        "There is no push."
    ),
}

# Per-family overrides: only what a family needs differently. Empty today except the schema dialect.
OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {
    "openai": {},
    "gemini": {},
    "anthropic": {},
}

_GEMINI_KEYS = {"type", "description", "properties", "required", "items", "enum", "minimum", "maximum", "nullable", "format"}


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's schema, without titles and with Optional[X] flattened to X (the model may omit it)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            node.pop("title", None)
            if "default" in node and node["default"] is None:
                node.pop("default")
            if "anyOf" in node:
                options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
                if len(options) == 1:
                    node.update(options[0])
            for key in ("properties",):
                if key in node:
                    node[key] = {k: walk(v) for k, v in node[key].items()}
            if "items" in node:
                node["items"] = walk(node["items"])
        return node

    walk(schema)  # in place: the copy's root is the same dict
    return schema


def _to_gemini(schema: dict[str, Any]) -> dict[str, Any]:
    """Gemini takes an OpenAPI subset with upper-case type names; unknown keys are dropped."""
    out = {k: v for k, v in schema.items() if k in _GEMINI_KEYS}
    if "type" in out:
        out["type"] = str(out["type"]).upper()
    if "properties" in out:
        out["properties"] = {k: _to_gemini(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = _to_gemini(out["items"])
    return out


def _model_for(name: str) -> type[BaseModel]:
    return GitArgs if name == "git" else ARGS_MODELS[name]


def base_declaration(name: str) -> dict[str, Any]:
    schema = _clean_schema(_model_for(name).model_json_schema())
    schema.pop("description", None)
    return {"name": name, "description": BASE_DESCRIPTIONS[name], "parameters": schema}


def declaration(name: str, family: str) -> dict[str, Any]:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}")
    base = base_declaration(name)
    base.update(OVERRIDES[family].get(name, {}))
    if family == "gemini":
        return {"name": base["name"], "description": base["description"], "parameters": _to_gemini(base["parameters"])}
    if family == "anthropic":  # the Messages API: JSON Schema as input_schema
        return {"name": base["name"], "description": base["description"], "input_schema": base["parameters"]}
    return {"type": "function", "function": {"name": base["name"], "description": base["description"], "parameters": base["parameters"]}}


def declarations(names: list[str], family: str) -> list[dict[str, Any]]:
    return [declaration(n, family) for n in names]
