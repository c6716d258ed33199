"""SWE-ReX's deployment/runtime pair (orchestrator/plugins/swerex_*.py) driven as SWE-agent-style code
drives any SWE-ReX runtime, with SWE-ReX's own request models and exceptions: commands, a bash
session keeping cwd/variables/functions across calls, files, uploads, typed timeouts; plus the
host's rules: a deny rule refuses through it, the box's state file and output never reach the
host unbounded or raw, and nothing is left after stop (box, egress gate, scratch workspace)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("swerex")

from swerex.deployment.config import get_deployment  # noqa: E402
from swerex.exceptions import (  # noqa: E402
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    DeploymentStartupError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (  # noqa: E402
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from orchestrator import ErrorType, OpenAgentsError  # noqa: E402
from orchestrator.config import LABEL  # noqa: E402
from orchestrator.plugins import swerex_runtime  # noqa: E402
from orchestrator.plugins.swerex_deployment import OpenAgentsDeployment, OpenAgentsDeploymentConfig  # noqa: E402
from orchestrator.plugins.swerex_runtime import (  # noqa: E402
    InteractiveUnsupportedError,
    OutputLimitError,
    PolicyRefusedError,
    SandboxClosedError,
)
from orchestrator.sandbox.owner import PID_LABEL  # noqa: E402
from orchestrator.workspace.records import open_own_record as load  # noqa: E402
from tests.helpers import make_workspace  # noqa: E402

pytestmark = [pytest.mark.usefixtures("sandbox_image"), pytest.mark.anyio]


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


def mine(docker_client) -> tuple[set[str], set[str]]:
    """This process's boxes and egress gates (containers), and its gates' networks."""
    labels = {"label": [f"{PID_LABEL}={os.getpid()}"]}
    containers = {c["Id"] for c in docker_client.api.containers(all=True, filters=labels) if c["Labels"].get(LABEL)}
    return containers, {n["Id"] for n in docker_client.api.networks(filters=labels)}


def scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("oa-swerex-*")}


def A(command: str, **kw) -> BashAction:  # noqa: N802 - SWE-ReX's own tests spell it so
    return BashAction(command=command, timeout=kw.pop("timeout", 30), **kw)


async def test_a_swerex_script_runs_commands_sessions_and_files_in_the_box(tmp_path, docker_client):
    before, dirs_before = mine(docker_client), scratch_dirs()
    deployment = OpenAgentsDeploymentConfig(egress=["example.com"]).get_deployment()
    assert isinstance(deployment, OpenAgentsDeployment)
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.runtime
    await deployment.start()
    runtime = deployment.runtime
    assert await deployment.is_alive()
    assert mine(docker_client)[0] - before[0]  # the box and its gate are up
    assert scratch_dirs() - dirs_before

    # execute(): subprocess.run's semantics
    r = await runtime.execute(Command(command="echo out; echo err >&2; exit 3", shell=True))
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    assert (await runtime.execute(Command(command=["printf", "%s|", "a b", "c"]))).stdout == "a b|c|"
    r = await runtime.execute(
        Command(
            command="echo $GIVEN; pwd; echo e >&2",
            shell=True,
            env={"GIVEN": "yes"},
            cwd="/tmp",
            merge_output_streams=True,
        )
    )
    assert (r.stdout, r.stderr) == ("yes\n/tmp\ne\n", "")
    with pytest.raises(NonZeroExitCodeError, match="exit code 1"):
        await runtime.execute(Command(command="false", shell=True, check=True, timeout=10))
    with pytest.raises(CommandTimeoutError):
        await runtime.execute(Command(command=["sleep", "30"], timeout=1))
    assert (await runtime.execute(Command(command="echo capped", shell=True, timeout=10_000))).stdout == "capped\n"

    # a bash session: state carried from call to call
    await runtime.create_session(CreateBashSessionRequest())
    with pytest.raises(SessionExistsError):
        await runtime.create_session(CreateBashSessionRequest())
    await runtime.run_in_session(
        A("mkdir -p sub/dir && cd sub/dir && export EXPORTED=1 && PLAIN='two words' && greet() { echo hi $1; }")
    )
    obs = await runtime.run_in_session(
        A("pwd; echo $EXPORTED $PLAIN; printenv EXPORTED; greet you; printenv PLAIN || echo unexported")
    )
    assert (
        obs.output.splitlines() == ["/workspace/sub/dir", "1 two words", "1", "hi you", "unexported"]
        and obs.exit_code == 0
    )
    obs = await runtime.run_in_session(A("cd /tmp; LAST=here; exit 4", check="silent"))
    assert obs.exit_code == 4
    assert (await runtime.run_in_session(A("pwd; echo $LAST"))).output.splitlines() == [
        "/tmp",
        "here",
    ]  # an `exit` keeps its state
    with pytest.raises(NonZeroExitCodeError, match="exit code 1"):
        await runtime.run_in_session(A("false", error_msg="why"))
    assert (await runtime.run_in_session(A("false", check="ignore"))).exit_code is None
    with pytest.raises(BashIncorrectSyntaxError) as syntax:
        await runtime.run_in_session(A("echo (("))
    assert "syntax error" in syntax.value.extra_info["bash_stderr"]
    with pytest.raises(CommandTimeoutError):
        await runtime.run_in_session(A("cd /; echo started; sleep 45 & sleep 45", timeout=2))
    await runtime.run_in_session(BashInterruptAction())
    obs = await runtime.run_in_session(A("pwd; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"))
    assert obs.output.startswith("/tmp\n")  # the timed-out call's `cd /` never reached the state
    assert "sleep 45" not in obs.output  # killed with everything it started
    with pytest.raises(InteractiveUnsupportedError):
        await runtime.run_in_session(A("python3", is_interactive_command=True, expect=[">>> "]))
    assert (
        await runtime.run_in_session(A("echo capped", timeout=10_000))
    ).output == "capped\n"  # capped to the box's 240 s
    await runtime.write_file(
        WriteFileRequest(path="/tmp/rc.sh", content="tool() { echo tool ran in $PWD; }\nexport FROM_RC=1\n")
    )
    await runtime.create_session(CreateBashSessionRequest(session="other", startup_source=["/tmp/rc.sh"]))
    assert (await runtime.run_in_session(A("tool; echo $FROM_RC", session="other"))).output.splitlines() == [
        "tool ran in /workspace",
        "1",
    ]
    assert (await runtime.run_in_session(A("pwd; echo ${EXPORTED:-unset}", session="other"))).output.splitlines() == [
        "/workspace",
        "unset",
    ]

    # files and uploads
    await runtime.write_file(WriteFileRequest(path="/tmp/new/dir/f.txt", content="héllo\n"))
    assert (await runtime.read_file(ReadFileRequest(path="/tmp/new/dir/f.txt"))).content == "héllo\n"
    await runtime.write_file(WriteFileRequest(path="rel.txt", content="in the workspace"))
    assert (await runtime.run_in_session(A("cat /workspace/rel.txt"))).output == "in the workspace"
    big = "".join(f"line {i}\n" for i in range(40_000))  # 390 KB: staged both ways in bounded pieces
    await runtime.write_file(WriteFileRequest(path="/tmp/big.txt", content=big))
    assert (await runtime.read_file(ReadFileRequest(path="/tmp/big.txt"))).content == big
    obs = await runtime.run_in_session(A("python3 <<EOF\nprint('from a here-document')\nEOF"))
    assert obs.output == "from a here-document\n"
    with pytest.raises(FileNotFoundError):
        await runtime.read_file(ReadFileRequest(path="/nope.txt"))
    with pytest.raises(IsADirectoryError):
        await runtime.read_file(ReadFileRequest(path="/tmp"))
    tools = make_workspace(
        tmp_path / "tools", {"bin/hello": "#!/bin/sh\necho hello from $0\n", "lib/data.txt": "data\n"}
    )
    (tools / "bin" / "hello").chmod(0o755)
    (tools / "empty").mkdir()
    await runtime.upload(
        UploadRequest(source_path=str(tools), target_path="/workspace/tools")
    )  # the box's /tmp is noexec
    obs = await runtime.run_in_session(
        A(
            "export PATH=/workspace/tools/bin:$PATH; hello; cat tools/lib/data.txt; test -d tools/empty && echo dir",
            session="other",
        )
    )
    assert obs.output.splitlines() == ["hello from /workspace/tools/bin/hello", "data", "dir"]
    await runtime.upload(UploadRequest(source_path=str(tools / "lib" / "data.txt"), target_path="/tmp/one.txt"))
    assert (await runtime.read_file(ReadFileRequest(path="/tmp/one.txt"))).content == "data\n"
    await runtime.close_session(CloseBashSessionRequest(session="other"))
    with pytest.raises(SessionDoesNotExistError):
        await runtime.run_in_session(A("true", session="other"))

    # every call went through the public API: the session's transcript has them
    transcript = deployment.sandbox.transcript_path.read_text()
    assert "greet() { echo hi $1; }" in transcript and "refused" not in transcript
    record = deployment.sandbox.record
    changes = await deployment.sandbox.changes()
    assert sorted(f.path for f in changes.files if f.path.startswith(".")) == [
        ".oa-plugin"
    ]  # the transport's staging directory
    await runtime.close()  # forgets the sessions, removes the (empty) staging directory
    changes = await deployment.sandbox.changes()
    assert sorted(f.path for f in changes.files) == [
        "rel.txt",
        "sub",
        "sub/dir",
        "tools",
        "tools/bin",
        "tools/bin/hello",
        "tools/empty",
        "tools/lib",
        "tools/lib/data.txt",
    ]  # no session state: it lives in the box's /tmp

    await deployment.stop()
    await deployment.stop()  # idempotent
    assert mine(docker_client) == before  # no box, no gate, no gate network
    assert scratch_dirs() <= dirs_before
    assert load(record.id).status in ("closed", "discarded")
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.runtime
    with pytest.raises(DeploymentNotStartedError):
        await deployment.is_alive()
    with pytest.raises(SandboxClosedError):
        await runtime.execute(Command(command="true", shell=True))
    with pytest.raises(SandboxClosedError):
        await runtime.create_session(CreateBashSessionRequest(session="late"))
    with pytest.raises(SandboxClosedError):
        await runtime.run_in_session(A("true"))
    with pytest.raises(SandboxClosedError):
        await runtime.read_file(ReadFileRequest(path="rel.txt"))
    assert not await runtime.is_alive()


async def test_a_deny_rule_refuses_through_the_runtime(tmp_path, docker_client):
    repo = make_workspace(tmp_path / "repo", {"a.txt": "a\n"})
    policy = tmp_path / "deny.toml"
    policy.write_text('[[rules]]\ntool = "shell"\ndecision = "deny"\n')
    before = mine(docker_client)
    deployment = OpenAgentsDeployment(workspace=str(repo), mode="copy", policy_files=[str(policy)])
    await deployment.start()
    try:
        runtime = deployment.runtime
        with pytest.raises(PolicyRefusedError, match="policy"):
            await runtime.execute(Command(command="rm a.txt", shell=True))
        await runtime.create_session(CreateBashSessionRequest())
        with pytest.raises(PermissionError, match="policy"):  # PolicyRefusedError is a PermissionError too
            await runtime.run_in_session(A("rm a.txt"))
        with pytest.raises(PolicyRefusedError):
            await runtime.write_file(WriteFileRequest(path="b.txt", content="never"))
        assert not (await deployment.is_alive())
        assert "refused_by_policy" in deployment.sandbox.transcript_path.read_text()
        record = deployment.sandbox.record
    finally:
        await deployment.stop()
    assert (repo / "a.txt").read_text() == "a\n" and not (repo / "b.txt").exists()
    assert mine(docker_client) == before
    assert load(record.id).status == "closed"


async def test_the_box_reaches_the_host_neither_through_its_state_nor_its_output(tmp_path, docker_client, monkeypatch):
    monkeypatch.setenv("OA_SWEREX_HOST_SECRET", "host-secret-value")
    before = mine(docker_client)
    deployment = OpenAgentsDeployment()
    await deployment.start()
    marker = tmp_path / "pwned"
    try:
        runtime = deployment.runtime
        await runtime.create_session(CreateBashSessionRequest())
        # the box rewrites its own state file: it is sourced by the box's bash, never read by the host
        await runtime.run_in_session(A("true"))  # the state file exists from the first call's end on
        await runtime.run_in_session(
            A(
                "trap - EXIT; for f in /tmp/.oa-swerex/*.sh; do cat > \"$f\" <<'EOF'\nmkdir -p "
                f"{marker.parent}; touch {marker}\nX=$(head -c 999999 /dev/zero | tr '\\0' y)\nEOF\ndone"
            )
        )
        obs = await runtime.run_in_session(
            A(f"echo ${{#X}}; ls {marker}; env | grep -c OA_SWEREX_HOST_SECRET", check="silent")
        )
        assert obs.output.splitlines()[:2] == ["999999", str(marker)]  # it happened in the box ...
        assert not marker.exists()  # ... not on the host
        assert obs.output.splitlines()[2] == "0"  # the host's variables never reach the box
        # terminal escapes in a session's output arrive as text
        obs = await runtime.run_in_session(
            A("printf 'a\\033]0;owned\\007\\033[2Jb\\n'; head -c 200000 /dev/zero | tr '\\0' x")
        )
        assert "\x1b" not in obs.output and "\x07" not in obs.output and len(obs.output) < 60_000
        # a bounded upload: over the bound, nothing is written
        many = make_workspace(tmp_path / "many", {f"f{i}.txt": "x" for i in range(5)})
        monkeypatch.setattr(swerex_runtime, "MAX_UPLOAD_FILES", 3)
        with pytest.raises(OutputLimitError):
            await runtime.upload(UploadRequest(source_path=str(many), target_path="/tmp/many"))
        assert (await runtime.execute(Command(command="test -e /tmp/many", shell=True))).exit_code == 1
        # an upload source holding links (a tree the box may have written): no link is followed
        secret = tmp_path / "host-secret.txt"
        secret.write_text("HOST-ONLY-CONTENT\n")
        linked = make_workspace(tmp_path / "linked", {"plain.txt": "plain\n"})
        (linked / "leak.txt").symlink_to(secret)
        (linked / "leakdir").symlink_to(tmp_path)
        await runtime.upload(UploadRequest(source_path=str(linked), target_path="/tmp/linked"))
        obs = await runtime.execute(
            Command(
                command="cat /tmp/linked/plain.txt; ls -A /tmp/linked; grep -r HOST-ONLY /tmp/linked | wc -l",
                shell=True,
            )
        )
        assert obs.stdout.splitlines() == ["plain", "plain.txt", "0"]
    finally:
        await deployment.stop()
    assert mine(docker_client) == before


def test_a_deployment_never_stopped_goes_at_interpreter_exit(tmp_path, docker_client):
    """SWE-ReX's base stops a deployment from __del__ through an event loop that may be gone: ours
    closes the box synchronously, at the latest when the interpreter exits."""
    import subprocess
    import sys

    before, dirs_before = mine(docker_client), scratch_dirs()
    code = (
        "import asyncio\n"
        "from swerex.runtime.abstract import Command\n"
        "from orchestrator.plugins.swerex_deployment import OpenAgentsDeployment\n"
        "d = OpenAgentsDeployment()\n"
        "async def main():\n"
        "    await d.start()\n"
        "    r = await d.runtime.execute(Command(command='echo alive', shell=True))\n"
        "    print('RESULT', r.stdout.strip(), d.sandbox.id)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    _, text, session = out.stdout.strip().splitlines()[-1].split()
    assert text == "alive", out.stderr[-2000:]
    record = load(session)
    assert record.status in ("closed", "discarded")
    assert mine(docker_client) == before
    for workspace in (record.workspace, record.box_workspace):
        assert not docker_client.api.containers(all=True, filters={"label": f"{LABEL}.workspace={workspace}"})
    assert scratch_dirs() <= dirs_before


async def test_no_docker_daemon_is_swerexs_startup_error_and_leaves_nothing(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    dirs_before = scratch_dirs()
    deployment = OpenAgentsDeployment()
    with pytest.raises(DeploymentStartupError, match="docker_unavailable") as failed:
        await deployment.start()
    assert (
        isinstance(failed.value.__cause__, OpenAgentsError)
        and failed.value.__cause__.type is ErrorType.DOCKER_UNAVAILABLE
    )
    assert scratch_dirs() <= dirs_before
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.runtime


def test_the_config_follows_swerex_configs_and_refuses_what_it_does_not_know():
    config = OpenAgentsDeploymentConfig.model_validate({"type": "openagents", "workspace": "repo", "mode": "bind"})
    deployment = get_deployment(config)  # SWE-ReX's own helper: duck-typed on get_deployment()
    assert isinstance(deployment, OpenAgentsDeployment) and deployment.config.workspace == "repo"
    with pytest.raises(ValueError):
        OpenAgentsDeploymentConfig.model_validate({"type": "docker"})
    with pytest.raises(ValueError):
        OpenAgentsDeploymentConfig.model_validate({"image_name": "python:3.11"})
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.sandbox
