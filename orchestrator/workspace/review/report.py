"""What apply did: the report the sanitiser returns and the CLI, MCP and ACP show.

Its own module because every caller of apply reads it, and plan and apply both fill it.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from pydantic import BaseModel, Field

from ...boxfs import show
from .scan import shown

T = TypeVar("T")


class LeftOut(BaseModel):
    path: str
    reason: str


class Conflict(BaseModel):
    path: str
    reason: str


class Normalised(BaseModel):
    path: str
    box_mode: str  # as the box left it, octal
    mode: str  # as written to the real workspace, octal


class ApplyReport(BaseModel):
    applied: list[str] = Field(default_factory=list)
    left_out: list[LeftOut] = Field(default_factory=list)
    conflicts: list[Conflict] = Field(default_factory=list)
    normalised: list[Normalised] = Field(default_factory=list)  # applied, with another mode than the box's
    already: list[str] = Field(default_factory=list)  # already as the box left them (an earlier, interrupted apply)

    def lines(self, limit: int | None = None) -> list[str]:
        """For a terminal: every path on one line, made visible (a name may hold a newline or escape
        sequences); with `limit`, at most that many lines of each kind, then "... and N more"."""

        def some(items: list[T], line: Callable[[T], str], what: str) -> list[str]:
            head = items if limit is None else items[:limit]
            more = [f"... and {len(items) - len(head)} more {what}"] if len(head) < len(items) else []
            return [line(item) for item in head] + more

        out = some(self.conflicts, lambda c: f"conflict: {shown(c.path)}: {show(c.reason)}", "conflicts")
        out += some(self.applied, lambda p: f"applied: {shown(p)}", "applied")
        out += some(
            self.normalised, lambda n: f"mode {n.box_mode} normalised to {n.mode}: {shown(n.path)}", "normalised"
        )
        return out + some(self.left_out, lambda lo: f"left out: {shown(lo.path)}: {show(lo.reason)}", "left out")
