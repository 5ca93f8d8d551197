"""Meta-device engines loaded per shard from a real HF checkpoint equal `from_pretrained` exactly, on real gloo ranks."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_dyna.config import Config
from rlhf_dyna.models.build import VALUE_HEAD
from rlhf_dyna.models.meta_init import value_head_init
from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from rlhf_dyna.orchestrator.setup import RankContext, build_actor, build_critic_engine, build_reference
from rlhf_dyna.train.engine import full_state_dict, position_ids_from_mask, token_logprobs
from tests.engines._common import nll_loss
from tests.engines._dist import run_ranks


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(6, vocab, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    response = torch.zeros_like(ids)
    response[:, 6:] = 1
    return {"input_ids": ids, "attention_mask": mask, "response_mask": response}


def _cfg(dp: int, tp: int) -> Config:
    cfg = Config()
    cfg.parallel.train.dp, cfg.parallel.train.tp = dp, tp
    cfg.algorithm.lr = 1e-2
    return cfg


def _check_layouts(rank: int, world: int, ckpt_dir: str, layouts: list[tuple[int, int]], with_critic: bool) -> None:
    hf = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    expected = hf.state_dict()
    total_bytes = sum(t.numel() * 4 for n, t in expected.items() if n != "lm_head.weight" or not hf.config.tie_word_embeddings)
    batch = _batch(hf.config.vocab_size)
    with torch.no_grad():
        mask = batch["attention_mask"]
        want_logp = token_logprobs(hf(input_ids=batch["input_ids"], attention_mask=mask,
                                      position_ids=position_ids_from_mask(mask)).logits, batch["input_ids"])
    for dp, tp in layouts:
        cfg = _cfg(dp, tp)
        actor = build_actor(cfg, ckpt_dir, RankContext(rank=rank, world=world, dp=dp, tp=tp, rollout_tp=1))
        got = dict(full_state_dict(actor))
        assert sorted(got) == sorted(expected), (sorted(set(got) ^ set(expected)))
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), f"{name} differs under dp={dp} tp={tp}"
        # this rank read its shard and nothing else: at most its share plus the tp-replicated norms
        read = actor.materialized.bytes_read
        assert read < total_bytes / (dp * tp) * 1.1 + 2 * hf.config.hidden_size * 4 * (2 * hf.config.num_hidden_layers + 1), \
            f"rank {rank} read {read} of {total_bytes} bytes under dp={dp} tp={tp}"
        for name, param in actor.model.named_parameters():
            assert not param.is_meta and not param.to_local().is_meta, name
        for name, buf in actor.model.named_buffers():
            assert torch.equal(buf, hf.get_buffer(name)), f"buffer {name} not recomputed"
        logp = actor.logprobs(batch["input_ids"], batch["attention_mask"])
        torch.testing.assert_close(logp, want_logp, rtol=1e-5, atol=1e-5)
        actor.step(batch, nll_loss)  # the reference copies the actor as it is now, not the checkpoint
        reference = build_reference(cfg, ckpt_dir, actor)
        trained = dict(full_state_dict(actor))
        for name, tensor in full_state_dict(reference):
            assert torch.equal(tensor, trained[name]), f"reference {name} differs from the actor"
        assert not torch.equal(trained["model.norm.weight"], expected["model.norm.weight"])
        if with_critic:
            critic = build_critic_engine(cfg, ckpt_dir, actor)
            head = value_head_init(hf.config, torch.float32, seed=cfg.trainer.seed + 1)
            for name, tensor in full_state_dict(critic):
                want = head[name] if name.startswith(VALUE_HEAD) else expected[name]
                assert torch.equal(tensor, want), f"critic {name} differs"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    single = make_tiny_checkpoint(root / "single", seed=1, initializer_range=0.2)
    tied = make_tiny_checkpoint(root / "tied", seed=2, tie_word_embeddings=True, dtype=torch.bfloat16)
    multi = root / "multi"  # several files + model.safetensors.index.json, as real checkpoints ship
    AutoModelForCausalLM.from_pretrained(tied).save_pretrained(multi, max_shard_size="150KB")
    assert (multi / "model.safetensors.index.json").exists() and len(list(multi.glob("*.safetensors"))) >= 2
    return {"single": str(single), "tied": str(tied), "multi": str(multi)}


def test_two_ranks_dp_and_tp_with_critic(checkpoints):
    run_ranks(_check_layouts, 2, checkpoints["single"], [(2, 1), (1, 2)], True)


def test_four_ranks_tied_bf16_multi_file_dp_x_tp(checkpoints):
    run_ranks(_check_layouts, 4, checkpoints["multi"], [(2, 2), (4, 1)], False)
