"""boxfs/atomic.py, the one atomic writer (terminal/machine.py's lists, the report page, the
checkpoint index): whole or not at all, and no temporary file left behind either way."""

from __future__ import annotations

import os
import stat

import pytest

from orchestrator.boxfs.atomic import write_atomic


def test_it_replaces_the_whole_file_with_the_mode_asked(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old and longer than the new")
    assert write_atomic(target, "new", mode=0o644) == target
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_failed_rename_leaves_the_old_content_and_no_temporary(tmp_path):
    """A directory where the file should be: the rename fails, nothing of ours is left."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "taken", b"bytes")
    assert (tmp_path / "taken" / "inside").read_text() == "kept"
    assert sorted(os.listdir(tmp_path)) == ["taken"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_durable_write_syncs_and_leaves_only_the_file(tmp_path):
    """The sweep journal's form (the directory synced after the rename): same result, nothing else left."""
    write_atomic(tmp_path / "journal.json", '{"v": 1}', durable=True)
    assert (tmp_path / "journal.json").read_text() == '{"v": 1}'
    assert os.listdir(tmp_path) == ["journal.json"]
