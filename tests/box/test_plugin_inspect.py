"""The Inspect AI provider (orchestrator/plugins/inspect_provider.py) against Inspect's own sandbox
conformance suite (inspect_ai/util/_sandbox/self_check.py, every check it ships), plus what the
host keeps: a deny rule refuses a harness exec, host variables never reach the box, nothing is
left running after cleanup, and a call after cleanup is a typed error."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.util import SandboxUnavailableError, SandboxUserUnsupportedError  # noqa: E402
from inspect_ai.util._sandbox import self_check  # noqa: E402
from inspect_ai.util._sandbox.self_check import *  # noqa: E402,F401,F403 - Inspect's checks, collected as ours

from orchestrator.config import LABEL  # noqa: E402
from orchestrator.plugins.inspect_provider import OpenAgentsSandboxConfig, OpenAgentsSandboxEnvironment  # noqa: E402
from orchestrator.sandbox.owner import PID_LABEL  # noqa: E402
from orchestrator.workspace.records import open_own_record as load  # noqa: E402

pytestmark = [pytest.mark.usefixtures("sandbox_image"), pytest.mark.anyio]

# The checks this provider does not pass, each for a reason docs/api.md (Plug-ins) gives:
EXPECTED_TO_DIFFER = {
    # the box never runs a command as root (nor as any user but its own): exec(user="root") raises
    # SandboxUserUnsupportedError, so the check's `adduser` as root cannot run
    "test_exec_as_user": SandboxUserUnsupportedError,
}
CHECKS = sorted(name for name in dir(self_check) if name.startswith("test_"))


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def my_boxes(docker_client) -> list[str]:
    return [
        c["Id"]
        for c in docker_client.api.containers(all=True, filters={"label": [f"{LABEL}=1", f"{PID_LABEL}={os.getpid()}"]})
    ]


@pytest.fixture(scope="module")
async def shared_env(anyio_backend):
    envs = await OpenAgentsSandboxEnvironment.sample_init("conformance", None, {})
    yield envs["default"]
    await OpenAgentsSandboxEnvironment.sample_cleanup("conformance", None, envs, False)


@pytest.fixture
async def sandbox_env(shared_env, request):
    name = request.node.originalname
    if name in EXPECTED_TO_DIFFER:
        request.node.add_marker(
            pytest.mark.xfail(raises=EXPECTED_TO_DIFFER[name], strict=True, reason="docs/api.md, Plug-ins")
        )
    yield shared_env


def test_every_check_of_inspects_suite_is_collected_here():
    assert len(CHECKS) >= 40
    here = sys.modules[__name__]
    assert all(getattr(here, name) is getattr(self_check, name) for name in CHECKS)
    assert set(EXPECTED_TO_DIFFER) <= set(CHECKS)


def installed_env(tmp_path: Path) -> dict[str, str]:
    """A subprocess environment where the entry point pyproject.toml declares is an installed
    distribution's metadata (as `pip install 'openagents-sandbox[inspect]'` makes it)."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"]["inspect_ai"]
    assert declared == {"openagents_sandbox": "orchestrator.plugins.inspect_provider"}
    assert "inspect" in project["optional-dependencies"] and "minisweagent" in project["optional-dependencies"]
    meta = tmp_path / "site" / "oa_plugin_check-0.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: oa-plugin-check\nVersion: 0\n")
    (meta / "entry_points.txt").write_text("[inspect_ai]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(meta.parent), str(Path(__file__).parents[2])])}


def test_inspect_finds_the_provider_through_its_entry_point(tmp_path):
    """Inspect logs a plug-in that fails to import and goes on: look it up in a fresh interpreter."""
    code = (
        "from inspect_ai.util._sandbox.registry import registry_find_sandboxenv\n"
        "print(registry_find_sandboxenv('openagents').__module__)"
    )
    env = installed_env(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip() == "orchestrator.plugins.inspect_provider", out.stderr[-2000:]


async def test_a_timeout_kills_the_whole_tree_seen_in_proc(shared_env):
    """The suite's kill checks use `ps` (the debootstrap image
    has it; an ordinary base may not): look in /proc as well."""
    with pytest.raises(TimeoutError):
        await shared_env.exec(["sh", "-c", "sleep 300 # oa-marker-child & sleep 300 # oa-marker-parent"], timeout=2)
    left = await shared_env.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"])
    assert "oa-marker" not in left.stdout


async def test_a_harness_timeout_above_the_box_limit_is_clamped(shared_env):
    from orchestrator.plugins.transport import MAX_COMMAND_TIMEOUT_S, clamp_timeout

    assert clamp_timeout(10_000) == MAX_COMMAND_TIMEOUT_S <= 240
    result = await shared_env.exec(["true"], timeout=10_000)
    assert result.success


async def test_exec_env_goes_to_the_command_only_never_host_variables(shared_env, monkeypatch):
    monkeypatch.setenv("OA_PLUGIN_HOST_SECRET", "host-secret-value")
    result = await shared_env.exec(["env"], env={"GIVEN": "to-the-command"})
    assert "GIVEN=to-the-command" in result.stdout
    assert "host-secret-value" not in result.stdout and "OA_PLUGIN_HOST_SECRET" not in result.stdout
    again = await shared_env.exec(["env"])
    assert "GIVEN" not in again.stdout


async def test_exec_output_over_the_limit_is_output_limit_exceeded(shared_env):
    from inspect_ai.util import OutputLimitExceededError
    from inspect_ai.util._sandbox.limits import override_max_exec_output_size

    with override_max_exec_output_size(1024):
        with pytest.raises(OutputLimitExceededError):
            await shared_env.exec(["sh", "-c", "head -c 5000 /dev/zero"])


async def test_the_root_probe_is_user_unsupported(shared_env):
    with pytest.raises(SandboxUserUnsupportedError):
        await shared_env.exec(["/bin/sh", "-c", "id -u"], user="root")


async def test_a_deny_rule_refuses_a_harness_exec_and_cleanup_leaves_nothing(tmp_path, docker_client):
    policy = tmp_path / "deny.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    before = set(my_boxes(docker_client))
    config = OpenAgentsSandboxConfig(policy_files=[str(policy)])
    envs = await OpenAgentsSandboxEnvironment.sample_init("deny", config, {})
    env = envs["default"]
    assert isinstance(env, OpenAgentsSandboxEnvironment)
    root, record = env.root, env.box.record
    assert set(my_boxes(docker_client)) - before
    with pytest.raises(PermissionError, match="policy"):
        await env.exec(["echo", "never runs"])
    with pytest.raises(PermissionError, match="policy"):
        await env.write_file("a.txt", "never written")
    await OpenAgentsSandboxEnvironment.sample_cleanup("deny", config, envs, True)  # as an interrupted sample
    await OpenAgentsSandboxEnvironment.task_cleanup("deny", config, True)
    assert set(my_boxes(docker_client)) <= before
    assert not root.exists()
    kept = load(record.id)
    assert kept.status in ("closed", "discarded")
    assert not Path(kept.box_workspace).exists()  # the private copy went with the box
    with pytest.raises(SandboxUnavailableError):
        await env.exec(["true"])
    with pytest.raises(SandboxUnavailableError):
        await env.read_file("a.txt")


async def test_what_the_box_sends_back_is_bounded_checked_and_escaped(shared_env):
    """The box program's answers are the box's: a claimed size over the limit is refused before
    anything is read, a payload that is not strict base64 or not the claimed size is an error, and
    the box's words in an exception are escaped."""
    from orchestrator import ErrorType, OpenAgentsError
    from orchestrator.plugins.transport import BoxFailure

    program = shared_env.program
    with pytest.raises(BoxFailure) as huge:
        await program.fetch({"staged": "x", "lines": 10**8, "size": 10**12}, 1024 * 1024)
    assert huge.value.kind == "limit"
    with pytest.raises(OpenAgentsError) as bad:
        await program.fetch({"inline": "not base64!"}, 1024)
    assert bad.value.type is ErrorType.INTERNAL_ERROR
    for spec in (
        {"staged": "../x", "lines": 1, "size": 1},
        {"staged": ".hidden", "lines": 1, "size": 1},
        ["not", "a", "dict"],
    ):
        with pytest.raises(OpenAgentsError):
            await program.fetch(spec, 1024)
    await shared_env.exec(["sh", "-c", "printf 'QUJD\\n' > .oa-plugin/liar.b64"])  # 3 bytes, claimed 2
    with pytest.raises(OpenAgentsError, match="size"):
        await program.fetch({"staged": "liar.b64", "lines": 1, "size": 2}, 1024)
    with pytest.raises(FileNotFoundError) as missing:
        await shared_env.read_file("no-such-\x1b[2J-file")
    assert "\x1b" not in str(missing.value) and "no-such-" in str(missing.value)


def test_config_round_trips_through_config_deserialize():
    config = OpenAgentsSandboxConfig(memory="512m", policy_files=["p.toml"])
    assert OpenAgentsSandboxEnvironment.config_deserialize(config.model_dump()) == config


def test_a_real_inspect_eval_runs_in_the_box(tmp_path, docker_client):
    """Inspect's own runner: a Task with sandbox="openagents", a solver that uses sandbox()."""
    before = set(my_boxes(docker_client))
    code = f"""
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import solver
from inspect_ai.util import sandbox

@solver
def in_the_box():
    async def solve(state, generate):
        await sandbox().write_file("answer.txt", "42\\n")
        result = await sandbox().exec(["sh", "-c", "cat answer.txt; id -un"])
        state.output.completion = result.stdout
        return state
    return solve

log = eval(Task(dataset=[Sample(input="x", target="42")], solver=in_the_box(), scorer=includes(), sandbox="openagents"),
           model="mockllm/model", log_dir={str(tmp_path / "logs")!r}, display="none")[0]
print(log.status, log.results.scores[0].metrics["accuracy"].value, log.samples[0].output.completion.split())
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=installed_env(tmp_path),
    )
    assert "success 1.0 ['42', 'sandbox']" in out.stdout, (out.stdout[-2000:], out.stderr[-3000:])
    assert set(my_boxes(docker_client)) <= before
    assert not list(Path("/tmp").glob(f"oa-inspect-*{os.getpid()}"))


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(OpenAgentsSandboxEnvironment.sample_init("x", None, {}))
