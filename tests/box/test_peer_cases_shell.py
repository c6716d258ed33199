"""What a user of Gemini CLI's shell tool, OpenHands' bash runtime or SWE-ReX's execute expects of
`shell`, restated against our contract (/bin/sh -c in the workspace, no standard input, stdout and
stderr merged in order, exit code reported, capped output with head and tail, nothing survives the
call), through a real container."""

from __future__ import annotations

import pytest

from orchestrator.errors import ErrorType, OpenAgentsError
from orchestrator.tools.args import validate_arguments
from tests.helpers import one_box_per_module

pytestmark = pytest.mark.docker


box, _ = one_box_per_module("peers-shell")


def run(box, command: str, **args):
    return box.call("shell", {"command": command, **args})


@pytest.mark.parametrize(
    "command, output",
    [
        ("echo 'hello world'", "hello world\n"),
        ("echo ''", "\n"),
        ("echo '   leading spaces'", "   leading spaces\n"),
        ("printf 'no newline'", "no newline"),
        ("printf '\\nstarts with a newline'", "\nstarts with a newline"),
        ("echo hi # a trailing comment", "hi\n"),
        ("echo one; echo two && echo three", "one\ntwo\nthree\n"),
        ("\n\n echo test\n\n", "test\n"),
        ("for i in 1 2 3; do\n  echo $i\ndone", "1\n2\n3\n"),
        ("x=0; while [ $x -lt 3 ]; do x=$((x+1)); echo $x; done", "1\n2\n3\n"),
        ("cat <<'EOF'\nliteral $HOME `no`\nEOF", "literal $HOME `no`\n"),
        ("(cd /tmp && pwd)", "/tmp\n"),
        ("echo a | tr a b | tr b c", "c\n"),
        ("printf '日本語 😀 ünï\\n'", "日本語 😀 ünï\n"),
        ("python3 -c 'print(1 + 1)'", "2\n"),
        ("echo 'a\\tb'", "a\tb\n"),
    ],
)
def test_shell_output_is_exactly_what_the_command_printed(box, command, output):
    result = run(box, command)
    assert result.ok and result.output == output and result.meta["exit_code"] == 0


@pytest.mark.parametrize(
    "command, code", [("exit 3", 3), ("false", 1), ("true", 0), ("sh -c 'exit 42'", 42), ("false | true", 0)]
)
def test_the_exit_code_is_reported(box, command, code):
    result = run(box, command)
    assert result.meta["exit_code"] == code and f"exit code {code}" in result.note


def test_a_failing_command_keeps_its_output_and_its_error_message(box):
    result = run(box, "echo before; ls /definitely/not/here; echo after")
    assert result.ok and result.meta["exit_code"] == 0
    assert result.output.startswith("before\n") and "not/here" in result.output and result.output.endswith("after\n")


def test_a_missing_program_is_exit_127_with_the_shells_message(box):
    result = run(box, "no_such_program_xyz --flag")
    assert result.meta["exit_code"] == 127 and "no_such_program_xyz" in result.output


def test_stderr_is_merged_with_stdout_in_order(box):
    result = run(box, "echo out1; echo err1 >&2; echo out2; echo err2 >&2")
    assert result.output == "out1\nerr1\nout2\nerr2\n"


def test_a_command_killed_by_a_signal_does_not_pass_for_success(box):
    result = run(box, "echo started; kill -9 $$")
    assert result.output.startswith("started") and result.meta["exit_code"] not in (0, None)


@pytest.mark.parametrize(
    "command, output",
    [
        ("cat; echo rc=$?", "rc=0\n"),  # stdin is empty, not a terminal that waits
        ("read line; echo rc=$?", "rc=1\n"),
        ("python3 -c 'input()' 2>/dev/null; echo rc=$?", "rc=1\n"),
        ("head -c 10 | wc -c", "0\n"),
    ],
)
def test_commands_that_read_stdin_see_end_of_file_at_once(box, command, output):
    result = run(box, command, timeout=30)
    assert result.ok and result.output.replace(" ", "") == output.replace(" ", "")


def test_a_huge_output_keeps_head_and_tail_and_marks_the_cut(box):
    result = run(box, "seq 1 300000")
    lines = result.output.splitlines()
    assert lines[0] == "1" and lines[-1] == "300000"
    assert result.meta["output_truncated"] is True and "omitted" in result.output
    assert len(result.output.encode()) < 64 * 1024
    assert result.meta["exit_code"] == 0


def test_binary_output_does_not_break_the_result(box):
    result = run(box, "head -c 4096 /dev/urandom; echo; echo done")
    assert result.ok and result.output.endswith("done\n")


def test_each_call_starts_in_the_workspace_with_a_fresh_environment(box):
    assert run(box, "pwd").output == "/workspace\n"
    assert run(box, "mkdir -p sub && cd sub && pwd").output == "/workspace/sub\n"
    assert run(box, "pwd").output == "/workspace\n", "cd does not carry over between calls"
    assert run(box, "export OA_PEER_VAR=1; echo ${OA_PEER_VAR}").output == "1\n"
    assert run(box, "echo ${OA_PEER_VAR:-unset}").output == "unset\n", "exports do not carry over"


def test_home_and_path_are_usable(box):
    home = run(box, 'echo "$HOME"').output.strip()
    assert home and run(box, f"test -d {home} && test -w {home} && echo ok").output == "ok\n"
    assert run(box, "command -v python3 >/dev/null && echo found").output == "found\n"


def test_files_the_shell_writes_are_what_the_file_tools_see(box):
    assert run(box, "mkdir -p made && printf 'x\\ny\\n' > made/f.txt").ok
    assert box.call("read_file", {"path": "made/f.txt"}).output == "x\ny\n"
    assert box.call("edit_file", {"path": "made/f.txt", "old_text": "y", "new_text": "z"}).ok
    assert run(box, "cat made/f.txt").output == "x\nz\n"


def test_a_background_process_does_not_hold_the_call_or_outlive_it(box):
    result = run(box, "sleep 300 & echo started", timeout=60)
    assert result.ok and result.output == "started\n" and result.meta["timed_out"] is False
    left = run(box, "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c '^sleep$' || true")
    assert left.output.strip() == "0"


def test_a_timeout_is_typed_and_keeps_what_was_printed(box):
    result = run(box, "echo before; sleep 30; echo never", timeout=2)
    assert result.error is not None and result.error.type is ErrorType.TIMEOUT and result.error.recoverable
    assert "before" in result.output and "never" not in result.output


def test_a_command_after_a_timeout_runs_normally(box):
    run(box, "sleep 30", timeout=1)
    assert run(box, "echo alive").output == "alive\n"


@pytest.mark.parametrize("args", [{"command": ""}, {"command": "echo", "timeout": 0}, {"timeout": 5}, {"command": 5}])
def test_bad_shell_arguments_are_refused_before_the_box(args):
    with pytest.raises(OpenAgentsError) as caught:
        validate_arguments("shell", args)
    assert caught.value.type is ErrorType.INVALID_ARGUMENTS


def test_bad_shell_arguments_are_typed_by_the_agent_too(box):
    assert box.call("shell", {"command": "echo", "timeout": 0}).error.type is ErrorType.INVALID_ARGUMENTS
    assert box.call("shell", {"command": 5}).error.type is ErrorType.INVALID_ARGUMENTS
    assert box.call("shell", {}).error.type is ErrorType.INVALID_ARGUMENTS


def test_a_long_line_without_a_newline_is_capped_too(box):
    result = run(box, "head -c 200000 /dev/zero | tr '\\0' x")
    assert result.meta["output_truncated"] is True and result.output.startswith("x") and result.output.endswith("x")
    assert "omitted" in result.output and len(result.output) < 64 * 1024


def test_carriage_returns_and_stderr_only_output_are_kept(box):
    assert run(box, "printf 'a\\rb\\n'").output == "a\rb\n"
    result = run(box, "echo oops >&2; exit 2")
    assert result.output == "oops\n" and result.meta["exit_code"] == 2


def test_a_command_that_closes_its_output_but_keeps_running_times_out(box):
    result = run(box, "echo bye; exec >&- 2>&-; sleep 30", timeout=2)
    assert result.error is not None and result.error.type is ErrorType.TIMEOUT and "bye" in result.output
