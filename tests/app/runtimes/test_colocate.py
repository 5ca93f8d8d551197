"""End to end: online changes of the training layout leave a run's per-step losses and rewards unchanged, and the
loop writes a Chrome trace of every transition.

The real app runs twice with the same seed in fp32 on 2 local ranks: once in dp2 throughout, once switching to tp2
before step 2 and back to dp2 (ZeRO-1) before step 3. Every per-step metric of the run (actor losses, grad norm,
rewards, response lengths, eval) must agree to a relative 1e-5. The setting is chosen so that agreement means
something: partial-credit rewards give non-zero advantages after a 20-step warm-up; two mini-batches per step make
the second one's ratio (so pg_loss, ppo_kl) depend on the weights the first one trained; and in tp2 a rank holds 64
rows of a mini-batch in one micro-batch where in dp2 it holds 32, so mini-batch composition and micro-batch metric
weights are exercised across layouts. Rollouts are sampled at temperature 1: TP's different fp32 summation order
changes weights by ~1e-7 relative, which in these 4 steps flips no sampled token (rewards and lengths agree exactly).
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.app.app_runs import read_metrics, run_app

RUN = [
    "recipe=grpo_tiny", "trainer.total_steps=4", "trainer.sft_warmup_steps=20", "trainer.sft_batch_size=16",
    "trainer.precision=fp32",
    "task.prompts_per_step=16", "task.partial_credit=true", "task.eval_size=16", "task.eval_every=100",
    "algorithm.mini_batches=2", "tracking.wandb_mode=disabled",
]
SCHEDULE = "parallel.schedule=[{step: 2, tp: 2}, {step: 3, tp: 1, zero: 1}]"
SWITCH_STEPS = (2, 3)
TRACED_SYNCS = 3  # the initial sync and those of steps 1 and 2; every relayout is traced
COMPARED = ("actor/", "reward/", "response_length/", "eval/", "sft/")
RTOL = 1e-5
# pg_loss and ppo_kl are means of nearly cancelling O(1) terms (+-advantages, log-prob differences): their fp32
# noise (~1e-7 of those terms) is absolute, not relative to the small result.
ATOL = 1e-6


def compared(row: dict) -> dict[str, float]:
    return {k: v for k, v in row.items() if k.startswith(COMPARED)}


def run(run_dir: Path, *extra: str) -> list[dict]:
    proc = run_app(*RUN, *extra, f"hydra.run.dir={run_dir}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


def assert_same_run(fixed: list[dict], switched: list[dict]) -> None:
    assert [r["step"] for r in fixed] == [r["step"] for r in switched] == [0, 1, 2, 3, 4]
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in fixed[1:]), "no learning signal: equality would be vacuous"
    differences = []
    for a, b in zip(fixed, switched):
        assert compared(a).keys() == compared(b).keys(), a["step"]
        for key, x in compared(a).items():
            if abs(x - b[key]) > RTOL * abs(x) + ATOL:
                differences.append((a["step"], key, x, b[key]))
    assert not differences, differences
    assert {"actor/pg_loss", "actor/grad_norm", "reward/mean", "eval/accuracy"} <= compared(fixed[-1]).keys()


def traced_rounds(spans: list[dict], name: str, rank: int) -> list[int]:
    return [e["args"]["round"] for e in sorted(spans, key=lambda e: e["ts"]) if e["name"] == name and e["pid"] == rank]


def test_layout_switches_leave_losses_and_rewards_unchanged_and_are_traced(tmp_path: Path) -> None:
    fixed = run(tmp_path / "fixed", "tracking.transition_trace=false")
    switched = run(tmp_path / "switched", SCHEDULE, f"tracking.trace_syncs={TRACED_SYNCS}")

    assert_same_run(fixed, switched)

    for row in switched:  # tp2 -> dp2 moves nothing (every shard stays: FSDP on the TP dims) but is logged
        assert ("reshard/train_relayout/bytes_moved" in row) == (row["step"] in SWITCH_STEPS), row
    assert switched[SWITCH_STEPS[0]]["reshard/train_relayout/bytes_moved"] > 0  # dp2 -> tp2: the norms move
    assert not (tmp_path / "fixed" / "transition_trace.json").exists()

    trace = json.loads((tmp_path / "switched" / "transition_trace.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    # one event per round per rank: each transition's rounds 0..n-1, n as logged for that step
    sync_rounds = [int(switched[1]["reshard/train_to_rollout/rounds"])]  # step 0's sync: step 1's layout
    sync_rounds += [int(r["reshard/train_to_rollout/rounds"]) for r in switched[1:TRACED_SYNCS]]
    relayout_rounds = [int(switched[s]["reshard/train_relayout/rounds"]) for s in SWITCH_STEPS]
    for rank in (0, 1):
        assert traced_rounds(spans, "train_to_rollout", rank) == [i for n in sync_rounds for i in range(n)]
        assert traced_rounds(spans, "train_relayout", rank) == [i for n in relayout_rounds for i in range(n)]


def test_switch_into_the_searched_rank_order_leaves_losses_unchanged(tmp_path: Path) -> None:
    """4 ranks, dp4 -> dp2 x tp2 before step 3: the rank order search puts TP outermost (TP groups {0, 2}, {1, 3}),
    so data-parallel ranks and batch rows are assigned differently from the default mesh; results must not move."""
    world = ["parallel.world_size=4", "tracking.transition_trace=false"]
    fixed = run(tmp_path / "fixed", *world)
    proc = run_app(*RUN, *world, "parallel.schedule=[{step: 3, tp: 2}]", f"hydra.run.dir={tmp_path / 'switched'}",
                   timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "training layout dp4xtp1-zero3 -> dp2xtp2-zero3-tp_outer" in proc.stdout
    switched = read_metrics(tmp_path / "switched")
    assert_same_run(fixed, switched)
    assert [r["step"] for r in switched if r.get("reshard/train_relayout/bytes_moved", 0) > 0] == [3]
