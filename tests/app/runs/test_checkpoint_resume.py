"""End to end: checkpoints and resume of the real app (Hydra, spawned gloo ranks, vLLM rollout, FSDP2 training).

GRPO with a KL term whose reference is the post-warm-up actor and whose coefficient the adaptive controller moves,
so resume must restore the actor, its Adam state, the reference, the KL coefficient, the loop's prompt rng and the
step without re-running the warm-up; partial-credit rewards after a
30-step warm-up make losses and rewards non-zero. 6 steps in one run must log what 3 steps + a resume for 3 log.
PPO checks the critic the same way. A 2-rank checkpoint resumed on 4 ranks continues close to the 2-rank run."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.app.app_runs import COMPARED, assert_recipe_outputs, read_metrics, run_app

GRPO = [
    "recipe=grpo_tiny", "trainer.sft_warmup_steps=30", "trainer.sft_batch_size=16", "algorithm.kl_coef=0.05",
    "trainer.precision=fp32",
    "algorithm.kl_ctrl=adaptive", "algorithm.kl_horizon=200",
    "task.prompts_per_step=8", "rollout.n=4", "task.partial_credit=true", "task.eval_size=16", "task.eval_every=2",
    "tracking.wandb_mode=disabled",
]
# the naive sync and wandb (offline): this run also checks ppo_tiny's outputs (app_runs.assert_recipe_outputs)
PPO = [*(a for a in GRPO if not a.startswith(("recipe=", "tracking.wandb_mode"))), "recipe=ppo_tiny",
       "algorithm.kl_in_reward=true", "rollout.sync=naive"]
RTOL = 1e-5


def compared(row: dict) -> dict[str, float]:
    return {k: v for k, v in row.items() if k.startswith(COMPARED)}


def run(run_dir: Path, *args: str) -> list[dict]:
    proc = run_app(*args, f"hydra.run.dir={run_dir}", timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


def assert_same_steps(expected: list[dict], got: list[dict], steps: range, rtol: float = RTOL) -> None:
    by_step = {r["step"]: r for r in expected}
    assert [r["step"] for r in got] == list(steps)
    for row in got:
        want = compared(by_step[row["step"]])
        assert set(compared(row)) == set(want), row["step"]
        for key, value in want.items():
            assert math.isclose(compared(row)[key], value, rel_tol=rtol, abs_tol=1e-7), (row["step"], key, value, row[key])


@pytest.fixture(scope="module")
def grpo_runs(tmp_path_factory):
    """Uninterrupted 6 steps, and 3 steps with the checkpoint the resumes start from."""
    root = tmp_path_factory.mktemp("grpo")
    full = run(root / "full", *GRPO, "trainer.total_steps=6")
    run(root / "first3", *GRPO, "trainer.total_steps=3")
    return root, full


def test_grpo_resume_auto_logs_what_an_uninterrupted_run_logs(grpo_runs, tmp_path):
    """resume=auto in a copy of the 3-step run's dir, with a half-written step_5.tmp left by a killed save."""
    import shutil

    root, full = grpo_runs
    assert any(abs(r.get("actor/pg_loss", 0.0)) > 1e-4 for r in full) and any(r.get("actor/kl", 0.0) > 0 for r in full)
    assert abs(full[4]["actor/kl_coef"] / 0.05 - 1) > 1e-3  # the coefficient step 4 trains with was saved at step 3
    run_dir = tmp_path / "run"
    shutil.copytree(root / "first3", run_dir)
    (run_dir / "checkpoints" / "step_5.tmp").mkdir()
    rows = run(run_dir, *GRPO, "trainer.total_steps=6", "trainer.resume=auto")
    assert [r["step"] for r in rows] == list(range(7)), "metrics of the first run were lost or a step repeated"
    assert_same_steps(full, rows[4:], range(4, 7))
    assert not any(k.startswith("sft/") for r in rows[4:] for k in r), "the warm-up ran again on resume"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_3", "step_6"]


def test_resume_on_four_ranks_continues_the_two_rank_run(grpo_runs):
    root, full = grpo_runs
    resumed = run(root / "resumed4", *GRPO, "trainer.total_steps=4", "parallel.world_size=4", "parallel.train.tp=2",
                  "rollout.tp=2",  # 2 rollout replicas as in the 2-rank run: the same prompts per replica, the same samples
                  f"trainer.resume={root / 'first3' / 'checkpoints' / 'step_3'}")
    assert_same_steps(full, resumed, range(4, 5), rtol=1e-3)  # dp2 x tp2 sums in another order than dp2


def test_ppo_resume_restores_the_critic(tmp_path):
    proc = run_app(*PPO, "trainer.total_steps=4", "trainer.save_every=2", f"hydra.run.dir={tmp_path / 'full'}",
                   timeout=400)  # keeps step_2 and step_4
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_recipe_outputs(tmp_path / "full", proc.stdout, "ppo_tiny", 4,
                          ["critic/vf_loss", "actor/kl", "actor/kl_coef", "return/mean"])
    full = read_metrics(tmp_path / "full")
    step2 = tmp_path / "full" / "checkpoints" / "step_2"
    resumed = run(tmp_path / "resumed", *PPO, "tracking.wandb_mode=disabled", "trainer.total_steps=4",
                  f"trainer.resume={step2}")
    assert any(abs(r.get("critic/vf_loss", 0.0)) > 0 for r in full)
    assert_same_steps(full, resumed, range(3, 5))
    marker = json.loads((step2 / "COMPLETE").read_text())
    assert marker["engines"] == ["actor", "critic", "reference"] and marker["step"] == 2
