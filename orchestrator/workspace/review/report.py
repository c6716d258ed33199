"""What apply did: the report the sanitiser returns and the CLI, MCP and ACP show.

Its own module because every caller of apply reads it, and plan and apply both fill it.
"""
from __future__ import annotations

from pydantic import BaseModel, Field

from ...boxfs import show
from .scan import shown


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

    def lines(self) -> list[str]:
        """For a terminal: every path made visible (a name may hold escape sequences)."""
        out = [f"conflict: {shown(c.path)}: {show(c.reason)}" for c in self.conflicts]
        out += [f"applied: {shown(p)}" for p in self.applied]
        out += [f"mode {n.box_mode} normalised to {n.mode}: {shown(n.path)}" for n in self.normalised]
        return out + [f"left out: {shown(lo.path)}: {show(lo.reason)}" for lo in self.left_out]
