"""Training layouts: FSDP2 / ZeRO over (dp, cp), DTensor TP, PP stages, EP with expert TP, on HF names.

Placement facts mirrored from torch 2.13: DTensor Shard(d) and FSDP2's fully_shard split with
torch.chunk semantics (ceil-sized chunks, trailing ones short or empty); under TP, FSDP2 shards dim 0
of the TP-local tensor (placements (_StridedShard(0, sf=tp), Shard(0)) for column-parallel weights), and
dim 1 of row-parallel weights where it splits evenly ((_StridedShard(1, sf=tp), Shard(1))). Tied embeddings are
replicated over tp (one Parameter cannot take two TP styles) and FSDP-sharded on dim 0 like a norm.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .box import Box
from .geometry import Geometry
from .layout_types import Entry, contiguous_strides
from .mesh import Steps, mesh_pieces
from .model import EXPERT_ROLES as EXPERT, CatalogTensor, ModelCatalog, Role
from .spec import ParallelSpec
from .split import chunk, even
from .tensor import Kind
from .validate import stage_layers, validate

COLUMN = {Role.Q, Role.K, Role.V, Role.GATE, Role.UP, Role.Q_BIAS, Role.K_BIAS, Role.V_BIAS}
ROW = {Role.O, Role.DOWN}
VOCAB = {Role.EMBED, Role.LM_HEAD}  # torchtitan: embedding RowwiseParallel, lm_head ColwiseParallel: both Shard(0)


def sharded_kind(zero: int, kind: Kind) -> bool:
    """Which kinds ZeRO shards over the data-parallel group."""
    if zero >= 3:
        return True
    if zero == 2:
        return kind != Kind.PARAM
    if zero == 1:
        return kind not in (Kind.PARAM, Kind.GRAD)
    return False


def tensor_stages(t: CatalogTensor, stages: list[tuple[int, int]], tied: bool) -> tuple[int, ...]:
    last = len(stages) - 1
    if t.layer is not None:
        return tuple(s for s, (lo, hi) in enumerate(stages) if lo <= t.layer < hi)
    if t.role == Role.EMBED:
        return (0, last) if tied and last > 0 else (0,)
    return (last,)


def live_names(t: CatalogTensor, n_stages: int) -> tuple[str, ...]:
    """Training-module parameter per holding slot (a tied embedding is lm_head.weight on the last stage)."""
    if t.role == Role.EMBED and n_stages == 2:
        return (t.train_buffer, "lm_head.weight")
    return (t.train_buffer,)


def train_entries(catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...]) -> Iterator[Entry]:
    dims = catalog.dims
    validate(spec, dims)
    stages = stage_layers(spec, dims.num_layers)
    grid = rank_grid(spec)
    memo: dict[tuple, Geometry] = {}
    for t in catalog.tensors:
        held_by = tensor_stages(t, stages, dims.tied_embeddings)
        names = live_names(t, len(held_by))
        for kind in kinds:
            sharded = sharded_kind(spec.zero, kind)
            key = (t.role, t.shape, held_by, sharded)
            if key not in memo:
                memo[key] = Geometry.from_pieces(t.shape, [
                    p for slot, s in enumerate(held_by)
                    for p in stage_pieces(t, grid[s], spec, sharded, slot, dims.tied_embeddings)
                ])
            yield Entry(catalog.logical(t, kind), memo[key], tuple(f"{n}:{kind.value}" for n in names))


def rank_grid(spec: ParallelSpec) -> np.ndarray:
    """Ranks on the canonical axes (pp, dp_replicate, dp*cp, tp), in the spec's rank order (its rank map, if any)."""
    ranks = np.array(spec.ranks, dtype=np.int64)
    if spec.tp_outer:
        return ranks.reshape(spec.pp, spec.tp, spec.dp_replicate, spec.dp * spec.cp).transpose(0, 2, 3, 1)
    return ranks.reshape(spec.pp, spec.dp_replicate, spec.dp * spec.cp, spec.tp)


def row_sharded_on_cols(cols: int, tp: int, fsdp: int) -> bool:
    """FSDP2 shards a row-parallel weight on dim 1 (its TP dim) when the TP-local columns split evenly over the
    FSDP group (FSDP2's Shard(1) needs even chunks): dp x tp shards are then column blocks, the same ones a pure
    dp layout holds, so dp <-> dp x tp relayouts keep them in place (train.parallelize.fsdp_shard_dim applies this rule)."""
    return cols % tp == 0 and (cols // tp) % fsdp == 0


def stage_pieces(t: CatalogTensor, stage: np.ndarray, spec: ParallelSpec, sharded: bool, slot: int, tied: bool):
    if t.role in EXPERT:
        return expert_pieces(t, stage, spec, sharded, slot)
    splits: dict[int, Steps] = {}
    if t.role in COLUMN or (t.role in VOCAB and not tied):  # a tied embedding stays whole over tp (train.parallelize)
        splits[0] = [("tp", chunk)]
    elif t.role in ROW:
        splits[1] = [("tp", chunk)]
    if sharded and t.role in ROW and row_sharded_on_cols(t.shape[1], spec.tp, stage.shape[1]):
        splits[1].append(("fsdp", even))
    elif sharded:
        splits[0] = splits.get(0, []) + [("fsdp", chunk)]
    return mesh_pieces(t.shape, stage, ("dpr", "fsdp", "tp"), splits, slot)


def expert_pieces(t: CatalogTensor, stage: np.ndarray, spec: ParallelSpec, sharded: bool, slot: int):
    edp = spec.dp * spec.cp * spec.tp // (spec.ep * spec.etp)
    mesh = stage.reshape(spec.dp_replicate, edp, spec.ep, spec.etp)
    # DTensor Shard(0) over ep (torch.chunk: train.expert_parallel), then FSDP2's dim-0 chunks of each rank's experts
    experts: Steps = [("ep", chunk)] + ([("edp", chunk)] if sharded else [])
    if t.role == Role.EXPERT_DOWN:
        return mesh_pieces(t.shape, mesh, ("dpr", "edp", "ep", "etp"), {0: experts, 2: [("etp", even)]}, slot)
    inter_r = t.shape[1] // spec.etp
    start = 0 if t.role == Role.EXPERT_GATE else inter_r

    def place(box: Box):  # gate_up_proj holds [gate_r; up_r] per expert
        shape = (box.shape[0], 2 * inter_r, t.shape[2])
        strides = contiguous_strides(shape)
        return shape, start * strides[1], strides

    return mesh_pieces(t.shape, mesh, ("dpr", "edp", "ep", "etp"), {0: experts, 1: [("etp", even)]}, slot, place)
