"""A vLLM-like tensor-parallel destination for Llama-family weights: the local buffers one rollout rank holds
(fused `qkv_proj` = [q_r; k_r; v_r], fused `gate_up_proj` = [gate_r; up_r], row-parallel `o_proj`/`down_proj`,
vocab-parallel embedding / lm_head padded to a multiple of 64 * tp, replicated norms) and, for every HF
source tensor, the parts of it that land in them. Used by benchmarks and baselines as the target of a
train -> rollout transition; the VPS planner's own rollout layouts replace it for planning.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PretrainedConfig

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE


@dataclass(frozen=True)
class Part:
    src: str  # HF name of the full source tensor
    dim: int  # the dimension along which the source is sliced and the destination is placed
    start: int  # [start, stop) of the source along dim
    stop: int
    dst: str  # vLLM parameter name
    offset: int  # where along dim the slice lands in dst

    @property
    def length(self) -> int:
        return self.stop - self.start


def _split(size: int, tp: int, rank: int) -> tuple[int, int]:
    if size % tp:
        raise ValueError(f"tp={tp} does not divide {size}")
    per = size // tp
    return rank * per, (rank + 1) * per


def rollout_parts(config: PretrainedConfig, tp: int, tp_rank: int) -> tuple[dict[str, tuple[int, ...]], list[Part]]:
    """(vLLM local shapes of this TP rank, parts filling them) for a Llama-family config."""
    h, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q_rows, kv_rows = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    padded_vocab = -(-config.vocab_size // (VOCAB_PADDING * tp)) * VOCAB_PADDING * tp
    vocab_lo, vocab_hi = _split(padded_vocab, tp, tp_rank)
    shapes: dict[str, tuple[int, ...]] = {}
    parts: list[Part] = []

    def vocab_parallel(name: str) -> None:
        shapes[name] = (padded_vocab // tp, h)
        stop = min(vocab_hi, config.vocab_size)  # padding rows belong to no logical tensor
        if stop > vocab_lo:
            parts.append(Part(name, 0, vocab_lo, stop, name, 0))

    vocab_parallel("model.embed_tokens.weight")
    if not config.tie_word_embeddings:
        vocab_parallel("lm_head.weight")
    for name in ["model.norm.weight"] + [f"model.layers.{i}.{n}.weight" for i in range(config.num_hidden_layers)
                                         for n in ("input_layernorm", "post_attention_layernorm")]:
        shapes[name] = (h,)
        parts.append(Part(name, 0, 0, h, name, 0))
    for i in range(config.num_hidden_layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        q_lo, q_hi = _split(q_rows, tp, tp_rank)
        kv_lo, kv_hi = _split(kv_rows, tp, tp_rank)
        shapes[f"{attn}.qkv_proj.weight"] = ((q_rows + 2 * kv_rows) // tp, h)
        parts += [Part(f"{attn}.q_proj.weight", 0, q_lo, q_hi, f"{attn}.qkv_proj.weight", 0),
                  Part(f"{attn}.k_proj.weight", 0, kv_lo, kv_hi, f"{attn}.qkv_proj.weight", q_hi - q_lo),
                  Part(f"{attn}.v_proj.weight", 0, kv_lo, kv_hi, f"{attn}.qkv_proj.weight", q_hi - q_lo + kv_hi - kv_lo)]
        shapes[f"{attn}.o_proj.weight"] = (h, q_rows // tp)
        parts.append(Part(f"{attn}.o_proj.weight", 1, q_lo, q_hi, f"{attn}.o_proj.weight", 0))
        i_lo, i_hi = _split(inter, tp, tp_rank)
        shapes[f"{mlp}.gate_up_proj.weight"] = (2 * inter // tp, h)
        parts += [Part(f"{mlp}.gate_proj.weight", 0, i_lo, i_hi, f"{mlp}.gate_up_proj.weight", 0),
                  Part(f"{mlp}.up_proj.weight", 0, i_lo, i_hi, f"{mlp}.gate_up_proj.weight", i_hi - i_lo)]
        shapes[f"{mlp}.down_proj.weight"] = (h, inter // tp)
        parts.append(Part(f"{mlp}.down_proj.weight", 1, i_lo, i_hi, f"{mlp}.down_proj.weight", 0))
    return shapes, parts


class RolloutTarget:
    """This rank's vLLM-like weight buffers and how each HF tensor fills them."""

    def __init__(self, config: PretrainedConfig, tp: int, tp_rank: int, dtype: torch.dtype = torch.float32) -> None:
        self.tp, self.tp_rank = tp, tp_rank
        shapes, parts = rollout_parts(config, tp, tp_rank)
        self.buffers: dict[str, Tensor] = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}
        self.parts_of: dict[str, list[Part]] = {}
        for part in parts:
            self.parts_of.setdefault(part.src, []).append(part)

    def fill(self, src: str, tensor: Tensor, first: int = 0) -> None:
        """Copy the parts of source `src` from `tensor`, which holds the source from index `first` on along each
        part's dim (0 for a full tensor; a TP shard's start for a shard)."""
        for part in self.parts_of[src]:
            piece = tensor.narrow(part.dim, part.start - first, part.length)
            self.buffers[part.dst].narrow(part.dim, part.offset, part.length).copy_(piece)

    def tp_shard_dim(self, src: str) -> int | None:
        """The dim along which this target splits `src` over TP (None: replicated)."""
        return None if src.endswith("norm.weight") else self.parts_of[src][0].dim  # norms are the replicated ones

    def must_receive(self, src: str, shape: tuple[int, ...], held_range: tuple[int, int, int]) -> int:
        """Elements of `src` this rank needs but does not hold, when it holds [lo, hi) of dim `dim` (0 or 1) and
        all of the other dims: held_range = (dim, lo, hi)."""
        dim, lo, hi = held_range
        inner = 1
        for size in shape[2:]:
            inner *= size
        needed = held = 0
        for part in self.parts_of[src]:
            across = shape[1 - part.dim] if len(shape) > 1 else 1  # size of the other of the first two dims
            needed += part.length * across * inner
            if part.dim == dim:
                held += max(0, min(hi, part.stop) - max(lo, part.start)) * across * inner
            else:
                held += (hi - lo) * part.length * inner
        return needed - held
