"""transformers 5 fuses a layer's experts into `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I];
checkpoints (and vLLM's loader) name them per expert: `experts.{e}.gate_proj.weight` [I, H], `up_proj`, `down_proj`.

This module maps between the two, for saving (fused -> per expert) and for per-shard loading (a box of the fused
tensor read from the per-expert tensors it covers, nothing else)."""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

import torch
from torch import Tensor

FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")


class BoxReader(Protocol):
    def __contains__(self, name: str) -> bool: ...
    def read_box(self, name: str, shape: tuple[int, ...], offset: tuple[int, ...]) -> Tensor: ...


def is_fused_expert(name: str) -> bool:
    return FUSED.match(name) is not None


def per_expert_pairs(name: str, fused: Tensor) -> Iterator[tuple[str, Tensor]]:
    """Checkpoint names and tensors of one fused expert parameter (gate rows first in gate_up_proj, as HF's forward
    chunks it)."""
    m = FUSED.match(name)
    prefix = m["prefix"]
    for e in range(fused.shape[0]):
        if m["proj"] == "down_proj":
            yield f"{prefix}.{e}.down_proj.weight", fused[e]
        else:
            gate, up = fused[e].chunk(2, dim=0)
            yield f"{prefix}.{e}.gate_proj.weight", gate
            yield f"{prefix}.{e}.up_proj.weight", up


def to_checkpoint_names(pairs: Iterable[tuple[str, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """Model state (HF parameter names) -> checkpoint names that transformers and vLLM load."""
    for name, tensor in pairs:
        if is_fused_expert(name):
            yield from per_expert_pairs(name, tensor)
        else:
            yield name, tensor


def stored_in(ckpt: BoxReader, name: str) -> bool:
    """Whether the checkpoint holds the fused parameter `name` per expert (expert 0 present is enough to try)."""
    m = FUSED.match(name)
    first = "down_proj" if m["proj"] == "down_proj" else "gate_proj"
    return f"{m['prefix']}.0.{first}.weight" in ckpt


def read_fused_box(ckpt: BoxReader, name: str, shape: tuple[int, ...], offset: tuple[int, ...]) -> Tensor:
    """The box [offset, offset + shape) of fused parameter `name` [E, rows, cols], read expert by expert."""
    m = FUSED.match(name)
    prefix = m["prefix"]
    (n_e, n_r, n_c), (e0, r0, c0) = shape, offset
    experts = []
    for e in range(e0, e0 + n_e):
        if m["proj"] == "down_proj":
            experts.append(ckpt.read_box(f"{prefix}.{e}.down_proj.weight", (n_r, n_c), (r0, c0)))
            continue
        half = ckpt_rows(ckpt, f"{prefix}.{e}.gate_proj.weight")
        parts = []
        for proj, lo in (("gate_proj", 0), ("up_proj", half)):  # rows [0, I) are gate, [I, 2I) are up
            start, stop = max(r0, lo), min(r0 + n_r, lo + half)
            if start < stop:
                parts.append(ckpt.read_box(f"{prefix}.{e}.{proj}.weight", (stop - start, n_c), (start - lo, c0)))
        experts.append(torch.cat(parts, dim=0))
    return torch.stack(experts)


def ckpt_rows(ckpt: BoxReader, name: str) -> int:
    return ckpt.shape(name)[0]
