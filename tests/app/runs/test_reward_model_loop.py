"""End to end: a learned reward in the RL loop (real app: Hydra, spawned gloo ranks, vLLM, FSDP2), on a tiny reward
model made here (a random one-label sequence classifier with the policy checkpoint's tokenizer and chat template).

- The `rm` scores the loop logs (samples.jsonl's reward parts) equal transformers' AutoModelForSequenceClassification
  on the same texts (fp32, < 1e-5), with the reward model on dp2 FSDP and on tp2; the weighted total adds the other
  rewards; reward/rm/mean and timing_s/reward_model are logged.
- Placement changes only time: under lend, the reward model on a rank set of its own ([2, 3] of 4), parked in host
  memory outside the prepare phase, and PPO's critic started from it, the run logs the rewards and losses colocate
  logs (fp32, < 1e-5), and the host copies each step.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint, make_tiny_reward_model
from tests.app.runs.test_file_task import chat_rows, write_jsonl
from tests.app.runtimes.placed_runs import NO_CLIP, assert_same_metrics
from tests.app.app_runs import read_metrics, run_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rm_loop")
    train, evals = chat_rows(16, 0), chat_rows(8, 100)
    return {"policy": make_tiny_checkpoint(root / "policy"), "rm": make_tiny_reward_model(root / "rm", initializer_range=0.2),
            "train": write_jsonl(root / "train.jsonl", train), "eval": write_jsonl(root / "eval.jsonl", evals)}


def file_task(models: dict[str, Path], *extra: str) -> list[str]:
    return ["task=file", f"model.path={models['policy']}", f"reward_model.path={models['rm']}",
            f"task.train_files=[{models['train']}]", f"task.eval_files=[{models['eval']}]", "task.reward=[rm,exact]",
            "task.reward_weights=[1.0,0.5]", "trainer.sft_warmup_steps=0", "rollout.max_new_tokens=8",
            "task.max_prompt_tokens=96", "task.eval_size=4", "trainer.precision=fp32", "tracking.wandb_mode=disabled",
            "trainer.save_last=false", "trainer.export_policy=false", *extra]


def run_ok(run_dir: Path, *args: str) -> list[dict]:
    proc = run_app(*args, f"hydra.run.dir={run_dir}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


def transformers_scores(rm: Path, samples: list[dict]) -> list[float]:
    from transformers import AutoModelForSequenceClassification

    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer
    from rlhf_dyna.tasks.reward_text import reward_ids

    tokenizer, model = HFTokenizer(rm), AutoModelForSequenceClassification.from_pretrained(rm, dtype=torch.float32)
    with torch.no_grad():
        return [float(model(input_ids=torch.tensor([reward_ids(tokenizer, s["prompt"], s["response_text"])])).logits[0, 0])
                for s in samples]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("tp", [1, 2], ids=["dp2", "tp2"])
def test_logged_rm_scores_equal_transformers(tmp_path, models, tp):
    run_dir = tmp_path / "run"
    rows = run_ok(run_dir, *file_task(models, "algorithm=grpo", f"parallel.train.tp={tp}", "trainer.total_steps=1",
                                      "task.prompts_per_step=4", "rollout.n=4", "task.eval_every=1",
                                      "tracking.sample_log=16"))
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16
    want = transformers_scores(models["rm"], samples)
    got = [s["reward_parts"]["rm"] for s in samples]
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert max(want) - min(want) > 1e-2, "samples the reward model cannot tell apart test nothing"
    for s in samples:
        assert s["reward"] == pytest.approx(s["reward_parts"]["rm"] + 0.5 * s["reward_parts"]["exact"], abs=1e-6)
    step = rows[1]
    assert step["reward/rm/mean"] == pytest.approx(sum(got) / len(got), rel=1e-5)
    assert step["timing_s/reward_model"] > 0 and "eval/reward" in step


PPO4 = ["algorithm=ppo", "algorithm.critic_init=reward_model", "parallel.world_size=4", "task.prompts_per_step=8",
        "rollout.n=2", "trainer.total_steps=2", "task.eval_every=2", *NO_CLIP]


@pytest.mark.timeout(1200)
def test_reward_model_on_its_own_set_under_lend_logs_what_colocate_logs(tmp_path, models):
    colocate = run_ok(tmp_path / "colocate", *file_task(models, *PPO4))
    lend = run_ok(tmp_path / "lend", *file_task(models, *PPO4, "placement=lend", "+placement.roles.reward_model=[2,2]",
                                                "reward_model.offload=true"))
    assert all(abs(r["reward/rm/mean"]) > 0 for r in colocate[1:])
    assert_same_metrics(colocate, lend)
    for row in lend[1:]:
        for copy in ("generate_to_prepare", "prepare_to_train_actor"):  # back from host memory to score, and out again
            assert row[f"reshard/reward_model/{copy}/bytes_moved"] > 0, (row["step"], copy)
        assert row["timing_s/reward_model"] > 0
    assert not any(k.startswith("reshard/reward_model/") for r in colocate for k in r)
