"""Layout: every logical tensor (per state kind) of a model with its geometry and live buffer names."""
from __future__ import annotations

from dataclasses import dataclass

from .layout_types import Buffer, Entry, Piece
from .model import ModelCatalog
from .rollout_layout import rollout_entries
from .spec import ParallelSpec, Phase
from .tensor import Kind
from .train_layout import train_entries


@dataclass(eq=False)
class Layout:
    spec: ParallelSpec
    entries: tuple[Entry, ...]

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def pieces(self, rank: int) -> list[Piece]:
        """Materialise one rank's pieces (tests and executors; planning never needs this)."""
        out = []
        for e in self.entries:
            for shard in e.geometry.shards:
                if rank in shard.ranks:
                    h = e.geometry.holding_of(shard, rank)
                    out.append(Piece(e.tensor, shard.box, e.buffers[h.slot], h.offset, h.strides))
        return out

    def buffers(self, rank: int) -> dict[str, Buffer]:
        """The rank's local buffers with their shapes (fused buffers appear once)."""
        out: dict[str, Buffer] = {}
        for e in self.entries:
            for shard in e.geometry.shards:
                if rank in shard.ranks:
                    h = e.geometry.holding_of(shard, rank)
                    out[e.buffers[h.slot]] = Buffer(e.buffers[h.slot], h.buffer_shape, e.tensor.dtype)
        return out

    def total_bytes(self) -> int:
        """Bytes held summed over ranks (replicas counted on every rank that holds them)."""
        return sum(
            sum(s.box.volume * len(s.ranks) for s in e.geometry.shards) * e.tensor.itemsize for e in self.entries
        )

    def bytes_by_rank(self) -> dict[int, int]:
        """Bytes each rank holds (a replica counted on every rank that holds it); ranks holding nothing are absent."""
        held: dict[int, int] = {}
        for e in self.entries:
            for shard in e.geometry.shards:
                for rank in shard.ranks:
                    held[rank] = held.get(rank, 0) + shard.box.volume * e.tensor.itemsize
        return held


def build_layout(catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...] | None = None) -> Layout:
    """Layout of `catalog` under `spec` for `kinds` (default: every kind the spec's phase keeps)."""
    kinds = kinds or spec.kinds
    build = rollout_entries if spec.phase == Phase.ROLLOUT else train_entries
    return Layout(spec, tuple(build(catalog, spec, kinds)))
