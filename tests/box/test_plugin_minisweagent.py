"""mini-swe-agent's environment class (orchestrator/plugins/minisweagent.py): selected from a config's
`environment_class` as mini-swe-agent selects any, its default agent (default.yaml) with its
DeterministicModel completes a task in our box; plus the host's rules: a deny rule refuses an
action, a timeout is clamped and kills the tree, env= only reaches the commands, nothing is left
after cleanup, and a call after cleanup is a typed error."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("minisweagent")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_from_spec  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from orchestrator import ErrorType, OpenAgentsError  # noqa: E402
from orchestrator.config import LABEL  # noqa: E402
from orchestrator.plugins.minisweagent import OpenAgentsEnvironment  # noqa: E402
from orchestrator.sandbox.owner import PID_LABEL  # noqa: E402
from orchestrator.workspace.records import open_own_record as load  # noqa: E402
from tests.helpers import make_workspace  # noqa: E402

pytestmark = pytest.mark.usefixtures("sandbox_image")
CLASS = "orchestrator.plugins.minisweagent.OpenAgentsEnvironment"


def my_boxes(docker_client) -> list[str]:
    return [
        c["Id"]
        for c in docker_client.api.containers(all=True, filters={"label": [f"{LABEL}=1", f"{PID_LABEL}={os.getpid()}"]})
    ]


def test_the_default_agent_with_a_deterministic_model_completes_a_task(tmp_path, docker_client, monkeypatch):
    monkeypatch.setenv("OA_PLUGIN_HOST_SECRET", "host-secret-value")
    repo = make_workspace(tmp_path / "repo", {"greet.py": "def greet():\n    return 'helo'\n"})
    before = set(my_boxes(docker_client))
    config = get_config_from_spec("default")
    config["environment"] = {
        "environment_class": CLASS,
        "workspace": str(repo),
        "mode": "bind",
        "timeout": 60,
        "env": {"PAGER": "cat", "GIVEN": "to-the-command"},
    }
    env = get_environment(config["environment"])
    assert isinstance(env, OpenAgentsEnvironment)
    fix = "sed -i \"s/'helo'/'hello'/\" greet.py && python3 -c 'import greet; print(greet.greet())'"
    model = DeterministicModel(
        outputs=[
            make_output("THOUGHT: fix the typo\n\n```mswea_bash_command\n" + fix + "\n```", [{"command": fix}]),
            make_output("THOUGHT: look at the environment\n", [{"command": "env"}]),
            make_output("THOUGHT: done\n", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat greet.py"}]),
        ]
    )
    agent = DefaultAgent(model, env, **config["agent"])
    result = agent.run("greet() should return 'hello'")
    assert result["exit_status"] == "Submitted", result
    assert "return 'hello'" in result["submission"]
    assert (repo / "greet.py").read_text() == "def greet():\n    return 'hello'\n"
    observations = "\n".join(str(m.get("content", "")) for m in agent.messages)
    assert "<returncode>0</returncode>" in observations and "hello" in observations
    assert "GIVEN=to-the-command" in observations and "host-secret-value" not in observations
    variables = env.get_template_vars()
    assert {"system", "release", "version", "machine"} <= set(variables) and variables["system"] == "Linux"
    assert "OA_PLUGIN_HOST_SECRET" not in variables
    assert env.serialize()["info"]["config"]["environment_type"] == CLASS
    session = env.sandbox.id
    env.cleanup()
    assert set(my_boxes(docker_client)) <= before
    assert load(session).status == "closed"
    with pytest.raises(OpenAgentsError) as closed:
        env.execute({"command": "true"})
    assert closed.value.type is ErrorType.SANDBOX_CLOSED


def test_timeouts_refusals_and_what_the_box_sees(tmp_path, docker_client):
    repo = make_workspace(tmp_path / "repo", {"a.txt": "a\n"})
    before = set(my_boxes(docker_client))
    env = OpenAgentsEnvironment(workspace=str(repo), mode="bind", cwd="sub", interpreter=["bash", "-c"])
    try:
        env.execute({"command": "true"}, cwd="/workspace")
        assert env.execute({"command": "mkdir -p sub"}, cwd="/workspace")["returncode"] == 0
        assert env.execute({"command": "pwd"})["output"].strip() == "/workspace/sub"
        timed = env.execute({"command": "echo started; sleep 30 & sleep 30"}, timeout=2)
        assert timed["returncode"] == -1 and "timed out" in timed["exception_info"] and "started" in timed["output"]
        left = env.execute({"command": "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"})["output"]
        assert "sleep 30" not in left
        clamped = env.execute({"command": "echo fine"}, timeout=10_000)  # clamped to 240 s, the box's limit
        assert clamped["returncode"] == 0
        hostile = env.execute(
            {"command": "printf 'a\\033]0;owned\\007\\033[2Jb\\n'; head -c 200000 /dev/zero | tr '\\0' x"}
        )
        assert "\x1b" not in hostile["output"] and "\x07" not in hostile["output"] and "owned" in hostile["output"]
        assert len(hostile["output"]) < 60_000  # the shell tool's bound: head and tail kept
        failed = env.execute({"command": "exit 3"})
        assert failed["returncode"] == 3 and failed["exception_info"] == ""
    finally:
        env.cleanup()
    assert set(my_boxes(docker_client)) <= before


def test_a_deny_rule_refuses_an_agents_action(tmp_path, docker_client):
    repo = make_workspace(tmp_path / "repo", {"a.txt": "a\n"})
    policy = tmp_path / "deny-shell.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    before = set(my_boxes(docker_client))
    env = get_environment(
        {"environment_class": CLASS, "workspace": str(repo), "mode": "bind", "policy_files": [str(policy)]}
    )
    try:
        refused = env.execute({"command": "rm a.txt"})
        assert refused["returncode"] == -1 and "refused" in refused["exception_info"], refused
        assert (repo / "a.txt").exists()
        assert env.get_template_vars()["system"] == ""  # the box's uname was refused too; the templates still render
        records = [line for line in env.sandbox.transcript_path.read_text().splitlines() if "refused_by_policy" in line]
        assert records  # the refusal is in the session's transcript, as a model's would be
    finally:
        env.cleanup()
    assert set(my_boxes(docker_client)) <= before


def test_an_environment_never_cleaned_up_goes_at_interpreter_exit(tmp_path, docker_client):
    """mini-swe-agent's runners never call cleanup(): the box goes when the program ends."""
    import subprocess

    repo = make_workspace(tmp_path / "repo", {"a.txt": "a\n"})
    code = (
        "from orchestrator.plugins.minisweagent import OpenAgentsEnvironment\n"
        f"env = OpenAgentsEnvironment(workspace={str(repo)!r}, mode='bind')\n"
        "print('RESULT', env.execute({'command': 'cat a.txt'})['output'].strip(), env.sandbox.id)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    _, text, session = out.stdout.strip().splitlines()[-1].split()
    assert text == "a", out.stderr[-2000:]
    assert load(session).status == "closed"
    assert not docker_client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={repo.resolve()}"})


def test_a_swe_bench_style_run_submits_its_git_diff_from_inside_the_box(tmp_path, docker_client):
    """Issue 46: the image has git, so mini-swe-agent's SWE-bench submission (`git diff`) runs in the box."""
    import subprocess

    from tests.helpers import chown_tree

    repo = make_workspace(tmp_path / "repo", {"greet.py": "def greet():\n    return 'helo'\n"})
    git = ["git", "-c", "safe.directory=*", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(git + args, check=True, capture_output=True, timeout=60)
    chown_tree(repo)
    env = get_environment({"environment_class": CLASS, "workspace": str(repo), "mode": "copy", "timeout": 60})
    fix = "sed -i \"s/'helo'/'hello'/\" greet.py"
    model = DeterministicModel(
        outputs=[
            make_output("THOUGHT: fix\n", [{"command": fix}]),
            make_output("THOUGHT: submit\n", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"}]),
        ]
    )
    config = get_config_from_spec("default")
    try:
        result = DefaultAgent(model, env, **config["agent"]).run("greet() should return 'hello'")
        assert result["exit_status"] == "Submitted", result
        assert "-    return 'helo'" in result["submission"] and "+    return 'hello'" in result["submission"]
    finally:
        env.cleanup()
