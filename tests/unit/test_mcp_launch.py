"""Issue 49 for the user's MCP servers, without a box (tests/attacks/test_host_programs.py has real
boxes make the plants): a server's program and `#!` interpreters are found once, at the start, on
a PATH with no entry the box can write; it runs in an empty directory of its own, with a HOME the
box cannot write and no loader variable pointing where it writes; what would run or load the box's
code is refused, named, and the session goes on. The user's PATH has the workspace first, as an
active venv, direnv's `PATH_add`, node_modules/.bin or a link make it, and oa-sandbox is started in
the workspace. The box's writes are made here. Real stdio MCP servers (standard library only, run by
the host's /usr/bin/python3), a real npx."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.tools.mcp.client import McpHost
from tests.helpers.host_programs import PY_SERVER
from tests.helpers.mcp_launch import SYSTEM_PATH, server_file

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def ws(tmp_path: Path, monkeypatch) -> Path:
    """The workspace, and oa-sandbox started in it (as `oa-sandbox run --workspace .` is)."""
    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.chdir(root)
    return root


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def plant(path: Path, canary: Path, then: str = "exit 3") -> None:
    """What the box writes: a program that, run on the host, says so in `canary`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(f'#!/bin/sh\necho "$0" >> {canary}\n{then}\n')
    path.chmod(0o755)


def ask(host: McpHost, name: str) -> dict:
    result = host.call(f"mcp__{name}__where", {})
    assert result.ok, (name, result, host.problems)
    return json.loads(result.output)


def outside(info: dict, ws: Path) -> list[str]:
    places = [info["program"], info["prefix"], info["cwd"], info["HOME"], *info["PATH"].split(":"), *info["sys.path"]]
    return [p for p in places if p and str(ws) in p]


def layout(kind: str, tmp_path: Path, ws: Path) -> tuple[str, Path]:
    """The user's PATH entry that reaches the workspace, and the directory the box plants in."""
    if kind == "link-into-workspace":  # ~/bin/project -> WS/.venv/bin
        (ws / ".venv/bin").mkdir(parents=True)
        (tmp_path / "links").mkdir()
        (tmp_path / "links/bin").symlink_to(ws / ".venv/bin")
        return str(tmp_path / "links/bin"), ws / ".venv/bin"
    folder = ws / {"venv": ".venv/bin", "direnv-PATH_add": "bin", "node_modules": "node_modules/.bin"}[kind]
    folder.mkdir(parents=True)
    return str(folder), folder


@pytest.mark.parametrize("kind", ["venv", "direnv-PATH_add", "node_modules", "link-into-workspace"])
def test_a_server_found_on_the_users_path_never_runs_the_boxs_program(tmp_path, ws, monkeypatch, kind):
    """`python3 server.py`, a `#!/usr/bin/env python3` script, and `sh -c "exec python3 ..."`:
    the box's python3 and sh first on the user's PATH never run; each server runs the host's,
    with no PATH entry, working directory or HOME in the workspace."""
    entry, folder = layout(kind, tmp_path, ws)
    canary = tmp_path / "canary"
    for name in ("python3", "sh", "env"):
        plant(folder / name, canary)
    monkeypatch.setenv("PATH", f"{entry}:.::{SYSTEM_PATH}")
    probe = server_file(tmp_path)
    envpy = server_file(tmp_path, "probe-env", "#!/usr/bin/env python3\n" + PY_SERVER)
    servers = [
        {"name": "py", "command": "python3", "args": [str(probe)]},
        {"name": "envpy", "command": str(envpy)},
        {"name": "sh", "command": "sh", "args": ["-c", f"exec python3 {probe}"]},
    ]
    with McpHost(servers, workspace=ws, start_deadline_s=20) as host:
        assert host.problems == []
        for name in ("py", "envpy", "sh"):
            info = ask(host, name)
            assert outside(info, ws) == [], (name, info)
            assert info["program"].startswith("/usr/bin/python3")
    assert not canary.exists(), canary.read_text()


def test_a_module_the_box_drops_in_the_working_directory_is_not_imported(tmp_path, ws):
    """`python3 -m oa_probe_server` (the real one on the server's own PYTHONPATH,
    outside): the box drops oa_probe_server.py in the workspace, where oa-sandbox was
    started; the server runs in a directory of its own, so `-m` finds the user's."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "oa_probe_server.py").write_text(PY_SERVER)
    canary = tmp_path / "canary"
    (ws / "oa_probe_server.py").write_text(f"open({str(canary)!r}, 'a').write('box module ran')\n")
    servers = [
        {
            "name": "mod",
            "command": "/usr/bin/python3",
            "args": ["-m", "oa_probe_server"],
            "env": {"PYTHONPATH": str(lib)},
        }
    ]
    with McpHost(servers, workspace=ws, start_deadline_s=20) as host:
        info = ask(host, "mod")
    assert not canary.exists()
    assert outside(info, ws) == [] and info["cwd"] != os.getcwd()


@pytest.mark.skipif(shutil.which("npx", path=SYSTEM_PATH) is None, reason="no npx on this host")
def test_npx_never_runs_the_workspaces_node_modules_bin(tmp_path, ws):
    """`npx --no-install oa-probe-server`: npx runs node_modules/.bin/X of its working directory
    first; the box plants one in the workspace, where oa-sandbox was started. It never runs (the
    server has a directory of its own, so npx finds nothing and the server is named as failed)."""
    canary = tmp_path / "canary"
    plant(ws / "node_modules/.bin/oa-probe-server", canary)
    servers = [
        {
            "name": "npx",
            "command": "npx",
            "args": ["--no-install", "oa-probe-server"],
            "env": {"npm_config_offline": "true"},
        }
    ]
    with McpHost(servers, workspace=ws, start_deadline_s=30) as host:
        assert host.names() == [] and "'npx' failed to start" in " ".join(host.problems), host.problems
    assert not canary.exists(), canary.read_text()


def test_a_home_in_the_workspace_gives_the_server_one_of_its_own(tmp_path, ws, monkeypatch):
    """HOME in the workspace (the box could write ~/.gitconfig, ~/.npmrc, Python's
    user site): a server gets an empty directory of its own as HOME, and a .pth in
    the user site never runs; a server whose own env names HOME gets that one."""
    home = ws / ".home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    site = subprocess.run(
        ["/usr/bin/python3", "-c", "import site; print(site.getusersitepackages())"],
        capture_output=True,
        text=True,
        check=True,
        env={"HOME": str(home), "PATH": SYSTEM_PATH},
    ).stdout.strip()
    Path(site).mkdir(parents=True)
    canary = tmp_path / "canary"
    (Path(site) / "oa_box.pth").write_text(f"import os; open({str(canary)!r}, 'a').write('user site ran; ')\n")
    probe = server_file(tmp_path)
    mine = tmp_path / "myhome"
    mine.mkdir()
    servers = [
        {"name": "py", "command": "python3", "args": [str(probe)]},
        {"name": "named", "command": "python3", "args": [str(probe)], "env": {"HOME": str(mine)}},
    ]
    with McpHost(servers, workspace=ws, start_deadline_s=20) as host:
        info = ask(host, "py")
        assert outside(info, ws) == [] and info["HOME"] == info["cwd"]
        assert ask(host, "named")["HOME"] == str(mine)
    assert not canary.exists(), canary.read_text()


def test_what_would_run_or_load_the_boxs_code_is_refused_and_named(tmp_path, ws, monkeypatch):
    """Refused at the start, each named, the others started: a program in the workspace, a #! interpreter there, a
    script argument there, a working directory there, a loader variable (PYTHONPATH, NODE_OPTIONS) naming it; the
    server's own env PATH loses its workspace entries; a directory argument there is passed (data the server serves)."""
    (ws / ".venv/bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", ws / ".venv/bin/python3")
    (ws / "tools").mkdir()
    (ws / "tools/server.py").write_text(PY_SERVER)
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    probe = server_file(tmp_path)
    shebang = server_file(tmp_path, "probe-venv", f"#!{ws}/.venv/bin/python3\n" + PY_SERVER)
    servers = [
        {"name": "program", "command": str(ws / ".venv/bin/python3"), "args": [str(probe)]},
        {"name": "shebang", "command": str(shebang)},
        {"name": "script", "command": "python3", "args": [str(ws / "tools/server.py")]},
        {"name": "relative", "command": "python3", "args": ["tools/server.py"], "cwd": str(ws)},
        {
            "name": "pythonpath",
            "command": "python3",
            "args": [str(probe)],
            "env": {"PYTHONPATH": f"/usr/lib:{ws}/tools"},
        },
        {
            "name": "nodeopts",
            "command": "python3",
            "args": [str(probe)],
            "env": {"NODE_OPTIONS": f"--require={ws}/x.js"},
        },
        {
            "name": "ok",
            "command": "python3",
            "args": [str(probe), str(ws)],
            "env": {"PATH": f"{ws}/.venv/bin:{SYSTEM_PATH}"},
        },
    ]
    with McpHost(servers, workspace=ws, start_deadline_s=20) as host:
        assert host.names() == ["mcp__ok__where"], host.problems
        problems = "\n".join(host.problems)
        info = ask(host, "ok")
    for name, says in {
        "program": ".venv/bin/python3",
        "shebang": "the interpreter on the #! line",
        "script": "tools/server.py",
        "relative": "working directory",
        "pythonpath": "PYTHONPATH",
        "nodeopts": "NODE_OPTIONS",
    }.items():
        line = next((p for p in host.problems if f"'{name}' not started" in p), "")
        assert says in line and "where the sandbox can write" in line, (name, problems)
    assert outside(info, ws) == []
