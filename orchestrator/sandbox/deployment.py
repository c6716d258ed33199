"""The interface every sandbox backend keeps. Docker is the one we ship; a remote or Kubernetes
backend plugs in here without touching the turn loop."""
from __future__ import annotations

from typing import Any, Protocol

from ..protocol import ToolResult


class Sandbox(Protocol):
    def start(self) -> None: ...

    def call(self, tool: str, args: dict[str, Any]) -> ToolResult:
        """Run one tool; never raises for a tool failure, only returns a typed result. A backend may
        take `on_output=callable` too (shell output while it runs): the registry passes it only then."""

    def kill_processes(self) -> None:
        """Kill every process in the sandbox but the agent (Ctrl-C, cancel, a passed deadline)."""

    def close(self) -> None: ...
