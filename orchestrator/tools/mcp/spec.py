"""One of the user's stdio MCP servers as configured (ACP's session/new `mcpServers`, or the config):
what client.py starts and launch.py plans the start of."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .names import safe


class McpServerSpec(BaseModel):
    """One stdio server: ACP's McpServerStdio ({name, command, args, env: [{name, value}]}) or a
    config's {name, command, args, env: {NAME: VALUE}}."""

    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=64)
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if isinstance(value, list):  # ACP: [{name, value}]
            return {
                str(item["name"]): str(item["value"]) for item in value if isinstance(item, dict) and "name" in item
            }
        return value or {}

    @property
    def key(self) -> str:
        return safe(self.name)
