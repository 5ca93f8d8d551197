"""A vLLM-like destination with no engine behind it: the local buffers one rollout rank holds in the VPS rollout
layout (`rlhf_dyna.vps.rollout_layout`, the one description of vLLM's layout: fused `qkv_proj` / `gate_up_proj`,
padded vocab-parallel rows, row-parallel columns, replicated norms) and, for every HF tensor, the pieces of it that
land in them. The benchmark's baselines (naive, redistribute) fill it from full or TP-sliced tensors; the
`vllm_like` rows of scripts/bench_reshard.py move into it. The real engine's rows use `rlhf_dyna.rollout`.
"""
from __future__ import annotations

import torch
from torch import Tensor
from transformers import PretrainedConfig

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.layout_types import Piece
from rlhf_dyna.vps.spec import rollout_spec
from rlhf_dyna.vps.tensor import Kind

DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


class RolloutTarget:
    """This rank's vLLM-like weight buffers (zeros: vLLM loads padding rows as 0) and how each HF tensor fills them."""

    def __init__(self, config: PretrainedConfig, tp: int, tp_rank: int, dtype: torch.dtype = torch.float32) -> None:
        self.tp, self.tp_rank = tp, tp_rank
        layout = build_layout(catalog_from_config(config, DTYPE_NAMES[dtype]), rollout_spec(tp, 1), (Kind.PARAM,))
        self.buffers: dict[str, Tensor] = {n: torch.zeros(b.shape, dtype=dtype) for n, b in layout.buffers(tp_rank).items()}
        self.pieces_of: dict[str, list[Piece]] = {}
        for piece in layout.pieces(tp_rank):  # one replica (vllm_dp=1): every replica holds the same
            self.pieces_of.setdefault(piece.tensor.name, []).append(piece)

    def tp_shard_dim(self, src: str) -> int | None:
        """The dim along which this target splits `src` over TP (None: replicated)."""
        piece = self.pieces_of[src][0]
        return next((d for d, (lo, hi) in enumerate(zip(piece.box.lo, piece.box.hi)) if hi - lo != piece.tensor.shape[d]), None)

    def fill(self, src: str, tensor: Tensor, first: int = 0) -> None:
        """Copy the pieces of source `src` from `tensor`, which holds the source from index `first` on along its TP
        dim (0 for a full tensor; a TP shard's start for a shard) and all of every other dim."""
        dim = self.tp_shard_dim(src)
        for piece in self.pieces_of[src]:
            view = tensor
            for d, (lo, hi) in enumerate(zip(piece.box.lo, piece.box.hi)):
                view = view.narrow(d, lo - (first if d == dim else 0), hi - lo)
            flat = self.buffers[piece.buffer].view(-1)
            flat.as_strided(view.shape, piece.strides, piece.offset).copy_(view)
