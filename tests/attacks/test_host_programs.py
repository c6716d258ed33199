"""Issue 49's "every other host program the product starts": the user's own MCP servers (config.toml's
[[mcp_servers]]) are host programs too. The user's PATH has the workspace first (an active project
venv, node_modules/.bin), the servers are named as their docs show them (`python3`, `node`, `sh -c`,
a `#!/usr/bin/env python3` script outside the workspace), and one shell call of a bind-mode box
plants a `.pth` in the venv or its own `python3`, `sh` or `node` there. At the next `oa-sandbox run`
nothing of the box's runs on the host: each server runs the host's own program, with a PATH, a
working directory and a HOME the box cannot write. Real boxes (runc, runsc), the real CLI, real
stdio MCP servers (standard library only, so the host's system python3 and node run them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.api import Sandbox
from tests.helpers import chown_tree, make_workspace
from tests.helpers.host_programs import PY_SERVER

pytestmark = [pytest.mark.docker, pytest.mark.timeout(400)]
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

NODE_SERVER = r"""
const readline = require("readline");
readline.createInterface({input: process.stdin}).on("line", (line) => {
  const msg = JSON.parse(line);
  if (msg.id === undefined) return;
  let result = {};
  if (msg.method === "initialize") result = {protocolVersion: msg.params.protocolVersion, capabilities: {tools: {}},
      serverInfo: {name: "probe", version: "1"}};
  else if (msg.method === "tools/list") result = {tools: [{name: "where", description: "what runs this server",
      inputSchema: {type: "object", properties: {}}}]};
  else if (msg.method === "tools/call") result = {content: [{type: "text", text: JSON.stringify({
      program: process.execPath, prefix: "", cwd: process.cwd(), PATH: process.env.PATH || "",
      HOME: process.env.HOME || "", "sys.path": []})}], isError: false};
  process.stdout.write(JSON.stringify({jsonrpc: "2.0", id: msg.id, result}) + "\n");
});
"""
# What the box writes (one shell call): each, run on the host, appends to CANARY.
BOX_PLANTS = {
    "pth": 'p=$(echo .venv/lib/python3*/site-packages) && echo "import '
    "os; open('CANARY', 'a').write('pth ran; ')\" > $p/oa_box.pth",
    "python3": "rm -f .venv/bin/python3 && printf '#!/bin/sh\\necho python3 ran >> CANARY\\nexec "
    '/usr/bin/python3 "$@"\\n\' > .venv/bin/python3 && chmod +x .venv/bin/python3',
    "sh": "printf '#!/bin/sh\\necho sh ran >> CANARY\\nexec /bin/sh \"$@\"\\n' > .venv/bin/sh && chmod +x .venv/bin/sh",
    "node": "printf '#!/bin/sh\\necho node ran >> CANARY\\nexec /usr/bin/node "
    '"$@"\\n\' > node_modules/.bin/node && chmod +x node_modules/.bin/node',
    "home": "mkdir -p USERSITE && echo \"import os; open('CANARY', "
    "'a').write('user site ran; ')\" > USERSITE/oa_box.pth",
}
SERVERS = ("py", "envpy", "sh", "node")


def box_runtime(runtime: str | None, docker_client) -> str | None:
    from orchestrator.sandbox.runtimes import choose_runtime

    return None if runtime is None else choose_runtime(runtime, False, docker_client).name


def user_config(tmp_path: Path) -> dict[str, str]:
    """The user's config.toml with four servers, each as its docs write it; the environment that reads it."""
    programs = tmp_path / "servers"
    programs.mkdir()
    (programs / "probe.py").write_text(PY_SERVER)
    (programs / "probe.js").write_text(NODE_SERVER)
    envpy = programs / "probe-env"
    envpy.write_text("#!/usr/bin/env python3\n" + PY_SERVER)
    envpy.chmod(0o755)
    servers = {
        "py": ("python3", [str(programs / "probe.py")]),
        "envpy": (str(envpy), []),
        "sh": ("sh", ["-c", f"exec python3 {programs / 'probe.py'}"]),
        "node": ("node", [str(programs / "probe.js")]),
    }
    lines = []
    for name, (command, args) in servers.items():
        lines += [
            "[[mcp_servers]]",
            f"name = {json.dumps(name)}",
            f"command = {json.dumps(command)}",
            f"args = {json.dumps(args)}",
            "",
        ]
    config = tmp_path / "xdg" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("\n".join(lines))
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "XDG_STATE_HOME": str(tmp_path / "state")}


@pytest.mark.parametrize("plant", list(BOX_PLANTS))
def test_a_box_writing_into_the_users_active_venv_runs_nothing_through_their_mcp_servers(
    sandbox_image, docker_client, tmp_path, monkeypatch, runtime, plant
):
    """The user's PATH has the workspace's .venv/bin and node_modules/.bin first (HOME in the workspace
    for the user-site case); config.toml's MCP servers are `python3 server.py`, a `#!/usr/bin/env
    python3` script outside the workspace, `sh -c "exec python3 ..."` and `node server.js`. A bind-mode
    box plants a .pth in the venv, its own python3, sh or node there, or a .pth in the user site under
    HOME: at the next `oa-sandbox run` none of it runs on the host, and each server answers from the
    host's own program with no PATH entry, working directory or HOME in the workspace."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--without-pip", str(ws / ".venv")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (ws / "node_modules/.bin").mkdir(parents=True)
    chown_tree(ws)
    canary = tmp_path / "canary"
    env = user_config(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = f"{ws / '.venv/bin'}:{ws / 'node_modules/.bin'}:{SYSTEM_PATH}"
    home: dict[str, str] = {}
    if plant == "home":  # HOME in the workspace, PATH the system's: the host's python3 reads its user site there
        path, home = SYSTEM_PATH, {"HOME": str(ws / ".home")}
        site = subprocess.run(
            ["/usr/bin/python3", "-c", "import site; print(site.getusersitepackages())"],
            env={**home, "PATH": path},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        plants = BOX_PLANTS[plant].replace("USERSITE", os.path.relpath(site, ws))
    else:
        plants = BOX_PLANTS[plant]
    with Sandbox(ws, auto_approve=True, mode="bind", runtime=box_runtime(runtime, docker_client)) as box:
        assert "planted" in box.shell(plants.replace("CANARY", str(canary)) + " && echo planted").output
    script = tmp_path / "model.jsonl"
    calls = [{"name": f"mcp__{name}__where", "arguments": {}} for name in SERVERS]
    script.write_text(json.dumps({"text": "asking", "tool_calls": calls}) + "\n" + json.dumps({"text": "done"}) + "\n")
    policy = tmp_path / "policy.toml"
    policy.write_text("".join(f'[[rules]]\naction = "mcp {name}"\ndecision = "allow"\n' for name in SERVERS))
    transcript = tmp_path / "t.jsonl"
    run_env = {**os.environ, **env, **home, "PATH": path}
    proc = subprocess.run(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--workspace-mode",
            "bind",
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--policy",
            str(policy),
            "--transcript",
            str(transcript),
            "go",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env=run_env,
        cwd=ws,
    )
    assert not canary.exists(), canary.read_text()
    assert proc.returncode == 0, proc.stderr
    results = {e["tool"]: e for e in map(json.loads, transcript.read_text().splitlines()) if e["type"] == "tool_result"}
    for name in SERVERS:
        result = results[f"mcp__{name}__where"]
        assert result["ok"], (name, result, proc.stderr)
        info = json.loads(result["output"])
        places = [
            info["program"],
            info["prefix"],
            info["cwd"],
            info["HOME"],
            *info["PATH"].split(":"),
            *info["sys.path"],
        ]
        assert not [p for p in places if p and str(ws) in p], (name, info)
