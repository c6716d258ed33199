"""The model is told the truth about the network (issue 36): the system prompt and the shell tool's
declaration said "no network" even when egress was open. Both cases, every model family."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import EgressConfig, EgressRule, SandboxLimits
from orchestrator.loop import TurnLoop
from orchestrator.models.script import ScriptedModel
from orchestrator.policy.approvals import ApprovalGate
from orchestrator.policy.ladder import Ladder
from orchestrator.tools import network
from orchestrator.tools.declarations import FAMILIES
from orchestrator.tools.registry import ToolRegistry
from orchestrator.transcript import Redactor, Transcript


class _Limits:
    """Only what the registry reads of a sandbox here: its limits (no call is made)."""

    def __init__(self, egress: EgressConfig | None) -> None:
        self.config = SandboxLimits(egress=egress)


def _told(tmp_path: Path, egress: EgressConfig | None) -> tuple[str, dict[str, str]]:
    registry = ToolRegistry(_Limits(egress), tmp_path)  # type: ignore[arg-type]
    session = TurnLoop(ScriptedModel([]), registry, ApprovalGate(Ladder(), None), Transcript(None, redactor=Redactor()))  # type: ignore[arg-type]
    shell = {}
    for family in FAMILIES:
        for d in registry.declarations(family):
            d = d.get("function", d)
            if d["name"] == "shell":
                shell[family] = d["description"]
    return session.messages[0].content, shell


def test_a_closed_box_is_said_closed(tmp_path):
    prompt, shell = _told(tmp_path, None)
    assert network.CLOSED in prompt
    assert set(shell) == set(FAMILIES) and all(
        d.endswith(network.CLOSED) and network.GENERIC not in d for d in shell.values()
    )
    assert "egress proxy" not in prompt


def test_an_open_box_names_its_hosts_and_says_the_rest_is_closed(tmp_path):
    egress = EgressConfig(
        allow=["pypi.org", "*.githubusercontent.com:443"],
        rules=[
            EgressRule(action="allow", host="api.example.com", methods=["GET"]),
            EgressRule(action="deny", host="evil.example"),
        ],
    )
    prompt, shell = _told(tmp_path, egress)
    for text in [prompt, *shell.values()]:
        assert "Network: none" not in text and "no network" not in text
        assert "pypi.org, *.githubusercontent.com:443, api.example.com" in text
        assert "evil.example" not in text  # a deny rule opens nothing
        assert "Every other host is refused" in text


def test_the_hosts_are_bounded_and_reduced_to_host_characters():
    many = [f"h{i}.example" for i in range(30)] + ["x" * 300 + ".example"]
    said = network.sentence(EgressConfig(allow=many))
    assert "h19.example" in said and "h20.example" not in said and "and 11 more" in said
    assert len(said) < 2500
    assert network._host("a\x1b[31m\u202eb.example") == "a?[31m?b.example"
    assert network._host("y" * 500).endswith("...") and len(network._host("y" * 500)) == network.MAX_HOST_CHARS + 3


@pytest.mark.parametrize("family", FAMILIES)
def test_the_static_description_stays_true_either_way(family):
    from orchestrator.tools.declarations import declaration

    d = declaration("shell", family)
    assert d.get("function", d)["description"].endswith(network.GENERIC)
