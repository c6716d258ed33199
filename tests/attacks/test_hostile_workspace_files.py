"""Issue 10, finding 6: the host reads WORKSPACE/.openagents/policy.*, which the box may have written.

Each scenario plants what a hostile box could plant (a YAML bomb, a symlink to a host secret, a
FIFO, a sparse giant, the nastiest 64 KiB parser inputs) in a real workspace on disk and shows the
host refuses it at once, typed, without following it, blocking on it, reading it or quoting it.
The end-to-end ones go through a real `oa-sandbox` process, and ACP through a real server with two
sessions, one poisoned.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.boxfs import lstat_workspace, read_workspace_file
from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.policy.ladder import POLICY_CAP, load_workspace_policy
from orchestrator.policy.load import load_session_policy
from orchestrator.policy.safeparse import PARSE_SECONDS, Refused, parse_data_bounded
from tests.helpers import make_workspace

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
MARKER = "HOST-SECRET-MARKER-5f3a"
# Nine levels of nine: 9**9 (387 million) strings once expanded, from a few hundred bytes.
ALIAS_BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{b}: &{b} [*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a},*{a}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
FAST = PARSE_SECONDS + 2.0  # the hard bound plus a child's start on a busy 2-core machine


def planted(tmp_path: Path, name: str = "policy.yaml", content: str | bytes | None = None) -> Path:
    """A workspace whose .openagents/NAME holds `content` (None: the caller plants it)."""
    ws = make_workspace(tmp_path / "ws", {"README.md": "# victim\n"})
    (ws / ".openagents").mkdir()
    if content is not None:
        path = ws / ".openagents" / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return ws


def host_secret(tmp_path: Path) -> Path:
    """A host file outside the workspace whose content must never surface."""
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.toml"
    secret.write_text(f'{MARKER} = "{MARKER}"\n[[rules]]\nid = "{MARKER}"\ndecision = "{MARKER}"\n')
    return secret


def refused(ws: Path, kind: ErrorType, timeout: float = FAST) -> OpenAgentsError:
    """load_session_policy must raise `kind` within `timeout`, run in a thread so a block fails the test
    instead of hanging it."""
    box: dict = {}

    def load() -> None:
        try:
            box["result"] = load_session_policy(ws, [])
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            box["error"] = err

    thread = threading.Thread(target=load, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"loading the workspace policy blocked for over {timeout} s"
    assert time.monotonic() - started < timeout
    err = box.get("error")
    assert isinstance(err, OpenAgentsError), f"expected a typed refusal, got {box}"
    assert err.type == kind, err.message
    assert MARKER not in err.message and len(err.message.splitlines()) == 1
    return err


def run_cli(ws: Path, tmp_path: Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "s.jsonl"
    script.write_text('{"text": "done"}\n')
    started = time.monotonic()
    proc = subprocess.run(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script}",
            "--non-interactive",
            "--transcript",
            str(tmp_path / "t.jsonl"),
            "task",
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return proc, time.monotonic() - started


def test_yaml_alias_bomb_is_refused_fast(tmp_path):
    """A 600-byte YAML alias bomb as the workspace policy is refused before any expansion, in milliseconds."""
    assert len(ALIAS_BOMB) < 700
    ws = planted(tmp_path, "policy.yaml", ALIAS_BOMB)
    err = refused(ws, ErrorType.CONFIG_INVALID)
    assert "aliases" in err.message and ".openagents/policy.yaml" in err.message


def test_yaml_alias_bomb_does_not_hang_oa_sandbox_run(tmp_path):
    """`oa-sandbox run` on a workspace holding the alias bomb ends at once with a typed set-up error."""
    ws = planted(tmp_path, "policy.yml", ALIAS_BOMB)
    proc, took = run_cli(ws, tmp_path)
    assert proc.returncode == 2 and took < 30
    assert "config_invalid" in proc.stderr and "aliases" in proc.stderr and "lol" not in proc.stderr + proc.stdout


def test_policy_symlinked_to_a_host_file_is_refused_and_never_read(tmp_path):
    """.openagents/policy.toml as a symlink to a host file: refused unread, its content never shown."""
    secret = host_secret(tmp_path)
    ws = planted(tmp_path)
    (ws / ".openagents" / "policy.toml").symlink_to(secret)
    err = refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE)
    assert "symlink" in err.message or "link" in err.message
    proc, _ = run_cli(ws, tmp_path)
    assert proc.returncode == 2 and "unsafe_workspace_file" in proc.stderr
    assert MARKER not in proc.stdout + proc.stderr


def test_symlinked_openagents_directory_is_refused(tmp_path):
    """.openagents itself a symlink to a host directory holding a policy: the link is never followed."""
    secret = host_secret(tmp_path)
    (secret.parent / "policy.toml").write_text(secret.read_text())
    ws = make_workspace(tmp_path / "ws", {"README.md": "# victim\n"})
    (ws / ".openagents").symlink_to(secret.parent, target_is_directory=True)
    err = refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE)
    assert "'.openagents' is a symlink" in err.message
    proc, _ = run_cli(ws, tmp_path)
    assert proc.returncode == 2 and "unsafe_workspace_file" in proc.stderr and MARKER not in proc.stdout + proc.stderr


def test_symlink_deeper_in_a_path_is_refused(tmp_path):
    """A symlinked directory in the middle of any workspace path (not just .openagents) is refused by boxfs."""
    secret = host_secret(tmp_path)
    ws = make_workspace(tmp_path / "ws", {"a/b/real.txt": "fine\n"})
    (ws / "a" / "link").symlink_to(secret.parent, target_is_directory=True)
    assert read_workspace_file(ws, "a/b/real.txt", 100) == b"fine\n"
    for rel in ("a/link/secret.toml", "a/link"):
        with pytest.raises(OpenAgentsError) as info:
            read_workspace_file(ws, rel, POLICY_CAP)
        assert info.value.type == ErrorType.UNSAFE_WORKSPACE_FILE and MARKER not in info.value.message
    with pytest.raises(OpenAgentsError) as info:
        lstat_workspace(ws, "a/link/secret.toml")
    assert info.value.type == ErrorType.UNSAFE_WORKSPACE_FILE
    for rel in ("../outside/secret.toml", "a/../../outside/secret.toml", "/etc/passwd", "a//b", "a/./b", "a\0b"):
        with pytest.raises(OpenAgentsError) as info:
            read_workspace_file(ws, rel, POLICY_CAP)
        assert info.value.type == ErrorType.PATH_INVALID


def test_fifo_policy_does_not_block(tmp_path):
    """A FIFO named policy.toml (no writer will ever come) is
    refused at once, in-process and through `oa-sandbox run`."""
    ws = planted(tmp_path)
    os.mkfifo(ws / ".openagents" / "policy.toml")
    err = refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE, timeout=5)
    assert "FIFO" in err.message
    proc, took = run_cli(ws, tmp_path, timeout=30)
    assert proc.returncode == 2 and "unsafe_workspace_file" in proc.stderr and took < 15


def test_socket_policy_is_refused(tmp_path):
    """A listening Unix socket named policy.yaml is refused without connecting or blocking."""
    ws = planted(tmp_path)
    here = os.getcwd()
    os.chdir(ws / ".openagents")  # a short relative name: tmp paths can pass the 108-byte limit
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind("policy.yaml")
        server.listen(1)
    finally:
        os.chdir(here)
    try:
        assert "socket" in refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE, timeout=5).message
    finally:
        server.close()


def test_directory_named_policy_toml_is_refused(tmp_path):
    """A directory named policy.toml is a typed refusal, not a crash or a silent skip."""
    ws = planted(tmp_path)
    (ws / ".openagents" / "policy.toml").mkdir()
    assert "directory" in refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE).message


def test_sparse_100_mb_policy_is_refused_by_size_without_reading_it(tmp_path):
    """A sparse 100 MB policy.toml is refused by its size; the host reads none of it (read syscalls counted)."""
    ws = planted(tmp_path)
    subprocess.run(["truncate", "-s", "100M", str(ws / ".openagents" / "policy.toml")], check=True)

    def read_bytes() -> int:
        return int(
            next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[
                1
            ]
        )

    before = read_bytes()
    err = refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE)
    assert read_bytes() - before < 1024 * 1024, "the host read the giant file"
    assert "104857600 bytes" in err.message and str(POLICY_CAP) in err.message


def test_policy_just_over_the_cap_is_refused(tmp_path):
    """A policy of cap+1 real bytes is refused; one of exactly the cap is read (the bound is the bound)."""
    ws = planted(tmp_path, "policy.toml", "#" * POLICY_CAP + "\n")
    refused(ws, ErrorType.UNSAFE_WORKSPACE_FILE)
    (ws / ".openagents" / "policy.toml").write_text("#" * (POLICY_CAP - 1) + "\n")
    assert load_session_policy(ws, []).rules == ()


def _fill(head: str, unit: str, tail: str = "") -> bytes:
    return (head + unit * ((POLICY_CAP - len(head) - len(tail)) // len(unit)) + tail).encode()


NASTY = {
    "policy.toml": {
        "deep arrays": _fill("a = ", "["),
        "deep inline tables": _fill("a = ", "{b="),
        "30000-part dotted key": _fill("", "a.", "a=1"),
        "30000-part table header": _fill("[", "a.", "a]"),
        "6000 keys": "".join(f"k{i} = {i}\n" for i in range(6000)).encode()[:POLICY_CAP],
        "8000 tables": "".join(f"[t{i}]\n" for i in range(8000)).encode()[:POLICY_CAP],
        "one 64 KiB string": _fill('x = "', "x", '"'),
        "64 KiB of escapes": _fill('x = "', "\\u0041", '"'),
        "a 65000-digit integer": _fill("x = ", "9"),
        "1500 rules": _fill("", '[[rules]]\ntool="shell"\ndecision="ask"\n'),
    },
    "policy.yaml": {
        "deep flow sequences": _fill("", "["),
        "deep flow mappings": _fill("", "{a: "),
        "deep block mappings": "".join(" " * i + "a:\n" for i in range(300)).encode(),
        "6000 keys": "".join(f"k{i}: {i}\n" for i in range(6000)).encode()[:POLICY_CAP],
        "32000 flow items": _fill("x: [", "1,", "1]"),
        "sexagesimal integer": _fill("x: 1", ":59"),
        "one 64 KiB plain scalar with spaces": _fill("x: a", " b"),
        "a 65000-digit integer": _fill("x: ", "9"),
        "8000 tags": _fill("x: [", "!!str a,", "]"),
        "64 KiB of !!binary": _fill("x: !!binary ", "QUFB"),
        "2000 rules": _fill("rules:\n", "  - {tool: shell, decision: ask}\n"),
    },
}


@pytest.mark.parametrize("name,label", [(n, k) for n, cases in NASTY.items() for k in cases])
def test_nastiest_64_kib_inputs_are_bounded_in_time(tmp_path, name, label):
    """The worst 64 KiB TOML and YAML we could build (deep nesting, many keys,
    long strings and numbers) each end fast, loaded or typed-refused."""
    raw = NASTY[name][label]
    assert len(raw) <= POLICY_CAP
    ws = planted(tmp_path, name, raw)
    started = time.monotonic()
    try:
        policy = load_workspace_policy(ws, f".openagents/{name}")
    except OpenAgentsError as err:
        assert err.type == ErrorType.CONFIG_INVALID and len(err.message.splitlines()) == 1 and len(err.message) < 400
    else:
        assert all(rule.decision.value == "ask" for rule in policy.rules)
    assert time.monotonic() - started < FAST, f"{label} took {time.monotonic() - started:.2f} s"


def test_a_parse_over_its_time_bound_is_killed(tmp_path):
    """A parse that outlasts its bound is killed (a real child process), not waited for."""
    slow = _fill("", "a.", "a=1")  # ~1.5 s of tomllib on this machine
    started = time.monotonic()
    with pytest.raises(Refused) as info:
        parse_data_bounded(slow, ".toml", seconds=0.3)
    assert "longer than 0.3 s" in str(info.value) and time.monotonic() - started < 1.5


def test_a_parse_over_its_memory_bound_is_named(tmp_path):
    """Given time enough, the dotted-key bomb runs the child out of
    memory: the refusal names that bound, not an unexplained exit code."""
    with pytest.raises(Refused) as info:
        parse_data_bounded(_fill("", "a.", "a=1"), ".toml", seconds=60)
    assert "MiB to parse" in str(info.value)


@pytest.mark.parametrize(
    "name,text",
    [
        ("policy.toml", f'[[rules]]\nid = "{MARKER}"\ndecision = "{MARKER}"\n'),
        ("policy.toml", f"{MARKER} = 1\n{MARKER} = 2\n"),
        ("policy.toml", f'[[rules]]\ntool = "shell"\ndecision = "ask"\n{MARKER} = "{MARKER}"\n'),
        ("policy.toml", f'x = "{MARKER}\n'),
        ("policy.yaml", f"rules:\n  - {{tool: shell, decision: {MARKER}}}\n"),
        ("policy.yaml", f"rules: [{MARKER}: {MARKER}\n"),
        ("policy.yaml", f"{MARKER}:\n  - {MARKER}\n   - x\n"),
        ("policy.yaml", f"rules:\n  - {{id: {MARKER}, tool: shell, decision: allow}}\n"),
        ("policy.yaml", f"{MARKER}\n"),
    ],
)
def test_errors_name_the_file_and_problem_but_never_echo_content(tmp_path, name, text):
    """Invalid policies (bad values, unknown keys, syntax errors,
    a loosening rule) get one line that never quotes the file."""
    ws = planted(tmp_path, name, text)
    err = refused(ws, ErrorType.CONFIG_INVALID)
    assert f".openagents/{name}" in err.message and err.message.count(":") >= 1


def test_a_sound_workspace_policy_still_tightens(tmp_path):
    """The guard refuses what is planted, not what is sound: a plain deny rule still loads and applies."""
    ws = planted(tmp_path, "policy.yaml", "rules:\n  - {id: no-shell, tool: shell, decision: deny}\n")
    rules = load_session_policy(ws, []).rules
    assert [(r.id, r.decision.value, r.tier.name) for r in rules] == [("no-shell", "deny", "WORKSPACE")]


@pytest.mark.docker
def test_one_poisoned_workspace_does_not_wedge_the_acp_server(sandbox_image, tmp_path):
    """In one ACP server, sessions on a slow-to-parse policy, a FIFO policy and an alias bomb fail
    typed while a normal session completes its prompt and initialize is answered meanwhile."""
    from tests.helpers.acp import Editor, updates

    slow = make_workspace(tmp_path / "slow", {".openagents/policy.toml": _fill("", "a.", "a=1").decode()})
    fifo = make_workspace(tmp_path / "fifo", {"README.md": "x\n"})
    (fifo / ".openagents").mkdir()
    os.mkfifo(fifo / ".openagents" / "policy.toml")
    bomb = make_workspace(tmp_path / "bomb", {".openagents/policy.yaml": ALIAS_BOMB})
    good = make_workspace(tmp_path / "good", {"hello.txt": "hello\n"})
    script = tmp_path / "s.jsonl"
    script.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "hello.txt"}}]},
                {"text": "read it"},
            ]
        )
    )
    editor = Editor("--model", f"script:{script}", "--transcript-dir", str(tmp_path / "t"))
    try:
        editor.call("initialize", {"protocolVersion": 1})
        editor._ids = 100
        for rid, ws in ((101, slow), (102, fifo), (103, bomb), (104, good)):
            editor.send({"id": rid, "method": "session/new", "params": {"cwd": str(ws), "mcpServers": []}})
        started = time.monotonic()
        editor.send({"id": 105, "method": "initialize", "params": {"protocolVersion": 1}})
        answers: dict = {}
        answered_at: dict = {}
        while len(answers) < 5:  # in whatever order they come; set-ups send no notifications
            msg = editor.inbox.get(timeout=120)
            assert "method" not in msg, msg
            answers[msg["id"]], answered_at[msg["id"]] = msg, time.monotonic()
        assert answers[105]["result"]["protocolVersion"] == 1
        assert answered_at[105] < answered_at[101], "initialize waited for a slow session set-up"
        assert answered_at[105] - started < 5
        slow_error = answers[101]["error"]
        # A 30,000-part dotted key runs into the parse's time or
        # memory bound, whichever the machine's speed reaches first.
        assert slow_error["data"]["type"] == "config_invalid" and (
            "longer than" in slow_error["message"] or "MiB to parse" in slow_error["message"]
        ), slow_error
        assert (
            answers[102]["error"]["data"]["type"] == "unsafe_workspace_file"
            and "FIFO" in answers[102]["error"]["message"]
        )
        assert (
            answers[103]["error"]["data"]["type"] == "config_invalid" and "aliases" in answers[103]["error"]["message"]
        )
        session_id = answers[104]["result"]["sessionId"]
        result = editor.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "read"}]})
        assert result["result"]["stopReason"] == "end_turn"
        assert (
            editor.call("session/prompt", {"sessionId": "sess_unknown", "prompt": [{"type": "text", "text": "x"}]})[
                "error"
            ]["code"]
            < 0
        )
    finally:
        editor.close()
    final = [u for u in updates(editor, "tool_call_update") if u.get("status") == "completed"]
    assert [u["toolCallId"] for u in final] == ["r1"] and "hello" in final[0]["content"][0]["content"]["text"]
