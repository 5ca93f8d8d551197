"""End to end: the real app (Hydra, spawned gloo ranks, vLLM rollout, FSDP2 training) on shortened recipes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SHORT = ["trainer.total_steps=2", "trainer.sft_warmup_steps=2", "task.eval_size=16", "task.eval_every=1"]
REQUIRED = [
    "timing_s/gen", "timing_s/train", "timing_s/weight_sync", "reshard/train_to_rollout/seconds",
    "reshard/train_to_rollout/bytes_moved", "reward/mean", "eval/accuracy", "actor/pg_loss", "response_length/mean",
    "response_length/max", "response_length/clip_ratio", "actor/entropy", "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
    "advantage/mean", "advantage/std", "perf/gen_tokens_per_s", "perf/train_tokens_per_s",
]


def run_app(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlhf_dyna", *args], capture_output=True, text=True, timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_recipe_outputs(run_dir: Path, stdout: str, recipe: str, steps: int, extra_keys: list[str]) -> None:
    """What every run writes: one metrics row per step with the required keys, the resolved config, an offline wandb
    run, and the launch line."""
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(steps + 1))
    for key in REQUIRED + extra_keys:
        assert key in rows[-1], f"{key} missing from {sorted(rows[-1])}"
    assert rows[-1]["reshard/train_to_rollout/bytes_moved"] > 0
    assert 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    assert (run_dir / "config_resolved.yaml").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline wandb run"
    assert f"recipe {recipe}, 2 local ranks" in stdout


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
