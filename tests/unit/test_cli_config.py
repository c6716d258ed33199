"""Set-up errors of `oa-sandbox run` (issue 14): each is exit 2 and one readable line, before any
sandbox starts, so these need no Docker: config typos, policy typos with a did-you-mean, a public
model URL without a key. Through the real CLI, in a subprocess."""

from __future__ import annotations

import pytest

from tests.helpers import make_workspace
from tests.helpers.cli_run import oa


def test_a_public_base_url_still_needs_a_key(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        "openai:gpt-4o",
        "--base-url",
        "https://api.example.com/v1",
        "go",
    )
    assert proc.returncode == 2 and "export OPENAI_API_KEY" in proc.stderr


def test_a_config_typo_is_one_line_with_a_suggestion(tmp_path):
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('modle = "openai:x"\n')
    proc = oa(tmp_path, "run", "--workspace", str(make_workspace(tmp_path / "ws")), "go")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"oa-sandbox: config_invalid: config {config}: modle: unknown key (did you mean "
        "'model'?); allowed keys: model, base_url, api_key_env, policy, runtime, engine, image, memory, "
        "cpus, pids, start_concurrency, max_turns, max_tokens, max_wall, model_timeout, "
        "context_window, copy_max_bytes, copy_max_entries, host_code_read_only, mcp_servers"
    ]


def test_start_concurrency_is_checked_in_the_config_file_and_on_the_command_line(tmp_path):
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("start_concurrency = 0\n")
    proc = oa(tmp_path, "run", "--workspace", str(make_workspace(tmp_path / "ws")), "--model", "script:/dev/null", "go")
    assert (
        proc.returncode == 2
        and f"config {config}: start_concurrency: Input should be greater than or equal to 1" in proc.stderr
    )
    config.unlink()
    proc = oa(
        tmp_path, "exec", "--workspace", str(make_workspace(tmp_path / "ws")), "--start-concurrency", "0", "list_files"
    )
    assert proc.returncode == 2 and "--start-concurrency" in proc.stderr


@pytest.mark.parametrize(
    "rule, expected",
    [
        (
            'kind = "edits"\ndecision = "allow"',
            "rules[0].kind: unknown kind (did you mean 'edit'?); allowed: delete, edit, execute",
        ),
        ('tool = "shel"\ndecision = "allow"', "rules[0].tool: unknown tool (did you mean 'shell'?)"),
        ('action = "git comit"\ndecision = "deny"', "rules[0].action: unknown action (did you mean 'git commit'?)"),
        (
            'tool = "shell"\ndecison = "allow"',
            "rules[0]: unknown key (did you mean 'decision'?); allowed "
            "keys: id, tool, kind, action, command_prefix, decision",
        ),
        ('tool = "shell"\ndecision = "alow"', "rules[0].decision: must be one of allow, ask, deny"),
    ],
)
def test_policy_typos_are_refused_at_load_with_did_you_mean(tmp_path, rule, expected):
    policy = tmp_path / "p.toml"
    policy.write_text(f"[[rules]]\n{rule}\n")
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(make_workspace(tmp_path / "ws")),
        "--model",
        "script:/dev/null",
        "--policy",
        str(policy),
        "go",
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith(f"oa-sandbox: config_invalid: policy {policy}: ")
        and expected in lines[0]
    ), lines
    assert "pydantic" not in proc.stderr


def test_a_config_file_the_box_can_reach_is_refused_not_read(tmp_path):
    """Attack: the config file's keys are authority (the model endpoint, the key variable, host MCP
    servers). One the box could have written (here the workspace holds it, as when the workspace is
    $HOME) is refused before anything starts: its MCP server never runs on the host."""
    ws = make_workspace(tmp_path)  # XDG_CONFIG_HOME is tmp_path/config: inside the workspace
    marker = tmp_path / "host-command-ran"
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        'model = "script:/dev/null"\n[[mcp_servers]]\nname = '
        f'"x"\ncommand = "/bin/sh"\nargs = ["-c", "touch {marker}"]\n'
    )
    for args in (
        ("run", "--workspace", str(ws), "go"),
        ("exec", "--workspace", str(ws), "list_files"),
        ("mcp", "--workspace", str(ws)),
    ):
        proc = oa(tmp_path, *args)
        assert proc.returncode == 2, proc.stderr
        assert "lies where the sandbox can write" in proc.stderr and not marker.exists()
    proc = oa(
        tmp_path, "run", "--workspace", str(make_workspace(tmp_path / "elsewhere")), "go"
    )  # the same file, a workspace that does not hold it
    assert "lies where the sandbox can write" not in proc.stderr


def test_the_config_files_keys_become_the_one_options_type_under_the_flags():
    """session_fields: the file's keys (max_wall, model_timeout, policy) as SandboxOptions names them,
    a flag given winning, an unset one left to SandboxOptions' defaults; validated once, there."""
    from pathlib import Path

    from orchestrator.api import SandboxOptions
    from orchestrator.cli.user_config import UserConfig, session_fields

    file = UserConfig(model="openai:a", policy=["/p/one.toml"], max_turns=7, max_wall=30.0, model_timeout=9.0)
    fields = session_fields(file, model="openai:b", max_turns=None, policy_files=[], max_wall_s=None)
    assert fields == {
        "model": "openai:b",
        "policy_files": [Path("/p/one.toml")],
        "max_turns": 7,
        "max_wall_s": 30.0,
        "model_timeout_s": 9.0,
    }
    options = SandboxOptions(**fields)
    assert (options.max_turns, options.max_wall_s, options.context_window) == (7, 30.0, None)
    assert session_fields(UserConfig(), policy_files=["/q.toml"]) == {"policy_files": [Path("/q.toml")]}
    assert SandboxOptions(**session_fields(UserConfig())).max_turns == SandboxOptions().max_turns
