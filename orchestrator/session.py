"""Assembling one session: policies, model, sandbox, registry, ladder, transcript.

`oa-sandbox run` and `oa-sandbox acp` differ only in who answers approvals and who watches the
events; everything else is put together here, once.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field

from .config import EgressConfig, SandboxConfig
from .loop import Session
from .models.base import key_variable, model_from_spec
from .policy.approvals import ApprovalGate, Approver
from .protocol import Executor
from .hostfs import lstat_workspace
from .policy.ladder import POLICY_NAMES, EgressPolicy, Ladder, PolicyRule, Tier, load_policy_file, load_workspace_policy
from .sandbox.docker import DockerSandbox
from .tools.registry import RegistryConfig, ToolRegistry
from .transcript import Redactor, Transcript

ADMIN_POLICY = "/etc/openagents-sandbox/policy.toml"


class SessionOptions(BaseModel):
    model_spec: str
    base_url: str | None = None
    api_key_env: str | None = None
    policy_files: list[str] = Field(default_factory=list)
    max_turns: int = 100
    registry: RegistryConfig = Field(default_factory=RegistryConfig)


def load_policies(workspace: Path, files: list[str]) -> tuple[list[PolicyRule], EgressPolicy]:
    """Admin (OA_ADMIN_POLICY or /etc/openagents-sandbox/policy.toml), the workspace's own
    (.openagents/policy.*, may only tighten), and the user's files (their own tier, default user).

    The workspace's files are the box's: they are looked at with lstat and read through hostfs
    only, so a symlink (or a symlinked .openagents), a FIFO or a huge file is refused, never
    followed, blocked on or read; whatever sits at one of the names must be a sound policy.
    """
    loaded = []
    admin = os.environ.get("OA_ADMIN_POLICY") or ADMIN_POLICY
    if Path(admin).is_file():
        loaded.append(load_policy_file(admin, Tier.ADMIN))
    for name in POLICY_NAMES:
        rel = f".openagents/{name}"
        if lstat_workspace(workspace, rel) is not None:
            loaded.append(load_workspace_policy(workspace, rel))
    loaded += [load_policy_file(path) for path in files]
    egress = EgressPolicy()
    for policy in loaded:
        if policy.egress:
            egress.allow += policy.egress.allow
            egress.allow_cidrs += policy.egress.allow_cidrs
    return [rule for policy in loaded for rule in policy.rules], egress


def with_policy_egress(config: SandboxConfig, egress: EgressPolicy) -> SandboxConfig:
    """A policy file can open egress (its hosts join --egress's); CIDRs come from admin policy only."""
    if not egress.allow and not egress.allow_cidrs:
        return config
    current = config.egress or EgressConfig()
    merged = current.model_copy(update={"allow": [*current.allow, *egress.allow], "allow_cidrs": [*current.allow_cidrs, *egress.allow_cidrs]})
    return config.model_copy(update={"egress": merged})


def default_transcript_path(prefix: str = "") -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "openagents-sandbox" / "transcripts" / f"{prefix}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}.jsonl"


@dataclass
class OpenSession:
    session: Session
    sandbox: DockerSandbox
    transcript: Transcript

    def kill_running(self) -> None:
        self.sandbox.kill_processes()

    def close(self) -> list[str]:
        """Removes the sandbox, which sweeps the workspace; returns what the sweeps found, one line
        each, for the end of the run (the transcript has them as `integrity_sweep` events)."""
        try:
            self.sandbox.close()
        finally:
            self.transcript.close()
        return [line for report in self.sandbox.sweeper.reports for line in report.lines()]


def open_session(options: SessionOptions, workspace: Path, config: SandboxConfig, approver: Approver,
                 transcript_path: Path | None = None, on_event: Callable[[dict], None] | None = None,
                 sandbox: DockerSandbox | None = None) -> OpenSession:
    """`sandbox`, if given, is already started (from a warm pool) for this workspace and config."""
    workspace = Path(workspace).resolve()
    model = model_from_spec(options.model_spec, base_url=options.base_url, api_key_env=options.api_key_env)
    rules, egress = load_policies(workspace, options.policy_files)
    key_var = key_variable(options.model_spec, options.api_key_env)
    redactor = Redactor.from_environment([os.environ.get(key_var, "")] if key_var else [])
    transcript = Transcript(transcript_path or default_transcript_path(), redactor, on_event=on_event)
    try:
        repo = ToolRegistry.open_repo(workspace, options.registry)  # before the box can write anything
        if sandbox is None:
            sandbox = DockerSandbox(workspace, with_policy_egress(config, egress))
            sandbox.start()
        registry = ToolRegistry(sandbox, workspace, options.registry, repo)
    except BaseException:
        if sandbox is not None:
            sandbox.close()
        transcript.close()
        raise
    sandbox.on_sweep = lambda report: transcript.event("integrity_sweep", executor=Executor.OPENAGENTS, **report.model_dump(mode="json"))
    session = Session(model, registry, ApprovalGate(Ladder(rules), approver), transcript, max_turns=options.max_turns)
    return OpenSession(session, sandbox, transcript)
