"""The seam between "how a box is started" (a Deployment, one module per backend) and "how calls run
in it" (the Channel and the SupervisedSandbox here, the same for every backend).

Nothing in the box is trusted once the model has run a command: the host keeps its own deadline
for every call, kills the command's whole process tree through the deployment when it expires, and
replaces the box when the agent dies, hangs or speaks garbage. That supervision lives here once,
so a second backend (Podman, Kubernetes) only says how to start, kill in, and remove one box.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from .. import host_memory, state
from ..boxfs import HostBudget
from ..config import EgressRule, SandboxConfig, SandboxLimits
from ..errors import ErrorType, OpenAgentsError
from ..protocol import AgentResponse, BoxCall, EgressRecord, Executor, ToolResult, agent_meta
from ..workspace import quota_fs
from ..workspace.integrity import Baseline, Sweeper, SweepReport
from ..workspace.overlay import fork_upper
from ..workspace.quota import WriteQuota
from . import sweep_journal
from .channel import AgentStream, Channel, wait
from .starts import START_GATE, StartGate, StartQueued

SWEEP_BUDGET_S = 300.0  # one sweep's wall time (300k entries take ~2 s here)

log = logging.getLogger(__name__)

WORKSPACE_IN_BOX = "/workspace"
START_DEADLINE_S = 30.0  # from the deployment's start to the agent's first answer
RETRIED_AFTER_DEADLINE_S = 3.0  # how long a killed call may take to answer before the box is replaced


class Box(Protocol):
    """The box: the container a session's calls run in, as the session, the registry, the pool and
    the self-check use it (DockerSandbox is one). The session itself is the public API's Sandbox."""

    restarts: int
    sweeper: Sweeper
    on_sweep: Callable[[SweepReport], None] | None
    on_start_queue: Callable[[StartQueued], None] | None  # a start (or restart) waits for a slot (starts.py)

    @property
    def config(self) -> SandboxLimits:
        """The limits the box runs under (egress among them: the MCP server says whether the world is open)."""

    @property
    def started(self) -> bool:
        """Whether a box is up (a pooled sandbox arrives started)."""

    @property
    def gvisor(self) -> bool:
        """Whether the box runs on gVisor's kernel (a few kernel-facing answers differ there)."""

    def start(self) -> None: ...

    def run(self, call: BoxCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        """Run one call, as its rule says; never raises for a tool failure, only returns a typed result.
        `on_output(text)`: a streaming call's output while it runs (the result still holds it all)."""

    def call(self, tool: str, args: dict[str, Any], on_output: Callable[[str], None] | None = None) -> ToolResult:
        """A request by name (the program's own operations, a self-check): `run` with the agent's rule for it."""

    def kill_processes(self) -> None:
        """Kill every process in the sandbox but the agent (Ctrl-C, cancel, a passed deadline)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class BoxSpec:
    """What a deployment needs to know about the box it starts, decided by the host beforehand."""

    workspace: Path  # mounted at /workspace, read-write
    user: str  # uid:gid the agent and every command run as, never 0
    baseline: Baseline  # its .git entries are mounted read-only
    git_dir: Path | None  # copy mode: the real workspace's .git, read-only at /workspace/.git


class Deployment(Protocol):
    """How one backend starts, reaches into and removes a box. start/remove/close are called under
    the sandbox's lock; kill_processes also from the quota's watcher thread."""

    def start(self) -> AgentStream:
        """Start a fresh box running the agent as PID 1; return its stdin/stdout. Raises a typed
        OpenAgentsError (IMAGE_MISSING, SANDBOX_START_FAILED, DOCKER_UNAVAILABLE ...) and leaves
        no box behind when it fails."""

    def kill_processes(self) -> None:
        """SIGKILL every process of the box but the agent, from outside; returns within seconds
        even when the box is dying. No box: nothing to do."""

    def remove(self) -> None:
        """Remove the current box, if any (idempotent). What outlives one box stays (see close)."""

    def close(self) -> None:
        """Release what the deployment keeps across restarts (e.g. an egress gate), after remove."""

    def others_on_workspace(self) -> bool:
        """Whether another box may still run on this workspace (the sweep keeps shared things then)."""

    def drain_egress(self) -> list[EgressRecord]:
        """Egress requests the box made since the last drain (empty without egress)."""

    def why_lost(self, err: OpenAgentsError) -> OpenAgentsError:
        """The agent is gone: the backend's better reason (e.g. the box was killed for memory), or `err`."""

    @property
    def gvisor(self) -> bool:
        """Whether the box runs on gVisor's kernel."""


@dataclass
class Diagnosis:
    """`oa-sandbox doctor`'s view of a backend: its checks as (status, text), status one of ok,
    info, fail; the config a box would get (its runtime chosen); whether a box can start at all."""

    checks: list[tuple[str, str]]
    config: SandboxConfig
    reachable: bool  # the backend answers (no daemon: doctor stops here)
    can_start: bool  # the image is there: the attack checks can run
    runtime: Any = field(default=None)  # the backend's own runtime choice, for settings_for


class Backend(Protocol):
    """A backend as the CLI, the pool and the session see it (made by backend.py from the config):
    its sandboxes, and the administration around them."""

    def sandbox(
        self,
        workspace: str | os.PathLike[str],
        config: SandboxConfig,
        *,
        state_dir: Path | None = None,
        git_dir: Path | None = None,
        baseline: Baseline | None = None,
    ) -> Box:
        """A sandbox for `workspace`, not started yet."""

    def diagnose(self, config: SandboxConfig) -> Diagnosis: ...

    def settings_for(self, diagnosis: Diagnosis, workspace: Path, user: str) -> list[tuple[str, str]]:
        """The security settings a box of `workspace` would get, as (name, value) rows."""

    def gc(self, everything: bool) -> int:
        """Remove leftover boxes; `everything`: also those whose host process is alive. How many went."""

    def build_image(
        self, tag: str | None, base: str, *, rebuild_base: bool, only_if_needed: bool, progress: Callable[[str], None]
    ) -> str:
        """Make the sandbox image `tag` (None: the one the backend's config names) on `base` (the
        backend's meaning: for Docker an image name, or 'debootstrap'); `only_if_needed`: leave a
        current image alone. Returns the tag."""


def workspace_user(workspace: Path, config: SandboxLimits) -> str:
    """The workspace owner's uid:gid, so files written in the box keep their owner on the host.
    Never uid 0: a root-owned workspace is worked on as a copy (sessions.resolve_mode)."""
    user = config.user or f"{workspace.stat().st_uid}:{workspace.stat().st_gid}"
    if user.split(":", 1)[0].strip() in ("0", "root"):
        raise OpenAgentsError(
            ErrorType.CONFIG_INVALID,
            f"the sandbox never runs as uid 0 (the workspace {workspace} is owned by root, or --user 0 "
            "was given): use --workspace-mode copy, the default for root-owned workspaces, or --user UID:GID",
        )
    return user


class SupervisedSandbox:
    """One box, one agent, one workspace, behind any Deployment. Use as a context manager: the box
    is removed on exit, also after Ctrl-C. Owns the host's deadlines, the restart after a lost
    agent, the write quota and the integrity sweep; the deployment only starts, kills and removes."""

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        config: SandboxLimits,
        deploy: Callable[[BoxSpec], Deployment],
        *,
        state_dir: Path | None = None,
        git_dir: Path | None = None,
        baseline: Baseline | None = None,
    ) -> None:
        """`deploy`: makes the backend's deployment for this box's spec, once.
        `state_dir`: where the sweep's quarantine goes (a session's directory; default a fresh one).
        `git_dir`: mounted read-only at /workspace/.git (copy mode: the real workspace's .git).
        `baseline`: taken earlier by the caller (a warm pool's, from before any of its boxes ran)."""
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise OpenAgentsError(ErrorType.CONFIG_INVALID, f"workspace {self.workspace} is not a directory")
        self.config = config
        self.user = workspace_user(self.workspace, self.config)
        self._channel: Channel | None = None
        self.restarts = 0
        self.agent_info: dict[str, Any] = {}
        # Taken before the box can write anything: what the sweep and the quota compare against.
        self.id = state.new_id()
        self.state_dir = state_dir or state.sandbox_state_dir(self.workspace, self.id)
        self.git_dir = git_dir
        self.baseline = baseline or sweep_journal.capture_baseline(self.workspace)
        # A copy on a size-limited file system (quota_fs): the quarantine lies in it, so moving out stays a rename.
        self.sweeper = Sweeper(
            self.workspace,
            self.baseline,
            quota_fs.quarantine_for(self.workspace) or self.state_dir / "quarantine",
            placeholder_mountpoint=git_dir is not None and ".git" not in self.baseline.git_entries,
        )  # docker.git_mounts
        self.on_sweep: Callable[[SweepReport], None] | None = None
        self.on_start_queue: Callable[[StartQueued], None] | None = None
        self.start_gate: StartGate = START_GATE  # shared by every box of the process
        self.quota: WriteQuota | None = None
        self.host_budget: HostBudget | None = (
            None  # bounds the sweeps and the quota's walks (the session's clock, when set)
        )
        self._journal: Path | None = None  # this box's pending sweep, journaled before it first starts
        self.deployment = deploy(BoxSpec(self.workspace, self.user, self.baseline, git_dir))
        # Calls run in parallel; when the agent dies they all fail at once. One of them replaces
        # the box, under this lock; the others see the new channel and do nothing.
        self._lifecycle = threading.RLock()
        # The agent runs several commands at once (at most its SHELL_MAX_CONCURRENT, a typed
        # RESOURCE_EXHAUSTED beyond), so a command's deadline starts when it is sent. A passed host
        # deadline (the agent did not end the command itself) still kills every process in the box.
        self._closed = False
        self._ever_started = False
        # Whether the box may hold processes besides its agent: a call that spawns (BoxRule.spawns) ran, or calls are
        # under way. Until then kill_processes has nothing to kill, and a close does not wait for a `docker exec`.
        self._spawned = False
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "SupervisedSandbox":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def started(self) -> bool:
        return self._channel is not None

    @property
    def gvisor(self) -> bool:
        return self.deployment.gvisor

    def start(self) -> None:
        self._closed = False
        if (
            self._journal is None
        ):  # durably, before the box can write anything: a host killed before its sweep leaves it to the next command
            try:
                self._journal = sweep_journal.record(
                    self.id, self.workspace, self.sweeper.quarantine, self.sweeper.placeholder_mountpoint, self.baseline
                )
            except OSError as err:
                raise OpenAgentsError(
                    ErrorType.IO_ERROR,
                    f"cannot journal the workspace's sweep under {sweep_journal.journal_dir()}: {err.strerror}",
                ) from None
        if self.quota is None:
            skip = set(self.baseline.git_entries.values())
            dedicated = quota_fs.enforced_at(self.workspace)
            if (
                dedicated is not None
            ):  # the file system stops the box at the quota (ENOSPC); the watcher stops the session past it
                quota_fs.set_headroom(dedicated, self.config.write_quota + quota_fs.SLACK)
            self.quota = WriteQuota(
                self.workspace,
                self.config.write_quota,
                self.baseline.usage_bytes,
                skip,
                on_exceeded=self.kill_processes,
                entry_limit=self.config.entry_quota,
                start_entries=self.baseline.entries,
                budget=self.host_budget,
                layer=fork_upper(self.workspace)
                if dedicated is None
                else None,  # a fork's overlay: the disk it uses counts
                dedicated=dedicated,
            )
        self.quota.start()
        first = not self._ever_started
        try:
            self._start_box()
        except BaseException:
            if first:  # what the first start set up (the quota's watcher, an egress gate, the journal) goes with it
                self.quota.stop()
                self.deployment.close()
                self._sweep_and_clear()
            raise
        self._ever_started = True

    def _start_box(self) -> None:
        """One start, first or after a lost agent: a slot of the process's start gate is held from
        the deployment's start to the agent's first answer, the part that costs the daemon and CPU."""
        with self.start_gate.slot(self.config.start_concurrency, self.on_start_queue):
            try:
                self._channel = Channel(self.deployment.start())
            except BaseException:
                self._remove()
                raise
            try:
                _, future = self._channel.request("hello", {})
                # The start's own deadline, not the call's: a replacement started after a short call
                # deadline passed must not fail only because a busy machine starts boxes slowly.
                hello = wait(future, START_DEADLINE_S)
            except (OpenAgentsError, FutureTimeout) as err:
                self._remove()
                raise OpenAgentsError(
                    ErrorType.SANDBOX_START_FAILED,
                    f"the agent did not answer: {str(err) or f'nothing within {START_DEADLINE_S:.0f} s'}",
                ) from None
        self.agent_info = hello.meta

    def restart(self) -> None:
        with self._lifecycle:
            self._remove()
            self.sweep()
            self.restarts += 1
            self.start()

    def close(self) -> None:
        with self._lifecycle:
            self._closed = True
            self._remove()
            if self.quota is not None:
                self.quota.stop()
            self._sweep_and_clear()
        self.deployment.close()

    def _sweep_and_clear(self) -> None:
        """The last sweep; its journal goes only when it finished (else the next command retries it)."""
        report = self.sweep()
        if report.complete and self._journal is not None:
            sweep_journal.clear(self._journal)
            self._journal = None

    def sweep(self, budget: HostBudget | None = None) -> SweepReport:
        """After our box is gone. Another session's box may still run on the same workspace;
        the walk acts only through O_NOFOLLOW directory fds, so it cannot be steered outside.
        `budget`: bounds it (default `host_budget`); one that cannot finish says so, typed."""
        report = self.sweeper.sweep(shared=self.deployment.others_on_workspace(), budget=budget or self._sweep_budget())
        if report and self.on_sweep:
            self.on_sweep(report)
        return report

    def _sweep_budget(self) -> HostBudget:
        """The sweep's own clock, never the session's: --max-wall ending a session must not cut short
        the sweep that makes its workspace safe. One that cannot finish within SWEEP_BUDGET_S says
        so and stays journaled, and the next command finishes it."""
        return HostBudget.until(SWEEP_BUDGET_S)

    def _remove(self) -> None:
        """The box first, its stream after: closing the stream first ends the agent's stdin, the agent
        exits by itself, and the removal then races that exit (how boxes leaked, issue 16)."""
        channel, self._channel = self._channel, None
        try:
            self.deployment.remove()
        finally:
            if channel is not None:
                channel.close()

    # -- calls -----------------------------------------------------------------------------
    def deadline_for(self, call: BoxCall) -> float:
        """A call that bounds its own run by its arguments (its rule's timeout_arg) gets that plus the
        grace; every other call the fixed per-call deadline."""
        own = call.rule.deadline(call.args)
        return own + self.config.shell_grace_s if own is not None else self.config.call_deadline_s

    def call(self, tool: str, args: dict[str, Any], on_output: Callable[[str], None] | None = None) -> ToolResult:
        return self.run(BoxCall.named(tool, args), on_output)

    def run(self, call: BoxCall, on_output: Callable[[str], None] | None = None) -> ToolResult:
        if self.quota is not None and self.quota.exceeded.is_set():
            return self._over_quota()
        with self._in_flight_lock:
            self._in_flight += 1
            self._spawned = self._spawned or call.rule.spawns
        try:
            with host_memory.tool_call():
                result = self._call(call, on_output=on_output)  # host_memory: free pages go back when idle
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1
        if self.quota is not None and call.rule.writes and self.quota.poll():
            return self._over_quota(result.output)
        return result

    def _over_quota(self, output: str = "") -> ToolResult:
        assert self.quota is not None
        err = OpenAgentsError(ErrorType.WORKSPACE_QUOTA_EXCEEDED, self.quota.message())
        return ToolResult.failure(
            err, executor=Executor.OPENAGENTS, output=output, meta={"workspace_growth_bytes": self.quota.growth}
        )

    def _call(self, call: BoxCall, resent: bool = False, on_output: Callable[[str], None] | None = None) -> ToolResult:
        with self._lifecycle:
            if self._closed:  # never a new box behind a close (a call racing it from another thread)
                return ToolResult.failure(
                    OpenAgentsError(ErrorType.SANDBOX_CLOSED, "the sandbox is closed: its box was removed"),
                    executor=Executor.OPENAGENTS,
                )
            if self._channel is None or self._channel.broken:
                try:
                    self.restart()
                except OpenAgentsError as err:  # no box to run it in (the daemon is gone ...): this call fails, typed
                    return ToolResult.failure(err, executor=Executor.OPENAGENTS)
            channel = self._channel
        assert channel is not None
        deadline = self.deadline_for(call)
        started = time.monotonic()
        rid: int | None = None
        try:
            rid, future = channel.request(call.tool, call.args, on_output if call.rule.streams else None)
            try:
                response = wait(future, deadline)
            except FutureTimeout:
                timed_out = self._on_deadline(call.tool, channel, rid, future, deadline)
                timed_out.egress = self.deployment.drain_egress()  # what it sent before it was killed is its own
                return timed_out
        except OpenAgentsError as err:
            if err.type is ErrorType.AGENT_LOST:
                err = self.deployment.why_lost(err)
            if err.type in (ErrorType.AGENT_LOST, ErrorType.PROTOCOL_ERROR):
                self._recover(err, channel)
                # The agent died before it read this request (e.g. right after a `kill 1`): nothing
                # of it ran, so it goes once to the fresh agent instead of failing for nothing.
                if (
                    err.type is ErrorType.AGENT_LOST
                    and not resent
                    and not self._closed
                    and (rid is None or not channel.was_received(rid))
                ):
                    return self._call(call, resent=True, on_output=on_output)
            return ToolResult.failure(err, executor=Executor.OPENAGENTS)
        result = ToolResult.from_agent(response)  # the agent's meta without the host's keys: those are set here
        result.meta["host_elapsed_s"] = round(time.monotonic() - started, 3)
        result.egress = self.deployment.drain_egress()
        return result

    def _on_deadline(
        self, tool: str, channel: Channel, rid: int, future: Future[AgentResponse], deadline: float
    ) -> ToolResult:
        """The host's deadline passed: kill every process in the box but the agent, from outside."""
        message = (
            f"{tool} passed the host's deadline of {deadline:.0f}s; the command and everything it started were killed"
        )
        self.kill_processes()
        try:
            response = wait(future, RETRIED_AFTER_DEADLINE_S)
        except (FutureTimeout, OpenAgentsError):
            channel.forget(rid)
            with self._lifecycle:
                if self._channel is channel:
                    try:
                        self.restart()
                    except OpenAgentsError as lost:  # e.g. the daemon stopped answering: that is the call's outcome
                        return ToolResult.failure(
                            OpenAgentsError(lost.type, f"{message}; {lost.message}"), executor=Executor.OPENAGENTS
                        )
            err = OpenAgentsError(
                ErrorType.TIMEOUT, message + "; the agent did not answer and the sandbox was replaced"
            )
            return ToolResult.failure(err, executor=Executor.OPENAGENTS)
        # Whatever the agent claims, the host's deadline decides: this call timed out.
        err = OpenAgentsError(ErrorType.TIMEOUT, message)
        return ToolResult.failure(
            err,
            executor=Executor.OPENAGENTS,
            output=response.output,
            meta={**agent_meta(response.meta), "timed_out": True},
        )

    def kill_processes(self) -> None:
        """SIGKILL to every process of the sandbox user except PID 1 (the agent): setsid'd and
        daemonized children too, since kill(-1) does not care about process groups. Nothing to do (and
        no `docker exec` waited for) while no call is under way and none that spawns processes ever ran."""
        with self._in_flight_lock:
            if not self._spawned and not self._in_flight:
                return
        self.deployment.kill_processes()

    def widen_egress(self, rule: EgressRule, once: bool) -> bool:
        """A rule the person allowed, added to the running egress gate for this session (a
        deployment without a gate, or without live rules, says False)."""
        widen = getattr(self.deployment, "widen_egress", None)
        return bool(widen(rule, once)) if callable(widen) else False

    def _recover(self, err: OpenAgentsError, channel: Channel) -> None:
        """The agent is gone or untrustworthy: a fresh one on the same workspace, so the session goes on."""
        with self._lifecycle:
            if self._channel is not channel:
                return  # another call already replaced it
            log.warning("sandbox agent lost (%s): %s; starting a fresh one", err.type.value, err.message)
            try:
                self.restart()
            except OpenAgentsError as restart_err:
                log.error("could not restart the sandbox: %s", restart_err.message)
