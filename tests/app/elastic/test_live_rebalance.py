"""End to end: ranks leave and join a live placement=split run that re-balances (4 gloo ranks, GRPO, starting on 2
rollout + 2 train ranks), `elastic.events=[leave:3@2,join@4]`, 6 steps: world 4, 4, 3, 3, 4, 4.

Re-balancing decides from measured times, so which split holds at each change varies from run to run; what must
hold whatever it decided: every step logs what the session's colocate run logs (a placement, its moves and the
changes of world never change results; relative 1e-5), no move is made at a boundary where a change is known to
come (steps 2 and 4), every step's split is one of its world's, rank 0 re-plans the splits over each new world, and
each change moves the planned minimum of the split it found: the dry run of the same change from that split (the leave
from 4 ranks, the join from the 3-rank world). A leave that mapped the launched split instead of the one that holds fails
it: after 2+2 -> 1+3, 2+2's mapping (2+1) would leave rank 1's training state without a home.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.app.app_runs import run_cli
from tests.app.elastic.test_live_split import left_and_joined_checks
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run, weight_files

STEPS = 6
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [
    f"trainer.total_steps={STEPS}", "placement=split", "placement.max_staleness=0", "placement.rollout_ranks=2",
    "placement.rebalance=true", "placement.rebalance_every=1", "placement.rebalance_margin=0.05"]
EVENTS = "elastic.events=[leave:3@2,join@4]"


def planned_bytes(tmp_path: Path, name: str, *overrides: str) -> int:
    """The planned minimum of the dry run's one change: ARGS with `overrides` (key=value, replacing ARGS' own)."""
    keys = {o.split("=")[0] for o in overrides}
    args = [a for a in ARGS if a.split("=")[0] not in keys]
    dry = run_cli(*args, *overrides, "dry_run=true", tmp_path=tmp_path / name)
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    rows = json.loads((tmp_path / name / "run" / "plan_summary.json").read_text())["transitions"]
    (change,) = [r for r in rows if r["transition"].startswith("elastic/")]
    assert change["bytes_moved"] == change["bytes_min"]
    return change["bytes_min"]


@pytest.mark.timeout(900)
def test_a_rebalancing_split_run_leaves_and_joins_and_logs_what_colocate_logs(grpo4_colocate, tmp_path: Path) -> None:
    run_dir, before = tmp_path / "rebalance", weight_files()
    try:
        rows = run(run_dir, *ARGS, EVENTS)
    finally:
        kill_marked(run_dir)
    assert weight_files() - before == set(), "the run left weight files in /dev/shm"
    left_and_joined_checks(run_dir, rows, worlds=[4.0, 4.0, 3.0, 3.0, 4.0, 4.0], leave_step=3, join_step=5)
    assert_same_metrics(grpo4_colocate[:STEPS + 1], rows)
    splits = [int(r["rebalance/rollout_ranks"]) for r in rows[1:]]
    assert all(1 <= r < r_world for r, r_world in zip(splits, [4, 4, 3, 3, 4, 4])), splits
    assert not rows[2].get("rebalance/moved") and not rows[4].get("rebalance/moved"), "a move before a change"
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "rebalance over 3 ranks from" in log and "rebalance over 4 ranks from" in log
    # the leave of train rank 3 from step 2's split: its share moves as the dry run of that split plans
    leave = planned_bytes(tmp_path, "dry_leave", f"placement.rollout_ranks={splits[1]}", "elastic.events=[leave:3@2]")
    assert rows[3]["elastic/leave/bytes_moved"] == leave > 0
    # the join from step 4's split of the 3-rank world
    join = planned_bytes(tmp_path, "dry_join", f"placement.rollout_ranks={splits[3]}", "parallel.world_size=3",
                         "elastic.events=[join@4]")
    assert rows[5]["elastic/join/bytes_moved"] == join > 0
