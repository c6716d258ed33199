"""Assembling one session: policies, model, sandbox, registry, ladder, transcript.

Every front-end (run, exec, mcp, acp, batch, --attempts, the plug-ins) differs only in who answers
approvals and who watches the events; everything else is put together here, once, and only the
public API (orchestrator/api/: Sandbox) calls open_session (tests/architecture/test_api_layout.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, Field

from . import events as ev
from .boxfs import HostBudget, lstat_workspace, read_workspace_file
from .budget import Budget
from .config import DEFAULT_MAX_TURNS, EgressConfig, SandboxConfig
from .errors import ErrorType, OpenAgentsError
from .hooks import wiring as hook_wiring
from .models.base import DEFAULT_MODEL_TIMEOUT_S, ModelClient, RetryNotice, RetryPolicy
from .pipeline import CallPipeline
from .policy import floors, pins
from .policy.approvals import ApprovalGate, Approver
from .policy.hook_spec import Collected
from .policy.ladder import (
    POLICY_CAP,
    POLICY_NAMES,
    Access,
    EgressPolicy,
    Ladder,
    PolicyFile,
    PolicyRule,
    Tier,
    access_of,
    parse_policy,
)
from .policy.pins import Source
from .protocol import Executor
from .sandbox.backend import backend_from_config
from .sandbox.base import Sandbox
from .sandbox.starts import StartQueued
from .tools import catalog
from .tools.registry import HostTools, RegistryConfig, ToolRegistry
from .transcript import Redactor, Transcript
from .transcript.resume import Rebuilt, rebuild, resumable
from .workspace import host_code, quota_fs
from .workspace import records as records_
from .workspace.checkpoints import CheckpointStore
from .workspace.context_files import ContextFiles
from .workspace.copy import CopyLimits
from .workspace.integrity import SweepReport
from .workspace.records import ResumeLock, SessionRecord, WorkspaceMode, prepare

if TYPE_CHECKING:
    from .loop import TurnLoop  # a session without a model (exec, the API's calls) never imports the turn loop

ADMIN_POLICY = "/etc/openagents-sandbox/policy.toml"


class SessionOptions(BaseModel):
    model_spec: str | None = None  # None: no model, the caller makes the calls (the MCP server's client)
    base_url: str | None = None
    api_key_env: str | None = None
    policy_files: list[str] = Field(default_factory=list)
    max_turns: int = DEFAULT_MAX_TURNS
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    budget: Budget = Field(default_factory=Budget)
    auto_approve: bool = False  # --auto-approve: what runs inside the sandbox proceeds without asking
    model_timeout_s: float = Field(
        default=DEFAULT_MODEL_TIMEOUT_S, gt=0
    )  # --model-timeout: the longest the model may stay silent
    context_files: bool = True  # AGENTS.md in the system prompt (context_files.py)


def load_authority(
    workspace: Path, files: list[str], resumed: SessionRecord | None, hooks: Collected
) -> tuple[list[PolicyRule], EgressPolicy, list[Source]]:
    """Everything a session's start trusts: the policies (load_policies) and the user's config file,
    with each source as read now, for pins.save."""
    read: list[Source] = []
    rules, egress = load_policies(workspace, files, resumed, read, hooks)
    config_file = pins.user_config_source(workspace)
    if config_file is not None:
        pins.note_changed(resumed, "user_config", config_file.path)
        read.append(config_file)
    return rules, egress, read


def load_policies(
    workspace: Path,
    files: list[str],
    resumed: SessionRecord | None = None,
    sources: list[Source] | None = None,
    hooks: Collected | None = None,
) -> tuple[list[PolicyRule], EgressPolicy]:
    """Admin (OA_ADMIN_POLICY or /etc/openagents-sandbox/policy.toml), the workspace's own
    (.openagents/policy.*, may only tighten), and the user's files (their own tier, default user).

    The workspace's files are the box's: they are looked at with lstat and read through boxfs
    only, so a symlink (or a symlinked .openagents), a FIFO or a huge file is refused, never
    followed, blocked on or read; whatever sits at one of the names must be a sound policy. Any
    file that lies where a box can write counts as a workspace policy, however it was named
    (policy/pins.py). `resumed`: the user's files come from what that session pinned at its start,
    and its pinned workspace policies apply beside today's. `sources` gets what was read (to pin).
    `hooks` gets the files' [[hooks]]: on resume, none from a workspace file read afresh (only its pin's).
    On resume, the levels and denies of files pinned at the start and not given now still hold
    (policy/floors.py), unless a file given now lifts them explicitly; the admin's never drop.
    """
    collected: list[Source] = []
    loaded = []
    admin = os.environ.get("OA_ADMIN_POLICY") or ADMIN_POLICY
    admin_source = None
    if Path(admin).is_file():
        admin_source = Source(
            "admin_policy",
            Path(admin).resolve(),
            pins.read_file(admin, "admin policy"),
            pins.inside(Path(admin), pins.box_roots(workspace)),
        )
        pins.note_changed(resumed, "admin_policy", admin_source.path)
        loaded.append(pins.parse(admin_source, Tier.ADMIN))
        collected.append(admin_source)
    for name in POLICY_NAMES:
        rel = f".openagents/{name}"
        if lstat_workspace(workspace, rel) is not None:
            raw = read_workspace_file(workspace, rel, POLICY_CAP)
            fresh = parse_policy(raw, rel, Path(rel).suffix, Tier.WORKSPACE, untrusted=True)
            if (
                resumed is not None and fresh.hooks and hooks is not None
            ):  # what the box wrote since the start grants nothing
                hooks.dropped += [
                    f"{h.label()}: {rel} read afresh on resume; only the hooks pinned at the session's start run"
                    for h in fresh.hooks
                ]
                fresh = fresh.model_copy(update={"hooks": []})
            loaded.append(fresh)
            collected.append(Source("workspace_policy", workspace / rel, raw, True))
    for source in pins.pinned_workspace_sources(resumed):
        loaded.append(pins.parse(source))
        collected.append(source)
    given = [(source, pins.parse(source)) for source in pins.user_sources(files, workspace, resumed)]
    loaded += [policy for _, policy in given]
    collected += [source for source, _ in given]
    # On resume, what the pinned files refused and the files given now do not explicitly lift (floors.py):
    # rules with their own tier, egress denies after the admin's rules, before the others.
    floor = floors.pinned_floors(resumed, files, given, admin_source)
    if floor.rules or floor.egress:
        at = 1 if admin_source is not None else 0
        loaded.insert(
            at, PolicyFile(rules=floor.rules, egress=EgressPolicy(rules=floor.egress) if floor.egress else None)
        )
    if sources is not None:
        sources += collected
    if hooks is not None:
        hooks.specs += [hook for policy in loaded for hook in policy.hooks]
        hooks.trusted = hooks.trusted or any(
            policy.trust_workspace_hooks for policy in loaded
        )  # parse_policy refuses it below the user tier
    egress = EgressPolicy()
    for policy in loaded:
        if policy.egress:
            egress.allow += policy.egress.allow
            egress.allow_cidrs += policy.egress.allow_cidrs
            egress.rules += policy.egress.rules  # admin's first: the first match wins
            egress.credentials += policy.egress.credentials
            egress.upstream_ca = egress.upstream_ca or policy.egress.upstream_ca
    return [rule for policy in loaded for rule in policy.rules], egress


def with_policy_egress(config: SandboxConfig, egress: EgressPolicy) -> SandboxConfig:
    """A policy file can open egress (its hosts join --egress's); CIDRs come from admin policy only."""
    if not egress.allow and not egress.allow_cidrs and not egress.rules and not egress.credentials:
        return config
    current = config.egress or EgressConfig()
    # The policies' rules come before --egress's hosts (whole-host allows): an admin's deny still wins.
    merged = current.model_copy(
        update={
            "allow": [*current.allow, *egress.allow],
            "allow_cidrs": [*current.allow_cidrs, *egress.allow_cidrs],
            "rules": [*egress.rules, *current.rules],
            "credentials": [*current.credentials, *egress.credentials],
            "upstream_ca": current.upstream_ca or egress.upstream_ca,
        }
    )
    return config.model_copy(update={"egress": merged})


def start_queued(transcript: Transcript, progress: StartQueued) -> None:
    """The box's start waits in the process's line (sandbox/starts.py): said live while it waits,
    recorded once it has a slot; the session's first start and every restart alike."""
    event = ev.SandboxStartQueued(
        executor=Executor.OPENAGENTS,
        ahead=progress.ahead,
        starting=progress.starting,
        limit=progress.limit,
        waited_s=progress.waited_s,
        slot_taken=progress.slot_taken,
    )
    if progress.slot_taken:
        transcript.emit(event)
    else:
        transcript.notify(event)


MUTATING_TOOLS = catalog.mutating()  # the tools that may change workspace files (their ToolDef says)


@dataclass
class OpenSession:
    sandbox: Sandbox
    transcript: Transcript
    record: SessionRecord
    checkpoints: "CheckpointStore | None" = None
    lock: ResumeLock | None = None  # a resumed session's: released when it closes
    # Every call's steps (validate, decide, execute, record), made last with the registry.
    pipeline: CallPipeline = field(init=False)
    # The turn loop over the pipeline, when the session has a model; its after_turn is checkpoint().
    turn_loop: TurnLoop = field(init=False)
    rebuilt: Rebuilt | None = field(init=False, default=None)  # a resumed session's conversation, as read back
    # The root's AGENTS.md (context_files.py), read before the box existed: a turn loop made later gets it too.
    context: ContextFiles | None = field(init=False, default=None)
    root_context: str = field(init=False, default="")
    hook_context: str = field(init=False, default="")  # what SessionStart hooks added, for the model's system prompt
    _ended: bool = field(init=False, default=False)

    def kill_running(self) -> None:
        self.sandbox.kill_processes()

    def checkpoint(self, turn: int, tools: list[str]) -> None:
        """After a turn that may have changed files. A failure is recorded, never fatal."""
        if self.checkpoints is None or (turn and not MUTATING_TOOLS & set(tools)):
            return
        try:
            point = self.checkpoints.record(turn)
        except Exception as err:  # noqa: BLE001 - a checkpoint must never end the session
            self.transcript.emit(
                ev.CheckpointRecorded(executor=Executor.OPENAGENTS, turn=turn, ok=False, error=str(err)[:500])
            )
            return
        if point is not None and not point.ok:  # failed or over the store's budget: changes unknown, never "none"
            self.transcript.emit(
                ev.CheckpointRecorded(
                    executor=Executor.OPENAGENTS,
                    turn=turn,
                    ok=False,
                    state=point.state,
                    error_type=point.error_type,
                    error=point.error[:500],
                )
            )
        elif point is not None:
            self.transcript.emit(
                ev.CheckpointRecorded(
                    executor=Executor.OPENAGENTS,
                    turn=turn,
                    ok=True,
                    files_changed=point.files_changed[:200],
                    skipped=[s.model_dump() for s in point.skipped[:200]],
                )
            )

    def finish(self, status: str, reason: str) -> None:
        self.record.status, self.record.reason = status, reason

    def close(self) -> list[str]:
        """Removes the sandbox, which sweeps the workspace; records what changed; returns what the
        sweeps found, one line each, for the end of the run (the transcript has them as events).
        A first checkpoint still being recorded is cancelled (no call that could change files ran:
        each waits for it) and recorded as failed, so the session never claims to know its changes."""
        if self.checkpoints is not None and self.checkpoints.recording:
            self.checkpoints.cancel()
            self.checkpoints.wait()
        if (
            not self._ended and getattr(self, "pipeline", None) is not None
        ):  # SessionEnd: once, also after Ctrl-C or a fatal error
            self._ended = True
            try:
                hook_wiring.session_end(self.pipeline.hooks, self.record.status, self.record.reason)
            except KeyboardInterrupt:  # a second Ctrl-C cuts the hooks short (killed), never the box's removal
                pass
        try:
            self.sandbox.close()
        finally:
            self.transcript.close()
            if self.checkpoints is not None:
                try:
                    changed = {f for point in self.checkpoints.list() for f in point.files_changed}
                    self.record.files_changed = sorted(changed)
                except Exception:  # noqa: BLE001 - the record is still saved
                    pass
                self.checkpoints.close()
            if self.record.status == "running":
                self.record.status = "closed"  # an editor's session, or one that ended without a result
            if getattr(self, "turn_loop", None) is not None and self.turn_loop.turn:
                self.record.turns = self.turn_loop.turn  # turns count on across runs: `rollback --turn` up to here
            self.record.save()
            if self.lock is not None:
                self.lock.release()
        return [line for report in self.sandbox.sweeper.reports for line in report.lines()]


def open_session(
    options: SessionOptions,
    workspace: Path,
    config: SandboxConfig,
    approver: Approver,
    transcript_path: Path | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    sandbox: Sandbox | None = None,
    mode: WorkspaceMode = WorkspaceMode.AUTO,
    kind: str = "run",
    host_tools: HostTools | None = None,
    copy_limits: CopyLimits | None = None,
    resume: SessionRecord | None = None,
) -> OpenSession:
    """`sandbox`, if given, is already started (from a warm pool) for this workspace and config
    (bind mode). In copy mode the copy is taken here, before any box exists. `host_tools` (the
    user's MCP servers, started) join the registry; their owner stops them. `copy_limits`: copy
    mode's size guard (sessions.prepare). `resume`: the record of a session to continue (resume.py):
    its workspace (its copy, in copy mode), its transcript appended to, its conversation rebuilt."""
    lock = None
    if resume is not None:  # checked again under the lock: another process may have taken it since
        lock = ResumeLock(resume)
        try:
            resume = resumable(records_.open_own_record(resume.id), conversation=options.model_spec is not None)
        except BaseException:
            lock.release()
            raise
        workspace = Path(resume.workspace)
    workspace = Path(workspace).resolve()
    watchers: list[Transcript] = []  # the transcript comes later; a retry before it has nobody to tell
    model = _model(options, watchers) if options.model_spec is not None else None
    try:
        hook_specs = Collected()
        rules, egress, read = load_authority(
            workspace, options.policy_files, resume, hook_specs
        )  # `read`: pinned in the record below
        access = access_of(rules)
        mode = access_mode(access, mode, sandbox, resume, config)
        if access == Access.READ_ONLY:
            config = config.model_copy(update={"workspace_read_only": True})
        mode, config, keep_out = host_code_mode(workspace, mode, config, sandbox, resume, kind)
        key_var = None
        if options.model_spec is not None:
            from .models.factory import key_variable  # the model clients (httpx) only when a model is used

            key_var = key_variable(options.model_spec, options.api_key_env)
        redactor = Redactor.from_environment([os.environ.get(key_var, "")] if key_var else [])
        repo = ToolRegistry.open_repo(workspace, options.registry)  # before the box can write anything
        rebuilt = None
        if resume is not None:
            record, git_dir = resume, (workspace / ".git" if resume.mode == WorkspaceMode.COPY else None)
            quota_fs.fit(
                record, config.write_quota + quota_fs.SLACK
            )  # room for this run's quota on the copy's own file system
            rebuilt = rebuild(record.transcript or "")  # bounded, typed (resume.py), before the record says running
            _mark_resumed(record)
        else:
            record, git_dir = prepare(
                workspace,
                WorkspaceMode.BIND if sandbox is not None else mode,
                config.user,
                kind,
                copy_limits,
                host_code=keep_out,
                write_quota=config.write_quota + quota_fs.SLACK,
            )
            record.transcript = str(transcript_path or record.dir / "transcript.jsonl")
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    box_ws = Path(record.box_workspace)
    if record.mode == WorkspaceMode.COPY:
        repo = None  # the real repository's work tree is not the box's: git stays off in copy mode
    record.model_spec, record.base_url, record.api_key_env = options.model_spec, options.base_url, options.api_key_env
    record.policy_files = [str(Path(f).resolve()) for f in options.policy_files]
    pins.save(record, read)  # the authority in force now, for any later resume
    record.save()
    try:
        transcript = Transcript(
            record.transcript, redactor, on_event=on_event, resume_seq=rebuilt.last_seq if rebuilt else None
        )
    except BaseException as err:
        _failed(record, err, lock)
        raise
    watchers.append(transcript)
    if rebuilt is not None:
        transcript.emit(
            ev.SessionResumed(
                executor=Executor.OPENAGENTS,
                session_id=record.id,
                previous_turns=rebuilt.previous_turns,
                messages=len(rebuilt.messages),
                unreadable=rebuilt.unreadable,
                missing_results=rebuilt.missing_results,
                model=model.name if model is not None else "",
                previous_model=rebuilt.previous_model,
                via=kind,
            )
        )
    context, root_context = None, ""
    if options.context_files:  # the root's AGENTS.md: before any box exists, or on resume compared with the start's
        context = ContextFiles(box_ws, note=transcript.emit, real=workspace)
        root_context = context.root(resumed_from=record.context_root, resumed=rebuilt is not None)
        if rebuilt is None:
            record.context_root = context.root_digest
            record.save()
    checkpoints = None
    try:
        # Host work on box data (checkpoints, the quota's walks) ends with the session's clock.
        host_budget = HostBudget.until(options.budget.max_wall_s)
        checkpoints = CheckpointStore(record.checkpoint_store, box_ws, budget=host_budget)
        if sandbox is None:
            box_config = with_policy_egress(config, egress).model_copy(update={"user": record.user})
            sandbox = backend_from_config(box_config).sandbox(box_ws, box_config, state_dir=record.dir, git_dir=git_dir)
        sandbox.on_start_queue = lambda progress: start_queued(transcript, progress)
        if hasattr(sandbox, "host_budget"):
            sandbox.host_budget = host_budget
        opened = OpenSession(sandbox, transcript, record, checkpoints, lock)
        # The start (turn 0; a resumed session's state), recorded while the box starts and read-only
        # calls run: any call that may change files waits for it (registry.before_change, below).
        checkpoints.in_background(
            lambda: _first_checkpoint(opened, rebuilt.previous_turns if rebuilt is not None else None)
        )
        if not sandbox.started:
            sandbox.start()
        registry = ToolRegistry(sandbox, box_ws, options.registry, repo, host_tools)
    except BaseException as err:
        if checkpoints is not None:  # the first record ends before its transcript and state go
            checkpoints.cancel()
            checkpoints.wait()
        if sandbox is not None:
            sandbox.close()
        transcript.close()
        _failed(record, err, lock)
        raise

    def swept(report: SweepReport) -> None:
        transcript.emit(ev.IntegritySwept(executor=Executor.OPENAGENTS, **report.model_dump(mode="json")))

    sandbox.on_sweep = swept
    from .workspace.preview import proposed_diff

    gate = ApprovalGate(
        Ladder(rules),
        approver,
        auto_approve=options.auto_approve,
        preview=lambda prepared: proposed_diff(box_ws, prepared),
    )
    opened.pipeline = CallPipeline(registry, gate, transcript)
    assert checkpoints is not None
    registry.before_change = partial(checkpoints.wait, opened.pipeline.cancel)
    credentials = [
        *(with_policy_egress(config, egress).egress or EgressConfig()).credentials,
        *(getattr(getattr(getattr(sandbox, "config", None), "egress", None), "credentials", None) or []),
    ]
    opened.pipeline.hooks = hook_wiring.make(
        hook_specs,
        workspace,
        transcript,
        record.id,
        key_var,
        box_ws,
        record,
        resumed=rebuilt is not None,
        withheld=hook_wiring.secret_names(credentials, key_var),
    )
    opened.context, opened.root_context = context, root_context
    opened.hook_context = hook_wiring.session_start(
        opened.pipeline.hooks, "resume" if rebuilt is not None else "startup", kind
    )
    if model is not None:
        opened.turn_loop = _turn_loop(opened, model, options)
        if rebuilt is not None:
            opened.turn_loop.messages += rebuilt.messages
            opened.turn_loop.turn = max(rebuilt.previous_turns, record.turns or 0)
    opened.rebuilt = rebuilt
    return opened


def access_mode(
    access: Access, mode: WorkspaceMode, sandbox: Sandbox | None, resume: SessionRecord | None, config: SandboxConfig
) -> WorkspaceMode:
    """The workspace mode a policy's workspace_access leaves: copy-only makes `auto` a copy and
    refuses bind mode (its edits would reach the workspace with no landing to refuse); read-only
    refuses a box started before the policy was known with the workspace writable (a warm pool's)."""
    pinned = f"the policy's workspace_access is {access.value}"
    if access == Access.COPY_ONLY:
        if (
            sandbox is not None
            or (resume is not None and resume.mode == WorkspaceMode.BIND)
            or mode == WorkspaceMode.BIND
        ):
            raise OpenAgentsError(
                ErrorType.REFUSED_BY_POLICY,
                f"{pinned}: bind mode (or a warm pool's box) would change the workspace "
                "directly; run with --workspace-mode copy (or auto), without --pool",
            )
        return WorkspaceMode.COPY
    if (
        access == Access.READ_ONLY
        and sandbox is not None
        and not getattr(getattr(sandbox, "config", None), "workspace_read_only", False)
    ):
        raise OpenAgentsError(
            ErrorType.REFUSED_BY_POLICY, f"{pinned}: this box was started with the workspace writable"
        )
    return mode


def host_code_mode(
    workspace: Path,
    mode: WorkspaceMode,
    config: SandboxConfig,
    sandbox: Sandbox | None,
    resume: SessionRecord | None,
    kind: str,
) -> tuple[WorkspaceMode, SandboxConfig, list[str]]:
    """Nothing the host runs or imports may lie where the box writes (workspace/host_code.py): the
    mode and config the session goes on with (`auto` made a copy, said on stderr; the override's
    read-only entries in the config), and the workspace paths a copy's apply must leave out.
    HostCodeInWorkspace (CONFIG_INVALID) when bind mode is refused."""
    fixed = instead = ""
    if sandbox is not None:
        fixed, instead = "a warm pool's box mounts the workspace itself", "Open the session without a warm pool's box"
    elif resume is not None:
        mode = resume.mode
        if resume.mode == WorkspaceMode.BIND:
            fixed, instead = (
                f"session {resume.id} works on the workspace in bind mode",
                "Start a new session (copy mode, or auto)",
            )
    decided = host_code.guard(workspace, mode, config, fixed_bind=fixed, instead=instead, api=kind == "api")
    decided.raise_refusal()
    if decided.note:
        host_code.say(decided.note)
    if decided.read_only:
        have = (
            set(getattr(getattr(sandbox, "config", None), "read_only_entries", None) or [])
            if sandbox is not None
            else None
        )
        if have is not None and not set(decided.read_only) <= have:
            missing = ", ".join(sorted(set(decided.read_only) - have))
            raise host_code.HostCodeInWorkspace(
                f"{fixed}, and it was started without {missing} mounted read-only (what the host runs or "
                f"imports: {host_code.summary(decided.found)}); start the pool with --host-code-read-only "
                "too, or run without --pool",
                decided.found,
            )
        config = config.model_copy(update={"read_only_entries": decided.read_only})
    return decided.mode, config, host_code.recorded(decided.found)


def _model(options: SessionOptions, watchers: list[Transcript]) -> ModelClient:
    """The model `options.model_spec` names, its retries told to the watchers' transcripts, checked
    before any box exists where it can be (a dead endpoint costs a second, not a sandbox)."""
    assert options.model_spec is not None

    def retried(notice: RetryNotice) -> None:
        for transcript in watchers:
            transcript.emit(ev.ModelRetrying(executor=Executor.OPENAGENTS, **notice.model_dump()))

    from .models.factory import model_from_spec

    model = model_from_spec(
        options.model_spec,
        base_url=options.base_url,
        api_key_env=options.api_key_env,
        retry=RetryPolicy(on_retry=retried),
        timeout_s=options.model_timeout_s,
    )
    check = getattr(model, "preflight", None)
    if check is not None:
        check()
    return model


def _turn_loop(opened: OpenSession, model: ModelClient, options: SessionOptions) -> TurnLoop:
    from .loop import TurnLoop

    loop = TurnLoop(
        model,
        opened.pipeline.registry,
        opened.pipeline.gate,
        opened.transcript,
        max_turns=options.max_turns,
        after_turn=opened.checkpoint,
        session_id=opened.record.id,
        workspace_mode=opened.record.mode.value,
        budget=options.budget,
        pipeline=opened.pipeline,
    )
    if opened.context is not None:
        loop.messages[0].content += opened.root_context
        loop.context_files = opened.context
    if opened.hook_context:
        loop.messages[0].content += opened.hook_context
    return loop


def attach_model(opened: OpenSession, options: SessionOptions) -> TurnLoop:
    """A turn loop for a model named after the session opened (the API's run()): over the session's
    own pipeline, gate, transcript and checkpoints, as open_session makes one for `run`. The record
    says which model worked on it last (what a resume takes again)."""
    loop = _turn_loop(opened, _model(options, [opened.transcript]), options)
    opened.turn_loop = loop
    record = opened.record
    record.model_spec, record.base_url, record.api_key_env = options.model_spec, options.base_url, options.api_key_env
    record.save()
    return loop


def _mark_resumed(record: SessionRecord) -> None:
    """The record of a session being continued: running again, by this process. A copy session's
    new work is not applied yet (its manifest was moved on by any landing: only new changes remain)."""
    record.status, record.reason, record.host_pid, record.host_uid = "running", "", os.getpid(), os.getuid()
    record.resumes += 1
    if record.mode == WorkspaceMode.COPY:
        record.applied = False


def _failed(record: SessionRecord, err: BaseException, lock: ResumeLock | None) -> None:
    """A session that could not open: its record says why. A new copy session's copy (and store,
    transcript) goes: no box ever ran on it, so it holds nothing but the workspace as it was, and a
    failed open must not cost the disk a copy each time. A resumed session keeps all it had."""
    record.status, record.reason = "failed", str(getattr(err, "message", err))[:500]
    record.save()
    if lock is not None:
        lock.release()
    elif record.mode == WorkspaceMode.COPY:
        try:
            records_.discard_state(record)
        except OSError:  # the record still says failed; `sessions prune` removes a failed session's state
            pass


def _first_checkpoint(opened: OpenSession, previous_turns: int | None) -> None:
    """The session's first record, on the store's background thread: turn 0 of a new session, or
    the state a resumed one finds. Its failure is recorded (checkpoint()), never raised."""
    try:
        if previous_turns is None:
            opened.checkpoint(0, [])  # the start, before the box changed anything
        else:
            _resume_checkpoint(opened, previous_turns)
    except Exception:  # noqa: BLE001 - the transcript was closed under it: the store's index has the record
        pass


def _resume_checkpoint(opened: OpenSession, previous_turns: int) -> None:
    """The workspace as the resumed run finds it, as the state after the previous last turn, when
    no checkpoint is at or after that turn (one that is there already holds it; what changed since,
    the user's edits between the runs, joins the next turn's). Unchanged: nothing is recorded."""
    store = opened.checkpoints
    if store is None or any(point.turn >= previous_turns for point in store.list()):
        return
    try:
        point = store.record(previous_turns)
    except Exception as err:  # noqa: BLE001 - as checkpoint(): never the end of the session
        opened.transcript.emit(
            ev.CheckpointRecorded(executor=Executor.OPENAGENTS, turn=previous_turns, ok=False, error=str(err)[:500])
        )
        return
    if point is not None:
        opened.transcript.emit(
            ev.CheckpointRecorded(
                executor=Executor.OPENAGENTS,
                turn=point.turn,
                ok=point.ok,
                state=None if point.ok else point.state,
                error_type=point.error_type,
                error=point.error[:500] or None,
                files_changed=point.files_changed[:200] if point.ok else None,
            )
        )
