"""What each model family sees of a tool: name, description, JSON schema. Data only, resolved from
the tool's ToolDef (its description and argument model) plus its per-family overrides, then put in
the family's shape by its dialect (models/dialects/), so the exact declaration a family receives is
testable alone (tests/unit/snapshots/). Invocation lives elsewhere (registry.py)."""

from __future__ import annotations

import copy
from typing import Any

from ..models.dialects import DIALECTS, dialect
from . import catalog, network

FAMILIES = tuple(DIALECTS)


def clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
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


def base_declaration(name: str) -> dict[str, Any]:
    tool = catalog.TOOLS[name]
    assert tool.args is not None, f"{name} declares no arguments"
    schema = clean_schema(tool.args.model_json_schema())
    schema.pop("description", None)
    return {"name": name, "description": tool.description, "parameters": schema}


def declaration(name: str, family: str, network_sentence: str | None = None) -> dict[str, Any]:
    """`network_sentence`: what this session's network really is (network.sentence); a tool that
    reaches the network says it in place of the generic sentence its static description ends with."""
    shape = dialect(family)  # ValueError for a family that has no dialect
    base = base_declaration(name)
    if network_sentence is not None and catalog.TOOLS[name].reaches_network:
        assert base["description"].endswith(network.GENERIC), f"{name} reaches the network but does not say so"
        base["description"] = base["description"][: -len(network.GENERIC)] + network_sentence
    base.update(catalog.TOOLS[name].overrides.get(family, {}))
    return shape.declare(base["name"], base["description"], base["parameters"])


def declarations(names: list[str], family: str, network_sentence: str | None = None) -> list[dict[str, Any]]:
    return [declaration(n, family, network_sentence) for n in names]
