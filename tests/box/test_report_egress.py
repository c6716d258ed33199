"""The report of a session with egress through the gate: the allowed and the denied request are
rows of the page's egress table, each with its decision and the call that made it (the compose
project of tests/egress: two test servers on internal networks, nothing leaves them)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import make_workspace
from tests.helpers.egress import (  # noqa: F401 - fixtures, used by name
    FETCH,
    OUTER_CIDR,
    docker_compose_command,
    docker_compose_file,
    docker_compose_project_name,
    docker_setup,
    egress_project,
)
from tests.helpers.report_browser import run_cli

pytestmark = pytest.mark.docker


def test_report_shows_allowed_and_denied_egress(egress_project, sandbox_image, tmp_path):  # noqa: F811 - the fixture
    """`run --egress allow:allowed.test:8000 --report FILE`: the page lists the allowed request to allowed.test and the
    denied one to denied.test, decided by openagents' gate, with each request's call."""
    ws = make_workspace(tmp_path / "ws", {"fetch.py": FETCH})
    admin = tmp_path / "admin.toml"
    admin.write_text(f'[egress]\nallow_cidrs = ["{OUTER_CIDR}"]\n[[rules]]\ntool = "shell"\ndecision = "allow"\n')
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": "python3 fetch.py http://allowed.test:8000/"}}
                    ]
                },
                {
                    "tool_calls": [
                        {
                            "name": "shell",
                            "arguments": {"command": "python3 fetch.py 'http://denied.test:8000/<script>'"},
                        }
                    ]
                },
                {"text": "done"},
            ]
        )
    )
    out = tmp_path / "egress.html"
    # The per-session gate must reach the test servers: its outer network is the project's.
    env = {"OA_ADMIN_POLICY": str(admin), "OA_EGRESS_OUTER_NETWORK": egress_project["outer"]}
    proc = run_cli(
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{script}",
        "--non-interactive",
        "--egress",
        "allow:allowed.test:8000",
        "--report",
        str(out),
        "fetch",
        state=tmp_path / "state",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = out.read_text(encoding="utf-8")
    egress = page.split('<section id="egress">', 1)[1].split("</section>", 1)[0]
    rows = [row for row in egress.split("<tr ")[1:]]
    allowed = [r for r in rows if r.startswith('class="decision-allow"')]
    denied = [r for r in rows if r.startswith('class="decision-deny"')]
    assert len(allowed) == 1 and "<td>allowed.test</td>" in allowed[0] and "<td>GET</td>" in allowed[0]
    assert len(denied) == 1 and "<td>denied.test</td>" in denied[0]
    assert "<script>" not in egress
    assert "No credential was injected." in egress
    timeline = page.split('<section id="timeline">', 1)[1].split("</section>", 1)[0]
    assert "1 egress record(s)" in timeline
