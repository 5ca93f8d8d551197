"""End to end: placement.rebalance=true, a split whose sets change size from measured phase times, on 4 gloo ranks
(real app), against colocate with the same seed.

A PPO run starts deliberately unbalanced (3 rollout ranks, 1 train rank, which trains every row of the step) and the
manager moves ranks from generation to training after a measured step (3+1 -> 2+2 or 1+3: ranks leave the rollout
set, so no engine has to start): one VPS move each of the actor's parameters and AdamW moments, the critic's
parameters and AdamW moments, and the reference's parameters. The run logs what colocate logs (a placement, and its
changes, never change results), and its trace and timeline show the move. Micro-batches of 1 row make training, not
generation, the longer phase on 3+1, on an idle machine too."""
from __future__ import annotations

import json

import pytest

from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, SYNC, assert_same_metrics, kill_marked, run, weight_files

# PPO (actor, critic and reference to move) with micro-batches of 2 rows: training-bound, so ranks move to training
PPO4_MB2 = ["recipe=ppo_tiny" if a == "recipe=grpo_tiny" else a.replace("micro_batch_size=16", "micro_batch_size=2")
            for a in GRPO4 if a != "algorithm.kl_coef=0.02"]
REBALANCE = ["placement=split", "placement.max_staleness=0", "placement.rollout_ranks=3", "placement.rebalance=true",
             "placement.rebalance_every=1", "placement.rebalance_margin=0.05"]


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path):
    yield
    for name in ("colocate", "rebalance"):
        kill_marked(tmp_path / name)


@pytest.mark.timeout(900)
def test_unbalanced_ppo_split_rebalances_and_logs_what_colocate_logs(tmp_path):
    colocate = run(tmp_path / "colocate", *PPO4_MB2)
    before = weight_files()
    rows = run(tmp_path / "rebalance", *PPO4_MB2, *REBALANCE)
    assert marked_processes(str(tmp_path / "rebalance")) == [], "engine or rank processes outlived the run"
    assert weight_files() - before == set(), "the run left its weight files in /dev/shm"

    moves = [r for r in rows if r.get("rebalance/moved")]
    assert len(moves) >= 1, [(r.get("timing_s/gen"), r.get("timing_s/train")) for r in rows]
    first = moves[0]
    assert first["step"] in (1, 2) and first["rebalance/from_rollout_ranks"] == 3
    assert first["rebalance/rollout_ranks"] in (1, 2)  # ranks left generation for training
    assert first["rebalance/predicted_gain_s"] > 0
    assert first["rebalance/predicted_total_gain_s"] > first["rebalance/predicted_cost_s"] > 0
    after = rows[first["step"] + 1]  # the move's cost is logged in the step it served
    assert after["rebalance/transition_seconds"] > 0 and after["rebalance/engine_start_seconds"] == 0.0
    for role in ("actor", "critic", "reference"):  # one VPS move each, 1 train rank -> 2 or 3
        assert after[f"reshard/{role}/rebalance/bytes_moved"] > 0 and after[f"reshard/{role}/rebalance/rounds"] >= 1
    for role in ("actor", "critic"):  # with their AdamW moments
        assert after[f"reshard/{role}/rebalance/bytes_moved"] > 2 * after["reshard/reference/rebalance/bytes_moved"]
    assert any(abs(r["critic/vf_loss"]) > 0 for r in rows[1:])
    assert after["placement/wait_seconds"] <= 0.1 * after["placement/build_seconds"] + 0.01
    assert 0 < after["rebalance/lost_seconds"] <= after["rebalance/transition_seconds"]
    share = after["rebalance/lost_seconds"] / after["timing_s/step"]
    assert after["rebalance/transition_share"] == pytest.approx(share)
    assert "rebalance/measured_gain_s" in after  # the step after a move measures its gain
    assert after["rebalance/rollout_ranks"] <= first["rebalance/rollout_ranks"]  # training-bound: never back to 3

    assert_same_metrics(colocate, rows)  # a placement, and its changes, never change results

    trace = json.loads((tmp_path / "rebalance" / "transition_trace.json").read_text())["traceEvents"]
    events = [e for e in trace if e["ph"] == "X"]
    moved = [e for e in events if e["name"] == "rebalance"]
    assert sorted(e["pid"] for e in moved if e["args"]["from"] == 3) == [0, 1, 2, 3]  # every rank took part
    for role in ("actor", "critic"):  # the train rank sent their state
        assert 3 in {e["pid"] for e in events if e["name"] == f"reshard/{role}/rebalance"}
    served = {(e["pid"], e["name"], e["args"]["roles"]) for e in events
              if e["cat"] == "phase" and e["args"]["step"] == 1}
    assert (0, "phase/generate", "rollout") in served and (3, "phase/train_actor", "actor") in served
    assert (3, "phase/train_critic", "critic") in served
    assert not any(p == 3 and n == "phase/generate" for p, n, _ in served)  # step 1: rank 3 only trained
    assert any(e["name"] == SYNC for e in events)  # the weight syncs' rounds
    assert (tmp_path / "rebalance" / "timeline.png").stat().st_size > 10_000
