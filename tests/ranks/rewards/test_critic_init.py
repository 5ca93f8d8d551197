"""algorithm.critic_init=reward_model: PPO's critic starts as the reward model (InstructGPT). On 2 gloo ranks (dp2
FSDP), the critic built from a reward model checkpoint gives, at each text's last token, the score transformers'
AutoModelForSequenceClassification gives the text (fp32, < 1e-5), and at earlier tokens the score of each prefix."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from rlhf_dyna.models.tiny_checkpoint import make_tiny_reward_model
from tests.multirank import run_ranks
from tests.ranks.rewards.test_reward_scores import COMPLETIONS, PROMPTS


def _values(rank: int, world: int, path: str, out: str) -> None:
    from rlhf_dyna.config import Config
    from rlhf_dyna.orchestrator.build import build_critic_engine
    from rlhf_dyna.orchestrator.reward_scoring import padded_rows
    from rlhf_dyna.parallel_layout import ParallelLayout
    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer
    from rlhf_dyna.tasks.reward_text import reward_ids
    from rlhf_dyna.train.mesh import build_mesh

    cfg = Config()
    cfg.reward_model.path, cfg.algorithm.critic_init, cfg.algorithm.name = path, "reward_model", "ppo"
    cfg.trainer.precision = "fp32"
    actor = SimpleNamespace(device=torch.device("cpu"), mesh=build_mesh(ParallelLayout(world)))  # where the critic goes
    critic = build_critic_engine(cfg, "unused: the policy's checkpoint", actor)
    tokenizer = HFTokenizer(path)
    rows = [reward_ids(tokenizer, p, c) for p, c in zip(PROMPTS, COMPLETIONS)]
    batch = padded_rows(rows, tokenizer.hf.pad_token_id)
    mine = slice(rank * 3, rank * 3 + 3)  # each dp rank its own rows, as the prepare phase gives them
    values = critic.values(batch["input_ids"][mine], batch["attention_mask"][mine])
    lengths = batch["attention_mask"][mine].sum(-1)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"last": [float(values[i, n - 1]) for i, n in enumerate(lengths)],
                   "prefix": float(values[0, 2])}, f)


def test_critic_from_reward_model_scores_like_it(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer
    from rlhf_dyna.tasks.reward_text import reward_ids
    from tests.ranks.rewards.test_reward_scores import reference_scores

    path = str(make_tiny_reward_model(tmp_path / "rm", initializer_range=0.2))
    out = str(tmp_path / "values")
    run_ranks(_values, 2, path, out)
    want = reference_scores(path)
    got = [json.loads(open(f"{out}.{rank}").read()) for rank in range(2)]
    assert got[0]["last"] + got[1]["last"] == pytest.approx(want, rel=1e-5, abs=1e-5)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    prefix = reward_ids(HFTokenizer(path), PROMPTS[0], COMPLETIONS[0])[:3]
    with torch.no_grad():
        assert abs(float(model(input_ids=torch.tensor([prefix])).logits[0, 0]) - got[0]["prefix"]) < 1e-5
