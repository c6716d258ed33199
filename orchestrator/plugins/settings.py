"""The box settings every plug-in's config takes: SandboxOptions' fields of the same names, so a
harness's config file can set the image, the container runtime, limits, egress and policies the way
the CLI's flags do, and each plug-in hands them to the public API the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

_BOX = ("image", "runtime", "memory", "cpus", "pids", "egress")


class BoxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str | None = None
    runtime: str | None = None  # the container runtime (runsc, runc), as SandboxOptions.runtime
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None
    egress: list[str] | None = None  # hosts the box may reach through the egress gate
    policy_files: list[str] = []

    def box_options(self) -> dict[str, Any]:
        """The settings given, as keyword arguments of Sandbox/AsyncSandbox (policy files apart)."""
        return {name: value for name in _BOX if (value := getattr(self, name)) is not None}

    def policy_paths(self) -> list[Path]:
        return [Path(p) for p in self.policy_files]
