"""Loading a session's policy: every policy file in force, read once at the start, as one
SessionPolicy (policy/value.py). Nothing is filled in by mutation: the value is the answer."""

from __future__ import annotations

import os
from pathlib import Path

from ..boxfs import lstat_workspace, read_workspace_file
from ..workspace.records import SessionRecord
from . import floors, pins
from .ladder import (
    POLICY_CAP,
    POLICY_NAMES,
    AccessPin,
    EgressPolicy,
    PolicyFile,
    Tier,
    access_level,
    access_pin,
    parse_policy,
)
from .pins import Source
from .value import SessionPolicy

ADMIN_POLICY = "/etc/openagents-sandbox/policy.toml"


def load_session_policy(workspace: Path, files: list[str], resumed: SessionRecord | None = None) -> SessionPolicy:
    """Admin (OA_ADMIN_POLICY or /etc/openagents-sandbox/policy.toml), the workspace's own
    (.openagents/policy.*, may only tighten), and the user's files (their own tier, default user).

    The workspace's files are the box's: they are looked at with lstat and read through boxfs
    only, so a symlink (or a symlinked .openagents), a FIFO or a huge file is refused, never
    followed, blocked on or read; whatever sits at one of the names must be a sound policy. Any
    file that lies where a box can write counts as a workspace policy, however it was named
    (policy/pins.py). `resumed`: the user's files come from what that session pinned at its start,
    and its pinned workspace policies apply beside today's; a workspace file read afresh then brings
    no hooks (only its pin's). On resume, the levels and denies of files pinned at the start and not
    given now still hold (policy/floors.py), unless a file given now lifts them explicitly; the
    admin's never drop. The value's `sources` are the files as read (what pins.save records).
    """
    collected: list[Source] = []
    loaded: list[tuple[PolicyFile, AccessPin | None]] = []
    dropped: list[str] = []
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
        loaded.append(_pinned(pins.parse(admin_source, Tier.ADMIN), admin_source))
        collected.append(admin_source)
    for name in POLICY_NAMES:
        rel = f".openagents/{name}"
        if lstat_workspace(workspace, rel) is not None:
            raw = read_workspace_file(workspace, rel, POLICY_CAP)
            fresh = parse_policy(raw, rel, Path(rel).suffix, Tier.WORKSPACE, untrusted=True)
            if resumed is not None and fresh.hooks:  # what the box wrote since the start grants nothing
                dropped += [
                    f"{h.label()}: {rel} read afresh on resume; only the hooks pinned at the session's start run"
                    for h in fresh.hooks
                ]
                fresh = fresh.model_copy(update={"hooks": []})
            loaded.append((fresh, access_pin(fresh, rel)))
            collected.append(Source("workspace_policy", workspace / rel, raw, True))
    for source in pins.pinned_workspace_sources(resumed):
        loaded.append(_pinned(pins.parse(source), source))
        collected.append(source)
    given = [(source, pins.parse(source)) for source in pins.user_sources(files, workspace, resumed)]
    loaded += [_pinned(policy, source) for source, policy in given]
    collected += [source for source, _ in given]
    # On resume, what the pinned files refused and the files given now do not explicitly lift (floors.py):
    # rules with their own tier, egress denies after the admin's rules, before the others.
    floor = floors.pinned_floors(resumed, files, given, admin_source)
    at = 1 if admin_source is not None else 0
    access = [pin for _, pin in loaded[:at] if pin is not None] + floor.access
    access += [pin for _, pin in loaded[at:] if pin is not None]
    if floor.rules or floor.egress:
        kept = PolicyFile(rules=floor.rules, egress=EgressPolicy(rules=floor.egress) if floor.egress else None)
        loaded.insert(at, (kept, None))
    policies = [policy for policy, _ in loaded]
    egress = EgressPolicy()
    for policy in policies:
        if policy.egress:
            egress.allow += policy.egress.allow
            egress.allow_cidrs += policy.egress.allow_cidrs
            egress.rules += policy.egress.rules  # admin's first: the first match wins
            egress.credentials += policy.egress.credentials
            egress.upstream_ca = egress.upstream_ca or policy.egress.upstream_ca
    return SessionPolicy(
        access=access_level(access),
        access_pins=tuple(access),
        rules=tuple(rule for policy in policies for rule in policy.rules),
        egress=egress,
        hooks=tuple(hook for policy in policies for hook in policy.hooks),
        hooks_trusted=any(policy.trust_workspace_hooks for policy in policies),  # parse_policy refuses it below user
        hooks_dropped=tuple(dropped),
        sources=tuple(collected),
    )


def _pinned(policy: PolicyFile, source: Source) -> tuple[PolicyFile, AccessPin | None]:
    return policy, access_pin(policy, str(source.path))


def authority_sources(policy: SessionPolicy, workspace: Path, resumed: SessionRecord | None) -> list[Source]:
    """Everything a session's start trusts, as read now, for pins.save: the policy's files and the
    user's config file."""
    read = list(policy.sources)
    config_file = pins.user_config_source(workspace)
    if config_file is not None:
        pins.note_changed(resumed, "user_config", config_file.path)
        read.append(config_file)
    return read
