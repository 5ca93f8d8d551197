"""End to end: the real app (Hydra, spawned gloo ranks, vLLM rollout, FSDP2 training) on shortened recipes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("recipe,sync,extra_keys", [
    ("grpo_tiny", "vps", []),
    ("ppo_tiny", "naive", ["critic/vf_loss", "actor/kl", "actor/kl_coef", "return/mean"]),
])
def test_recipe_runs_end_to_end(recipe, sync, extra_keys, tmp_path):
    run_dir = tmp_path / recipe
    proc = run_app(f"recipe={recipe}", f"rollout.sync={sync}", *SHORT, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in REQUIRED + extra_keys:
        assert key in rows[-1], f"{key} missing from {sorted(rows[-1])}"
    assert rows[-1]["reshard/train_to_rollout/bytes_moved"] > 0
    assert 0.0 <= rows[-1]["eval/accuracy"] <= 1.0
    assert (run_dir / "config_resolved.yaml").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline wandb run"
    assert f"recipe {recipe}, 2 local ranks" in proc.stdout


def test_multirun_sweep_writes_every_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_app("-m", "algorithm.lr=1e-4,3e-4", "trainer.total_steps=1", "trainer.sft_warmup_steps=0", "task.eval_size=16",
                   "tracking.wandb_mode=disabled", f"hydra.sweep.dir={sweep}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists())
    assert [p.name for p in jobs] == ["0", "1"]
    lrs = [float(next(l for l in (p / "config_resolved.yaml").read_text().splitlines() if l.strip().startswith("lr:")).split()[-1]) for p in jobs]
    assert lrs == [1e-4, 3e-4]
