"""Attacks on the agent itself: kill it, replace it, talk over it. The host notices, reports a
typed error, brings up a fresh agent on the same workspace, and the session goes on."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker


def test_kill_9_of_pid_1(victim):
    """`kill -9 1` either does nothing (the kernel protects PID 1) or is reported as agent_lost; the next call works."""
    first = victim.box.container.id
    result = victim.sh("kill -9 1; echo after")
    assert (result.ok and result.output == "after\n") or result.error.type.value == "agent_lost"
    assert victim.call("read_file", {"path": "README.md"}).output == "# victim\n"
    assert victim.box.container.id == first or victim.box.restarts == 1
    victim.assert_intact()


def test_kill_of_the_agent_is_agent_lost(victim):
    """Killing the agent (SIGTERM to PID 1) is reported as agent_lost by the host, which restarts it."""
    first = victim.box.container.id
    result = victim.sh("kill -TERM 1; sleep 5")
    assert not result.ok and result.error.type.value == "agent_lost" and result.executor.value == "openagents"
    assert victim.box.container.id != first and victim.box.restarts == 1
    victim.assert_intact()


def test_replacing_the_agent_files(victim):
    """A fake agent planted in /tmp (or over the real one) never runs: the code is read-only, -I ignores
    PYTHONPATH, and a restart starts from a clean /tmp."""
    out = victim.sh(
        "mkdir -p /tmp/sandbox_agent && echo 'import os; os.system(\"touch /workspace/pwned\")' "
        "> /tmp/sandbox_agent/__main__.py; cp /tmp/sandbox_agent/__main__.py "
        "/opt/openagents/sandbox_agent/__main__.py 2>&1; echo rc=$?"
    ).output
    assert "rc=1" in out and ("Read-only file system" in out or (victim.gvisor and "Permission denied" in out)), (
        out
    )  # gVisor checks the mode first
    lost = victim.sh("kill 1; sleep 5")
    assert lost.error.type.value == "agent_lost"
    assert victim.sh("ls /tmp").output == ""
    assert not (victim.ws / "pwned").exists()
    victim.assert_intact()


def test_modules_planted_before_a_tools_first_call_are_never_imported(victim):
    """The agent imports a tool's module at the tool's first call or in its warm-up after its first
    answer (issue 26), and standard modules when a path needs them (difflib for a failed edit): after
    commands may have run. Modules planted wherever a command can write (the workspace, the agent's working directory;
    /tmp, its HOME), named as the agent's package and the standard modules those tools import, are
    never loaded: the agent's import path is the read-only image only (-I, -S, an absolute path)."""
    names = [
        "sandbox_agent",
        "re",
        "difflib",
        "hashlib",
        "mmap",
        "select",
        "fnmatch",
        "codecs",
        "stat",
        "itertools",
        "ctypes",
    ]
    planted = "; ".join(
        f"for d in /workspace /tmp /tmp/sandbox_agent /workspace/sandbox_agent; do mkdir -p $d/{name}; "
        f'printf \'open("/tmp/PWNED-{name}", "w").close()\\n\' | '
        f"tee $d/{name}.py $d/{name}/__init__.py >/dev/null; done"
        for name in names + ["search", "writing", "listing", "globs", "edit_text", "search_child"]
    )
    assert victim.sh(planted + "; ls /tmp | head -3").ok
    assert victim.call("grep_files", {"pattern": "vic+tim", "path": "."}).ok
    assert victim.call("list_files", {"path": "."}).ok
    assert victim.call("write_file", {"path": "new.txt", "content": "one\ntwo\n"}).ok
    assert not victim.call(
        "edit_file", {"path": "new.txt", "old_text": "thre", "new_text": "3"}
    ).ok  # a failed edit loads difflib
    assert victim.call("edit_file", {"path": "new.txt", "old_text": "two", "new_text": "2"}).ok
    assert victim.sh("ls /tmp | grep -c PWNED").output.strip() == "0"
    victim.assert_intact(
        changed=(
            "new.txt",
            "sandbox_agent/",
            *(f"{n}.py" for n in names),
            *(f"{n}/" for n in names),
            *(f"{n}.py" for n in ("search", "writing", "listing", "globs", "edit_text", "search_child")),
            *(f"{n}/" for n in ("search", "writing", "listing", "globs", "edit_text", "search_child")),
        )
    )


def test_garbage_on_the_agents_stdout(victim):
    """A command cannot write to the agent's stdout under runc (/proc/1/fd is closed to it: the agent is
    not dumpable). gVisor does not apply that check to /proc/1/fd, so there the garbage reaches the host,
    which answers with a typed protocol_error and a fresh box: the channel stays sound either way."""
    result = victim.sh(
        'echo \'{"v":1,"id":999,"ok":true}\' > /proc/1/fd/1 2>&1; echo garbage > /proc/1/fd/1 2>&1; echo rc=$?'
    )
    if victim.gvisor:
        assert not result.ok and result.error.type.value == "protocol_error" and result.error.recoverable, result
        assert victim.box.restarts == 1
    else:
        assert "Permission denied" in result.output
    assert victim.call("read_file", {"path": "README.md"}).ok
    victim.assert_intact()


def test_a_catastrophic_regex_ends_at_the_host_deadline_and_the_box_stays(victim_factory):
    """A catastrophic regex no longer wedges the agent (it runs in a child of its own): the call ends,
    typed, at the host's deadline, the child is killed, and the same agent answers the next call."""
    victim = victim_factory(call_deadline_s=2)
    (victim.ws / "r.txt").write_text("a" * 40 + "!\n")
    victim.seal()
    result = victim.call("grep_files", {"pattern": "^(a+)+$"})
    assert result.error.type.value == "timeout" and result.executor.value == "openagents"
    assert victim.call("read_file", {"path": "README.md"}).ok
    assert victim.box.restarts == 0
    victim.assert_intact()
