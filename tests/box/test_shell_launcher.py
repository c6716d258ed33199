"""The shell prepared before its command is known (sandbox_agent/launcher.py, issue 26), under runc
and under runsc: a command run by it sees what `/bin/sh -c` showed it, and no call sees another's.

Each command is run twice: as it is (short: the prepared `/bin/sh -s` runs it) and followed by a
comment line that takes it past PIPE_BUF (started as `/bin/sh -c` the ordinary way). The shell's own
command line tells which way each went, so the comparison cannot pass by taking one way twice.
"""

from __future__ import annotations

import time

import pytest

from tests.helpers import BOTH_RUNTIMES, chown_tree

pytestmark = pytest.mark.docker

PAD = "\n#" + "p" * 5000  # past PIPE_BUF (4096): the launcher refuses it


@pytest.fixture(scope="module", params=BOTH_RUNTIMES)
def box(request, sandbox_image, docker_client, tmp_path_factory):
    from orchestrator.sandbox.docker import DockerSandbox
    from tests.helpers import require_runtime, sandbox_config

    require_runtime(request.param, docker_client)
    root = tmp_path_factory.mktemp(f"shell-launcher-{request.param}") / "ws"
    root.mkdir()
    chown_tree(root)
    with DockerSandbox(root, sandbox_config(request.param, docker_client), client=docker_client) as sandbox:
        sandbox.call("shell", {"command": "true"})  # the first call starts its own; it prepares the next
        yield sandbox


def run(box, command: str):
    time.sleep(0.1)  # the next shell is made after a call; a call made at once waits for it either way
    result = box.call("shell", {"command": "head -c 10 /proc/$$/cmdline | tr '\\0' ' '; echo\n" + command})
    way, _, rest = result.output.partition("\n")
    return way.strip(), rest, result.meta.get("exit_code"), result.error


COMMANDS = [
    "echo $0 $- $#",  # `-s` would show in $- had the script not said `set +s`
    "ls /proc/self/fd",  # 0, 1, 2 and ls's own directory: the script's pipe is not inherited
    "readlink /proc/self/fd/0; cat; echo rc=$?",  # standard input is /dev/null, at end of file at once
    "grep -E '^(SigIgn|SigBlk)' /proc/self/status",  # SIGPIPE and SIGXFSZ back to default, no signal blocked
    "test $(cut -d' ' -f6 /proc/$$/stat) = $$ && test $(cut -d' ' -f5 /proc/$$/stat) = $$ && echo leader",
    "pwd; env | grep -v '^PWD=' | sort",
    "foo_not_found_anywhere",
    "echo a\nif then\necho b",
    "trap 'echo bye' EXIT; echo hi; exit 7",
    "echo ${unset_var?is unset}",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_prepared_shell_runs_a_command_as_sh_c_does(box, command):
    prepared = run(box, command)
    ordinary = run(box, command + PAD)
    assert (prepared[0], ordinary[0]) == ("/bin/sh -s", "/bin/sh -c")
    assert prepared[1:] == ordinary[1:]


def test_each_call_gets_a_fresh_shell(box):
    box.call("shell", {"command": "cd /tmp; x=1; export Y=2; trap 'echo leaked' EXIT; umask 077"})
    _, out, code, _ = run(box, 'pwd; echo "[$x$Y]"; umask')
    assert (out, code) == ("/workspace\n[]\n0022\n", 0)


def test_a_long_command_takes_the_ordinary_way_and_the_next_call_is_prepared_again(box):
    assert run(box, "echo long" + PAD) == ("/bin/sh -c", "long\n", 0, None)
    assert run(box, "echo short") == ("/bin/sh -s", "short\n", 0, None)


# Each way a shell's end is seen (sandbox_agent/shell.py: without pidfd, under gVisor, the call reaps
# the shell itself when its output ends as it exits, and hands it to the waiter thread otherwise),
# each on the prepared shell and on `/bin/sh -c`: the exit code is the shell's, and the call ends
# when the shell does (a background job holding the pipe costs the drain, no more).
EXITS = [
    ("exit 3", 3),  # output ends as it exits
    ("exec >&- 2>&-; sleep 0.3; exit 4", 4),  # output ends long before it exits
    ("sleep 0.1; exit 6", 6),  # exits after the waiter was handed it
    ("sleep 30 & exit 5", 5),  # exits while a job holds its output open
    ("kill -9 $$", -9),  # killed by a signal
]


@pytest.mark.parametrize(("command", "code"), EXITS)
def test_the_exit_code_is_the_shells_whichever_way_its_end_is_seen(box, command, code):
    for padded, way in ((command, "/bin/sh -s"), (command + PAD, "/bin/sh -c")):
        started = time.monotonic()
        seen_way, _, seen_code, error = run(box, padded)
        assert (seen_way, seen_code, error) == (way, code, None)
        assert time.monotonic() - started < 5  # the job's 30 s sleep was swept, not waited for
