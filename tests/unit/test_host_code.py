"""What the host runs and imports, found wherever it lies (issue 49, workspace/host_code.py): a real
venv made in a workspace, an editable clone mapped by a finder, links in and out of the workspace;
the one decision (copy for `auto`, a typed refusal for bind, read-only entries under the override)
and the apply that leaves the host's code out. Real files and real interpreters; no box."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.api import Sandbox, SandboxOptions
from orchestrator.config import SandboxConfig
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.workspace import host_code
from orchestrator.workspace.copy import copy_workspace
from orchestrator.workspace.host_code import HostCodeInWorkspace, HostPath, found_in, guard, read_only_tops
from orchestrator.workspace.records import WorkspaceMode
from orchestrator.workspace.review import apply_changes, planned_changes
from tests.helpers import chown_tree, make_workspace, venvs

PROBE = (
    "import json, sys; import orchestrator.cli; from orchestrator.workspace.host_code import found_in; "
    "print(json.dumps([[f.what, list(f.rels)] for f in found_in(sys.argv[1])]))"
)


@pytest.fixture(autouse=True)
def own_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def probe(python: Path, ws: Path, cwd: Path) -> list[tuple[str, list[str]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    out = subprocess.run(
        [str(python), "-c", PROBE, str(ws)], capture_output=True, text=True, timeout=120, env=env, cwd=cwd, check=True
    ).stdout
    return [(what, rels) for what, rels in json.loads(out)]


def test_a_venv_in_the_workspace_is_found_by_its_own_interpreter(tmp_path):
    """The interpreter of a venv made in the workspace finds its prefix, its site-packages and itself
    (a link: by where the link lies) there; from the workspace as working directory, '' on sys.path
    is the workspace itself."""
    ws = make_workspace(tmp_path / "ws")
    venvs.venv(ws / ".venv")
    listed = probe(ws / ".venv" / "bin" / "python", ws, tmp_path)
    found = dict(listed)
    assert found["sys.prefix"] == [".venv"]  # sys.exec_prefix is the same path: listed once
    assert found["the interpreter (sys.executable)"][0] == ".venv/bin/python"  # the link's place: its target is outside
    assert f".venv/lib/{venvs.PY}/site-packages" in [rels[0] for what, rels in listed if what == "a sys.path entry"]
    here = probe(ws / ".venv" / "bin" / "python", ws, ws)
    assert ("a sys.path entry", [""]) in here


def test_an_editable_clone_is_found_by_its_modules_though_not_on_sys_path(tmp_path):
    """The venv outside, the project editable from a clone inside: no sys.path entry lies in the
    workspace, but the loaded modules' directories and the finder's mapping do."""
    ws = make_workspace(tmp_path / "ws")
    venvs.venv(tmp_path / "venv", project=None)
    venvs.editable_clone(ws / "tools" / "oa", tmp_path / "venv")
    found = probe(tmp_path / "venv" / "bin" / "python", ws, tmp_path)
    assert not [f for f in found if f[0] in ("a sys.path entry", "sys.prefix")], found
    assert ("the editable install of orchestrator", ["tools/oa/orchestrator"]) in found
    assert any(
        what.startswith("the directory of module orchestrator") and rels == ["tools/oa/orchestrator/cli"]
        for what, rels in found
    ), found


def test_a_venv_outside_finds_nothing_in_the_workspace(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    venvs.venv(tmp_path / "venv")
    assert probe(tmp_path / "venv" / "bin" / "python", ws, tmp_path) == []


def test_links_count_where_they_lie_and_where_they_lead(tmp_path):
    """By spelling and along the resolution: a link in the workspace leading out (the box can
    re-point it), a link outside leading in, a link in the workspace met half way, a path not
    there yet, the workspace itself; the workspace named through a link of its own."""
    ws = make_workspace(tmp_path / "ws", {"real/lib/x.py": ""})
    outside = tmp_path / "outside"
    (outside / "venv").mkdir(parents=True)
    (ws / ".venv").symlink_to(outside / "venv")
    (outside / "into").symlink_to(ws / "real")
    (ws / "hop").symlink_to(outside / "venv")
    (outside / "via").symlink_to(ws / "hop")
    (tmp_path / "ws-link").symlink_to(ws)
    paths = [
        HostPath("sys.prefix", str(ws / ".venv")),
        HostPath("a", str(outside / "into" / "lib")),
        HostPath("b", str(outside / "via")),
        HostPath("c", str(ws / "missing" / "x")),
        HostPath("d", str(ws)),
        HostPath("e", str(outside / "venv")),
        HostPath("f", str(tmp_path / "ws-link" / "real")),
    ]
    found = {f.what: f.rels for f in found_in(ws, paths)}
    assert found == {
        "sys.prefix": (".venv",),
        "a": ("real/lib",),
        "b": ("hop",),
        "c": ("missing/x",),
        "d": ("",),
        "f": ("real",),
    }
    assert {f.what for f in found_in(tmp_path / "ws-link", paths)} == set(found)
    tops, problems = read_only_tops(ws, found_in(ws, paths))
    assert tops == ["real"]
    assert any(".venv" in p and "symbolic link" in p for p in problems) and any("hop" in p for p in problems)
    assert any("missing" in p and "not there yet" in p for p in problems) and any(
        "workspace itself" in p for p in problems
    )


def _bind_workspace(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    ws = make_workspace(tmp_path / "ws", files or {".venv/lib/site-packages/m.py": "", "app.py": ""})
    chown_tree(ws)  # the user's own: auto is bind mode
    return ws


def test_the_decision_for_each_mode(tmp_path):
    ws = _bind_workspace(tmp_path)
    found = found_in(
        ws,
        [HostPath("sys.prefix", str(ws / ".venv")), HostPath("a sys.path entry", str(ws / ".venv/lib/site-packages"))],
    )
    assert [f.rel for f in found] == [".venv", ".venv/lib/site-packages"]
    auto = guard(ws, WorkspaceMode.AUTO, SandboxConfig(), found=found)
    assert (
        auto.mode == WorkspaceMode.COPY
        and auto.error is None
        and "sys.prefix .venv" in auto.note
        and "--host-code-read-only" in auto.note
    )
    bind = guard(ws, WorkspaceMode.BIND, SandboxConfig(), found=found)
    assert (
        isinstance(bind.error, HostCodeInWorkspace)
        and bind.error.type == ErrorType.CONFIG_INVALID
        and not bind.error.recoverable
    )
    assert (
        "--workspace-mode copy" in bind.error.message
        and "--host-code-read-only" in bind.error.message
        and ".venv" in bind.error.message
    )
    api = guard(ws, WorkspaceMode.BIND, SandboxConfig(), found=found, api=True)
    assert (
        api.error is not None and "host_code_read_only=True" in api.error.message and "mode='copy'" in api.error.message
    )
    assert "--" not in api.error.message
    for mode in (WorkspaceMode.BIND, WorkspaceMode.AUTO):
        over = guard(ws, mode, SandboxConfig(host_code_read_only=True), found=found)
        assert over.error is None and over.read_only == [".venv"] and over.mode == mode and not over.note
    copy = guard(ws, WorkspaceMode.COPY, SandboxConfig(), found=found)
    assert copy.mode == WorkspaceMode.COPY and copy.error is None and not copy.note
    pool = guard(
        ws, WorkspaceMode.AUTO, SandboxConfig(), found=found, fixed_bind="a warm pool's box mounts the workspace itself"
    )
    assert pool.error is not None and pool.error.message.startswith("a warm pool's box")
    assert guard(ws, WorkspaceMode.BIND, SandboxConfig(), found=[]).error is None


def test_the_override_refuses_what_a_read_only_mount_cannot_cover(tmp_path):
    ws = _bind_workspace(tmp_path)
    for path in (ws, ws / "not-yet" / "lib"):
        decided = guard(
            ws,
            WorkspaceMode.BIND,
            SandboxConfig(host_code_read_only=True),
            found=found_in(ws, [HostPath("a sys.path entry", str(path))]),
        )
        assert (
            decided.error is not None
            and "even with --host-code-read-only" in decided.error.message
            and not decided.read_only
        )


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned workspace needs root to make")
def test_a_root_owned_workspace_is_a_copy_anyway(tmp_path):
    ws = make_workspace(tmp_path / "ws", {".venv/x": ""})
    os.chown(ws, 0, 0)
    decided = guard(
        ws, WorkspaceMode.AUTO, SandboxConfig(), found=found_in(ws, [HostPath("sys.prefix", str(ws / ".venv"))])
    )
    assert decided.mode == WorkspaceMode.AUTO and not decided.note and decided.error is None


def test_the_config_directory_and_the_state_directory(tmp_path, monkeypatch):
    """The config directory in the workspace is the host's too; nothing of the host's may lie in the
    state directory (copy mode's copies lie there), whatever the mode."""
    ws = _bind_workspace(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(ws / ".config"))
    found = [f for f in found_in(ws) if not f.in_state]
    assert [(f.what, f.rel) for f in found] == [("the config directory", ".config/openagents-sandbox")]
    assert guard(ws, WorkspaceMode.AUTO, SandboxConfig(), found=found).mode == WorkspaceMode.COPY
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    inside_state = found_in(ws, [HostPath("a sys.path entry", str(tmp_path / "state" / "openagents-sandbox" / "venv"))])
    assert [f.in_state for f in inside_state] == [True]
    decided = guard(ws, WorkspaceMode.COPY, SandboxConfig(host_code_read_only=True), found=inside_state)
    assert (
        decided.error is not None
        and "state directory" in decided.error.message
        and "XDG_STATE_HOME" in decided.error.message
    )


def test_apply_leaves_the_hosts_code_out_and_lists_it(tmp_path, monkeypatch):
    """A copy session's box plants a .pth in the venv, an entry-script line, a file in a package the
    host imports now, and replaces the venv with a link; apply carries the ordinary edit only, and
    lists each of the others as left out, with why."""
    real = tmp_path / "real"
    site = f".venv/lib/{venvs.PY}/site-packages"
    for rel, text in {
        f"{site}/ok.py": "",
        ".venv/bin/oa-sandbox": "#!python\n",
        "src/app.py": "old\n",
        "lib/pkg/mod.py": "x = 1\n",
        "other/keep.txt": "keep\n",
    }.items():
        (real / rel).parent.mkdir(parents=True, exist_ok=True)
        (real / rel).write_text(text)
    manifest = copy_workspace(real, tmp_path / "state" / "copy", os.getuid(), os.getgid())
    manifest.host_code = [".venv"]  # what the session's start recorded (its interpreter's venv)
    monkeypatch.syspath_prepend(str(real / "lib"))  # and what this process imports from now
    copy = Path(manifest.copy_dir)
    (copy / site / "zz.pth").write_text("import os\n")
    with open(copy / ".venv/bin/oa-sandbox", "a") as fh:
        fh.write("import os\n")
    (copy / "src/app.py").write_text("new\n")
    (copy / "lib/pkg/evil.py").write_text("import os\n")
    (copy / "lib/extra.pth").write_text("import os\n")
    carried, preview = planned_changes(manifest)
    assert [c.path for c in carried] == ["src/app.py"]
    report = apply_changes(manifest)
    assert report.applied == ["src/app.py"] and not report.conflicts
    left = {item.path: item.reason for item in report.left_out}
    assert set(left) == {f"{site}/zz.pth", ".venv/bin/oa-sandbox", "lib/pkg/evil.py", "lib/extra.pth"}
    assert all("the host runs or imports from" in why and "never carried" in why for why in left.values())
    assert [lo.path for lo in preview.left_out] == [lo.path for lo in report.left_out]
    assert not (real / site / "zz.pth").exists() and (real / ".venv/bin/oa-sandbox").read_text() == "#!python\n"
    assert not (real / "lib/pkg/evil.py").exists() and (real / "src/app.py").read_text() == "new\n"


def test_a_program_in_the_workspace_names_the_keyword(tmp_path, monkeypatch):
    """Through the API, bind mode is refused before any box, naming the keyword (a program's words)."""
    ws = _bind_workspace(tmp_path, {"lib/helper.py": ""})
    monkeypatch.syspath_prepend(str(ws / "lib"))
    with pytest.raises(HostCodeInWorkspace) as info:
        Sandbox(ws, mode="bind").open()
    assert "host_code_read_only=True" in info.value.message and "lib" in info.value.message
    assert [f.rel for f in info.value.found] == ["lib"]


def test_the_options_carry_the_override_and_check_the_entries():
    assert SandboxOptions(host_code_read_only=True).sandbox_config().host_code_read_only
    assert not SandboxOptions().sandbox_config().host_code_read_only
    for bad in ("../x", "a/b", "", ".", ".."):
        with pytest.raises(ValueError):
            SandboxConfig(read_only_entries=[bad])
    assert SandboxConfig(read_only_entries=[".venv"]).read_only_entries == [".venv"]


def test_what_the_host_runs_now_is_listed(tmp_path):
    """This very process: its interpreter, its prefix, its entry script and its modules' directories."""
    paths = {p.what: p.path for p in host_code.host_paths()}
    assert "sys.prefix" in paths and "the interpreter (sys.executable)" in paths and "the config directory" in paths
    assert any(what.startswith("the directory of module orchestrator") for what in paths)
    assert os.path.isabs(paths["sys.prefix"])


def test_an_error_of_its_own_kind_is_still_the_taxonomys():
    err = HostCodeInWorkspace("x", [])
    assert isinstance(err, OpenAgentsError) and err.detached().found == [] and err.to_dict()["type"] == "config_invalid"


def test_openssl_is_never_taken_from_the_users_path(tmp_path, monkeypatch):
    """The per-session CA's `openssl` comes from the system's directories: one planted first on PATH
    (an activated venv in the workspace, a direnv PATH_add the box writes) never runs."""
    from orchestrator.sandbox.egress_tls import SessionCA

    planted = tmp_path / "ws" / ".venv" / "bin"
    planted.mkdir(parents=True)
    marker = tmp_path / "ran"
    (planted / "openssl").write_text(f"#!/bin/sh\necho ran > {marker}\nexit 1\n")
    (planted / "openssl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted}:{os.environ['PATH']}")
    ca = SessionCA(["api.example.com"])
    try:
        assert "api.example.com" in ca.leaves and not marker.exists()
    finally:
        ca.close()
