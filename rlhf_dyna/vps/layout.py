"""Pieces and layouts: which rank holds which box of which logical tensor, and where in local memory."""
from __future__ import annotations

from dataclasses import dataclass, field

from .box import Box
from .tensor import LogicalTensor


@dataclass(frozen=True, slots=True)
class Buffer:
    """A rank-local tensor (e.g. an FSDP shard, vLLM's fused qkv_proj) that holds one or more pieces."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Piece:
    """Box `box` of `tensor` stored in local buffer `buffer`, starting at element `offset`.

    `strides` are the element strides, inside the buffer, of the box's dimensions (row-major
    contiguous pieces have strides equal to the buffer's own trailing strides).
    """

    tensor: LogicalTensor
    box: Box
    buffer: str
    offset: int
    strides: tuple[int, ...]


@dataclass
class Layout:
    """rank -> pieces (and the local buffers holding them). Replication: several ranks may hold a box."""

    world_size: int
    pieces: dict[int, list[Piece]] = field(default_factory=dict)
    buffers: dict[int, dict[str, Buffer]] = field(default_factory=dict)
    node_of_rank: dict[int, int] = field(default_factory=dict)  # for source choice / cost; default one node

    def add(self, rank: int, piece: Piece) -> None:
        self.pieces.setdefault(rank, []).append(piece)

    def add_buffer(self, rank: int, buf: Buffer) -> None:
        self.buffers.setdefault(rank, {})[buf.name] = buf

    def node(self, rank: int) -> int:
        return self.node_of_rank.get(rank, 0)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))
