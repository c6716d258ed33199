"""Names the box made, as they leave the host (issue 40.4, issue 41.3).

A box names its files with whatever bytes it likes: a newline followed by text that looks like
ours, a tab, a quote, a backslash, an escape sequence, bytes that are not UTF-8. Where a person
reads a name it must stay on its one line, escaped; where a machine reads it (run --output json,
batch result lines, a batch patch) it must be the exact name in one documented form, and a patch
must land it with `git apply`. And the box decides how many names there are: every machine-readable
result stays bounded (at most 1,000 names a list, a total, the full list in a file, a line at most
1 MiB) whether it made 30 names or 200,000.

Real CLI processes (this checkout's code), real boxes, real `git`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.boxfs.names import exact, from_exact, git_quoted, show
from orchestrator.ground.text import json_line
from orchestrator.terminal.machine import MAX_LINE_BYTES, MAX_LISTED
from tests.helpers import chown_tree, make_workspace
from tests.helpers.names_in_output import _many, maker, model, policy

ROOT = Path(os.environ.get("OA_NAMES_CLI_ROOT") or Path(__file__).resolve().parents[2])  # the checkout whose CLI runs
OA = os.path.join(os.path.dirname(sys.executable), "oa-sandbox")
MARK = b"INJECTED by the box"
# A newline then text at the left margin, a tab, a quote, a
# backslash, an escape, invalid UTF-8, a space, a DEL, UTF-8 proper.
NAMES = [
    b"nl\n" + MARK,
    b"tab\tname",
    b'quo"te',
    b"back\\slash",
    b"esc\x1b[2Jclear",
    b"bad\xffutf8",
    b"two words",
    b"del\x7f",
    "ünï €".encode(),
    b"cr\rret",
]


def env(tmp_path: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "GEMINI_API_KEY")}
    out.update(PYTHONPATH=str(ROOT), XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return out


def measured(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run `oa-sandbox ARGS`; its output and its peak RSS in KiB (GNU time's %M, this process alone)."""
    rss = tmp_path / f"rss-{time.monotonic_ns()}"
    proc = subprocess.run(
        ["/usr/bin/time", "-o", str(rss), "-f", "%M", OA, *args],
        capture_output=True,
        timeout=timeout,
        env=env(tmp_path),
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    return proc, int(rss.read_text().split()[-1])


def make_names(names: list[bytes]) -> dict:
    return maker(
        f"import os\nfor n in {names!r}:\n    open(n, 'wb').write(b'made by the box: ' + repr(n).encode() + b'\\n')\n"
    )


def batch_one(tmp_path: Path, ws: Path, script: Path) -> tuple[dict, bytes, int, subprocess.CompletedProcess[bytes]]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps(
            {
                "id": "t",
                "workspace": str(ws),
                "task": "make names",
                "model": f"script:{script}",
                "policy": str(policy(tmp_path)),
            }
        )
        + "\n"
    )
    out = tmp_path / "results.jsonl"
    proc, rss = measured(tmp_path, "batch", str(tasks), "--out", str(out))
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    raw = out.read_bytes()
    (line,) = raw.splitlines()
    return json.loads(line), line, rss, proc


def no_margin_injection(*texts: bytes) -> None:
    for text in texts:
        for line in text.splitlines():
            assert not line.startswith(MARK), f"the box's text reached the left margin: {line!r}"
            assert b"\x1b" not in line and b"\r" not in line, line


def test_git_quoting_of_names_is_git_s_own():
    """A batch patch names files as git quotes them: our quoting of
    each hostile name equals git's (ls-files, core.quotePath)."""
    repo = Path(os.environ.get("TMPDIR", "/tmp")) / f"quote-{os.getpid()}-{time.monotonic_ns()}"
    repo.mkdir()
    try:
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        for name in NAMES:
            (repo / os.fsdecode(name)).write_bytes(b"x\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        listed = subprocess.run(
            ["git", "-C", str(repo), "-c", "core.quotePath=true", "ls-files"], check=True, capture_output=True
        ).stdout
        ours = sorted(git_quoted(n) for n in NAMES)
        assert sorted(listed.decode("ascii").splitlines()) == ours
    finally:
        shutil.rmtree(repo)


def test_the_exact_form_of_a_name_is_lossless_and_its_shown_form_one_line():
    """A name in machine output is its UTF-8 text or {"bytes_b64"} (encoded
    surrogates too), decoding to the very bytes; shown is one escaped line."""
    for name in [*NAMES, b"\xed\xa0\x80lone-surrogate", b"\xc3\x28"]:
        value = exact(name)
        line = json_line({"path": value})
        assert "\n" not in line and "\x1b" not in line and "\r" not in line
        assert from_exact(json.loads(line)["path"]) == name
        assert isinstance(value, str) == _utf8(name)
        assert "\n" not in show(name) and "\t" not in show(name) and "\x1b" not in show(name) and "\r" not in show(name)


def _utf8(name: bytes) -> bool:
    try:
        name.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.docker
def test_a_batch_patch_lands_every_hostile_name_with_git_apply(sandbox_image, tmp_path):
    """A batch task's box makes files named with a newline, tab, quote, backslash, escape, invalid
    UTF-8: its patch lands each exact name with `git apply`, and its lists give the exact names."""
    ws = make_workspace(tmp_path / "ws", {"keep.txt": "keep\n"})
    chown_tree(ws)
    result, line, _, proc = batch_one(tmp_path, ws, model(tmp_path, make_names(NAMES)))
    assert result["status"] == "finished", result
    no_margin_injection(proc.stderr, proc.stdout, line)
    assert sorted(from_exact(p) for p in result["files_changed"]) == sorted(NAMES)
    assert all("\n" not in s and "\t" not in s for s in result["files_changed_shown"])
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "keep.txt").write_text("keep\n")
    (tmp_path / "p.diff").write_text(result["patch"])
    applied = subprocess.run(["git", "apply", "-v", str(tmp_path / "p.diff")], cwd=fresh, capture_output=True)
    assert applied.returncode == 0, applied.stderr.decode(errors="replace")
    made = {n for n in os.listdir(os.fsencode(fresh)) if n != b"keep.txt"}
    assert made == set(NAMES)
    for name in NAMES:
        assert (fresh / os.fsdecode(name)).read_bytes() == b"made by the box: " + repr(name).encode() + b"\n"


@pytest.mark.docker
def test_run_apply_keeps_box_names_off_the_left_margin_and_json_names_are_exact(sandbox_image, tmp_path):
    """`run --apply` prints every box-made name on its own escaped line; `--output json`
    gives applied and changed_files as exact names with shown forms beside them."""
    ws = make_workspace(tmp_path / "ws", {"keep.txt": "keep\n"})
    chown_tree(ws)
    args = [
        "run",
        "--workspace",
        str(ws),
        "--policy",
        str(policy(tmp_path)),
        "--non-interactive",
        "--workspace-mode",
        "copy",
        "--apply",
    ]
    text, _ = measured(tmp_path, *args, "--model", f"script:{model(tmp_path, make_names(NAMES))}", "go")
    assert text.returncode == 0, text.stderr.decode(errors="replace")[-2000:]
    no_margin_injection(text.stdout, text.stderr)

    ws2 = make_workspace(tmp_path / "ws2", {"keep.txt": "keep\n"})
    chown_tree(ws2)
    args[2] = str(ws2)
    proc, _ = measured(
        tmp_path, *args, "--model", f"script:{model(tmp_path, make_names(NAMES))}", "--output", "json", "go"
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    no_margin_injection(proc.stdout, proc.stderr)
    out = json.loads(proc.stdout)
    assert sorted(from_exact(p) for p in out["applied"]) == sorted(NAMES)
    assert out["applied_shown"] == [show(from_exact(p)) for p in out["applied"]]
    assert sorted(from_exact(c["path"]) for c in out["changed_files"]) == sorted(NAMES)
    assert all(c["path_shown"] == show(from_exact(c["path"])) for c in out["changed_files"])
    assert {n for n in os.listdir(os.fsencode(ws2)) if n != b"keep.txt"} == set(NAMES)


def _bounded_batch(tmp_path: Path, count: int) -> None:
    ws = make_workspace(tmp_path / "ws", {"keep.txt": "keep\n"})
    chown_tree(ws)
    began = time.monotonic()
    result, line, rss, _ = batch_one(tmp_path, ws, model(tmp_path, _many(count)))
    wall = time.monotonic() - began
    print(
        f"\n{count} box-made names through a local batch: result line "
        f"{len(line)} bytes, driver peak RSS {rss >> 10} MiB, {wall:.0f} s"
    )
    assert result["status"] == "finished", result["reason"]
    assert len(line) <= MAX_LINE_BYTES
    assert len(result["left_out"]) <= MAX_LISTED and result["left_out_total"] == count
    assert len(result["files_changed"]) <= MAX_LISTED and result["files_changed_total"] == count + 100
    full = Path(result["left_out_file"]).read_bytes().splitlines()
    assert len(full) == count and all(json.loads(x)["reason"] for x in full[:10])
    assert len(Path(result["files_changed_file"]).read_bytes().splitlines()) == count + 100
    assert "+++ b/plain099" in result["patch"]


@pytest.mark.docker
def test_30000_box_made_names_leave_a_batch_result_line_bounded(sandbox_image, tmp_path):
    """A batch task's box makes 30,000 long-named absolute symlinks: its result
    line stays under 1 MiB, 1,000 names a list, totals and full lists on disk."""
    _bounded_batch(tmp_path, 30_000)


@pytest.mark.slow
@pytest.mark.docker
def test_200000_box_made_names_leave_a_batch_result_line_bounded(sandbox_image, tmp_path):
    """The same with 199,900 names (just under the box's entry quota of 200,000, which stops
    a session past it): the line and the lists stay bounded, the driver's memory measured."""
    _bounded_batch(tmp_path, 199_800)


@pytest.mark.docker
def test_30000_applied_names_leave_run_output_json_bounded(sandbox_image, tmp_path):
    """`run --apply --output json` after a box made 30,000 files: one object
    under 1 MiB, applied and changed_files cut at 1,000 with totals and files."""
    ws = make_workspace(tmp_path / "ws", {"keep.txt": "keep\n"})
    chown_tree(ws)
    turn = maker("import os\nfor i in range(30000):\n    open('F' * 150 + '%06d' % i, 'w').write('x\\n')\n")
    proc, rss = measured(
        tmp_path,
        "run",
        "--workspace",
        str(ws),
        "--policy",
        str(policy(tmp_path)),
        "--non-interactive",
        "--workspace-mode",
        "copy",
        "--apply",
        "--output",
        "json",
        "--model",
        f"script:{model(tmp_path, turn)}",
        "go",
    )
    print(f"\nrun --output json, 30,000 applied names: {len(proc.stdout)} bytes, peak RSS {rss >> 10} MiB")
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    assert len(proc.stdout) <= MAX_LINE_BYTES + 1
    out = json.loads(proc.stdout)
    assert len(out["applied"]) <= MAX_LISTED and out["applied_total"] == 30_000
    assert len(Path(out["applied_file"]).read_bytes().splitlines()) == 30_000
    assert len(out["changed_files"]) <= MAX_LISTED and out["changed_files_total"] == 30_000
