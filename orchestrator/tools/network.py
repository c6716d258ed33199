"""What the model is told about the sandbox's network: the truth of this session's egress (issue 36).

The default box has no network; with egress opened (`--egress allow:HOST,...`, a policy's [egress])
it reaches the allowed hosts through the egress proxy and nothing else. The system prompt and the
description of each tool that reaches the network (ToolDef.reaches_network) say which. Host names
come from configuration, never from the box, and are still bounded and reduced to host characters
before they reach a prompt: at most MAX_HOSTS, each at most MAX_HOST_CHARS."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import EgressConfig

# What a static description (docs, the MCP server's tool list) says: true whatever the session opened.
GENERIC = "Network: none unless the user opened egress, and then only the hosts it allows."
CLOSED = "Network: none. No host, registry or mirror can be reached; do not try to download anything."
MAX_HOSTS = 20
MAX_HOST_CHARS = 100
_NOT_HOST = re.compile(r"[^A-Za-z0-9.*:_\-\[\]]")


def _host(text: str) -> str:
    cut = _NOT_HOST.sub("?", text[:MAX_HOST_CHARS])
    return cut + ("..." if len(text) > MAX_HOST_CHARS else "")


def sentence(egress: EgressConfig | None) -> str:
    """One sentence for the model: CLOSED, or the hosts the egress proxy lets through."""
    if egress is None:
        return CLOSED
    allowed = list(dict.fromkeys([*egress.allow, *(r.host for r in egress.rules if r.action == "allow")]))
    if not allowed:
        return CLOSED
    shown = ", ".join(_host(h) for h in allowed[:MAX_HOSTS])
    more = f" and {len(allowed) - MAX_HOSTS} more" if len(allowed) > MAX_HOSTS else ""
    rules = " (some only for certain methods or paths)" if egress.rules else ""
    return (
        "Network: only through the egress proxy (HTTP_PROXY/HTTPS_PROXY are set), to these hosts: "
        f"{shown}{more}{rules}. Every other host is refused, and the proxy records every request."
    )


def of_sandbox(sandbox: Any) -> str:
    """The sentence for a sandbox's own limits (Sandbox.config.egress); a registry over no box
    (host tools alone) has no network to speak of."""
    limits = getattr(sandbox, "config", None)
    return sentence(getattr(limits, "egress", None))
