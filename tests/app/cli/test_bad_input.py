"""Bad input fails fast, with one clear paragraph, non-zero, before any rank is spawned."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.app.app_runs import run_cli

CASES = [
    (["recipe=grpo_tin"], "Unknown recipe 'grpo_tin'. Did you mean 'grpo_tiny'?"),
    (["algorithm.lrr=1e-4"], "Did you mean 'algorithm.lr'?"),
    (["paralel.world_size=2"], "Did you mean 'parallel'?"),
    (["parallel.train.tp=3"], "tp*pp*cp = 3*1*1 = 3 does not divide parallel.world_size=2"),
    (
        ["model.num_attention_heads=3", "model.num_key_value_heads=1", "model.hidden_size=48", "parallel.train.tp=2"],
        "parallel.train.tp=2 does not divide num_attention_heads=3; valid parallel.train.tp: [1, 3]",
    ),
    (["rollout.tp=3"], "rollout.tp=3 does not divide num_attention_heads=4"),
    (["parallel.world_size=3", "rollout.tp=2"], "rollout.tp=2 does not divide parallel.world_size=3"),
    (["parallel.world_size=512", "task.prompts_per_step=512"], "512"),
    (["model.path=/nonexistent/ckpt"], "model.path=/nonexistent/ckpt is not a local HF checkpoint directory"),
    (["recipe=grpo_70b"], "needs 128 CUDA devices"),
    (["algorithm.name=dpo"], "algorithm.name='dpo' is not a valid choice; valid: grpo, ppo"),
    (["rollout.n=0"], "rollout.n=0 is out of range; it must be an integer >= 1"),
    (["algorithm.lr=-1"], "algorithm.lr=-1.0 is out of range; it must be > 0"),
    (["task.prompts_per_step=0"], "task.prompts_per_step=0 is out of range"),
    (["rollout.temperature=0"], "rollout.temperature=0 (greedy) with rollout.n=8 draws 8 identical samples"),
    (["rollout.max_new_tokens=0"], "rollout.max_new_tokens=0 is out of range"),
    (["algorithm.micro_batch_size=0"], "algorithm.micro_batch_size=0 is out of range"),
    (["parallel.train.ep=2"], "parallel.train.ep=2 on a dense model"),
    (["recipe=ppo_235b_moe", "model.path=null", "parallel.device=cpu", "parallel.world_size=8", "rollout.tp=4",
      "parallel.train.tp=4", "parallel.nodes=1", "task.prompts_per_step=8"], "does not run live yet"),
    (["parallel.world_size=4", "parallel.train.cp=2"], "parallel.train.cp=2 does not run live yet"),
    (["parallel.world_size=4", "parallel.train.pp=4"], "pp=4 exceeds model.num_hidden_layers=2"),
    (["rollout.n=1"], "GRPO's baseline is the mean reward of a prompt's group"),
    (["algorithm.adv_estimator=gae"], "gae needs the critic that only algorithm.name=ppo trains"),
    (["algorithm.mini_batches=3"], "do not split into algorithm.mini_batches=3 x dp=2 equal shards"),
    (["tracking.console=loud"], "tracking.console='loud' is not a valid choice; valid: progress, plain, verbose, off"),
    (["rollout.max_model_len=100"], "rollout.max_model_len=100 exceeds the model's max_position_embeddings=64 "
                                    "(model.max_position_embeddings)"),
    (["rollout.kv_cache_bytes=1000"], "rollout.kv_cache_bytes=1,000 cannot hold one sequence"),
]


@pytest.mark.parametrize("args,expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_refused_before_spawning(args, expected, tmp_path):
    start = time.monotonic()
    proc = run_cli(*args, tmp_path=tmp_path)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert elapsed < 30
    assert not list((tmp_path / "run").rglob("rank*.log")), "a rank was spawned"


def test_dry_run_still_plans_what_does_not_run_live(tmp_path):
    # planning imports torch and the model catalogs: ~8 s of CPU, ~45 s on a 2-core machine at load 20
    proc = run_cli("dry_run=true", "parallel.world_size=4", "parallel.train.pp=2", tmp_path=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "transition(s) planned" in proc.stdout


def test_wrong_type_is_refused(tmp_path):
    proc = run_cli("algorithm.lr=fast", tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "algorithm.lr" in proc.stderr


def test_help_lists_groups_and_recipes(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rlhf_dyna", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for group in ("model:", "parallel:", "algorithm:", "rollout:", "task:", "tracking:", "recipe:"):
        assert group in proc.stdout
    for recipe in ("grpo_tiny", "ppo_tiny", "grpo_file", "grpo_7b", "grpo_70b", "ppo_235b_moe"):
        assert recipe in proc.stdout
