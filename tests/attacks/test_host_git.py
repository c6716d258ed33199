"""The host git tool against a working tree (and a repository config) written by an attacker.

Every payload is a command that would create a marker file on the host if anything ran it; every
planted secret is a file outside the workspace whose content must never reach an output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pygit2
import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.models.base import ToolCall
from orchestrator.tools.host_git import GIT_OUTPUT_CAP, HostRepo, parse_args
from orchestrator.tools.registry import RegistryConfig, ToolRegistry
from tests.helpers import chown_tree
from tests.helpers.host_git import SIG, init_repo, run

SECRET = "host secret: must never be read"


def raw_repo(ws: Path) -> pygit2.Repository:
    """The repository as the test reads it afterwards (the workspace may belong to the sandbox's uid)."""
    pygit2.settings.owner_validation = False
    try:
        return pygit2.Repository(str(ws / ".git"), pygit2.enums.RepositoryOpenFlag.NO_SEARCH)
    finally:
        pygit2.settings.owner_validation = True


class Markers:
    def __init__(self, root: Path) -> None:
        self.dir = root / "markers"
        self.dir.mkdir()

    def cmd(self, name: str) -> str:
        return f'"touch {self.dir}/{name}"'

    def fired(self) -> list[str]:
        return sorted(os.listdir(self.dir))


def hostile_config(m: Markers, hooks: Path) -> str:
    """Every repository setting that made the git program start a command."""
    return f"""
[core]
\tfsmonitor = {m.cmd("fsmonitor")}
\thooksPath = {hooks}
\tpager = {m.cmd("pager")}
\tsshCommand = {m.cmd("ssh")}
\teditor = {m.cmd("editor")}
[filter "evil"]
\tclean = {m.cmd("clean")}
\tsmudge = {m.cmd("smudge")}
\tprocess = {m.cmd("process")}
[diff]
\texternal = {m.cmd("external")}
[diff "evil"]
\ttextconv = {m.cmd("textconv")}
\tcommand = {m.cmd("diffcommand")}
[gpg]
\tprogram = {m.cmd("gpg")}
[gpg "ssh"]
\tprogram = {m.cmd("gpgssh")}
[commit]
\tgpgSign = true
[log]
\tshowSignature = true
[remote "origin"]
\turl = ext::sh -c {m.cmd("remote")}
\treceivepack = {m.cmd("receivepack")}
\tuploadpack = {m.cmd("uploadpack")}
"""


def plant_hooks(hooks: Path, m: Markers) -> None:
    hooks.mkdir(parents=True, exist_ok=True)
    for name in (
        "pre-commit",
        "prepare-commit-msg",
        "commit-msg",
        "post-commit",
        "post-index-change",
        "reference-transaction",
        "pre-push",
    ):
        hook = hooks / name
        hook.write_text(f"#!/bin/sh\ntouch {m.dir}/hook-{name}\n")
        hook.chmod(0o755)


def every_command(repo: HostRepo, message: str = "commit by the tool") -> dict[str, object]:
    return {
        sub: run(repo, subcommand=sub, **({"message": message} if sub == "commit" else {}))
        for sub in ("status", "diff", "log", "commit")
    }


@pytest.fixture
def hostile(tmp_path):
    """A workspace whose repository config names a marker command for every program git could start."""
    m = Markers(tmp_path)
    ws = tmp_path / "ws"
    init_repo(ws, {"app.py": "print('hi')\n", "data.txt": "one\n"})
    plant_hooks(ws / ".git" / "hooks", m)
    plant_hooks(tmp_path / "hooks", m)
    with open(ws / ".git" / "config", "a") as f:
        f.write(hostile_config(m, tmp_path / "hooks"))
    (ws / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
    (ws / "app.py").write_text("print('changed')\n")
    (ws / "new.txt").write_text("new\n")
    return ws, m


def test_fsmonitor_and_pager_in_config_run_nothing(hostile):
    """core.fsmonitor, core.pager and core.editor in .git/config: status, diff, log and commit start no program."""
    ws, m = hostile
    repo = HostRepo.open_at_start(ws)
    assert repo is not None
    results = every_command(repo)
    assert all(r.ok for r in results.values()), results
    assert " M app.py" in results["status"].output and "?? new.txt" in results["status"].output
    assert m.fired() == []


def test_filter_clean_and_smudge_from_gitattributes_are_not_applied(hostile):
    """filter.evil.clean/smudge/process named by a box-written
    .gitattributes: commit stores the raw bytes, nothing runs."""
    ws, m = hostile
    repo = HostRepo.open_at_start(ws)
    assert run(repo, subcommand="commit", message="filtered?").ok
    raw = raw_repo(ws)
    tree = raw[raw.head.target].peel(pygit2.Tree)
    assert raw[tree["app.py"].id].data == b"print('changed')\n"
    assert m.fired() == []


def test_diff_external_and_textconv_run_nothing(hostile):
    """diff.external, diff.evil.textconv and diff.evil.command: the diff is computed in-process."""
    ws, m = hostile
    result = run(HostRepo.open_at_start(ws), subcommand="diff")
    assert result.ok and "-print('hi')" in result.output and "+print('changed')" in result.output
    assert m.fired() == []


def test_gpg_program_with_commit_gpgsign_and_log_showsignature_runs_nothing(hostile):
    """gpg.program with commit.gpgSign and log.showSignature: the commit is unsigned, log verifies nothing."""
    ws, m = hostile
    repo = HostRepo.open_at_start(ws)
    assert run(repo, subcommand="commit", message="sign me?").ok
    assert run(repo, subcommand="log").output.splitlines()[0].endswith("sign me?")
    raw = raw_repo(ws)
    assert b"gpgsig" not in raw.odb.read(raw.head.target)[1]
    assert m.fired() == []


def test_hooks_in_git_dir_and_hookspath_never_run(hostile):
    """Executable pre-commit, commit-msg, post-commit, reference-transaction
    hooks (and core.hooksPath): none runs on commit."""
    ws, m = hostile
    result = run(HostRepo.open_at_start(ws), subcommand="commit", message="hooks?")
    assert result.ok and "hooks?" in result.output
    assert m.fired() == []


def test_core_worktree_elsewhere_turns_the_tool_off(tmp_path):
    """core.worktree=/ (or any other directory): the repository
    is refused at session start, so `:/etc` reads nothing."""
    for target in ("/", str(tmp_path)):
        ws = tmp_path / f"ws{len(target)}"
        init_repo(ws, {"a": "a\n"})
        with open(ws / ".git" / "config", "a") as f:
            f.write(f"[core]\n\tworktree = {target}\n")
        repo, why = HostRepo.inspect_at_start(ws)
        assert repo is None and "core.worktree" in why
        assert "git" not in ToolRegistry(None, ws, RegistryConfig(), ToolRegistry.open_repo(ws)).active()


def test_config_including_a_workspace_file_turns_the_tool_off(tmp_path):
    """[include] path or core.excludesFile naming a box-writable
    file (later core.worktree=/ or a FIFO): refused at start."""
    for line in (
        "[include]\n\tpath = ../cfg\n",
        '[includeIf "gitdir:/"]\n\tpath = ../sub/cfg\n',
        "[core]\n\texcludesFile = ../ignore\n",
    ):
        ws = tmp_path / f"ws{len(line)}"
        init_repo(ws, {"a": "a\n"})
        with open(ws / ".git" / "config", "a") as f:
            f.write(line)
        repo, why = HostRepo.inspect_at_start(ws)
        assert repo is None and "working tree" in why, line
    ws = tmp_path / "fine"
    init_repo(ws, {"a": "a\n"})
    with open(ws / ".git" / "config", "a") as f:
        f.write(f"[include]\n\tpath = {tmp_path}/trusted.cfg\n")
    assert HostRepo.open_at_start(ws) is not None


def test_gitfile_or_link_at_the_top_is_never_followed(tmp_path):
    """A `.git` gitfile (gitdir: ../planted) or a `.git` symlink at
    the top: the git tool is off; the sibling repo is untouched."""
    m = Markers(tmp_path)
    planted = tmp_path / "planted"
    init_repo(planted, {"secret.txt": SECRET})
    with open(planted / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {m.cmd('fsmonitor')}\n")
    head = (planted / ".git" / "refs" / "heads" / "main").read_text()
    for kind in ("gitfile", "symlink"):
        ws = tmp_path / f"ws-{kind}"
        ws.mkdir()
        (ws / "secret.txt").write_text("workspace copy\n")
        if kind == "gitfile":
            (ws / ".git").write_text(f"gitdir: {planted}/.git\n")
        else:
            (ws / ".git").symlink_to(planted / ".git")
        repo, why = HostRepo.inspect_at_start(ws)
        assert repo is None and "not a real directory" in why
    assert (planted / ".git" / "refs" / "heads" / "main").read_text() == head
    assert m.fired() == []


def test_git_dir_swapped_after_session_start_is_refused(tmp_path):
    """.git replaced by a gitfile after the repository was opened: every later command is refused, typed."""
    planted = tmp_path / "planted"
    init_repo(planted, {"secret.txt": SECRET})
    ws = tmp_path / "ws"
    init_repo(ws, {"a": "a\n"})
    repo = HostRepo.open_at_start(ws)
    os.rename(ws / ".git", tmp_path / "moved")
    (ws / ".git").write_text(f"gitdir: {planted}/.git\n")
    result = run(repo, subcommand="diff")
    assert (
        not result.ok and result.error.type == ErrorType.UNSAFE_WORKSPACE_FILE and result.executor.value == "openagents"
    )
    assert SECRET not in result.output


def _submodule_workspace(tmp_path: Path, m: Markers) -> tuple[Path, Path]:
    """A workspace with a committed submodule whose gitfile the box rewrote to point at ../.planted."""
    ws = tmp_path / "ws"
    repo = init_repo(ws, {"README.md": "# top\n"})
    (ws / ".gitmodules").write_text(
        '[submodule "sub"]\n\tpath = sub\n\turl = ../evil\n\tupdate = !touch ' + str(m.dir) + "/update\n"
    )
    index = repo.index
    index.add(pygit2.IndexEntry("sub", pygit2.Oid(hex="1" * 40), pygit2.enums.FileMode.COMMIT))
    index.add(".gitmodules")
    index.write()
    repo.create_commit("HEAD", SIG, SIG, "add sub", index.write_tree(), [repo.head.target])
    planted = ws / ".planted"
    init_repo(planted, {"secret.txt": SECRET})
    with open(planted / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {m.cmd('fsmonitor')}\n\tworktree = {tmp_path}\n")
    (ws / "sub").mkdir()
    (ws / "sub" / ".git").write_text("gitdir: ../.planted/.git\n")
    (ws / "sub" / "secret.txt").write_text(SECRET)
    return ws, planted


def test_submodule_gitfile_pointing_at_a_planted_repo_is_never_opened(tmp_path):
    """A submodule's `.git` gitfile rewritten to `gitdir: ../.planted`
    (and a hostile .gitmodules): nothing opens it or runs."""
    m = Markers(tmp_path)
    ws, planted = _submodule_workspace(tmp_path, m)
    head = (planted / ".git" / "refs" / "heads" / "main").read_text()
    repo = HostRepo.open_at_start(ws)
    results = every_command(repo)
    assert all(r.ok for r in results.values()), results
    assert "sub/ (nested repository or submodule: not opened)" in results["status"].output
    for r in results.values():
        assert SECRET not in r.output
    raw = raw_repo(ws)
    tree = raw[raw.head.target].peel(pygit2.Tree)
    assert tree["sub"].filemode == 0o160000 and str(tree["sub"].id) == "1" * 40  # the gitlink is left as it was
    assert (planted / ".git" / "refs" / "heads" / "main").read_text() == head
    assert m.fired() == []


def test_nested_repository_is_opaque_and_never_committed(tmp_path):
    """A box-made nested repository (vendor/.git with a hostile
    config): shown as one entry, never opened, never committed."""
    m = Markers(tmp_path)
    ws = tmp_path / "ws"
    init_repo(ws, {"a.txt": "a\n"})
    nested = ws / "vendor"
    init_repo(nested, {"secret.txt": SECRET})
    with open(nested / ".git" / "config", "a") as f:
        f.write(hostile_config(m, tmp_path / "hooks"))
    plant_hooks(nested / ".git" / "hooks", m)
    also = ws / "deep" / "lib"
    also.mkdir(parents=True)
    (also / ".git").write_text("gitdir: ../../../outside\n")
    (also / "secret.txt").write_text(SECRET)
    repo = HostRepo.open_at_start(ws)
    results = every_command(repo)
    assert all(r.ok for r in results.values()), results
    assert "-- vendor/" in results["status"].output and "-- deep/lib/" in results["status"].output
    assert not any(SECRET in r.output for r in results.values())
    raw = raw_repo(ws)
    names = {e.path for e in raw.index}
    assert names == {"a.txt"}, names
    refused = run(repo, subcommand="diff", paths=["vendor/secret.txt"])
    assert not refused.ok and refused.error.type == ErrorType.PATH_INVALID
    assert m.fired() == []


def test_workspace_inside_a_bigger_repository_sees_nothing_outside(tmp_path):
    """A workspace inside a bigger repository: no upward discovery, and `:/`, `:(top)`, `..` pathspecs are refused."""
    outer = tmp_path / "outer"
    init_repo(outer, {"secret.txt": SECRET, "inner/keep.txt": "k\n"})
    inner = outer / "inner"
    assert HostRepo.open_at_start(inner) is None  # the outer .git is never discovered
    init_repo(inner, {"a.txt": "a\n"})
    repo = HostRepo.open_at_start(inner)
    for spec, kind in (
        (":/", "path_invalid"),
        (":/secret.txt", "path_invalid"),
        (":(top)secret.txt", "path_invalid"),
        ("../secret.txt", "path_outside_workspace"),
        ("/etc/passwd", "path_outside_workspace"),
        ("-x", "path_invalid"),
        (".git/config", "path_in_git_dir"),
        ("a\x00b", "path_invalid"),
    ):
        with pytest.raises(OpenAgentsError) as err:
            run(repo, subcommand="diff", paths=[spec])
        assert err.value.type.value == kind, spec
    outer_head = (outer / ".git" / "refs" / "heads" / "main").read_text()
    results = every_command(repo)
    assert not any(SECRET in r.output for r in results.values())
    assert (outer / ".git" / "refs" / "heads" / "main").read_text() == outer_head


def test_symlink_pathspec_leading_outside_is_refused_and_never_read(tmp_path):
    """A symlink to a host file, and a path through a symlinked
    directory: refused as pathspecs; a link is committed as a link."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    ws = tmp_path / "ws"
    init_repo(ws, {"a.txt": "a\n"})
    (ws / "leak").symlink_to(tmp_path / "outside" / "secret.txt")
    (ws / "dirlink").symlink_to(tmp_path / "outside")
    repo = HostRepo.open_at_start(ws)
    for spec in ("leak", "dirlink/secret.txt"):
        result = run(repo, subcommand="diff", paths=[spec])
        assert not result.ok and result.error.type == ErrorType.PATH_OUTSIDE_WORKSPACE, spec
    results = every_command(repo)
    assert not any(SECRET in r.output for r in results.values())
    raw = raw_repo(ws)
    tree = raw[raw.head.target].peel(pygit2.Tree)
    assert (
        tree["leak"].filemode == 0o120000
        and raw[tree["leak"].id].data == str(tmp_path / "outside" / "secret.txt").encode()
    )
    missing = run(repo, subcommand="status", paths=["no/such"])
    assert not missing.ok and missing.error.type == ErrorType.FILE_NOT_FOUND


def _finishes(fn, seconds: float = 20.0):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, "the host git tool hung"
    return box[0]


def test_fifo_at_a_tracked_path_and_as_gitignore_does_not_hang_the_host(tmp_path):
    """A FIFO at a tracked path, as .gitignore and as .gitattributes:
    every command answers at once, the FIFO is never opened."""
    ws = tmp_path / "ws"
    init_repo(ws, {"data.txt": "d\n", "sub/x.txt": "x\n"})
    for rel in ("data.txt", ".gitignore", "sub/.gitignore", ".gitattributes"):
        (ws / rel).unlink(missing_ok=True)
        os.mkfifo(ws / rel)
    repo = HostRepo.open_at_start(ws)
    results = _finishes(lambda: every_command(repo))
    assert all(r.ok for r in results.values()), results
    assert "T data.txt (not a regular file: not read)" in results["status"].output
    assert "ignore rules below it are not applied" in results["status"].note


def test_huge_diff_is_bounded_and_large_files_are_summarised(tmp_path):
    """A 300 MB changed file and thousands of changed lines: output
    at most the cap, big files summarised, host RSS bounded."""
    ws = tmp_path / "ws"
    init_repo(ws, {"big.bin": "small\n", **{f"f{i}.txt": "x\n" * 50 for i in range(200)}})
    with open(ws / "big.bin", "wb") as f:
        f.truncate(300 << 20)
    for i in range(200):
        (ws / f"f{i}.txt").write_text("y\n" * 50)
    script = f"""
import resource, sys
from orchestrator.tools.host_git import HostRepo, parse_args
repo = HostRepo.open_at_start({str(ws)!r})
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = [repo.run(parse_args({{"subcommand": s, **({{"message": "m"}} if s == "commit" else {{}})}}))
       for s in ("status", "diff", "commit")]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(max(len(r.output) for r in out), (after - before) // 1024,
      int("binary/large, 6 -> 314572800 bytes" in out[1].output and out[1].meta["cut"]), int(all(r.ok for r in out)))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    longest, grown_mib, summarised, ok = map(int, proc.stdout.split())
    assert ok and summarised and longest <= GIT_OUTPUT_CAP
    assert grown_mib < 64, f"host RSS grew {grown_mib} MiB for a 300 MB file"


def test_push_is_not_a_git_subcommand(tmp_path):
    """push (receivepack, remote URLs from a config the box could write) is gone: a typed refusal, nothing runs."""
    with pytest.raises(OpenAgentsError) as err:
        parse_args({"subcommand": "push"})
    assert err.value.type == ErrorType.INVALID_ARGUMENTS


def test_no_git_at_start_means_no_git_tool_even_after_one_is_planted(tmp_path):
    """No .git at session start: the git tool is off, and a .git planted later (with core.fsmonitor) changes nothing."""
    m = Markers(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    registry = ToolRegistry(None, ws, RegistryConfig(), ToolRegistry.open_repo(ws))
    init_repo(ws, {"a": "a\n"})
    with open(ws / ".git" / "config", "a") as f:
        f.write(f"[core]\n\tfsmonitor = {m.cmd('fsmonitor')}\n")
    assert "git" not in registry.active()
    with pytest.raises(OpenAgentsError) as err:
        registry.prepare(ToolCall(id="c", name="git", arguments={"subcommand": "status"}))
    assert err.value.type == ErrorType.TOOL_DISABLED
    assert m.fired() == []


@pytest.mark.docker
def test_plants_from_inside_a_real_sandbox_run_nothing_on_the_host(tmp_path, open_sandbox):
    """From a real sandbox shell: nested repo with hostile config, submodule gitfile
    to ../.planted, .gitattributes filter, a FIFO at a tracked path, a write to
    .git/config; then host status/diff/log/commit: no marker, no secret, no hang."""
    m = Markers(tmp_path)
    os.chmod(m.dir, 0o777)
    ws = tmp_path / "ws"
    init_repo(ws, {"app.py": "print('hi')\n", "data.txt": "d\n"})
    chown_tree(ws)
    repo = ToolRegistry.open_repo(ws)  # at session start, before the box exists
    box = open_sandbox(ws)
    registry = ToolRegistry(box, ws, RegistryConfig(), repo)
    cfg = hostile_config(m, Path("/workspace/hooks")).replace('"', '\\"')
    plant = box.call(
        "shell",
        {
            "command": (
                "set -e; cd /workspace; mkdir -p vendor/.git .planted/.git/refs/heads sub hooks; printf '%s' "
                f'"{cfg}" > vendor/.git/config; cp vendor/.git/config .planted/.git/config; echo \'ref: '
                "refs/heads/main' > vendor/.git/HEAD; echo 'ref: refs/heads/main' > .planted/.git/HEAD; echo "
                f"'{SECRET}' > vendor/secret.txt; echo '{SECRET}' > sub/secret.txt; echo 'gitdir: "
                "../.planted/.git' > sub/.git; printf '[submodule \"sub\"]\\n\\tpath = sub\\n\\turl = "
                "../.planted\\n' > .gitmodules; echo '* filter=evil diff=evil' > .gitattributes; printf "
                f"'#!/bin/sh\\ntouch {m.dir}/hook\\n' > hooks/pre-commit; chmod +x hooks/pre-commit; rm "
                "data.txt; mkfifo data.txt; echo changed > app.py; (echo '[core]' ; echo '  fsmonitor = x') "
                ">> .git/config 2>/dev/null && echo WROTE-GIT-CONFIG || echo git-config-read-only"
            )
        },
    )
    assert plant.ok and "git-config-read-only" in plant.output, plant.output
    results = _finishes(
        lambda: {
            s: registry.invoke(
                registry.prepare(
                    ToolCall(
                        id=s, name="git", arguments={"subcommand": s, **({"message": "m"} if s == "commit" else {})}
                    )
                )
            )
            for s in ("status", "diff", "log", "commit")
        },
        60,
    )
    assert all(r.ok and r.executor.value == "openagents" for r in results.values()), results
    assert "-- vendor/" in results["status"].output and "-- sub/" in results["status"].output
    assert not any(SECRET in r.output for r in results.values())
    raw = raw_repo(ws)
    committed = {e.path for e in raw.index}
    assert not any(p.startswith(("vendor/", "sub/")) for p in committed) and "app.py" in committed
    assert m.fired() == []
