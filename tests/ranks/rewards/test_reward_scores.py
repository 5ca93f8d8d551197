"""The reward model's scores on 2 gloo ranks, dp2 FSDP and tp2, equal transformers' AutoModelForSequenceClassification
on each text alone (fp32, < 1e-5): per-shard loading, right padding of a batch of unequal lengths, and the gather of
every dp rank's share to every rank."""
from __future__ import annotations

import json

import pytest
import torch

from rlhf_dyna.models.tiny_checkpoint import make_tiny_reward_model
from tests.multirank import run_ranks

PROMPTS = ["What is 3 + 4?", [{"role": "user", "content": "Write a number with sevens."}], "Say 77",
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to 3."}], "Hi", "7 7 7"]
COMPLETIONS = [" 7", "777 and 17", " seventy-seven, 77", "1 2 3", "", " 12"]


def reference_scores(path: str) -> list[float]:
    """transformers, one text at a time (no padding at all)."""
    from transformers import AutoModelForSequenceClassification

    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer
    from rlhf_dyna.tasks.reward_text import reward_ids

    tokenizer, model = HFTokenizer(path), AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return [float(model(input_ids=torch.tensor([reward_ids(tokenizer, p, c)])).logits[0, 0])
                for p, c in zip(PROMPTS, COMPLETIONS)]


def _score(rank: int, world: int, path: str, tp: int, out: str) -> None:
    from rlhf_dyna.config import Config
    from rlhf_dyna.orchestrator.build import build_reward_engine
    from rlhf_dyna.orchestrator.reward_scoring import score_rows
    from rlhf_dyna.parallel_layout import ParallelLayout
    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer
    from rlhf_dyna.tasks.reward_text import reward_ids
    from rlhf_dyna.train.mesh import build_mesh

    cfg = Config()
    cfg.reward_model.path, cfg.trainer.precision, cfg.algorithm.micro_batch_size = path, "fp32", 2
    engine = build_reward_engine(cfg, build_mesh(ParallelLayout(world // tp, tp)))
    tokenizer = HFTokenizer(path)
    rows = [reward_ids(tokenizer, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    scores = score_rows(engine, rows, len(rows), engine.model.config.pad_token_id)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(scores, f)


@pytest.mark.parametrize("tp", [1, 2], ids=["dp2", "tp2"])
def test_sharded_scores_equal_transformers(tmp_path, tp):
    path = str(make_tiny_reward_model(tmp_path / "rm", initializer_range=0.2))
    out = str(tmp_path / "scores")
    run_ranks(_score, 2, path, tp, out)
    want = reference_scores(path)
    assert max(want) - min(want) > 1e-2, "texts the model cannot tell apart test nothing"
    for rank in range(2):
        got = json.loads(open(f"{out}.{rank}").read())
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5), (rank, got, want)
