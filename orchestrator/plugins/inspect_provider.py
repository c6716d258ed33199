"""Inspect AI's sandbox provider: `sandbox="openagents"` in a Task (or `--sandbox openagents`).

Installed with `pip install 'openagents-sandbox[inspect]'`; Inspect finds it through the
`inspect_ai` entry point group (pyproject.toml). Each sample gets its own box on an empty private
workspace (copy mode), opened with the public API and discarded at sample_cleanup: nothing is left
running and nothing reaches the host's files. Every exec, read and write is a `shell`, `read_file`
or `write_file` call of that API, so a policy's deny refuses it (PermissionError here).
docs/api.md (Plug-ins) lists what differs from Inspect's local and docker providers and why.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal, Union, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict

from .. import AsyncSandbox, ErrorType, OpenAgentsError, ToolError
from ..boxfs import remove_path
from .settings import BoxSettings
from .transport import BoxFailure, BoxProgram, clamp_timeout, os_error

MAX_READ_BYTES = 1 << 30  # what the bytes API moves at most per file (Sandbox.read_bytes)


class OpenAgentsSandboxConfig(BoxSettings):
    """`sandbox=("openagents", OpenAgentsSandboxConfig(...))`: the box's settings (SandboxOptions'
    fields of the same names). Commands are approved automatically inside the box; `policy_files`
    may still deny them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # None: Inspect's own limit (SandboxEnvironmentLimits.MAX_READ_FILE_SIZE, 100 MiB, read at each call)
    max_read_bytes: int | None = None


class CommandTimeout(TimeoutError):
    """A command killed at its timeout; `truncated_output` is what it printed (Inspect shows it)."""

    def __init__(self, message: str, truncated_output: str) -> None:
        super().__init__(message)
        self.truncated_output = truncated_output


def _config(config: SandboxEnvironmentConfigType | None) -> OpenAgentsSandboxConfig:
    if config is None:
        return OpenAgentsSandboxConfig()
    if isinstance(config, OpenAgentsSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return OpenAgentsSandboxConfig(**config.model_dump())
    raise ValueError(f"the openagents sandbox takes an OpenAgentsSandboxConfig, not {type(config).__name__}")


def _raise(err: BoxFailure, path: str) -> None:
    error = os_error(err, path)
    if error is not None:
        raise error
    if err.kind == "user":
        raise SandboxUserUnsupportedError(err.message)
    if err.kind == "limit":
        raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
    raise OSError(f"{path}: {err.message}")


@sandboxenv(name="openagents")
class OpenAgentsSandboxEnvironment(SandboxEnvironment):
    """One sample's box."""

    def __init__(self, box: AsyncSandbox, root: Path, config: OpenAgentsSandboxConfig) -> None:
        super().__init__()
        self.box, self.root, self.config = box, root, config
        self.program = BoxProgram(box)

    # -- life cycle ------------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return OpenAgentsSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        settings = _config(config)
        root = Path(tempfile.mkdtemp(prefix="oa-inspect-"))
        box = AsyncSandbox(
            root,
            mode="copy",
            auto_approve=True,
            approve="ask",
            policy_files=settings.policy_paths(),
            kind="inspect",
            **settings.box_options(),
        )
        try:
            await box.open()
        except BaseException:
            remove_path(root)
            raise
        return {"default": cls(box, root, settings)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, cls):
                await env.close(interrupted)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        return None  # every box is removed by its sample's cleanup (and at interpreter exit at the latest)

    async def close(self, interrupted: bool = False) -> None:  # noqa: ARG002 - Inspect's flag; the answer is the same
        """Remove the box, its copy, checkpoints and transcript; the record stays (marked discarded)."""
        try:
            if not self.box.closed:  # interrupted or not: a sample's box and copy have nothing worth keeping
                await self.box.discard()
        finally:
            remove_path(self.root)

    # -- the calls ---------------------------------------------------------------------------------
    async def _run(self, request: dict[str, Any], timeout_s: int = 30) -> dict[str, Any]:
        if self.box.closed:
            raise SandboxUnavailableError("the openagents sandbox of this sample was cleaned up")
        try:
            return await self.program.run(request, timeout_s)
        except ToolError as err:
            if err.type in (ErrorType.REFUSED_BY_POLICY, ErrorType.REJECTED_BY_USER):
                raise PermissionError(13, f"refused by the sandbox's policy: {err.message}") from None
            raise
        except OpenAgentsError as err:
            if err.type is ErrorType.SANDBOX_CLOSED:
                raise SandboxUnavailableError(err.message) from None
            raise

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
            raise TypeError("exec: cmd must be a non-empty list of str")
        seconds = clamp_timeout(timeout)
        request: dict[str, Any] = {
            "op": "exec",
            "cmd": cmd,
            "cwd": cwd,
            "env": dict(env or {}),
            "user": user,
            "timeout": seconds,
            "limit": SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
        }
        if input is not None:
            request["stdin"] = await self.program.stage(input.encode() if isinstance(input, str) else bytes(input))
        try:
            answer = await self._run(request, seconds)
            stdout = await self.program.fetch(answer.get("stdout"), SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)
            stderr = await self.program.fetch(answer.get("stderr"), SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)
        except BoxFailure as err:
            if err.kind == "limit":
                raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, None) from None
            _raise(err, cmd[0])
            raise
        out, errtext = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        if answer.get("timed_out") is True:
            raise CommandTimeout(
                f"the command did not end in {seconds} s (killed with everything it started)", out + errtext
            )
        code = answer.get("rc")
        code = code if isinstance(code, int) and not isinstance(code, bool) else 1
        return ExecResult(success=code == 0, returncode=code, stdout=out, stderr=errtext)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        if not isinstance(file, str):
            raise TypeError("write_file: file must be a str")
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        request = {"op": "write", "path": file, "data": await self.program.stage(data)}
        try:
            await self._run(request, 60)
        except BoxFailure as err:
            _raise(err, file)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        if not isinstance(file, str):
            raise TypeError("read_file: file must be a str")
        limit = min(
            SandboxEnvironmentLimits.MAX_READ_FILE_SIZE, self.config.max_read_bytes or MAX_READ_BYTES, MAX_READ_BYTES
        )
        try:
            answer = await self._run({"op": "read", "path": file, "limit": limit}, 60)
            data = await self.program.fetch(answer.get("data"), limit)
        except BoxFailure as err:
            if err.kind == "limit":
                raise OutputLimitExceededError(_size(limit), None) from None
            _raise(err, file)
            raise
        return data.decode("utf-8") if text else data


def _size(limit: int) -> str:
    if limit == SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
        return SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR
    return f"{limit / (1024 * 1024):.0f} MiB" if limit >= 1024 * 1024 else f"{limit} bytes"
