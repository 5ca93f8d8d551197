"""End to end: placement=split placement.rebalance=true on 4 gloo ranks (real app: Hydra, spawned ranks, vLLM engines
in their own processes, FSDP2 training of the actor and its reference).

The run starts deliberately unbalanced: 3 rollout ranks and 1 train rank, where one rank trains every row of the step
while three engines share the generation. After the first step the manager moves ranks from generation to training
(3+1 -> 2+2 or 1+3: ranks leave the rollout set, so no engine has to start), one VPS move of the actor's parameters and
AdamW moments and of the reference's parameters. One run checks: the move and its metrics; the same losses, rewards
and eval as colocate (staleness 0, fp32, relative < 1e-5); the trace and timeline with the move; no process of the
run and no weight file in /dev/shm left behind."""
from __future__ import annotations

import json
import os
import signal

import pytest

from tests.e2e.test_placement_lend import assert_same_metrics
from tests.e2e.test_placement_split import run, weight_files, with_mark

GRPO4 = [
    "recipe=grpo_tiny", "parallel.world_size=4", "trainer.sft_warmup_steps=30", "trainer.precision=fp32",
    "task.prompts_per_step=12", "rollout.n=2", "task.partial_credit=true", "task.eval_size=12", "task.eval_every=2",
    "trainer.total_steps=3", "algorithm.mini_batches=2", "algorithm.kl_coef=0.02", "trainer.save_last=false",
    "trainer.export_policy=false", "tracking.wandb_mode=disabled",
]
REBALANCE = ["placement=split", "placement.max_staleness=0", "placement.rollout_ranks=3", "placement.rebalance=true",
             "placement.rebalance_every=1", "placement.rebalance_margin=0.05"]


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path):
    yield
    for name in ("colocate", "rebalance"):  # a timeout kills only the launcher
        for pid in with_mark(str(tmp_path / name)):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(900)
def test_unbalanced_split_rebalances_and_logs_what_colocate_logs(tmp_path):
    colocate = run(tmp_path / "colocate", *GRPO4)
    before = weight_files()
    rows = run(tmp_path / "rebalance", *GRPO4, *REBALANCE)
    assert with_mark(str(tmp_path / "rebalance")) == [], "engine or rank processes outlived the run"
    assert weight_files() - before == set(), "the run left its weight files in /dev/shm"

    moves = [r for r in rows if r.get("rebalance/moved")]
    assert len(moves) >= 1, [r.get("rebalance/rollout_ranks") for r in rows]
    first = moves[0]
    assert first["step"] == 1 and first["rebalance/from_rollout_ranks"] == 3
    assert first["rebalance/rollout_ranks"] in (1, 2)  # ranks left generation for training
    assert first["rebalance/predicted_gain_s"] > 0 and first["rebalance/predicted_cost_s"] > 0
    assert first["rebalance/predicted_total_gain_s"] > first["rebalance/predicted_cost_s"]
    assert 0 < first["rebalance/transition_seconds"] and first["rebalance/engine_start_seconds"] == 0.0
    for role in ("actor", "reference"):  # one VPS move each, 1 train rank -> 2 or 3
        assert first[f"reshard/{role}/rebalance/bytes_moved"] > 0 and first[f"reshard/{role}/rebalance/rounds"] >= 1
    assert first["reshard/actor/rebalance/bytes_moved"] > 2 * first["reshard/reference/rebalance/bytes_moved"]  # + AdamW
    assert first["placement/wait_seconds"] <= 0.1 * first["placement/build_seconds"] + 0.01
    assert "rebalance/measured_gain_s" in rows[2]  # step 2 ran on the new split

    assert_same_metrics(colocate, rows)  # a placement, and its changes, never change results

    trace = json.loads((tmp_path / "rebalance" / "transition_trace.json").read_text())["traceEvents"]
    events = [e for e in trace if e["ph"] == "X"]
    moved = [e for e in events if e["name"] == "rebalance"]
    assert sorted(e["pid"] for e in moved) == [0, 1, 2, 3] and all(e["args"]["from"] == 3 for e in moved)
    assert {e["pid"] for e in events if e["name"] == "reshard/actor/rebalance"} >= {3}  # the train rank sent
    served = {(e["pid"], e["name"], e["args"]["roles"]) for e in events if e["cat"] == "phase" and e["args"]["step"] == 1}
    assert (0, "phase/generate", "rollout") in served and (3, "phase/train_actor", "actor") in served
    assert not any(p == 3 and n == "phase/generate" for p, n, _ in served)  # step 1: rank 3 only trained
    assert any(e["name"] == "reshard/actor/train_actor_to_generate" for e in events)  # the weight syncs
    assert (tmp_path / "rebalance" / "timeline.png").stat().st_size > 10_000
