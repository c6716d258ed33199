"""--max-wall bounds host work on box data too: the session's HostBudget ends checkpoints and the
quota's walks with the session's clock, and what they could not finish reads as unknown, never as
"no change"; the end-of-session sweep keeps a clock of its own."""

from __future__ import annotations

import time

from orchestrator.boxfs import HostBudget
from orchestrator.sandbox.base import SWEEP_BUDGET_S, SupervisedSandbox
from orchestrator.workspace.checkpoints import CheckpointStore
from orchestrator.workspace.quota import WriteQuota


def test_a_checkpoint_past_the_sessions_clock_is_unknown_not_empty(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(50):
        (ws / f"f{i}").write_text("x")
    spent = HostBudget.until(0.0)
    time.sleep(0.01)
    store = CheckpointStore(tmp_path / "store", ws, budget=spent)
    point = store.record(0)
    assert point is not None and not point.ok and point.error_type == "resource_exhausted", point
    assert "wall-time" in point.error


def test_the_quotas_walk_past_the_sessions_clock_counts_as_over_quota(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_text("x")
    spent = HostBudget.until(0.0)
    time.sleep(0.01)
    quota = WriteQuota(ws, 1 << 30, 0, budget=spent)
    assert quota.check(), "a walk that could not finish was taken for a workspace within its quota"
    assert quota.unmeasured


def test_the_final_sweep_has_its_own_clock_not_the_sessions() -> None:
    budget = SupervisedSandbox._sweep_budget(None)  # type: ignore[arg-type]
    remaining = budget.remaining_s()
    assert remaining is not None and SWEEP_BUDGET_S - 5 < remaining <= SWEEP_BUDGET_S and budget.parent is None
