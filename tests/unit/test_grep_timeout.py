"""The search's timeout says what was measured (sandbox_agent/search_child.py _Stopped): one block
of one file's lines taking the CPU (the pattern backtracking), one file taking the time (its size),
or the walk as a whole; and a machine too busy to give the search the CPU, which is no fault of the
pattern. Issue 50: under load an ordinary regex hit the limit and the error blamed catastrophic
backtracking. The in-box case, a real backtracking pattern: tests/box/test_tools_in_sandbox.py."""

from __future__ import annotations

from sandbox_agent.search_child import PROGRESS_BYTES, _Child, _Stopped


def _message(**measured: object) -> str:
    values: dict = {
        "where": "src/big.py",
        "files": 40,
        "line": 1,
        "elapsed": 30.0,
        "in_file": 1.0,
        "in_block": 1.0,
        "cpu": 29.0,
        "cpu_in_block": 0.5,
    }
    values.update(measured)
    return _Stopped(**values).message(30, 3)


def test_one_block_computing_most_of_the_time_is_called_backtracking() -> None:
    text = _message(line=120, in_file=28.0, in_block=27.5, cpu_in_block=27.0)
    assert "backtracking" in text and "src/big.py from line 120" in text and "27.0s of CPU" in text
    assert "after 39 other file(s) in 2.0s" in text and "busy" not in text


def test_a_busy_machine_is_not_called_backtracking() -> None:
    """The same place, but the search had 3 s of CPU in 30: the machine, not the pattern."""
    text = _message(line=120, in_file=28.0, in_block=27.5, cpu=3.0, cpu_in_block=0.4)
    assert "backtrack" not in text and "src/big.py alone took 28.0s" in text
    assert "the machine is busy: the search had 3.0s of CPU in its 30.0s" in text


def test_a_large_file_is_its_size() -> None:
    text = _message(line=90000, in_file=25.0, in_block=0.01, cpu_in_block=0.01)
    assert "backtrack" not in text and "src/big.py alone took 25.0s" in text and "lines from 90000 on" in text


def test_the_walk_as_a_whole() -> None:
    text = _message(files=41000, in_file=0.001, in_block=0.001, cpu_in_block=0.0)
    assert "backtrack" not in text and "after searching 41000 file(s) in 30.0s" in text
    assert "no single file took most of the time" in text and "busy" not in text
    busy = _message(files=9000, in_file=0.001, in_block=0.001, cpu=4.0, cpu_in_block=0.0)
    assert "no single file took most of the time; the machine is busy: the search had 4.0s of CPU" in busy


def test_a_file_being_opened_has_no_lines_to_blame() -> None:
    text = _message(line=0, in_file=29.0, in_block=29.0, cpu_in_block=20.0)
    assert "backtrack" not in text and "opening it and judging its first bytes" in text


def test_the_shared_page_reads_back_what_the_child_wrote() -> None:
    import mmap
    import time

    shared = mmap.mmap(-1, PROGRESS_BYTES)
    child = _Child(-1, shared)
    started = time.monotonic_ns()
    child.at("a.txt")
    child.at("dir/ünï.txt")
    child.lines(77)
    # The child's CPU clock starts at 0 in a real fork; here it is this process's, which has run the
    # suite before: the CPU at the stop is given as 3 s past the clock at the block's start.
    cpu_at_stop = time.process_time() + 3.0
    stopped = _Stopped.read(bytes(shared), started, time.monotonic_ns() + 2_000_000_000, cpu=cpu_at_stop)
    assert (stopped.where, stopped.files, stopped.line) == ("dir/ünï.txt", 2, 77)
    assert 2.0 <= stopped.in_block <= stopped.in_file <= stopped.elapsed < 10
    assert stopped.cpu_in_block is not None and 3.0 <= stopped.cpu_in_block < 4.0


def test_a_search_in_the_agent_has_the_same_deadline(tmp_path) -> None:
    """A pattern that cannot backtrack is searched in the agent itself, without the child: it stops
    at the deadline all the same (a tree too large for it would otherwise hold the call until the
    host's deadline replaces the box), with the lines found before it and what took the time."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ws = tmp_path / "ws"
    # One file in 60 matches: 100 lines in all, under the 200-line bound, so the search must walk
    # every file (6,000 opens and reads take 70 ms here, the deadline is 10 ms) rather than end at the bound.
    for i in range(6000):
        sub = ws / f"d{i // 100:02}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:04}.txt").write_text((f"needle {i}\n" if i % 60 == 0 else "") + "hay\n" * 200)
    program = (
        "import json, sys\nfrom sandbox_agent import limits, search, tools\nfull = "
        "search.grep_files({'pattern': 'needle'})\nlimits.GREP_TIMEOUT_S = float(sys.argv[1])\n"
        "try:\n    search.grep_files({'pattern': 'needle'}); print(json.dumps({'full': "
        "full}))\nexcept tools.ToolError as err:\n    print(json.dumps({'full': full, 'kind': "
        "err.kind, 'message': str(err), 'output': err.output, 'meta': err.meta}))\n"
    )
    env = {**os.environ, "OA_AGENT_WORKSPACE": str(ws), "PYTHONPATH": str(root)}
    answer = json.loads(
        subprocess.run([sys.executable, "-c", program, "0.01"], cwd=ws, env=env, capture_output=True, check=True).stdout
    )
    assert answer["kind"] == "timeout" and answer["meta"]["timed_out"] is True
    assert "passed its 0s limit" in answer["message"] and "backtrack" not in answer["message"]
    assert answer["meta"]["files_searched"] < 6000 and answer["full"]["meta"]["matches"] == 100
    found = answer["output"].splitlines()
    assert found == answer["full"]["output"].splitlines()[: len(found)]  # what it found, in order, before it stopped
