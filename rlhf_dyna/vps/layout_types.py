"""Rank-local views of a layout: buffers and the pieces of logical tensors they hold."""
from __future__ import annotations

from dataclasses import dataclass

from .box import Box
from .geometry import Geometry
from .tensor import LogicalTensor


@dataclass(frozen=True, slots=True)
class Buffer:
    """A rank-local tensor (an FSDP shard, vLLM's fused qkv_proj, ...) holding one or more pieces."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Piece:
    """Box `box` of `tensor` stored in local buffer `buffer`, starting at element `offset`.

    `strides` are the element strides, inside the buffer, of the box's dimensions.
    """

    tensor: LogicalTensor
    box: Box
    buffer: str
    offset: int
    strides: tuple[int, ...]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


@dataclass(frozen=True, eq=False)
class Entry:
    """One logical tensor of one kind: its geometry and the live buffer name for each holding slot."""

    tensor: LogicalTensor
    geometry: Geometry
    buffers: tuple[str, ...]
