"""Per-shard loading: every rank reads from the checkpoint's safetensors files only the slices its DTensors hold.

A parameter's local slice follows from its DTensor placements and mesh
(`torch.distributed.tensor._utils.compute_local_shape_and_global_offset`); `safe_open(...).get_slice` reads
exactly that box from disk, so no rank ever materialises a full tensor that it holds only a shard of.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from . import moe_weights

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def local_box(param: Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(local shape, global offset) of this rank's part of `param`: its DTensor shard, or all of a plain tensor."""
    if isinstance(param, DTensor):
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        if tuple(shape) != tuple(param.to_local().shape):  # a placement whose shard is not one box would land here
            raise ValueError(f"local shard {tuple(param.to_local().shape)} is not the box {tuple(shape)} that placements "
                             f"{param.placements} give; per-shard loading needs each shard to be one contiguous box")
        return tuple(shape), tuple(offset)
    return tuple(param.shape), (0,) * param.dim()


@dataclass
class SafetensorsCheckpoint:
    """The weights of an HF checkpoint directory: one model.safetensors or several files named by the index json."""

    path: Path
    file_of: dict[str, str] = field(default_factory=dict)  # tensor name -> file name inside `path`
    bytes_read: int = 0  # sum of the slices read so far, as stored on disk (before any dtype cast)

    @classmethod
    def open(cls, path: str | Path) -> SafetensorsCheckpoint:
        path = Path(path)
        if (path / INDEX_FILE).exists():
            file_of = dict(json.loads((path / INDEX_FILE).read_text())["weight_map"])
        elif (path / SINGLE_FILE).exists():
            with safe_open(str(path / SINGLE_FILE), framework="pt") as f:
                file_of = {name: SINGLE_FILE for name in f.keys()}
        else:
            raise FileNotFoundError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}; a model.path must be an HF "
                                    f"checkpoint directory with safetensors weights")
        return cls(path=path, file_of=file_of)

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def _open(self, name: str):
        # opened per tensor: safe_open maps the file, and pages a slice touched stay resident until it is unmapped
        # (kept open per file, as DCP's HuggingFaceStorageReader does, the bench's per-shard peak exceeded its bound)
        return safe_open(str(self.path / self.file_of[name]), framework="pt")

    def shape(self, name: str) -> tuple[int, ...]:
        with self._open(name) as f:
            return tuple(f.get_slice(name).get_shape())

    def read_box(self, name: str, shape: tuple[int, ...], offset: tuple[int, ...]) -> Tensor:
        """The box [offset, offset + shape) of tensor `name`, read from disk alone (nothing outside it)."""
        index = tuple(slice(o, o + s) for o, s in zip(offset, shape))
        with self._open(name) as f:
            part = f.get_slice(name)
            box = (part[index] if index else part[:]).clone()  # own memory, not a view of the mapping
        self.bytes_read += box.numel() * box.element_size()
        return box


@torch.no_grad()
def load_shards_(model: nn.Module, ckpt: SafetensorsCheckpoint, extra: Mapping[str, Tensor] = (),
                 name_in_checkpoint=lambda name: name) -> None:
    """Fill every (already materialised) parameter of `model` with its local slice from `ckpt`, cast to its dtype.

    Tied parameters are loaded once, under whichever of their names the checkpoint stores. `extra` gives full tensors
    for parameters the checkpoint does not have (e.g. a critic's freshly initialised value head); they are small."""
    extra = dict(extra)
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    missing = []
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        shape, offset = local_box(param)
        stored = next((name_in_checkpoint(n) for n in names[id(param)] if name_in_checkpoint(n) in ckpt), None)
        if stored is not None:
            if ckpt.shape(stored) != tuple(param.shape):
                raise ValueError(f"{ckpt.path}: {stored} has shape {ckpt.shape(stored)} but the model built from its "
                                 f"config.json has {tuple(param.shape)}; config and weights disagree")
            local.copy_(ckpt.read_box(stored, shape, offset))
        elif moe_weights.is_fused_expert(name) and moe_weights.stored_in(ckpt, name_in_checkpoint(name)):
            local.copy_(moe_weights.read_fused_box(ckpt, name_in_checkpoint(name), shape, offset))
        elif name in extra:
            local.copy_(extra[name][tuple(slice(o, o + s) for o, s in zip(offset, shape))])
        else:
            missing.append(name)
    if missing:
        raise ValueError(f"{ckpt.path} lacks weights {missing[:5]} (of {len(missing)} missing); the checkpoint must "
                         f"hold every parameter of the model its config.json describes")
