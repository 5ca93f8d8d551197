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

from tests.e2e.test_recipes import read_metrics, run_app

GRPO = [
    "recipe=grpo_tiny", "trainer.sft_warmup_steps=30", "algorithm.kl_coef=0.05", "trainer.precision=fp32",
    "algorithm.kl_ctrl=adaptive", "algorithm.kl_horizon=200",
    "task.prompts_per_step=8", "rollout.n=4", "task.partial_credit=true", "task.eval_size=16", "task.eval_every=2",
    "tracking.wandb_mode=disabled",
]
PPO = [*(a for a in GRPO if not a.startswith("recipe=")), "recipe=ppo_tiny", "algorithm.kl_in_reward=true"]
COMPARED = ("actor/", "critic/", "reward/", "response_length/", "eval/")
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


def test_grpo_resume_logs_what_an_uninterrupted_run_logs(grpo_runs):
    root, full = grpo_runs
    assert any(abs(r.get("actor/pg_loss", 0.0)) > 1e-4 for r in full) and any(r.get("actor/kl", 0.0) > 0 for r in full)
    assert abs(full[4]["actor/kl_coef"] / 0.05 - 1) > 1e-3  # the coefficient step 4 trains with was saved at step 3
    resumed = run(root / "resumed", *GRPO, "trainer.total_steps=6", f"trainer.resume={root / 'first3'}")
    assert_same_steps(full, resumed, range(4, 7))
    assert not any(k.startswith("sft/") for r in resumed for k in r), "the warm-up ran again on resume"


def test_resume_on_four_ranks_continues_the_two_rank_run(grpo_runs):
    root, full = grpo_runs
    resumed = run(root / "resumed4", *GRPO, "trainer.total_steps=4", "parallel.world_size=4", "parallel.train.tp=2",
                  "rollout.tp=2",  # 2 rollout replicas as in the 2-rank run: the same prompts per replica, the same samples
                  f"trainer.resume={root / 'first3' / 'checkpoints' / 'step_3'}")
    assert_same_steps(full, resumed, range(4, 5), rtol=1e-3)  # dp2 x tp2 sums in another order than dp2


def test_resume_auto_in_the_same_run_dir_appends(grpo_runs, tmp_path):
    root, full = grpo_runs
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(root / "first3", run_dir)
    (run_dir / "checkpoints" / "step_5.tmp").mkdir()  # a run killed while writing step 5
    rows = run(run_dir, *GRPO, "trainer.total_steps=4", "trainer.resume=auto")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4], "metrics of the first run were lost or a step repeated"
    assert_same_steps(full, rows[-1:], range(4, 5))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_3", "step_4"]


def test_ppo_resume_restores_the_critic(tmp_path):
    full = run(tmp_path / "full", *PPO, "trainer.total_steps=4", "trainer.save_every=2")  # keeps step_2 and step_4
    step2 = tmp_path / "full" / "checkpoints" / "step_2"
    resumed = run(tmp_path / "resumed", *PPO, "trainer.total_steps=4", f"trainer.resume={step2}")
    assert any(abs(r.get("critic/vf_loss", 0.0)) > 0 for r in full)
    assert_same_steps(full, resumed, range(3, 5))
    marker = json.loads((step2 / "COMPLETE").read_text())
    assert marker["engines"] == ["actor", "critic", "reference"] and marker["step"] == 2
