"""Meta-device engines loaded per shard from a real HF checkpoint equal `from_pretrained` exactly, on real gloo ranks."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf_dyna.config import Config
from rlhf_dyna.models.build import VALUE_HEAD
from rlhf_dyna.models.meta_init import value_head_init
from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from rlhf_dyna.orchestrator.build import build_actor, build_critic_engine, build_reference
from rlhf_dyna.train.engine import full_state_dict, position_ids_from_mask, token_logprobs
from rlhf_dyna.train.mesh import build_mesh
from tests.ranks.tiny_models import nll_loss
from tests.multirank import run_ranks


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(6, vocab, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    response = torch.zeros_like(ids)
    response[:, 6:] = 1
    return {"input_ids": ids, "attention_mask": mask, "response_mask": response}


def _cfg(dp: int, tp: int, zero: int) -> Config:
    cfg = Config()
    cfg.parallel.train.dp, cfg.parallel.train.tp, cfg.parallel.train.zero = dp, tp, zero
    cfg.parallel.world_size = dp * tp
    cfg.algorithm.lr = 1e-2
    return cfg


def _check_layouts(rank: int, world: int, ckpt_dir: str, layouts: list[tuple[int, int, int]], with_critic: bool,
                   stored_dtype: torch.dtype) -> None:
    hf = AutoModelForCausalLM.from_pretrained(ckpt_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    expected = hf.state_dict()
    batch = _batch(hf.config.vocab_size)
    with torch.no_grad():
        mask = batch["attention_mask"]
        want_logp = token_logprobs(hf(input_ids=batch["input_ids"], attention_mask=mask,
                                      position_ids=position_ids_from_mask(mask)).logits, batch["input_ids"])
    for dp, tp, zero in layouts:
        cfg = _cfg(dp, tp, zero)
        actor = build_actor(cfg, ckpt_dir, build_mesh(cfg.parallel.train_layout()))
        got = dict(full_state_dict(actor))
        assert sorted(got) == sorted(expected), (sorted(set(got) ^ set(expected)))
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), f"{name} differs under dp={dp} tp={tp}"
        # this rank read exactly its shards (tp-replicated norms whole) and nothing else
        stored_size = torch.finfo(stored_dtype).bits // 8
        own = sum(p.to_local().numel() for p in actor.model.parameters()) * stored_size
        assert actor.materialized.bytes_read == own, f"rank {rank} read {actor.materialized.bytes_read} bytes, its shards are {own}"
        for name, param in actor.model.named_parameters():  # every sharded parameter holds (and read) less than its whole
            sharded_over = [param.device_mesh.size(i) for i, pl in enumerate(param.placements) if pl.is_shard()]
            assert param.to_local().numel() * max(sharded_over, default=1) <= param.numel() + param.numel() // 2, name
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
    qwen2 = make_tiny_checkpoint(root / "qwen2", arch="qwen2", seed=3)  # q/k/v biases: column-parallel shards too
    return {"single": str(single), "tied": str(tied), "multi": str(multi), "qwen2": str(qwen2)}


def test_two_ranks_dp_and_tp_with_critic(checkpoints):
    run_ranks(_check_layouts, 2, checkpoints["single"], [(2, 1, 3), (1, 2, 3), (2, 1, 2)], True, torch.float32)


def test_four_ranks_tied_bf16_multi_file_dp_x_tp(checkpoints):
    run_ranks(_check_layouts, 4, checkpoints["multi"], [(2, 2, 3), (4, 1, 3)], False, torch.bfloat16)


def test_two_ranks_qwen2_biases_tp(checkpoints):
    run_ranks(_check_layouts, 2, checkpoints["qwen2"], [(1, 2, 3)], False, torch.float32)
