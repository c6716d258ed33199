"""Red team (issue 10, finding 4 variants): host resources the box can take without the bounds seeing it."""

from __future__ import annotations

import pytest

from tests.helpers import make_workspace

pytestmark = pytest.mark.docker


def test_redteam_data_below_the_walk_depth_still_counts_against_the_write_quota(open_sandbox, tmp_path):
    """Files written 600 directories deep (below the 512 levels the
    usage walk enters) still stop the session at the write quota."""
    ws = make_workspace(tmp_path / "ws", {"a.txt": "a\n"})
    quota = 32 << 20
    box = open_sandbox(ws, write_quota=quota)
    script = (
        "d=.; i=0; while [ $i -lt 600 ]; do d=$d/d; i=$((i+1)); done; mkdir -p $d && cd $d && "
        "i=0; while [ $i -lt 24 ]; do head -c 4194304 /dev/zero > f$i || exit 1; i=$((i+1)); done; echo finished"
    )
    res = box.call("shell", {"command": script, "timeout": 120})
    if res.ok:  # the command may finish between two polls: the next call must still see the growth
        res = box.call("read_file", {"path": "a.txt"})
    assert not res.ok and res.error.type.value == "workspace_quota_exceeded", res
