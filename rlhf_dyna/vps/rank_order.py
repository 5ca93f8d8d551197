"""Rank order search: of the train rank orders a destination layout may take, the one that moves the fewest bytes.

A (dp, tp) mesh can put TP innermost (consecutive ranks share a TP group) or outermost (the same mesh,
transposed). From FSDP dp=N, TP outermost lets rank r keep its own dim-0 chunk of every column-parallel weight
(dp4 -> dp2 x tp2 moves about half as many bytes); other changes prefer the default. Both candidates are planned
and the cheaper one wins; ties keep the default order.
"""
from __future__ import annotations

from dataclasses import replace

from .layout import Layout, build_layout
from .model import ModelCatalog
from .plan import build_plan
from .spec import ParallelSpec, Phase
from .tensor import Kind


def candidate_orders(spec: ParallelSpec) -> list[ParallelSpec]:
    """The spec in every rank order that differs in effect (TP and the data-parallel axes both larger than 1)."""
    if spec.phase != Phase.TRAIN or spec.tp == 1 or spec.dp * spec.cp * spec.dp_replicate == 1:
        return [spec]
    return [replace(spec, tp_outer=False), replace(spec, tp_outer=True)]


def bytes_by_order(src: Layout, catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...],
                   ranks_per_node: int) -> dict[ParallelSpec, int]:
    """Bytes each candidate order of `spec` must move from `src` (the plan's minimum)."""
    return {c: build_plan(src, build_layout(catalog, c, kinds), ranks_per_node).moved_bytes for c in candidate_orders(spec)}


def least_moving_order(src: Layout, catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...],
                       ranks_per_node: int) -> ParallelSpec:
    by_order = bytes_by_order(src, catalog, spec, kinds, ranks_per_node)
    return min(by_order, key=lambda c: (by_order[c], c.tp_outer))  # ties: the default order
