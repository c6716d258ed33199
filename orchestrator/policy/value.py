"""SessionPolicy: the authority a session starts with, as one immutable value, resolved once
(policy/load.py, load_session_policy) and read by everything the policy decides:

- `access` (with `access_pins`, the files that set it): the box's configuration (the workspace
  mounted read-only), the workspace mode (copy-only makes a copy, refuses bind mode and a warm
  pool's box), and the ladder's refusals of edits and landing;
- `rules`: the approval rules, every tier's, for the ladder (`ladder()`), so the gate and the
  landing permit alike;
- `egress`: what the egress gate may reach (`box_config`);
- `hooks`, `hooks_trusted`, `hooks_dropped`: the [[hooks]] the hooks' wiring resolves;
- `sources`: every file read, as read, for the session record's pins (policy/pins.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import EgressConfig, SandboxConfig
from ..errors import ErrorType, OpenAgentsError
from .hook_spec import Collected, HookSpec
from .ladder import Access, AccessPin, EgressPolicy, Ladder, PolicyRule
from .pins import Source

if TYPE_CHECKING:
    from ..workspace.records import WorkspaceMode


@dataclass(frozen=True)
class SessionPolicy:
    access: Access = Access.READ_WRITE
    access_pins: tuple[AccessPin, ...] = ()
    rules: tuple[PolicyRule, ...] = ()
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    hooks: tuple[HookSpec, ...] = ()
    hooks_trusted: bool = False  # a user or admin file said trust_workspace_hooks = true
    hooks_dropped: tuple[str, ...] = ()  # hooks left out as read (a workspace file's read afresh on resume)
    sources: tuple[Source, ...] = ()

    def ladder(self) -> Ladder:
        """The approval ladder this policy gives: its rules under its workspace_access pins."""
        return Ladder(self.rules, self.access_pins)

    def hook_specs(self) -> Collected:
        """The [[hooks]] as the hooks' wiring takes them (a fresh, mutable copy)."""
        collected = Collected()
        collected.specs, collected.trusted, collected.dropped = (
            list(self.hooks),
            self.hooks_trusted,
            list(self.hooks_dropped),
        )
        return collected

    def box_config(self, config: SandboxConfig) -> SandboxConfig:
        """`config` as this policy makes it: the workspace mounted read-only for read-only access, and
        the policy files' egress joining the config's (their rules first, so an admin's deny wins;
        CIDRs come from the admin's policy only, which the loader checked)."""
        if self.access == Access.READ_ONLY:
            config = config.model_copy(update={"workspace_read_only": True})
        egress = self.egress
        if not egress.allow and not egress.allow_cidrs and not egress.rules and not egress.credentials:
            return config
        current = config.egress or EgressConfig()
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

    def refuse_warm_box(self) -> None:
        """A warm pool's box is started before any session, on the workspace itself (bind mode): never
        for copy-only access (REFUSED_BY_POLICY); for read-only it is mounted read-only (box_config)."""
        if self.access == Access.COPY_ONLY:
            raise OpenAgentsError(
                ErrorType.REFUSED_BY_POLICY,
                "the policy's workspace_access is copy-only: a warm pool's boxes "
                "mount the workspace itself; run without --pool",
            )

    def workspace_mode(
        self, mode: WorkspaceMode, *, resumed: WorkspaceMode | None = None, warm_box_read_only: bool | None = None
    ) -> WorkspaceMode:
        """The workspace mode this policy leaves of `mode`: copy-only makes `auto` a copy and refuses
        bind mode (a resumed bind session's, or a warm pool's box: `warm_box_read_only` is not None),
        as its edits would reach the workspace with no landing to refuse; read-only refuses a warm
        box started with the workspace writable."""
        from ..workspace.records import WorkspaceMode

        pinned = f"the policy's workspace_access is {self.access.value}"
        if self.access == Access.COPY_ONLY:
            if warm_box_read_only is not None or WorkspaceMode.BIND in (resumed, mode):
                raise OpenAgentsError(
                    ErrorType.REFUSED_BY_POLICY,
                    f"{pinned}: bind mode (or a warm pool's box) would change the workspace "
                    "directly; run with --workspace-mode copy (or auto), without --pool",
                )
            return WorkspaceMode.COPY
        if self.access == Access.READ_ONLY and warm_box_read_only is False:
            raise OpenAgentsError(
                ErrorType.REFUSED_BY_POLICY, f"{pinned}: this box was started with the workspace writable"
            )
        return mode
