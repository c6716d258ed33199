"""Every bound and rule of shared/spec/tools.md, through a real container."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

from orchestrator.protocol import BoxCall
from tests.helpers import chown_tree, live_processes, make_workspace

pytestmark = pytest.mark.docker


def test_read_file_caps_at_48_kib_and_points_at_the_next_line(open_sandbox, tmp_path):
    line = "x" * 63 + "\n"  # 64 bytes: 768 lines are exactly 48 KiB
    ws = make_workspace(tmp_path / "ws", {"big.txt": line * 2000})
    box = open_sandbox(ws)
    result = box.call("read_file", {"path": "big.txt"})
    assert result.ok
    assert len(result.output.encode()) == 48 * 1024
    assert result.meta["last_line"] == 768 and result.meta["next_offset"] == 769
    assert "read on from line 769" in result.note
    nxt = box.call("read_file", {"path": "big.txt", "offset": 769, "limit": 10})
    assert nxt.ok and nxt.output == line * 10 and nxt.meta["first_line"] == 769


def test_read_file_offset_limit_and_hash(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "".join(f"line {i}\n" for i in range(1, 11))})
    result = open_sandbox(ws).call("read_file", {"path": "a.txt", "offset": 3, "limit": 2})
    assert result.output == "line 3\nline 4\n"
    assert result.meta["sha256"] == hashlib.sha256((ws / "a.txt").read_bytes()).hexdigest()
    assert result.meta["next_offset"] == 5


def test_list_files_stops_at_500_entries(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {f"f{i:03}.txt": "" for i in range(501)})
    result = open_sandbox(ws).call("list_files", {"path": "."})
    entries = [e for e in result.output.splitlines() if not e.startswith("[")]
    assert len(entries) == 500 and result.meta["truncated"] is True
    assert "stops at 500 entries" in result.output


def test_list_files_skips_vcs_and_build_directories(open_sandbox, tmp_path):
    files = {f"{d}/inner.txt": "" for d in (".git", "node_modules", "target", "dist")}
    files["src/main.py"] = ""
    ws = make_workspace(tmp_path / "ws", files)
    result = open_sandbox(ws).call("list_files", {})
    assert result.output.splitlines() == ["src/", "src/main.py"]


def test_grep_stops_at_200_matching_lines(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"m.txt": "match\n" * 201, "node_modules/x.txt": "match\n"})
    result = open_sandbox(ws).call("grep_files", {"pattern": "match"})
    lines = [line for line in result.output.splitlines() if line.startswith("m.txt:")]
    assert len(lines) == 200 and result.meta["truncated"] is True
    assert "node_modules" not in result.output


def test_a_catastrophic_regex_is_a_typed_timeout_and_the_box_stays(open_sandbox, tmp_path):
    """Issue 23, class 9. Roo-Code src/services/ripgrep/index.ts and goose
    crates/goose-mcp/src/developer/tests/search_test.rs bound a search's time (ripgrep's own engine
    cannot backtrack). Python's re can: `(a+)+$` on 40 a's and a '!' runs for hours. The search's own
    deadline (limits.GREP_TIMEOUT_S) kills it and answers `timeout` with what it found before, well
    inside the host's 120 s deadline, so the box is not replaced; the agent answers at once after."""
    from sandbox_agent import limits

    ws = make_workspace(
        tmp_path / "ws", {"a_first.txt": "aaaa\n", "b_evil.txt": "a" * 40 + "!\n", "c_after.txt": "aa\n"}
    )
    box = open_sandbox(ws)
    started = time.monotonic()
    result = box.call("grep_files", {"pattern": "(a+)+$"})
    elapsed = time.monotonic() - started
    assert result.error is not None and result.error.type.value == "timeout", result
    assert "b_evil.txt" in result.error.message and "backtrack" in result.error.message
    # what was measured: the one file, its line, the files before it, the CPU that went into it
    assert "from line 1 on" in result.error.message and "after 1 other file(s)" in result.error.message
    assert result.meta["files_searched"] == 2 and result.meta["seconds_in_block"] > limits.GREP_TIMEOUT_S / 2
    assert result.output == "a_first.txt:1:aaaa"
    assert limits.GREP_TIMEOUT_S - 1 < elapsed < limits.GREP_TIMEOUT_S + 20
    assert box.restarts == 0
    quick = time.monotonic()
    assert box.call("read_file", {"path": "c_after.txt"}).output == "aa\n"
    assert box.call("grep_files", {"pattern": "a+$", "path": "c_after.txt"}).output == "c_after.txt:1:aa"
    assert time.monotonic() - quick < 5
    assert not [p for p in live_processes(box) if "python" in p and not p.startswith("1 ")], (
        "the search child outlived its call"
    )


def test_grep_invalid_regex_is_typed(sandbox):
    result = sandbox.call("grep_files", {"pattern": "("})
    assert not result.ok and result.error.type.value == "invalid_regex" and result.error.recoverable


def test_edit_keeps_bom_and_crlf(open_sandbox, tmp_path):
    original = b"\xef\xbb\xbfalpha\r\nbeta\r\ngamma\r\n"
    ws = make_workspace(tmp_path / "ws", {"w.txt": original})
    result = open_sandbox(ws).call(
        "edit_file", {"path": "w.txt", "old_text": "beta\ngamma", "new_text": "BETA\ngamma\ndelta"}
    )
    assert result.ok, result
    assert (ws / "w.txt").read_bytes() == b"\xef\xbb\xbfalpha\r\nBETA\r\ngamma\r\ndelta\r\n"


def test_edit_refuses_stale_content(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"s.txt": "one\n"})
    box = open_sandbox(ws)
    seen = box.call("read_file", {"path": "s.txt"}).meta["sha256"]
    (ws / "s.txt").write_text("one\ntwo\n")  # someone else changed it
    result = box.call("edit_file", {"path": "s.txt", "old_text": "one", "new_text": "uno", "expected_sha256": seen})
    assert not result.ok and result.error.type.value == "stale_content"
    assert (ws / "s.txt").read_text() == "one\ntwo\n"


def test_edit_refuses_non_unique_match_unless_asked(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"d.txt": "x = 1\nx = 1\n"})
    box = open_sandbox(ws)
    refused = box.call("edit_file", {"path": "d.txt", "old_text": "x = 1", "new_text": "x = 2"})
    assert refused.error.type.value == "edit_ambiguous" and (ws / "d.txt").read_text() == "x = 1\nx = 1\n"
    done = box.call("edit_file", {"path": "d.txt", "old_text": "x = 1", "new_text": "x = 2", "allow_multiple": True})
    assert done.ok and done.meta["replacements"] == 2 and (ws / "d.txt").read_text() == "x = 2\nx = 2\n"


def test_edit_no_match_is_typed(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"d.txt": "abc\n"})
    result = open_sandbox(ws).call("edit_file", {"path": "d.txt", "old_text": "zzz", "new_text": "y"})
    assert result.error.type.value == "edit_no_match"


def test_write_is_atomic_keeps_mode_and_owner(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"run.sh": "#!/bin/sh\n"})
    os.chmod(ws / "run.sh", 0o755)
    box = open_sandbox(ws)
    result = box.call("write_file", {"path": "run.sh", "content": "#!/bin/sh\necho hi\n"})
    assert result.ok
    st = os.stat(ws / "run.sh")
    assert oct(st.st_mode & 0o777) == "0o755" and st.st_uid == 1000
    # no temp file left behind (and no .git mount point: bind mode makes none, issue 40)
    assert sorted(p.name for p in ws.iterdir()) == ["run.sh"]
    created = box.call("write_file", {"path": "new/dir/f.txt", "content": "x"})
    assert created.ok and (ws / "new/dir/f.txt").read_text() == "x"


@pytest.mark.parametrize(
    "tool,args,kind",
    [
        ("read_file", {"path": "a\x00b"}, "path_invalid"),
        ("read_file", {"path": "/etc/passwd"}, "path_outside_workspace"),
        ("read_file", {"path": "sub/../../x"}, "path_outside_workspace"),
        ("read_file", {"path": "out/passwd"}, "path_outside_workspace"),
        ("write_file", {"path": ".git/config", "content": "x"}, "path_in_git_dir"),
        ("edit_file", {"path": ".git/HEAD", "old_text": "ref", "new_text": "x"}, "path_in_git_dir"),
        ("write_file", {"path": "out/evil", "content": "x"}, "path_outside_workspace"),
    ],
)
def test_path_rules_hold_in_the_agent_alone(open_sandbox, tmp_path, tool, args, kind):
    """These calls skip the host's lexical check (sandbox.call is the raw wire), so the agent's own rules must hold."""
    ws = make_workspace(tmp_path / "ws", {".git/HEAD": "ref: refs/heads/main\n", ".git/config": "[core]\n"})
    os.symlink("/etc", ws / "out")
    chown_tree(ws)
    result = open_sandbox(ws).call(tool, args)
    assert not result.ok and result.error.type.value == kind, result
    assert (ws / ".git/config").read_text() == "[core]\n"


def test_git_dir_is_read_only_even_from_the_shell(open_sandbox, tmp_path):
    ws = make_workspace(tmp_path / "ws", {".git/config": "[core]\n", "a.txt": "a"})
    result = open_sandbox(ws).call("shell", {"command": "echo hacked > .git/config; echo x > .git/new; echo rc=$?"})
    assert "Read-only file system" in result.output
    assert (ws / ".git/config").read_text() == "[core]\n" and not (ws / ".git/new").exists()


def test_shell_has_no_stdin(sandbox):
    started = time.monotonic()
    result = sandbox.call("shell", {"command": "cat; echo done", "timeout": 20})
    assert result.ok and result.output == "done\n"
    assert time.monotonic() - started < 5


def test_shell_timeout_is_clamped_to_240_and_says_so(sandbox):
    result = sandbox.call("shell", {"command": "true", "timeout": 1000})
    assert result.ok and result.meta["clamped"] is True and result.meta["timeout_s"] == 240
    assert "clamped to the 240s ceiling" in result.note
    assert sandbox.deadline_for(BoxCall.named("shell", {"timeout": 1000})) <= 240 + sandbox.config.shell_grace_s


def test_shell_timeout_keeps_earlier_output(sandbox):
    started = time.monotonic()
    result = sandbox.call("shell", {"command": "echo before; sleep 30; echo after", "timeout": 2})
    elapsed = time.monotonic() - started
    assert not result.ok and result.error.type.value == "timeout" and result.error.recoverable
    assert result.output == "before\n"
    assert 1.5 < elapsed < 6


def test_background_and_setsid_children_do_not_survive(sandbox):
    result = sandbox.call(
        "shell", {"command": "sleep 100 & setsid sleep 101 & (setsid sh -c 'sleep 102 &' &); echo started"}
    )
    assert result.ok and result.output == "started\n"
    remaining = live_processes(sandbox)
    assert not [p for p in remaining if "sleep" in p], remaining
    assert remaining == ["1 python3"], remaining


def test_timed_out_daemons_do_not_survive(sandbox):
    result = sandbox.call(
        "shell",
        {
            "command": 'setsid sh -c \'trap "" TERM; while :; do sleep 1; '
            "done' & nohup sleep 200 >/dev/null 2>&1 & sleep 50",
            "timeout": 2,
        },
    )
    assert result.error.type.value == "timeout"
    assert live_processes(sandbox) == ["1 python3"]


def test_host_variables_do_not_reach_the_sandbox(sandbox_image, docker_client, workspace, monkeypatch, runtime):
    from orchestrator.sandbox.docker import DockerSandbox
    from tests.helpers import sandbox_config

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-host-secret-123")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_hostsecret456")
    with DockerSandbox(workspace, sandbox_config(runtime, docker_client), client=docker_client) as box:
        env = box.call("shell", {"command": "env; cat /proc/self/environ | tr '\\0' '\\n'"})
        assert env.ok
        assert "sk-test-host-secret" not in env.output and "ghp_hostsecret" not in env.output
        names = {line.split("=", 1)[0] for line in env.output.splitlines() if "=" in line}
        allowed = {"PATH", "HOME", "LANG", "TERM", "PWD", "SHLVL", "_", "OLDPWD", "HOSTNAME"}
        assert names <= allowed, names  # under Podman too: its container=podman is left out at create


def test_kill_1_is_agent_lost_and_the_next_call_works(sandbox, workspace):
    (workspace / "keep.txt").write_text("kept\n")
    first = sandbox.container.id
    result = sandbox.call("shell", {"command": "kill 1; sleep 5"})
    assert not result.ok and result.error.type.value == "agent_lost" and result.executor.value == "openagents"
    after = sandbox.call("read_file", {"path": "keep.txt"})
    assert after.ok and after.output == "kept\n"
    assert sandbox.container.id != first and sandbox.restarts == 1


def test_host_deadline_holds_when_the_agent_hangs(open_sandbox, tmp_path):
    """A catastrophic regex wedges the agent's thread; the host's own deadline still ends the call."""
    ws = make_workspace(tmp_path / "ws", {"r.txt": "a" * 40 + "!\n"})
    box = open_sandbox(ws, call_deadline_s=2)
    started = time.monotonic()
    result = box.call("grep_files", {"pattern": "^(a+)+$"})
    assert not result.ok and result.error.type.value == "timeout" and result.executor.value == "openagents"
    assert time.monotonic() - started < 15
    assert box.call("read_file", {"path": "r.txt"}).ok


def test_unknown_tool_and_bad_types_are_typed_on_the_wire(sandbox):
    assert sandbox.call("rm_rf", {}).error.type.value == "unknown_tool"
    bad = sandbox.call("read_file", {"path": 7})
    assert bad.error.type.value == "invalid_arguments" and bad.error.recoverable


def _oa(*args, env=None):
    exe = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def test_exec_cli_prints_one_json_object_with_exit_codes(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"hello.txt": "hi\n"})
    ok = _oa("exec", "--workspace", str(ws), "read_file", '{"path": "hello.txt"}')
    assert ok.returncode == 0, ok.stderr
    body = json.loads(ok.stdout)
    assert body["ok"] is True and body["output"] == "hi\n" and body["error"] is None and body["executor"] == "runtime"
    bad = _oa("exec", "--workspace", str(ws), "read_file", '{"path": "../etc/passwd"}')
    assert bad.returncode == 1
    err = json.loads(bad.stdout)["error"]
    assert err == {"type": "path_outside_workspace", "message": err["message"], "recoverable": True}
    no_daemon = _oa(
        "exec",
        "--workspace",
        str(ws),
        "read_file",
        '{"path": "hello.txt"}',
        env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no.sock", "OA_ENGINE": "docker"},
    )
    assert no_daemon.returncode == 2 and "dockerd" in no_daemon.stderr


def test_read_file_edges_one_huge_line_empty_file_and_past_the_end(open_sandbox, tmp_path):
    ws = make_workspace(
        tmp_path / "ws", {"one.txt": "é" * 60_000 + "\nnext\n", "empty.txt": "", "bom.txt": b"\xef\xbb\xbfhi\r\n"}
    )
    box = open_sandbox(ws)
    huge = box.call("read_file", {"path": "one.txt"})
    assert huge.ok and len(huge.output.encode()) <= 48 * 1024 and huge.output == "é" * (48 * 1024 // 2)
    assert huge.meta["next_offset"] == 2 and "longer than" in huge.note
    assert box.call("read_file", {"path": "one.txt", "offset": 2}).output == "next\n"
    empty = box.call("read_file", {"path": "empty.txt"})
    assert empty.ok and empty.output == "" and empty.meta["total_lines"] == 0
    assert box.call("read_file", {"path": "one.txt", "offset": 3}).error.type.value == "invalid_arguments"
    bom = box.call("read_file", {"path": "bom.txt"})
    assert bom.output == "hi\r\n" and bom.meta["sha256"] == hashlib.sha256(b"\xef\xbb\xbfhi\r\n").hexdigest()
