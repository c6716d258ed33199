"""The policy as one immutable value (issue 48): loaded once, its access level and approval rules
separate fields, and every effect (the box's configuration, the workspace mode, the ladder, the
hooks) derived from it."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config import SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.policy.ladder import Access, Level
from orchestrator.policy.load import load_session_policy
from orchestrator.policy.value import SessionPolicy
from orchestrator.tools.catalog import LAND_ACTION, LAND_KIND, LAND_TOOL
from orchestrator.workspace.records import WorkspaceMode


@pytest.fixture
def no_admin(tmp_path, monkeypatch):
    monkeypatch.setenv("OA_ADMIN_POLICY", str(tmp_path / "no-admin.toml"))


def load(tmp_path, text: str) -> SessionPolicy:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    policy = tmp_path / "p.toml"
    policy.write_text(text)
    return load_session_policy(ws, [str(policy)])


def test_the_access_level_is_its_own_field_not_a_rule(tmp_path, no_admin):
    policy = load(tmp_path, 'workspace_access = "copy-only"\n[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    assert policy.access == Access.COPY_ONLY
    assert [(r.tool, r.decision.value) for r in policy.rules] == [("shell", "deny")]  # no synthetic rule beside it
    assert [pin.label for pin in policy.access_pins] == [
        f"workspace_access = copy-only (user policy {tmp_path}/p.toml)"
    ]
    level, why = policy.ladder().level(LAND_TOOL, LAND_KIND, LAND_ACTION)
    assert level == Level.REFUSE and why == policy.access_pins[0].label


def test_the_value_cannot_be_changed(tmp_path, no_admin):
    policy = load(tmp_path, 'workspace_access = "read-only"\n')
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.access = Access.READ_WRITE


def test_each_effect_comes_from_the_value(tmp_path, no_admin):
    read_only = load(tmp_path, 'workspace_access = "read-only"\n[egress]\nallow = ["pypi.org"]\n')
    config = read_only.box_config(SandboxConfig())
    assert config.workspace_read_only and config.egress is not None and config.egress.allow == ["pypi.org"]
    with pytest.raises(OpenAgentsError) as err:  # a warm box started writable
        read_only.workspace_mode(WorkspaceMode.BIND, warm_box_read_only=False)
    assert err.value.type == ErrorType.REFUSED_BY_POLICY
    assert read_only.workspace_mode(WorkspaceMode.BIND, warm_box_read_only=True) == WorkspaceMode.BIND
    copy_only = SessionPolicy(access=Access.COPY_ONLY)
    assert copy_only.workspace_mode(WorkspaceMode.AUTO) == WorkspaceMode.COPY
    for refused in (
        lambda: copy_only.workspace_mode(WorkspaceMode.BIND),
        lambda: copy_only.workspace_mode(WorkspaceMode.AUTO, resumed=WorkspaceMode.BIND),
        copy_only.refuse_warm_box,
    ):
        with pytest.raises(OpenAgentsError) as err:
            refused()
        assert err.value.type == ErrorType.REFUSED_BY_POLICY
    assert SessionPolicy().box_config(SandboxConfig()) == SandboxConfig()  # no policy: the config as given


def test_the_hooks_come_back_as_a_fresh_copy(tmp_path, no_admin):
    policy = load(tmp_path, '[[hooks]]\nevent = "BeforeTool"\ncommand = ["/bin/true"]\n')
    first = policy.hook_specs()
    first.specs.clear()
    assert len(policy.hook_specs().specs) == 1 and len(policy.hooks) == 1
