"""End to end: placement=split on 4 gloo ranks (real app: Hydra, spawned ranks, vLLM engines in their own processes on
ranks 0-1, FSDP2 training of the actor and its reference on ranks 2-3), against colocate with the same seed.

A placement never changes results, only time: with max_staleness=0, split logs the same losses, rewards and eval
accuracy as colocate (fp32, relative difference < 1e-5). The samples agree because sampling seeds are global prompt
indices; the weights the rollout set generates with arrive by a VPS plan every step, so a stale or wrong sync would
change the rewards of the next step. No engine process outlives the run and no weight file stays in /dev/shm. The
split run saves a checkpoint after step 3 (the train set's engines, by DCP) and exports the policy; a split run
resumed from that checkpoint logs the uninterrupted run's step 4. With max_staleness=1 generation runs a step ahead:
its first step is still on-policy and logs colocate's step 1; later steps train on samples of older weights. Both
compare with the first 4 steps of the session's colocate run (tests/app/conftest.py's grpo4_colocate), which the live
leave and join tests compare with too."""
from __future__ import annotations


import pytest

from tests.app.app_runs import run_app
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, SYNC, assert_same_metrics, kill_marked, run, weight_files

STEPS = 4  # so that step 4, the last, evaluates in both runs: eval_every=2 (a last step evaluates too)
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}"]


@pytest.fixture
def colocate(grpo4_colocate) -> list[dict]:
    """GRPO4 under colocate, its steps 0-4: the rows both split runs compare with."""
    return grpo4_colocate[:STEPS + 1]


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path):
    yield
    for name in ("split", "resumed"):
        kill_marked(tmp_path / name)


@pytest.mark.timeout(900)
def test_split_staleness_0_logs_what_colocate_logs(colocate, tmp_path):
    before = weight_files()
    saving = ["trainer.save_every=3", "trainer.export_policy=true"]  # a checkpoint after step 3, an export at the end
    split = run(tmp_path / "split", *ARGS, *saving, "placement=split", "placement.max_staleness=0")
    assert marked_processes(str(tmp_path / "split")) == [], "engine or rank processes outlived the split run"
    assert weight_files() - before == set(), "the split run left its weight files in /dev/shm"
    trained = [r for r in colocate if r["step"] > 0]
    assert any(r["reward/mean"] > 0 for r in trained) and any(abs(r["actor/pg_loss"]) > 1e-3 for r in trained)
    assert "eval/accuracy" in split[-1] and "actor/kl" in split[-1]
    assert_same_metrics(colocate, split)
    for row in split[1:]:  # every step moved the actor's weights to the rollout set by a VPS plan
        assert row[f"{SYNC}/bytes_moved"] > 0 and row[f"{SYNC}/rounds"] >= 1, row["step"]
        assert 0 < row["placement/change_share"] < 1 and row["placement/staleness"] == 0
    assert not any(k.startswith(SYNC) for r in colocate for k in r), "colocate logged a split transition"
    assert not any(k.startswith("rebalance/") for r in split for k in r), "a split run without rebalance moved"
    assert (tmp_path / "split" / "transition_trace.json").is_file() and (tmp_path / "split" / "timeline.png").is_file()

    # resumed from the train set's checkpoint of step 3, step 4 is the uninterrupted run's step 4
    step_3 = tmp_path / "split" / "checkpoints" / "step_3"
    resumed = run(tmp_path / "resumed", *ARGS, "placement=split", "placement.max_staleness=0",
                  f"trainer.resume={step_3}")
    assert [r["step"] for r in resumed] == [4]
    assert_same_metrics([split[-1]], resumed)
    policy = tmp_path / "split" / "policy"  # exported at the end by the train set's first rank
    assert (policy / "config.json").is_file() and list(policy.glob("*.safetensors"))


def test_split_refuses_what_it_does_not_run_before_spawn(tmp_path):
    proc = run_app(*GRPO4, "placement=split", "placement.max_staleness=0", "rollout.tp=2", f"hydra.run.dir={tmp_path}",
                   timeout=120)
    assert proc.returncode != 0
    assert "placement=split" in proc.stderr and "rollout.tp=2" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.timeout(900)
def test_split_staleness_1_generates_ahead_and_logs_its_staleness(colocate, tmp_path):
    """Generation of step k+1 (weights of step k-1) overlaps the training of step k; the run logs staleness 1 from
    step 2 on (step 1's samples come from the initial weights, on-policy, so steps 0 and 1 are colocate's), and still
    learns from real rewards."""
    rows = run(tmp_path / "split", *ARGS, "placement=split", "placement.max_staleness=1")
    assert_same_metrics(colocate[:2], rows[:2])
    parted = [k for k in ("reward/mean", "response_length/mean") if rows[2][k] != pytest.approx(colocate[2][k], rel=1e-5)]
    assert parted, "step 2 sampled with the weights colocate sampled with: generation did not run a step ahead"
    assert marked_processes(str(tmp_path / "split")) == [], "engine or rank processes outlived the split run"
    assert [r["placement/staleness"] for r in rows[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert all(r[f"{SYNC}/bytes_moved"] > 0 for r in rows[1:]) and "eval/accuracy" in rows[-1]
    assert any(r["reward/mean"] > 0 for r in rows[1:])
