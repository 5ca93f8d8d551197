"""Worker for the vLLM live-agreement test: vLLM's own model classes and weight loaders on gloo ranks.

vLLM's CPU backend repacks linear weights in process_weights_after_loading, so the check runs right
after `model.load_weights` (the loaders that put checkpoint tensors into vLLM's fused, padded, TP-
sharded parameters) and before any repack: that is the layout a GPU engine keeps.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3MoeConfig

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.model import Role, expert_checkpoint_name
from rlhf_dyna.vps.spec import ParallelSpec, Phase

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
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config

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


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    root = Path(sys.argv[1])
    if rank == 0:
        for arch, cfg in MODELS.items():
            cfg.save_pretrained(root / arch)
        (root / "ready").touch()
    while not (root / "ready").exists():
        time.sleep(0.1)
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    vc = VllmConfig(model_config=ModelConfig(model=str(root / "qwen3_moe"), skip_tokenizer_init=True, dtype="float32"),
                    parallel_config=ParallelConfig(tensor_parallel_size=world))
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}")
        initialize_model_parallel(tensor_model_parallel_size=world)
    for arch, ep in (("qwen3", False), ("qwen3_moe", False), ("qwen3_moe", True)):
        n = check(arch, root / arch, rank, world, ep)
        print(f"{arch} ep={ep}: rank {rank} checked {n} pieces", flush=True)


if __name__ == "__main__":
    main()
