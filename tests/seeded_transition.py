"""Synthetic training state for executor tests: every rank's buffers filled from one seeded logical state, and the
check that a destination holds exactly that state."""
from __future__ import annotations

import torch
from transformers import Qwen3Config

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.vps.layout import Layout, build_layout
from rlhf_dyna.vps.plan import build_plan
from rlhf_dyna.vps.schedule import build_schedule
from rlhf_dyna.vps.spec import ParallelSpec

# tp=2 > num_kv_heads=1 (KV replication in the rollout layout); vocab 70 -> padded 128; odd FSDP chunks.
CONFIG = Qwen3Config(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=1, head_dim=4, vocab_size=70, tie_word_embeddings=False)
CONFIGS = {"kv1": CONFIG, "kv2": Qwen3Config(**{**CONFIG.to_dict(), "num_key_value_heads": 2})}  # train TP needs tp | kv heads


def logical_state(layout: Layout, seed: int = 0) -> dict[tuple[str, str], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {(e.tensor.name, e.tensor.kind.value): torch.randn(e.tensor.shape, generator=g) for e in layout.entries}


def local_buffers(layout: Layout, state, rank: int, fill: bool) -> dict[str, torch.Tensor]:
    """This rank's buffers (shaped as the layout says); filled from the logical state or zero."""
    bufs = {n: torch.zeros(b.shape, dtype=TORCH_DTYPES[b.dtype]) for n, b in layout.buffers(rank).items()}
    if fill:
        for p in layout.pieces(rank):
            flat = bufs[p.buffer].view(-1)
            flat.as_strided(p.box.shape, p.strides, p.offset).copy_(state[(p.tensor.name, p.tensor.kind.value)][_box(p.box)])
    return bufs


def _box(box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in zip(box.lo, box.hi))


def expect_destination(layout: Layout, state, rank: int, bufs: dict[str, torch.Tensor]) -> None:
    """Every piece equals the logical state (in the destination dtype); bytes outside pieces stay zero."""
    covered = {n: torch.zeros(b.numel(), dtype=torch.bool) for n, b in bufs.items()}
    for p in layout.pieces(rank):
        got = bufs[p.buffer].view(-1).as_strided(p.box.shape, p.strides, p.offset)
        want = state[(p.tensor.name, p.tensor.kind.value)][_box(p.box)].to(got.dtype)
        assert torch.equal(got, want), f"rank {rank}: {p.tensor.name}/{p.tensor.kind.value} {p.box} differs"
        covered[p.buffer].as_strided(p.box.shape, p.strides, p.offset).fill_(True)
    for n, mask in covered.items():
        assert not bufs[n].view(-1)[~mask].any(), f"rank {rank}: {n} written outside its pieces (vocab padding?)"


def seeded_transition(rank: int, src_spec: ParallelSpec, dst_spec: ParallelSpec, budget: int,
                      dst_param_dtype: str = "float32", config: str = "kv2"):
    """(source layout, destination layout, schedule, logical state, this rank's filled source buffers, its zeroed
    destination buffers) of a move between two specs of CONFIGS[config]."""
    src = build_layout(catalog_from_config(CONFIGS[config], "float32", "float32"), src_spec)
    dst = build_layout(catalog_from_config(CONFIGS[config], dst_param_dtype, "float32"), dst_spec)
    schedule = build_schedule(build_plan(src, dst, ranks_per_node=8), budget)
    state = logical_state(src)
    return src, dst, schedule, state, local_buffers(src, state, rank, True), local_buffers(dst, state, rank, False)
