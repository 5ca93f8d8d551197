"""End to end: the real app (Hydra, spawned gloo ranks, vLLM rollout, FSDP2 training) on shortened recipes."""
from __future__ import annotations

from tests.app.app_runs import assert_recipe_outputs, run_app


def test_recipe_runs_end_to_end(grpo_tiny_run):
    """grpo_tiny with the VPS sync (the run conftest.grpo_tiny_run shares with test_policy_export); ppo_tiny with the
    naive sync is the first run of tests/app/runs/test_checkpoint_resume.py::test_ppo_resume_restores_the_critic."""
    run_dir, proc = grpo_tiny_run
    assert_recipe_outputs(run_dir, proc.stdout, "grpo_tiny", 2, [])


def test_multirun_sweep_writes_every_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_app("-m", "algorithm.lr=1e-4,3e-4", "trainer.total_steps=1", "trainer.sft_warmup_steps=0", "task.eval_size=16",
                   "task.prompts_per_step=8", "tracking.wandb_mode=disabled", f"hydra.sweep.dir={sweep}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists())
    assert [p.name for p in jobs] == ["0", "1"]
    lrs = [float(next(l for l in (p / "config_resolved.yaml").read_text().splitlines() if l.strip().startswith("lr:")).split()[-1]) for p in jobs]
    assert lrs == [1e-4, 3e-4]
