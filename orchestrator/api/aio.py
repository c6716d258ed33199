"""`AsyncSandbox`: the same sandbox for asyncio programs. Each method runs the sync one on the
sandbox's own worker threads (the box's channel is blocking I/O; never the loop's default executor,
whose size would make sandboxes wait for each other), so the event loop never waits on the box.

A cancelled call ends that call alone (api/turns.py): if it has not reached the box it is never
sent; if its command runs (beside others: the box runs several at once), only that command is
killed; other tasks' calls and their results are untouched. The cancelled task's CancelledError is
raised once its call has ended. Opening and closing are shielded from cancellation (a box half
started or half removed is never left behind)."""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from os import PathLike
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, TypeVar

from .box_files import MAX_FILE
from .options import SandboxOptions
from .processes import Process
from .sandbox import Sandbox
from .turns import CallToken

if TYPE_CHECKING:
    from pathlib import Path

    from ..config import SandboxLimits
    from ..events import Event
    from ..loop import SessionResult
    from ..policy.approvals import ApprovalOutcome
    from ..policy.value import SessionPolicy
    from ..protocol import ToolResult
    from ..tools.registry import PreparedCall
    from ..transcript.resume import Rebuilt
    from ..workspace.checkpoints import Checkpoint, RestoreReport
    from ..workspace.records import SessionRecord
    from .agent import AgentRun
    from .results import (
        ApplyResult,
        Changes,
        EditResult,
        GrepResult,
        ListResult,
        ReadResult,
        ShellResult,
        TreeResult,
        WriteResult,
    )

T = TypeVar("T")
_END = object()
MAX_THREADS = 16  # calls of one sandbox in flight at once (threads are made as needed); more wait in line


def _retrieved(future: "asyncio.Future[Any]") -> None:
    """The worker's outcome is always taken, also when nobody awaits it any more (a cancelled call)."""
    if not future.cancelled():
        future.exception()


class AsyncSandbox:
    """`async with AsyncSandbox("repo") as box: await box.shell("make test")`."""

    def __init__(
        self,
        workspace: str | PathLike[str] | None = None,
        options: SandboxOptions | None = None,
        *,
        kind: str = "api",
        **settings: Any,
    ) -> None:
        self.sync = Sandbox(workspace, options, kind=kind, **settings)
        self._threads: ThreadPoolExecutor | None = None  # its own workers, made on first use and let go at close

    def _submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> "asyncio.Future[T]":
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="oa-async-sandbox")
        future = asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))
        future.add_done_callback(_retrieved)
        return future

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        token = CallToken()

        def work() -> T:
            with self.sync._calling_as(token):
                return fn(*args, **kwargs)

        future = self._submit(work)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.shield(self._submit(self.sync._cancel_call, token))
            try:  # the call ends now (never sent, or killed); the cancellation goes on after it
                await asyncio.shield(future)
            except BaseException:  # noqa: BLE001 - its outcome is the cancellation's
                pass
            raise

    async def open(self) -> "AsyncSandbox":
        future = self._submit(self.sync.open)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:  # opened all the same: removed before the cancellation goes on
            await asyncio.shield(self._close_after(future))
            raise
        return self

    async def _close_after(self, future: "asyncio.Future[Any]") -> None:
        try:
            await future
        except BaseException:  # noqa: BLE001 - open failed: it removed what it made
            return
        await self._submit(self.sync.close)

    async def close(self, *, status: str | None = None, reason: str = "") -> list[str]:
        try:
            return await asyncio.shield(self._submit(self.sync.close, status=status, reason=reason))
        finally:
            threads = self._threads
            if (
                threads is not None and self.sync.closed
            ):  # its idle workers end (a later fork() or report() makes new ones)
                self._threads = None
                threads.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncSandbox":
        return await self.open()

    async def __aexit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        if isinstance(err, (KeyboardInterrupt, asyncio.CancelledError)):
            await self.close(status="cancelled", reason="cancelled")
        elif err is not None:
            await self.close(status="stopped", reason=f"{type(err).__name__}: {str(err)[:300]}")
        else:
            await self.close()

    # -- what it is --------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def record(self) -> SessionRecord:
        return self.sync.record

    @property
    def mode(self) -> str:
        return self.sync.mode

    @property
    def closed(self) -> bool:
        return self.sync.closed

    @property
    def transcript_path(self) -> Path:
        return self.sync.transcript_path

    async def kill_running(self) -> None:
        """Kill every process the box runs (every call running there ends, killed); the box stays."""
        await asyncio.shield(self._submit(self.sync.kill_running))

    # -- what a front-end drives a session with (Sandbox's, api/driving.py) ---------------------
    async def run_turns(self, task: str, *, again: bool = False) -> SessionResult:
        return await self._run(self.sync.run_turns, task, again=again)

    def cancel(self) -> None:
        self.sync.cancel()

    async def decide(
        self, tool: str, arguments: dict[str, Any], call_id: str | None = None
    ) -> PreparedCall | ToolResult:
        return await self._run(self.sync.decide, tool, arguments, call_id)

    async def execute(self, prepared: PreparedCall, *, counted: bool = True) -> ToolResult:
        return await self._run(self.sync.execute, prepared, counted=counted)

    def emit(self, event: Event) -> None:
        self.sync.emit(event)

    async def decide_landing(self, requested: str | None = None) -> ApprovalOutcome:
        return await self._run(self.sync.decide_landing, requested)

    @property
    def box_config(self) -> SandboxLimits:
        return self.sync.box_config

    @property
    def box_workspace(self) -> Path:
        return self.sync.box_workspace

    @property
    def policy(self) -> SessionPolicy:
        return self.sync.policy

    @property
    def resumed(self) -> Rebuilt | None:
        return self.sync.resumed

    # -- the tools -----------------------------------------------------------------------------
    async def call(self, tool: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        return await self._run(self.sync.call, tool, arguments)

    async def read_file(
        self, path: str | bytes | PathLike[str] | PathLike[bytes], offset: int = 1, limit: int | None = None
    ) -> ReadResult:
        return await self._run(self.sync.read_file, path, offset, limit)

    async def list_files(
        self, path: str | bytes | PathLike[str] | PathLike[bytes] = ".", recursive: bool = True
    ) -> ListResult:
        return await self._run(self.sync.list_files, path, recursive)

    async def grep_files(
        self,
        pattern: str,
        path: str | bytes | PathLike[str] | PathLike[bytes] = ".",
        glob: str | None = None,
        ignore_case: bool = False,
    ) -> GrepResult:
        return await self._run(self.sync.grep_files, pattern, path, glob, ignore_case)

    async def write_file(self, path: str | PathLike[str], content: str) -> WriteResult:
        return await self._run(self.sync.write_file, path, content)

    async def edit_file(
        self,
        path: str | PathLike[str],
        old_text: str,
        new_text: str,
        allow_multiple: bool = False,
        expected_sha256: str | None = None,
    ) -> EditResult:
        return await self._run(self.sync.edit_file, path, old_text, new_text, allow_multiple, expected_sha256)

    async def shell(
        self,
        command: str,
        timeout: int = 60,
        on_output: Callable[[str], None] | None = None,
        *,
        cwd: str | PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> ShellResult:
        return await self._run(self.sync.shell, command, timeout, on_output, cwd=cwd, env=env)

    async def read_bytes(self, path: str | PathLike[str], *, limit: int = MAX_FILE) -> bytes:
        return await self._run(self.sync.read_bytes, path, limit=limit)

    async def write_bytes(self, path: str | PathLike[str], data: bytes | bytearray | memoryview) -> WriteResult:
        return await self._run(self.sync.write_bytes, path, data)

    async def upload(self, local_path: str | PathLike[str], box_path: str | PathLike[str]) -> WriteResult | TreeResult:
        return await self._run(self.sync.upload, local_path, box_path)

    async def download(
        self, box_path: str | PathLike[str], local_path: str | PathLike[str], *, limit: int = MAX_FILE
    ) -> WriteResult | TreeResult:
        return await self._run(self.sync.download, box_path, local_path, limit=limit)

    async def start(
        self, command: str, *, cwd: str | PathLike[str] | None = None, env: dict[str, str] | None = None
    ) -> "AsyncProcess":
        """Sandbox.start: a background process, its methods awaitable."""
        return AsyncProcess(self, await self._run(self.sync.start, command, cwd=cwd, env=env))

    async def processes(self) -> list[dict[str, Any]]:
        return await self._run(self.sync.processes)

    def shell_stream(
        self,
        command: str,
        timeout: int = 60,
        *,
        cwd: str | PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> "ShellStream":
        """`async for text in box.shell_stream("make test")`: the output as it comes; then `.result`."""
        return ShellStream(self, command, timeout, cwd, env)

    # -- review, checkpoints, a run ----------------------------------------------------------
    async def changes(self) -> Changes:
        return await self._run(self.sync.changes)

    async def apply(self) -> ApplyResult:
        return await self._run(self.sync.apply)

    async def discard(self) -> int:
        return await asyncio.shield(self._submit(self.sync.discard))

    async def checkpoints(self) -> list[Checkpoint]:
        return await self._run(self.sync.checkpoints)

    async def rollback(self, turn: int) -> RestoreReport:
        return await self._run(self.sync.rollback, turn)

    async def report(self, path: str | PathLike[str] | None = None) -> str:
        return await self._run(self.sync.report, path)

    async def fork(self, n: int = 1, *, turn: int | None = None) -> list[str]:
        return await self._run(self.sync.fork, n, turn=turn)

    def run(
        self, task: str, *, model: str | None = None, base_url: str | None = None, api_key_env: str | None = None
    ) -> AgentRun:
        """`async for event in box.run(task, model=...)`; or `await run.wait_async()`."""
        return self.sync.run(task, model=model, base_url=base_url, api_key_env=api_key_env)


class ShellStream:
    """A command's output chunks as an async iterator; `.result` (a ShellResult) once it ended. A
    failure (a refusal, a timeout) is raised from the iteration, as shell() raises it."""

    def __init__(
        self,
        box: AsyncSandbox,
        command: str,
        timeout: int,
        cwd: str | PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self._box, self._command, self._timeout, self._cwd, self._env = box, command, timeout, cwd, env
        self.result: ShellResult | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[Any] = asyncio.Queue()

        def output(text: str) -> None:
            loop.call_soon_threadsafe(chunks.put_nowait, text)

        async def work() -> ShellResult:
            try:
                return await self._box.shell(self._command, self._timeout, output, cwd=self._cwd, env=self._env)
            finally:
                chunks.put_nowait(_END)

        task = asyncio.ensure_future(work())
        try:
            while True:
                chunk = await chunks.get()
                if chunk is _END:
                    break
                yield chunk
            self.result = await task
        finally:
            if not task.done():
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001 - the program left the loop; the call is killed
                    pass


class AsyncProcess:
    """A background process of an AsyncSandbox (processes.Process, each method awaitable)."""

    def __init__(self, box: AsyncSandbox, process: Process) -> None:
        self._box, self.sync = box, process

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def pid(self) -> int | None:
        return self.sync.pid

    @property
    def exit_code(self) -> int | None:
        return self.sync.exit_code

    async def read(self) -> str:
        return await self._box._run(self.sync.read)

    async def write(self, data: str | bytes, *, close: bool = False) -> None:
        await self._box._run(self.sync.write, data, close=close)

    async def wait(self, timeout: float | None = None) -> int | None:
        return await self._box._run(self.sync.wait, timeout)

    async def kill(self) -> int | None:
        return await self._box._run(self.sync.kill)

    async def stream(self, timeout: float | None = None) -> AsyncIterator[str]:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            text, ended = await self._box._run(self.sync.next_text, end)
            if text:
                yield text
            if ended:
                return
