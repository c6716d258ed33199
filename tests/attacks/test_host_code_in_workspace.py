"""Issue 49, item 1: the host's own installation inside the workspace. The usual Python layout puts
the project's virtualenv in the repository (`python -m venv .venv`), and the user runs
`.venv/bin/oa-sandbox exec --workspace .` on it. One shell call in a bind-mode box then wrote a
`.pth` file into the venv's site-packages and a line into `.venv/bin/oa-sandbox`, and the user's
next `oa-sandbox sessions` ran both on the host. The same with the project installed editable
from a clone inside the workspace (a setuptools finder maps its packages there; the clone is not
on sys.path at all).

Each case is the real attack with the real entry script of a real venv, under runc and runsc: an
explicit bind mode is refused before any box starts, `auto` works on a copy (and `apply` carries
none of the planted files back), and --host-code-read-only keeps bind mode with the host's code
mounted read-only in the box, where the writes fail and leave every byte as it was. After each,
`oa-sandbox sessions` from that venv runs nothing of the box's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import chown_tree, make_workspace, sandbox_config, venvs

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under `root` (nothing followed): content, link target or kind, and mode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = os.lstat(path)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                out[rel] = f"{st.st_mode:o} " + hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = f"{st.st_mode:o}"
    return out


def plant(marker: Path, site: str, script: str) -> str:
    """The box's one shell call: a .pth in every site-packages under `site`, and a line inserted
    into `script` (after its #! line, so it runs before main()); each writes `marker` on the host."""
    line = f"import os; open({str(marker)!r}, 'a').write('ran\\n')"
    return (
        f'for d in {site}; do printf \'%s\\n\' "{line}" > "$d/zz_planted.pth" && echo planted-pth; done; '
        f"{{ head -n 1 {script}; printf '%s\\n' \"{line}\"; tail -n +2 {script}; "
        f"}} > /tmp/s && cat /tmp/s > {script} && echo planted-script; true"
    )


class Host:
    """The user's shell: the venv's own entry script, a state and config directory of the test's."""

    def __init__(self, tmp_path: Path, entry: Path, runtime: str | None, docker_client) -> None:
        self.entry = entry
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OA_ADMIN", "VIRTUAL_ENV"))}
        self.env.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
        self.runtime = sandbox_config(runtime, docker_client).backend.runtime or "runc"

    def oa(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.entry), *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=self.env,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
        )

    def exec_shell(self, ws: Path, command: str, *flags: str) -> subprocess.CompletedProcess:
        return self.oa(
            "exec", "--workspace", str(ws), "--runtime", self.runtime, *flags, "shell", json.dumps({"command": command})
        )


def _session_id(stderr: str) -> str | None:
    for line in stderr.splitlines():
        if "(copy mode): review with" in line:
            return line.split("session ", 1)[1].split()[0]
    return None


def _check_nothing_ran(host: Host, marker: Path) -> None:
    proc = host.oa("sessions")
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), f"the box's code ran on the host: {marker.read_text()!r}"


def test_a_venv_in_the_workspace_gives_the_box_nothing_the_host_runs(sandbox_image, docker_client, runtime, tmp_path):
    """`.venv/bin/oa-sandbox exec --workspace .` with the project installed in `.venv`: the planted
    .pth and entry-script line never run on the host, in any mode."""
    ws = make_workspace(tmp_path / "ws", {"app.py": "print('hi')\n"})
    entry = venvs.venv(ws / ".venv")
    chown_tree(ws)  # the user's own checkout: auto is bind mode here
    marker = tmp_path / "host-ran-box-code"
    host = Host(tmp_path, entry, runtime, docker_client)
    attack = plant(marker, ".venv/lib/python3*/site-packages", ".venv/bin/oa-sandbox")
    _check_nothing_ran(host, marker)  # the venv works, and runs nothing of its own
    before = tree_digest(ws / ".venv")

    # bind mode, asked for: refused before any box, naming what was found and what to do
    proc = host.exec_shell(ws, attack, "--workspace-mode", "bind")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "config_invalid" in proc.stderr and ".venv" in proc.stderr and "sys.prefix" in proc.stderr, proc.stderr
    assert "--workspace-mode copy" in proc.stderr and "--host-code-read-only" in proc.stderr, proc.stderr
    assert "planted-" not in proc.stdout
    assert tree_digest(ws / ".venv") == before
    _check_nothing_ran(host, marker)

    # auto: a copy, said in one line; the planted files stay in the copy, and apply leaves them out
    proc = host.exec_shell(ws, attack)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "planted-pth" in proc.stdout and "planted-script" in proc.stdout  # in the copy
    notes = [
        line for line in proc.stderr.splitlines() if "copy mode" in line and ".venv" in line and "sys.prefix" in line
    ]
    assert len(notes) == 1, proc.stderr
    sid = _session_id(proc.stderr)
    assert sid is not None, proc.stderr
    assert tree_digest(ws / ".venv") == before
    _check_nothing_ran(host, marker)
    proc = host.oa("apply", sid)
    assert "zz_planted.pth" in proc.stdout + proc.stderr and "left out" in proc.stdout + proc.stderr, (
        proc.stdout + proc.stderr
    )
    assert ".venv/bin/oa-sandbox" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert tree_digest(ws / ".venv") == before
    _check_nothing_ran(host, marker)

    # the override: bind mode with .venv mounted read-only in the box: every write fails, nothing changes
    proc = host.exec_shell(ws, attack + "; echo x > app.py", "--workspace-mode", "bind", "--host-code-read-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "planted-pth" not in proc.stdout and "planted-script" not in proc.stdout, proc.stdout
    assert "Read-only file system" in proc.stdout, proc.stdout
    assert (ws / "app.py").read_text() == "x\n"  # bind mode: the rest of the workspace is the box's to change
    assert tree_digest(ws / ".venv") == before
    _check_nothing_ran(host, marker)


def test_an_editable_clone_in_the_workspace_gives_the_box_nothing_the_host_runs(
    sandbox_image, docker_client, runtime, tmp_path
):
    """The venv outside, the project installed editable from a clone inside the workspace (its
    packages mapped by a setuptools finder, not on sys.path): a line the box appends to the CLI's
    own module never runs on the host."""
    ws = make_workspace(tmp_path / "ws", {"app.py": "print('hi')\n"})
    entry = venvs.venv(tmp_path / "venv", project=None)
    venvs.editable_clone(ws / "tools" / "oa", tmp_path / "venv")
    chown_tree(ws)
    marker = tmp_path / "host-ran-box-code"
    host = Host(tmp_path, entry, runtime, docker_client)
    line = f"open({str(marker)!r}, 'a').write('ran\\n')"
    attack = f"printf '%s\\n' \"{line}\" >> tools/oa/orchestrator/cli/__init__.py && echo planted-line; true"
    _check_nothing_ran(host, marker)
    before = tree_digest(ws / "tools")

    proc = host.exec_shell(ws, attack, "--workspace-mode", "bind")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tools/oa/orchestrator" in proc.stderr, proc.stderr
    _check_nothing_ran(host, marker)

    proc = host.exec_shell(ws, attack)
    assert proc.returncode == 0 and "planted-line" in proc.stdout, proc.stdout + proc.stderr
    assert any("copy mode" in line and "tools" in line for line in proc.stderr.splitlines()), proc.stderr
    sid = _session_id(proc.stderr)
    assert sid is not None
    proc = host.oa("apply", sid)
    assert (
        "tools/oa/orchestrator/cli/__init__.py" in proc.stdout + proc.stderr and "left out" in proc.stdout + proc.stderr
    )
    assert tree_digest(ws / "tools") == before
    _check_nothing_ran(host, marker)

    proc = host.exec_shell(ws, attack, "--workspace-mode", "bind", "--host-code-read-only")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "planted-line" not in proc.stdout and "Read-only file system" in proc.stdout, proc.stdout
    assert tree_digest(ws / "tools") == before
    _check_nothing_ran(host, marker)


def test_a_program_whose_code_lies_in_the_workspace_keeps_it_read_only(
    sandbox_image, docker_client, runtime, tmp_path, monkeypatch
):
    """A program using the API imports from a directory inside the workspace: bind mode is refused
    unless host_code_read_only, and then that directory is read-only in the box; a warm box handed
    over without it mounted read-only is refused too; `auto` is a copy."""
    from orchestrator.api import HostCodeInWorkspace, Sandbox
    from orchestrator.sandbox.docker import DockerSandbox

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    ws = make_workspace(tmp_path / "ws", {"lib/helper.py": "X = 1\n", "app.py": ""})
    chown_tree(ws)
    monkeypatch.syspath_prepend(str(ws / "lib"))
    config = sandbox_config(runtime, docker_client)
    with pytest.raises(HostCodeInWorkspace) as info:
        Sandbox(ws, mode="bind", config=config).open()
    assert "host_code_read_only=True" in info.value.message and [f.rel for f in info.value.found] == ["lib"]
    allowed = config.model_copy(update={"host_code_read_only": True})
    with Sandbox(ws, mode="bind", config=allowed, auto_approve=True) as box:
        out = box.shell(
            "echo 'import os' >> lib/helper.py; touch lib/evil.pth; mv lib lib2; echo ok > app.py; cat app.py"
        ).output
    assert "Read-only file system" in out and "ok" in out, out
    assert (ws / "lib" / "helper.py").read_text() == "X = 1\n" and sorted(os.listdir(ws / "lib")) == ["helper.py"]
    with Sandbox(ws, config=config) as box:
        assert box.record is not None and box.record.mode.value == "copy"
    warm = DockerSandbox(ws, config, client=docker_client)
    warm.start()
    with pytest.raises(HostCodeInWorkspace) as info:
        Sandbox(ws, box=warm, config=allowed).open()
    assert "started without lib mounted read-only" in info.value.message
    assert not warm.started  # the box handed over went with the refused open
    warm = DockerSandbox(ws, allowed.model_copy(update={"read_only_entries": ["lib"]}), client=docker_client)
    warm.start()
    with Sandbox(ws, box=warm, config=allowed, auto_approve=True) as box:
        assert "Read-only file system" in box.shell("touch lib/evil.pth").output
    assert sorted(os.listdir(ws / "lib")) == ["helper.py"]
