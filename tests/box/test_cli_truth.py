"""Issue 24, the CLI's part: copy mode's size guard, session state that cleans up (`discard`,
`sessions prune`, `sessions` with a header and --json), one JSON object on stdout at every exit of
`run --output json`, `--transcript` checked at set-up, `rollback --turn` past the last turn refused,
`transcript show ID`.

Real CLI subprocesses (this checkout's code: PYTHONPATH is set to it), real sandboxes where a
session runs, each test with its own XDG_STATE_HOME and XDG_CONFIG_HOME.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import make_workspace

OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
ROOT = Path(__file__).resolve().parents[2]
ALLOW = '[[rules]]\nkind = "edit"\ndecision = "allow"\n[[rules]]\ntool = "shell"\ndecision = "allow"\n'


def oa(tmp_path: Path, *args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY")
    }
    environment.update(
        XDG_STATE_HOME=str(tmp_path / "state"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        PYTHONPATH=str(ROOT),
        **(env or {}),
    )
    return subprocess.run(
        [OA, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=environment
    )


def sessions_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "openagents-sandbox" / "sessions"


def script(tmp_path: Path, turns: list[dict]) -> Path:
    path = tmp_path / f"model-{time.monotonic_ns()}.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in turns) + "\n")
    return path


def shell(command: str) -> dict:
    return {"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}


def run(tmp_path: Path, ws: Path, turns: list[dict], *extra: str) -> subprocess.CompletedProcess:
    policy = tmp_path / "allow.toml"
    policy.write_text(ALLOW)
    return oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--model",
        f"script:{script(tmp_path, turns)}",
        "--non-interactive",
        "--policy",
        str(policy),
        *extra,
        "task",
    )


def one_json(proc: subprocess.CompletedProcess) -> dict:
    """stdout holds exactly one JSON object, on one line."""
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    out = json.loads(lines[0])
    assert isinstance(out, dict)
    return out


def session_id(proc: subprocess.CompletedProcess) -> str:
    return next(line.split()[1] for line in map(str.strip, proc.stderr.splitlines()) if line.startswith("session: "))


def many_empty_files(root: Path, n: int) -> None:
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    try:
        for i in range(n):
            os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


# --- item 3: the size guard --------------------------------------------------------------------


def test_a_201000_entry_workspace_is_refused_in_seconds_before_anything_is_copied(tmp_path):
    ws = tmp_path / "big"
    many_empty_files(ws, 201_000)
    started = time.monotonic()
    proc = oa(
        tmp_path, "run", "--workspace", str(ws), "--workspace-mode", "copy", "--model", "script:/dev/null", "task"
    )
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert took < 20, f"the guard took {took:.1f} s"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "over 200,000 entries" in lines[0] and "200,001 entries" in lines[0] and "--copy-max-entries" in lines[0], (
        lines[0]
    )
    assert not sessions_dir(tmp_path).exists() or not any(sessions_dir(tmp_path).iterdir()), (
        "a session (or its copy) was made"
    )
    # the same with --output json: one object, typed
    proc = oa(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "copy",
        "--model",
        "script:/dev/null",
        "--output",
        "json",
        "task",
    )
    out = one_json(proc)
    assert proc.returncode == 2 and out["exit_code"] == 2 and out["status"] == "setup_error"
    assert out["error"]["type"] == "resource_exhausted" and "--copy-max-entries" in out["error"]["message"]


def test_the_byte_limit_names_its_flag_and_the_flag_and_config_key_raise_it(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"blob.bin": os.urandom(3 << 20), "a.txt": "a\n"})
    proc = oa(
        tmp_path,
        "exec",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "copy",
        "--copy-max-bytes",
        "1m",
        "read_file",
        '{"path": "a.txt"}',
    )
    assert proc.returncode == 2 and "over 1.0 MiB of data" in proc.stderr and "--copy-max-bytes" in proc.stderr, (
        proc.stderr
    )
    said = json.loads(proc.stdout)  # exec's one JSON result, for a set-up error too
    assert (
        said["ok"] is False
        and said["error"]["type"] == "resource_exhausted"
        and "--copy-max-bytes" in said["error"]["message"]
    )
    assert not sessions_dir(tmp_path).exists()
    proc = oa(
        tmp_path,
        "exec",
        "--workspace",
        str(ws),
        "--workspace-mode",
        "copy",
        "--copy-max-bytes",
        "8m",
        "read_file",
        '{"path": "a.txt"}',
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["output"] == "a\n", proc.stderr
    config = tmp_path / "config" / "openagents-sandbox" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("copy_max_entries = 1\n")
    proc = oa(tmp_path, "exec", "--workspace", str(ws), "--workspace-mode", "copy", "read_file", '{"path": "a.txt"}')
    assert proc.returncode == 2 and "over 1 entries" in proc.stderr, proc.stderr


# --- item 5: one JSON object at every exit --------------------------------------------------------


def test_set_up_errors_print_one_typed_json_object_with_output_json(tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    bad_policy = tmp_path / "bad.toml"
    bad_policy.write_text('[[rules]]\nkind = "edt"\ndecision = "allow"\n')
    existing = tmp_path / "old.jsonl"
    existing.write_text('{"seq": 1}\n')
    cases = {
        "docker_unavailable": (["--workspace", str(ws)], {"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"}),
        "config_invalid": (["--workspace", str(ws), "--policy", str(bad_policy)], None),
        "invalid_arguments": (["--workspace", str(tmp_path / "nowhere")], None),
        "not_a_directory": (["--workspace", str(ws), "--transcript", str(existing / "t.jsonl")], None),
        "io_error": (["--workspace", str(ws), "--transcript", "/proc/oa-t.jsonl"], None),
    }
    for expected, (args, env) in cases.items():
        proc = oa(tmp_path, "run", "--model", "script:/dev/null", "--output", "json", *args, "task", env=env)
        out = one_json(proc)
        assert proc.returncode == 2 and out["exit_code"] == 2 and out["status"] == "setup_error", (
            expected,
            proc.stdout,
            proc.stderr,
        )
        assert out["error"]["type"] == expected and out["error"]["message"], (expected, out)
        assert "Traceback" not in proc.stderr, proc.stderr
    # an existing transcript is refused, never appended to
    proc = oa(
        tmp_path, "run", "--workspace", str(ws), "--model", "script:/dev/null", "--transcript", str(existing), "task"
    )
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "never appended to" in proc.stderr and existing.read_text() == '{"seq": 1}\n'


@pytest.mark.docker
def test_run_apply_reports_what_it_applied_and_left_out_as_fields(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    proc = run(
        tmp_path,
        ws,
        [shell("echo changed > a.txt; ln -s /etc/passwd pw"), {"text": "done"}],
        "--workspace-mode",
        "copy",
        "--apply",
        "--output",
        "json",
    )
    out = one_json(proc)
    assert proc.returncode == 0 and out["exit_code"] == 0 and out["status"] == "finished" and out["error"] is None, (
        proc.stderr
    )
    assert out["applied"] == ["a.txt"] and [lo["path"] for lo in out["left_out"]] == ["pw"] and out["conflicts"] == []
    assert (ws / "a.txt").read_text() == "changed\n"
    bind = one_json(run(tmp_path, ws, [{"text": "done"}], "--workspace-mode", "bind", "--output", "json"))
    assert bind["applied"] is None and bind["left_out"] is None and bind["conflicts"] is None  # no apply was tried


@pytest.mark.docker
def test_an_apply_conflict_after_run_is_a_typed_stop_in_the_json(sandbox_image, tmp_path):
    """The user edits the real file while the box works on the copy: `run --apply` applies nothing,
    exit 1, and the JSON says why: status stopped, a typed error, the conflicts listed."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    policy = tmp_path / "allow.toml"
    policy.write_text(ALLOW)
    turns = [
        shell("echo box > a.txt; i=0; while [ ! -e go-on ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"),
        {"text": "done"},
    ]
    environment = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [
            OA,
            "run",
            "--workspace",
            str(ws),
            "--model",
            f"script:{script(tmp_path, turns)}",
            "--non-interactive",
            "--policy",
            str(policy),
            "--workspace-mode",
            "copy",
            "--apply",
            "--output",
            "json",
            "task",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        deadline = time.monotonic() + 120
        copies: list[Path] = []
        while not copies and time.monotonic() < deadline:
            copies = (
                [c for c in sessions_dir(tmp_path).glob("*/copy") if (c / "a.txt").exists()]
                if sessions_dir(tmp_path).exists()
                else []
            )
            time.sleep(0.05)
        assert copies, "no copy was made"
        time.sleep(0.05)
        (ws / "a.txt").write_text("the user's own edit\n")
        (copies[0] / "go-on").write_text("")
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    out = json.loads(stdout)
    assert out["exit_code"] == 1 and out["status"] == "stopped" and out["session_status"] == "finished"
    assert out["error"]["type"] == "stale_content" and "apply conflict" in out["reason"]
    assert [c["path"] for c in out["conflicts"]] == ["a.txt"] and out["applied"] == []
    assert (ws / "a.txt").read_text() == "the user's own edit\n" and not (ws / "go-on").exists()


# --- item 4: session state that cleans up -------------------------------------------------------


def du(path: Path) -> int:
    return sum(os.lstat(p).st_blocks * 512 for p in path.rglob("*")) + os.lstat(path).st_blocks * 512


@pytest.mark.docker
def test_discard_leaves_only_the_record_marked_discarded(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n", "d/b.txt": "b\n" * 1000})
    turns = [
        shell("echo one > a.txt; head -c 2000000 /dev/urandom > blob; mkfifo pipe"),
        shell("echo two > a.txt; rm blob"),
        {"text": "done"},
    ]
    proc = run(tmp_path, ws, turns, "--workspace-mode", "copy")
    assert proc.returncode == 0, proc.stderr
    sid = session_id(proc)
    state = sessions_dir(tmp_path) / sid
    assert {"copy", "manifest.json", "checkpoints.git", "transcript.jsonl", "session.json"} <= set(os.listdir(state))
    before = du(state)
    assert oa(tmp_path, "transcript", "show", sid).returncode == 0
    done = oa(tmp_path, "discard", sid)
    assert done.returncode == 0, done.stderr
    assert os.listdir(state) == ["session.json"], os.listdir(state)
    after = du(state)
    assert after <= 8192 < before, (before, after)
    record = json.loads((state / "session.json").read_text())
    assert record["discarded"] is True and record["transcript"] is None
    listing = oa(tmp_path, "sessions").stdout.splitlines()
    assert listing[0].startswith("ID ") and listing[1].startswith(sid) and "(discarded)" in listing[1]
    gone = oa(tmp_path, "transcript", "show", sid)
    assert gone.returncode == 2 and "discarded" in gone.stderr
    again = oa(tmp_path, "discard", sid)
    assert again.returncode == 2 and "was discarded" in again.stderr
    assert (ws / "a.txt").read_text() == "a\n"


@pytest.mark.docker
def test_sessions_lists_yours_under_a_header_or_as_json_and_prune_keeps_unapplied_copies(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})

    def make(mode: str) -> str:
        before = set(os.listdir(sessions_dir(tmp_path))) if sessions_dir(tmp_path).exists() else set()
        proc = oa(
            tmp_path,
            "exec",
            "--workspace",
            str(ws),
            "--workspace-mode",
            mode,
            "write_file",
            '{"path": "n.txt", "content": "x"}',
        )
        assert proc.returncode == 0, proc.stderr
        (made,) = set(os.listdir(sessions_dir(tmp_path))) - before
        return made

    bind = make("bind")
    (ws / "n.txt").unlink()
    unapplied, applied, discarded = make("copy"), make("copy"), make("copy")
    assert oa(tmp_path, "apply", applied).returncode == 0
    assert oa(tmp_path, "discard", discarded).returncode == 0
    (ws / "n.txt").unlink()
    other = make("bind")
    record = sessions_dir(tmp_path) / other / "session.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "host_uid": os.getuid() + 4242}))
    for path in (record.parent, record):  # another user's: whose a record is, is its owner on disk (issue 41)
        os.chown(path, os.getuid() + 4242, os.getgid())

    listing = oa(tmp_path, "sessions")
    assert listing.returncode == 0 and listing.stdout.splitlines()[0].split()[:3] == ["ID", "CREATED", "MODE"]
    shown = [line.split()[0] for line in listing.stdout.splitlines()[1:]]
    assert sorted(shown) == sorted([bind, unapplied, applied, discarded]), "another user's session was listed"
    everyone = json.loads(oa(tmp_path, "sessions", "--json", "--all-users").stdout)
    assert {r["id"] for r in everyone} == {bind, unapplied, applied, discarded, other}
    assert {r["id"]: r["shown_status"] for r in everyone}[applied] == "finished (applied)"

    assert oa(tmp_path, "sessions", "prune").stdout.startswith("removed 0 sessions")  # all younger than 7 days
    pruned = oa(tmp_path, "sessions", "prune", "--older-than", "0")
    assert pruned.returncode == 0 and "removed 3 sessions" in pruned.stdout and unapplied in pruned.stdout, (
        pruned.stdout + pruned.stderr
    )
    assert sorted(os.listdir(sessions_dir(tmp_path))) == sorted([unapplied, other]), (
        "prune removed an unapplied copy or another user's"
    )
    pruned = oa(tmp_path, "sessions", "prune", "--older-than", "0s", "--all")
    assert "removed 1 session " in pruned.stdout and os.listdir(sessions_dir(tmp_path)) == [other]
    assert oa(tmp_path, "sessions", "prune", "--older-than", "soon").returncode == 2


# --- item 7: rollback past the last turn, transcript show ID --------------------------------------


@pytest.mark.docker
def test_rollback_past_the_last_turn_is_refused_and_transcript_show_takes_an_id(sandbox_image, tmp_path):
    ws = make_workspace(tmp_path / "ws", {"a.txt": "one\n"})
    proc = run(tmp_path, ws, [shell("echo two > a.txt"), shell("true"), {"text": "done"}], "--workspace-mode", "bind")
    assert proc.returncode == 0, proc.stderr
    sid = session_id(proc)
    past = oa(tmp_path, "rollback", sid, "--turn", "4")
    assert past.returncode == 2 and "ran 3 turns" in past.stderr and "no turn 4" in past.stderr, past.stderr
    assert (ws / "a.txt").read_text() == "two\n"
    last = oa(tmp_path, "rollback", sid, "--turn", "3")  # a turn that changed nothing: the state after turn 1 holds
    assert last.returncode == 0, last.stderr
    assert oa(tmp_path, "rollback", sid, "--turn", "0").returncode == 0 and (ws / "a.txt").read_text() == "one\n"
    by_id = oa(tmp_path, "transcript", "show", sid)
    by_path = oa(tmp_path, "transcript", "show", str(sessions_dir(tmp_path) / sid / "transcript.jsonl"))
    assert by_id.returncode == 0 and by_id.stdout == by_path.stdout and "echo two" in by_id.stdout
    nothing = oa(tmp_path, "transcript", "show", "no-such-thing")
    assert nothing.returncode == 2 and "not a session id" in nothing.stderr
