"""mini-swe-agent's environment class: `environment_class: orchestrator.plugins.minisweagent.OpenAgentsEnvironment`
in the `environment` section of a config (or `mini --environment-class ...`).

Installed with `pip install 'openagents-sandbox[minisweagent]'`. Each instance opens one box on
`workspace` with the public API (`Sandbox`); every action is that sandbox's `shell` call, so it
goes through the call pipeline, the policy ladder and the transcript, and a deny is an error
observation the agent reads. Follows mini-swe-agent's Environment protocol as its local
environment does (execute -> output, returncode, exception_info; Submitted on the finishing line).
`env` is exported to each command only: the box never sees the host's environment, and the
template variables carry no host variable either (local's do).
"""

from __future__ import annotations

import shlex
import weakref
from pathlib import Path
from typing import Any, Literal

from minisweagent.exceptions import Submitted

from .. import ErrorType, OpenAgentsError, Sandbox, ToolError
from ..ground.text import visible
from .settings import BoxSettings

MAX_TIMEOUT_S = 240  # the shell tool's limit, kept by the host: a longer timeout is clamped to it
_FINISH = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class OpenAgentsEnvironmentConfig(BoxSettings):
    """The `environment` section's keys: these and the box's settings (BoxSettings)."""

    workspace: str = "."  # the host directory the box works on (/workspace in the box)
    mode: Literal["auto", "bind", "copy"] = "auto"  # as SandboxOptions.mode
    cwd: str = ""  # in the box; relative to /workspace; default /workspace
    env: dict[str, str] = {}  # exported to every command (only to the commands)
    timeout: int = 30
    interpreter: list[str] = []  # e.g. ["bash", "-lc"]; default /bin/sh -c (the shell tool's)
    auto_approve: bool = True  # commands inside the box run without asking; a policy's deny still refuses them


class OpenAgentsEnvironment:
    """`OpenAgentsEnvironment(workspace="repo", timeout=60)`; `cleanup()` removes the box (also done
    when the object goes, and at interpreter exit: mini-swe-agent's runners never call it)."""

    def __init__(
        self, *, config_class: type[OpenAgentsEnvironmentConfig] = OpenAgentsEnvironmentConfig, **kwargs: Any
    ) -> None:
        self.config = config_class(**kwargs)
        self.sandbox = Sandbox(
            Path(self.config.workspace),
            mode=self.config.mode,
            auto_approve=self.config.auto_approve,
            approve="ask",
            policy_files=self.config.policy_paths(),
            kind="minisweagent",
            **self.config.box_options(),
        )
        self.sandbox.open()
        self._finalizer = weakref.finalize(self, self.sandbox.close)
        self._uname = self._box_uname()

    def _box_uname(self) -> dict[str, str]:
        """The box's uname (its kernel is gVisor's, not the host's) for the templates."""
        try:
            lines = self.sandbox.shell(
                "uname -s; uname -n; uname -r; uname -v; uname -m", timeout=10
            ).output.splitlines()
        except ToolError:  # a policy that refuses every command: the templates still render
            lines = []
        keys = ("system", "node", "release", "version", "machine")
        return {key: (lines[i][:200] if i < len(lines) else "") for i, key in enumerate(keys)}

    def command_line(self, command: str, cwd: str) -> str:
        """What the shell tool runs: the command itself (so a policy sees exactly it), preceded by
        the exports of `env` and a `cd` when there are some, or handed to `interpreter`."""
        exports = "".join(
            f"export {name}={shlex.quote(value)}\n" for name, value in self.config.env.items() if name.isidentifier()
        )
        place = cwd or self.config.cwd
        enter = f"cd -- {shlex.quote(place)} || exit 1\n" if place else ""
        run = (
            " ".join([*map(shlex.quote, self.config.interpreter), shlex.quote(command)])
            if self.config.interpreter
            else command
        )
        return f"{exports}{enter}{run}"

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """One command in the box: {"output" (stdout and stderr, bounded by the shell tool and escaped:
        mini-swe-agent shows it on the terminal), "returncode", "exception_info"}. A
        timeout returns (-1, the partial output), the command and all it started killed; a refusal
        returns -1 and says why. A closed environment raises OpenAgentsError(SANDBOX_CLOSED)."""
        command = action.get("command", "") if isinstance(action, dict) else ""
        seconds = max(1, min(int(timeout or self.config.timeout), MAX_TIMEOUT_S))
        output: dict[str, Any]
        try:
            result = self.sandbox.shell(self.command_line(str(command), cwd), timeout=seconds)
            output = {
                "output": visible(result.output),
                "returncode": result.exit_code if result.exit_code is not None else -1,
                "exception_info": "",
            }
        except ToolError as err:
            if err.type is ErrorType.TIMEOUT:
                info = f"The command timed out after {seconds} s and was killed with everything it started."
            elif err.type in (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER):
                info = f"The sandbox's policy refused the command: {err.message}"
            else:
                info = f"An error occurred while executing the command: {err.type.value}: {err.message}"
            output = {
                "output": visible(err.output),
                "returncode": -1,
                "exception_info": visible(info),
                "extra": {"exception_type": err.type.value, "exception": err.message},
            }
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == _FINISH and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(), **self._uname, "session_id": self.sandbox.id, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                    "session_id": self.sandbox.id,
                }
            }
        }

    def cleanup(self) -> None:
        """Remove the box (and its egress gate); the session record stays (`oa-sandbox sessions`)."""
        self._finalizer()

    def __del__(self) -> None:
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()


__all__ = ["OpenAgentsEnvironment", "OpenAgentsEnvironmentConfig", "OpenAgentsError"]
