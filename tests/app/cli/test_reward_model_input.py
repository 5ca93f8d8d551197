"""Bad input for learned rewards fails before spawn with one paragraph each (a reward model that is not one, `rm`
without a reward model, a preference file without a column, a reward model without the chat template chat prompts
need); pairs whose chosen and rejected are identical are counted, dropped and said, and the run goes on."""
from __future__ import annotations

import json
import time

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint, make_tiny_reward_model
from tests.app.app_runs import run_cli

CHAT = [{"role": "user", "content": "Write a line."}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm_input")
    pairs = [{"prompt": CHAT, "chosen": f"7{i} 77", "rejected": f"{i}"} for i in range(8)]
    same = [{"prompt": CHAT, "chosen": "same", "rejected": "same"}] * 2
    return {
        "policy": make_tiny_checkpoint(root / "policy", num_hidden_layers=1),
        "rm": make_tiny_reward_model(root / "rm", num_hidden_layers=1),
        "rm_no_template": make_tiny_reward_model(root / "rm_no_template", num_hidden_layers=1, chat_template=False),
        "prompts": write_jsonl(root / "prompts.jsonl", [{"prompt": CHAT, "answer": "7"}] * 4),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs + same),
        "no_rejected": write_jsonl(root / "no_rejected.jsonl", [{"prompt": CHAT, "chosen": "7", "worse": "1"}] * 4),
        "all_same": write_jsonl(root / "all_same.jsonl", same),
    }


def ppo_file(s, *extra: str) -> list[str]:
    return ["recipe=ppo_rm_tiny", f"model.path={s['policy']}", f"task.train_files=[{s['prompts']}]",
            f"task.eval_files=[{s['prompts']}]", "task.reward=[rm]", "task.reward_weights=[]", *extra]


def reward_tiny(s, data: str, *extra: str) -> list[str]:
    return ["recipe=reward_tiny", f"model.path={s['policy']}", f"task.train_files=[{s[data]}]", "task.eval_files=[]",
            *extra]


CASES = {
    "rm path missing": (lambda s: ppo_file(s, "reward_model.path=/nonexistent/rm"),
                        "reward_model.path=/nonexistent/rm is not a local HF checkpoint directory (no config.json)"),
    "rm path is a causal LM": (lambda s: ppo_file(s, f"reward_model.path={s['policy']}"),
                               "holds a LlamaForCausalLM (config.json architectures), not a sequence classifier"),
    "rm without path": (lambda s: ppo_file(s, "reward_model.path=null", "algorithm.critic_init=policy"),
                        "task.reward names rm, the score of a reward model, but reward_model.path is not set"),
    "rm on a toy task": (lambda s: ["recipe=grpo_tiny", "task.reward=[rm]", f"reward_model.path={s['rm']}"],
                         "task=arithmetic scores with its own rule"),
    "rm without chat template": (lambda s: ppo_file(s, f"reward_model.path={s['rm_no_template']}",
                                                    "algorithm.critic_init=policy"),
                                 "task.prompt_key holds chat messages but the reward model's tokenizer"),
    "preference column missing": (lambda s: reward_tiny(s, "no_rejected"),
                                  "task.rejected_key='rejected' is not a column of task.train_files"),
    "all pairs identical": (lambda s: reward_tiny(s, "all_same"), "all 2 pairs have identical 'chosen' and 'rejected'"),
    "preference with grpo": (lambda s: reward_tiny(s, "pairs", "algorithm=grpo"),
                             "algorithm.name=grpo with task=preference"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_reward_model_input_is_refused_before_spawn(name, setup, tmp_path):
    args, expected = CASES[name]
    start = time.monotonic()
    proc = run_cli(*args(setup), tmp_path=tmp_path, timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60
    assert not list((tmp_path / "run").rglob("rank*.log")), "a rank was spawned"
    if name == "rm path is a causal LM":  # the paragraph names the class found and what a reward model is
        assert "LlamaForSequenceClassification, num_labels=1" in proc.stderr


def test_identical_pairs_are_counted_dropped_and_said(setup, tmp_path):
    proc = run_cli(*reward_tiny(setup, "pairs", "trainer.total_steps=1", "task.prompts_per_step=2",
                                "task.eval_size=2", "trainer.export_policy=false"), tmp_path=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "dropped 2 of 10 pairs of task.train_files whose chosen and rejected completions are identical" in proc.stdout
