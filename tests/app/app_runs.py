"""Running the real app (`python -m rlhf_dyna`) as a subprocess and reading what a run writes."""
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
COMPARED = ("actor/", "critic/", "reward/", "response_length/", "eval/")  # what a placement or a resume must not change


def run_app(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlhf_dyna", *args], capture_output=True, text=True, timeout=timeout)


def run_cli(*args: str, tmp_path, timeout: int = 60) -> subprocess.CompletedProcess:
    """The app in tmp_path/run without wandb: for refusals, which must come before any rank starts."""
    cmd = [sys.executable, "-m", "rlhf_dyna", *args, f"hydra.run.dir={tmp_path}/run", "tracking.wandb_mode=disabled"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


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
