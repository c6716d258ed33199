"""Assembling one session from its options (SandboxOptions): the policy value, model, box, registry,
ladder, transcript, checkpoints, hooks.

Every front-end (run, exec, mcp, acp, batch, --attempts, the plug-ins) differs only in who answers
approvals and who watches the events; everything else is put together here, once, and only the
public API (orchestrator/api/: Box) calls open_session (tests/architecture/test_api_layout.py).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import events as ev
from ..boxfs import HostBudget
from ..config import EgressConfig, SandboxConfig
from ..hooks import wiring as hook_wiring
from ..models.base import ModelClient, RetryNotice, RetryPolicy
from ..pipeline import CallPipeline
from ..policy import pins
from ..policy.approvals import ApprovalGate, Approver
from ..policy.load import authority_sources, load_session_policy
from ..protocol import Executor
from ..sandbox.backend import backend_from_config
from ..sandbox.base import Box
from ..sandbox.starts import StartQueued
from ..tools.registry import HostTools, ToolRegistry
from ..transcript import Redactor, Transcript
from ..transcript.resume import rebuild, resumable
from ..workspace import host_code, quota_fs
from ..workspace import records as records_
from ..workspace.cleanup import discard_state
from ..workspace.context_files import ContextFiles
from ..workspace.copy import CopyLimits
from ..workspace.integrity import SweepReport
from ..workspace.records import ResumeLock, SessionRecord, WorkspaceMode, prepare
from .opened import OpenSession, first_checkpoint
from .options import SandboxOptions

if TYPE_CHECKING:
    from ..loop import TurnLoop  # a session without a model (exec, the API's calls) never imports the turn loop


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


def open_session(
    options: SandboxOptions,
    workspace: Path,
    config: SandboxConfig,
    approver: Approver,
    transcript_path: Path | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    box: Box | None = None,
    mode: WorkspaceMode = WorkspaceMode.AUTO,
    kind: str = "run",
    host_tools: HostTools | None = None,
    copy_limits: CopyLimits | None = None,
    resume: SessionRecord | None = None,
) -> OpenSession:
    """`box`, if given, is already started (from a warm pool) for this workspace and config
    (bind mode). In copy mode the copy is taken here, before any box exists. `host_tools` (the
    user's MCP servers, started) join the registry; their owner stops them. `copy_limits`: copy
    mode's size guard (sessions.prepare). `resume`: the record of a session to continue (resume.py):
    its workspace (its copy, in copy mode), its transcript appended to, its conversation rebuilt."""
    lock = None
    if resume is not None:  # checked again under the lock: another process may have taken it since
        lock = ResumeLock(resume)
        try:
            resume = resumable(records_.open_own_record(resume.id), conversation=options.model is not None)
        except BaseException:
            lock.release()
            raise
        workspace = Path(resume.workspace)
    workspace = Path(workspace).resolve()
    watchers: list[Transcript] = []  # the transcript comes later; a retry before it has nobody to tell
    model = _model(options, watchers) if options.model is not None else None
    try:
        policy = load_session_policy(workspace, [str(p) for p in options.policy_files], resume)  # resolved once, here
        read = authority_sources(policy, workspace, resume)  # pinned in the record below
        mode = policy.workspace_mode(
            mode,
            resumed=resume.mode if resume is not None else None,
            warm_box_read_only=_read_only(box) if box is not None else None,
        )
        config = policy.box_config(config)
        mode, config, keep_out = host_code_mode(workspace, mode, config, box, resume, kind)
        key_var = None
        if options.model is not None:
            from ..models.factory import key_variable  # the model clients (httpx) only when a model is used

            key_var = key_variable(options.model, options.api_key_env)
        redactor = Redactor.from_environment([os.environ.get(key_var, "")] if key_var else [])
        repo = ToolRegistry.open_repo(workspace, options.registry_config())  # before the box can write anything
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
                WorkspaceMode.BIND if box is not None else mode,
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
    record.model_spec, record.base_url, record.api_key_env = options.model, options.base_url, options.api_key_env
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
        host_budget = HostBudget.until(options.run_budget().max_wall_s)
        from_real = rebuilt is None and record.mode == WorkspaceMode.COPY and record.manifest_path.is_file()
        if not unchangeable(kind, config):
            from ..workspace.checkpoints import CheckpointStore, CopyBaseline  # pygit2: only where it records

            checkpoints = CheckpointStore(record.checkpoint_store, box_ws, budget=host_budget)
            if from_real:  # copy mode: turn 0 from the untouched real tree (checkpoints/baseline.py)
                checkpoints.baseline = CopyBaseline(workspace, record.manifest_path)
        if box is None:
            box_config = config.model_copy(update={"user": record.user})
            box = backend_from_config(box_config).sandbox(
                box_ws, box_config, state_dir=record.dir, git_dir=git_dir, baseline=record.take_fresh_baseline()
            )
        box.on_start_queue = lambda progress: start_queued(transcript, progress)
        if hasattr(box, "host_budget"):
            box.host_budget = host_budget
        opened = OpenSession(box, transcript, record, checkpoints, lock)
        # The start (turn 0; a resumed session's state), recorded while the box starts and read-only
        # calls run: in bind mode any call that may change files waits for it (registry.before_change,
        # below).
        if checkpoints is not None:
            checkpoints.in_background(
                lambda: first_checkpoint(opened, rebuilt.previous_turns if rebuilt is not None else None)
            )
        if not box.started:
            box.start()
        registry = ToolRegistry(box, box_ws, options.registry_config(), repo, host_tools)
    except BaseException as err:
        if checkpoints is not None:  # the first record ends before its transcript and state go
            checkpoints.cancel()
            checkpoints.wait()
        if box is not None:
            box.close()
        transcript.close()
        _failed(record, err, lock)
        raise

    def swept(report: SweepReport) -> None:
        transcript.emit(ev.IntegritySwept(executor=Executor.OPENAGENTS, **report.model_dump(mode="json")))

    box.on_sweep = swept
    from ..workspace.preview import proposed_diff

    gate = ApprovalGate(
        policy.ladder(),
        approver,
        auto_approve=options.auto_approve,
        preview=lambda prepared: proposed_diff(box_ws, prepared),
    )
    opened.pipeline = CallPipeline(registry, gate, transcript)
    if (
        checkpoints is not None and not from_real
    ):  # copy mode's turn 0 reads the real tree: the box may write the copy meanwhile
        registry.before_change = partial(checkpoints.wait, opened.pipeline.cancel)
    credentials = [
        *(config.egress or EgressConfig()).credentials,
        *(getattr(getattr(getattr(box, "config", None), "egress", None), "credentials", None) or []),
    ]
    opened.pipeline.hooks = hook_wiring.make(
        policy.hook_specs(),
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
    opened.rebuilt, opened.policy = rebuilt, policy
    return opened


def unchangeable(kind: str, config: SandboxConfig) -> bool:
    """`oa-sandbox exec` of a read-only tool (cli/run.py): one call in a box whose workspace is mounted
    read-only, no model, no turn after it. Nothing there can change the workspace, so there is nothing
    for a checkpoint to record (no store; `checkpoints ID` lists none) and its pygit2 is not imported
    (issue 50). Every other session records its start, read-only or not (a host tool, a later call)."""
    return kind == "exec" and config.workspace_read_only


def warm_box_config(
    workspace: Path, policy_files: list[str], config: SandboxConfig, mode: WorkspaceMode
) -> SandboxConfig:
    """The configuration of a warm pool's boxes for `workspace`, started before any session (bind
    mode, on the workspace itself): the policy's (never for copy-only access; the workspace mounted
    read-only for read-only; its egress), and what the host runs or imports mounted read-only, or
    refused (workspace/host_code.py). Each session on one of them loads the policy again."""
    policy = load_session_policy(workspace, policy_files)
    policy.refuse_warm_box()
    config = policy.box_config(config)
    decided = host_code.guard(
        workspace,
        mode,
        config,
        fixed_bind="a warm pool's boxes mount the workspace itself",
        instead="Run without --pool",
    )
    decided.raise_refusal()
    return config.model_copy(update={"read_only_entries": decided.read_only})


def _read_only(box: Box) -> bool:
    """Whether a box started before the session (a warm pool's) mounts the workspace read-only."""
    return bool(getattr(getattr(box, "config", None), "workspace_read_only", False))


def host_code_mode(
    workspace: Path,
    mode: WorkspaceMode,
    config: SandboxConfig,
    box: Box | None,
    resume: SessionRecord | None,
    kind: str,
) -> tuple[WorkspaceMode, SandboxConfig, list[str]]:
    """Nothing the host runs or imports may lie where the box writes (workspace/host_code.py): the
    mode and config the session goes on with (`auto` made a copy, said on stderr; the override's
    read-only entries in the config), and the workspace paths a copy's apply must leave out.
    HostCodeInWorkspace (CONFIG_INVALID) when bind mode is refused."""
    fixed = instead = ""
    if box is not None:
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
        have = set(getattr(getattr(box, "config", None), "read_only_entries", None) or []) if box is not None else None
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


def _model(options: SandboxOptions, watchers: list[Transcript]) -> ModelClient:
    """The model `options.model` names, its retries told to the watchers' transcripts, checked
    before any box exists where it can be (a dead endpoint costs a second, not a sandbox)."""
    assert options.model is not None

    def retried(notice: RetryNotice) -> None:
        for transcript in watchers:
            transcript.emit(ev.ModelRetrying(executor=Executor.OPENAGENTS, **notice.model_dump()))

    from ..models.factory import model_from_spec

    model = model_from_spec(
        options.model,
        base_url=options.base_url,
        api_key_env=options.api_key_env,
        retry=RetryPolicy(on_retry=retried),
        timeout_s=options.model_timeout_s,
    )
    check = getattr(model, "preflight", None)
    if check is not None:
        check()
    return model


def _turn_loop(opened: OpenSession, model: ModelClient, options: SandboxOptions) -> TurnLoop:
    from ..loop import TurnLoop

    loop = TurnLoop(
        model,
        opened.pipeline.registry,
        opened.pipeline.gate,
        opened.transcript,
        max_turns=options.max_turns,
        after_turn=opened.checkpoint,
        session_id=opened.record.id,
        workspace_mode=opened.record.mode.value,
        budget=options.run_budget(),
        pipeline=opened.pipeline,
    )
    if opened.context is not None:
        loop.messages[0].content += opened.root_context
        loop.context_files = opened.context
    if opened.hook_context:
        loop.messages[0].content += opened.hook_context
    return loop


def attach_model(opened: OpenSession, options: SandboxOptions) -> TurnLoop:
    """A turn loop for a model named after the session opened (the API's run()): over the session's
    own pipeline, gate, transcript and checkpoints, as open_session makes one for `run`. The record
    says which model worked on it last (what a resume takes again)."""
    loop = _turn_loop(opened, _model(options, [opened.transcript]), options)
    opened.turn_loop = loop
    record = opened.record
    record.model_spec, record.base_url, record.api_key_env = options.model, options.base_url, options.api_key_env
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
            discard_state(record)
        except OSError:  # the record still says failed; `sessions prune` removes a failed session's state
            pass
