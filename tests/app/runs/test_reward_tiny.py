"""End to end: recipe=reward_tiny trains a reward model from a tiny causal LM checkpoint on the shipped pairs (more
sevens preferred, examples/sevens.py) to >= 90 % held-out pair accuracy; its export opens with transformers'
AutoModelForSequenceClassification and prefers what the pairs prefer; a run resumed from its checkpoint logs what the
uninterrupted run logs."""
from __future__ import annotations


import pytest
import torch

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from tests.app.runs.test_checkpoint_resume import compared
from tests.app.app_runs import read_metrics, run_app


def run_ok(run_dir, *args: str) -> list[dict]:
    proc = run_app("recipe=reward_tiny", *args, "tracking.wandb_mode=disabled", f"hydra.run.dir={run_dir}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return read_metrics(run_dir)


@pytest.mark.timeout(900)
def test_reward_tiny_learns_the_preference_and_exports_a_classifier(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = make_tiny_checkpoint(tmp_path / "base")
    rows = run_ok(tmp_path / "run", f"model.path={base}", "trainer.total_steps=40", "task.eval_every=40")
    assert rows[0]["eval/accuracy"] < 0.75 and rows[-1]["eval/accuracy"] >= 0.9, [r.get("eval/accuracy") for r in rows]
    assert rows[-1]["reward_model/loss"] < rows[1]["reward_model/loss"]
    export = tmp_path / "run" / "reward_model"
    model = AutoModelForSequenceClassification.from_pretrained(export, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1

    def score(text: str) -> float:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": "Go on."},
                                              {"role": "assistant", "content": text}], tokenize=False)
        with torch.no_grad():
            return float(model(**tokenizer(chat, return_tensors="pt", add_special_tokens=False)).logits[0, 0])

    assert score(" 77 7 17 70 7") > score(" 12 ab 88 0 3")

    # resumed from its step-2 checkpoint, a run logs steps 3 and 4 as the uninterrupted one does
    short = ["trainer.total_steps=4", "task.eval_every=2", "trainer.save_every=2", "trainer.precision=fp32",
             "trainer.export_policy=false", f"model.path={base}"]
    whole = run_ok(tmp_path / "whole", *short)
    resumed = run_ok(tmp_path / "resumed", *short, f"trainer.resume={tmp_path / 'whole' / 'checkpoints' / 'step_2'}")
    assert [r["step"] for r in resumed] == [3, 4]
    for want, got in zip(whole[3:], resumed):
        assert compared(got) == pytest.approx(compared(want), rel=1e-5, abs=1e-6)
        assert got["reward_model/loss"] == pytest.approx(want["reward_model/loss"], rel=1e-5)
