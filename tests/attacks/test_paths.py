"""Path attacks: every one is tried at the host's check AND straight at the agent (the raw wire),
so each layer is shown to hold alone."""

from __future__ import annotations

import os
import threading

import pytest

from orchestrator.errors import OpenAgentsError
from orchestrator.tools.args import validate_arguments

pytestmark = pytest.mark.docker
PASSWD_MARK = "root:x:0:0"


def host_refuses(tool: str, args: dict) -> str | None:
    try:
        validate_arguments(tool, args)
    except OpenAgentsError as err:
        return err.type.value
    return None


@pytest.mark.parametrize(
    "path", ["../outside/canary.txt", "src/../../outside/canary.txt", "./../x", "src/..", "a/b/../../../x", ".."]
)
def test_dotdot_in_every_position(victim, path):
    """`..` at the start, middle and end of a path is refused by the host and by the agent."""
    assert host_refuses("read_file", {"path": path}) == "path_outside_workspace"
    result = victim.call("read_file", {"path": path})
    assert not result.ok and result.error.type.value == "path_outside_workspace"
    victim.assert_intact()


@pytest.mark.parametrize("path", ["/etc/passwd", "//etc/passwd", "~/.ssh/id_rsa"])
def test_absolute_paths(victim, path):
    """Absolute and home-relative paths are refused by both layers."""
    assert host_refuses("read_file", {"path": path}) == "path_outside_workspace"
    assert victim.call("read_file", {"path": path}).error.type.value == "path_outside_workspace"
    victim.assert_intact()


def test_nul_byte(victim):
    """A NUL byte (truncation trick) is refused by both layers."""
    assert host_refuses("write_file", {"path": "ok.txt\x00../../x", "content": "x"}) == "path_invalid"
    assert victim.call("write_file", {"path": "ok.txt\x00../../x", "content": "x"}).error.type.value == "path_invalid"
    victim.assert_intact()


@pytest.mark.parametrize(
    "path",
    [
        "%2e%2e/outside/canary.txt",
        "..%2f..%2fetc%2fpasswd",
        "\u2024\u2024/etc/passwd",
        "\uff0e\uff0e/etc/passwd",
        "..\\..\\etc\\passwd",
    ],
)
def test_encoded_and_lookalike_dots_are_just_names(victim, path):
    """URL-encoded, backslashed and Unicode look-alike dots are plain file names: nothing outside is read."""
    result = victim.call("read_file", {"path": path})
    assert not result.ok and result.error.type.value == "file_not_found"
    assert PASSWD_MARK not in (result.output or "")
    victim.assert_intact()


def test_symlink_to_etc_passwd(victim):
    """A symlink in the workspace pointing at /etc/passwd cannot be read, grepped or written through."""
    os.symlink("/etc/passwd", victim.ws / "pw")
    victim.seal()
    assert victim.call("read_file", {"path": "pw"}).error.type.value == "path_outside_workspace"
    assert victim.call("write_file", {"path": "pw", "content": "x"}).error.type.value == "path_outside_workspace"
    grep = victim.call("grep_files", {"pattern": "root"})
    assert PASSWD_MARK not in grep.output
    victim.assert_intact()


def test_symlink_to_the_hosts_parent_directory(victim):
    """A symlink to the host directory above the workspace leads
    nowhere: refused, and the host path is not even in the box."""
    os.symlink(str(victim.outside), victim.ws / "up")
    os.symlink("..", victim.ws / "dotdot")
    victim.seal()
    for path in ("up/canary.txt", "dotdot/outside/canary.txt"):
        result = victim.call("read_file", {"path": path})
        assert not result.ok and result.error.type.value == "path_outside_workspace", result
    assert (
        victim.call("write_file", {"path": "up/new.txt", "content": "x"}).error.type.value == "path_outside_workspace"
    )
    assert victim.sh(f"cat {victim.outside}/canary.txt 2>&1").output.strip().endswith("No such file or directory")
    victim.assert_intact()


def test_symlinked_directory_is_not_followed(victim):
    """A symlinked directory pointing at /etc is refused for listing, and grep over the workspace does not follow it."""
    os.symlink("/etc", victim.ws / "etcdir")
    victim.seal()
    assert victim.call("list_files", {"path": "etcdir"}).error.type.value == "path_outside_workspace"
    assert victim.call("grep_files", {"pattern": "root", "path": "etcdir"}).error.type.value == "path_outside_workspace"
    assert PASSWD_MARK not in victim.call("grep_files", {"pattern": "root:x"}).output
    victim.assert_intact()


def test_symlink_swapped_between_check_and_use(victim):
    """A file swapped for a symlink to /etc/passwd while reads run (race) never yields /etc/passwd."""
    target = victim.ws / "race.txt"
    target.write_text("harmless\n")
    victim.seal()
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            tmp = victim.ws / ".race.tmp"
            try:
                os.symlink("/etc/passwd", tmp)
                os.replace(tmp, target)
                tmp.write_text("harmless\n")
                os.replace(tmp, target)
            except OSError:
                pass

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        outputs = [victim.call("read_file", {"path": "race.txt"}) for _ in range(300)]
    finally:
        stop.set()
        flipper.join()
    assert not [r for r in outputs if PASSWD_MARK in r.output]
    assert any(r.ok for r in outputs) and any(not r.ok for r in outputs)  # the race really happened
    victim.assert_intact(changed=("race.txt", ".race.tmp"))


def test_hardlink_to_a_file_outside(victim):
    """A hard link from the workspace to a file outside it cannot be made (separate mount)."""
    result = victim.sh(
        "ln /etc/passwd /workspace/pw 2>&1; ln /opt/openagents/sandbox_agent/server.py /workspace/s 2>&1; ls /workspace"
    )
    assert "Invalid cross-device link" in result.output or "Operation not permitted" in result.output
    assert not (victim.ws / "pw").exists() and not (victim.ws / "s").exists()
    victim.assert_intact()


@pytest.mark.parametrize(
    "tool,args",
    [
        ("write_file", {"path": ".git/config", "content": "[core]\n\thooksPath = /tmp\n"}),
        ("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\ncurl evil\n"}),
        ("edit_file", {"path": ".git/config", "old_text": "bare = false", "new_text": "bare = true"}),
        ("write_file", {"path": ".GIT/config", "content": "x"}),
        ("write_file", {"path": "./.git/config", "content": "x"}),
    ],
)
def test_git_directory_mutations(victim, tool, args):
    """Writes and edits under .git (any case) are refused by both layers."""
    assert host_refuses(tool, args) == "path_in_git_dir"
    assert victim.call(tool, args).error.type.value == "path_in_git_dir"
    victim.assert_intact()


def test_symlink_into_git_directory(victim):
    """A symlink that leads into .git cannot be written through, and the shell finds .git read-only."""
    os.symlink(".git/config", victim.ws / "cfg")
    os.symlink(".git", victim.ws / "g")
    victim.seal()
    assert victim.call("write_file", {"path": "cfg", "content": "x"}).error.type.value == "path_in_git_dir"
    assert (
        victim.call("write_file", {"path": "g/hooks/post-checkout", "content": "x"}).error.type.value
        == "path_in_git_dir"
    )
    shell = victim.sh("echo x > .git/config; mkdir -p .git/hooks && echo x > .git/hooks/pre-commit; echo done")
    assert "Read-only file system" in shell.output
    victim.assert_intact()
