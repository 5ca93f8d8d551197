"""State movers: move live training state from one layout's tensors into another's.

A mover gets two dicts keyed alike, (HF name, kind) -> live tensor (DTensor shards of the source layout, and
allocated DTensor shards of the destination layout), and fills the destination. It is collective: every rank
calls it with the keys of the whole model. The VPS executor is one such mover; this file holds torch's.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

StateKey = tuple[str, str]  # (HF parameter name, kind: "param" | "exp_avg" | "exp_avg_sq")


@dataclass(frozen=True)
class MoveStats:
    seconds: float  # wall time on this rank
    bytes_received: int  # bytes this rank received from other ranks
    rounds: int  # communication rounds
    peak_extra_bytes: int  # most bytes of transfer buffers alive at once on this rank


StateMover = Callable[[Mapping[StateKey, Tensor], Mapping[StateKey, Tensor]], MoveStats]


def nbytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def local_of(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def move_by_full_tensors(source: Mapping[StateKey, Tensor], destination: Mapping[StateKey, Tensor]) -> MoveStats:
    """The naive mover: gather each tensor whole on every rank, keep the destination's slice, free the rest.

    One tensor at a time, so extra memory stays at one full tensor plus its slice."""
    start = time.perf_counter()
    received, peak = 0, 0
    keys = sorted(destination)  # same order on every rank: each gather is a collective on the source mesh
    for key in keys:
        src, dst = source[key], destination[key]
        full = src.full_tensor() if isinstance(src, DTensor) else src.detach()
        received += nbytes(full) - nbytes(local_of(src))  # what this rank already held is not moved
        if isinstance(dst, DTensor):
            piece = distribute_tensor(full, dst.device_mesh, dst.placements, src_data_rank=None).to_local()
        else:
            piece = full
        local_of(dst).copy_(piece)
        peak = max(peak, nbytes(full) + (nbytes(piece) if piece is not full else 0))
        del full, piece
    return MoveStats(seconds=time.perf_counter() - start, bytes_received=received, rounds=len(keys), peak_extra_bytes=peak)
