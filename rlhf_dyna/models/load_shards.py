"""Per-shard loading: every rank reads from the checkpoint's safetensors files only the slices its DTensors hold.

A parameter's local slice follows from its DTensor placements and mesh
(`torch.distributed.tensor._utils.compute_local_shape_and_global_offset`); `safe_open(...).get_slice` reads
exactly that box from disk, so no rank ever materialises a full tensor that it holds only a shard of. Onto a GPU
each box is read into pinned host memory and copied with `non_blocking`, so the copy of one box overlaps the read of
the next (`HostToDevice`, a bounded number of bytes in flight); onto the CPU nothing changes.
"""
from __future__ import annotations

import json
from collections import deque
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

    def read_box(self, name: str, shape: tuple[int, ...], offset: tuple[int, ...], pinned: bool = False) -> Tensor:
        """The box [offset, offset + shape) of tensor `name`, read from disk alone (nothing outside it); `pinned`: into
        page-locked memory (the source of a non-blocking copy to a GPU)."""
        index = tuple(slice(o, o + s) for o, s in zip(offset, shape))
        with self._open(name) as f:
            part = f.get_slice(name)
            view = part[index] if index else part[:]
            box = torch.empty_like(view, pin_memory=True).copy_(view) if pinned else view.clone()  # not the mapping
        self.bytes_read += box.numel() * box.element_size()
        return box


class HostToDevice:
    """Copies of host boxes into a rank's tensors. Into CUDA tensors the copy is non-blocking from pinned memory, and
    each pinned box is kept until its copy has completed, at most `inflight_bytes` of them at once; otherwise a plain
    copy. `finish` waits for every copy still running."""

    def __init__(self, inflight_bytes: int = 256 << 20) -> None:
        self.inflight_bytes = inflight_bytes
        self.pending: deque[tuple[Tensor, torch.cuda.Event]] = deque()
        self.held = 0

    def copy_(self, dst: Tensor, box: Tensor) -> None:
        if not (dst.is_cuda and box.is_pinned()):
            dst.copy_(box)
            return
        dst.copy_(box, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.pending.append((box, done))
        self.held += box.numel() * box.element_size()
        while self.held > self.inflight_bytes:
            self._retire()

    def _retire(self) -> None:
        box, done = self.pending.popleft()
        done.synchronize()
        self.held -= box.numel() * box.element_size()

    def finish(self) -> None:
        while self.pending:
            self._retire()


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
    copies = HostToDevice()
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        shape, offset = local_box(param)
        stored = next((name_in_checkpoint(n) for n in names[id(param)] if name_in_checkpoint(n) in ckpt), None)
        if stored is not None:
            if ckpt.shape(stored) != tuple(param.shape):
                raise ValueError(f"{ckpt.path}: {stored} has shape {ckpt.shape(stored)} but the model built from its "
                                 f"config.json has {tuple(param.shape)}; config and weights disagree")
            copies.copy_(local, ckpt.read_box(stored, shape, offset, pinned=local.is_cuda))
        elif moe_weights.is_fused_expert(name) and moe_weights.stored_in(ckpt, name_in_checkpoint(name)):
            local.copy_(moe_weights.read_fused_box(ckpt, name_in_checkpoint(name), shape, offset))
        elif name in extra:
            local.copy_(extra[name][tuple(slice(o, o + s) for o, s in zip(offset, shape))])
        else:
            missing.append(name)
    copies.finish()
    if missing:
        raise ValueError(f"{ckpt.path} lacks weights {missing[:5]} (of {len(missing)} missing); the checkpoint must "
                         f"hold every parameter of the model its config.json describes")
