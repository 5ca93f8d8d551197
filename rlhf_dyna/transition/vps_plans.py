"""Rank plans of VPS transitions, cached per (models, specs, kinds, budget, rank): planning runs once per switch kind."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import torch.distributed as dist

from rlhf_dyna.transition.executor import PreparedPlan, prepare
from rlhf_dyna.vps.adopt import adoptable
from rlhf_dyna.vps.cache import model_key
from rlhf_dyna.vps.layout import Layout, build_layout
from rlhf_dyna.vps.layout_types import Buffer
from rlhf_dyna.vps.model import ModelCatalog
from rlhf_dyna.vps.plan import Plan, build_plan
from rlhf_dyna.vps.relay import relay_plans
from rlhf_dyna.vps.rank_plan import for_rank
from rlhf_dyna.vps.schedule import Schedule, build_schedule
from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.tensor import Kind

DEFAULT_BUDGET_BYTES = 1 << 30  # per rank and round: half for sends, half for receives


@dataclass(frozen=True)
class PlannedTransition:
    src: Layout
    dst: Layout
    schedule: Schedule
    rank_plan: PreparedPlan  # this rank's share, cut into messages once

    @cached_property
    def bytes_between_ranks(self) -> int:
        """Bytes the whole schedule sends from rank to rank (the same on every rank: no collective)."""
        return int(self.schedule.plan.pair_bytes().sum())

    @cached_property
    def src_buffers(self) -> dict[str, Buffer]:
        return self.src.buffers(self.rank_plan.plan.rank)

    @cached_property
    def dst_buffers(self) -> dict[str, Buffer]:
        return self.dst.buffers(self.rank_plan.plan.rank)

    @cached_property
    def in_place(self) -> tuple[dict[str, str], PreparedPlan]:
        """For a consumed source: destination buffers that adopt a source buffer's storage, and the plan without
        their copies (vps.adopt)."""
        adopted = adoptable(self.rank_plan.plan, self.src_buffers, self.dst_buffers)
        return adopted, without_copies(self.rank_plan, adopted)


def without_copies(p: PreparedPlan, adopted: Mapping[str, str]) -> PreparedPlan:
    """`p` minus the local copies into adopted buffers; their sources are never released (the destination holds
    them now), though they may still be sent to other ranks."""
    if not adopted:
        return p
    kept = set(adopted.values())
    plan = replace(p.plan, copies=[t for t in p.plan.copies if t.dst_buffer not in adopted])
    last_read = {i: [n for n in names if n not in kept] for i, names in p.last_read.items()}
    return replace(p, plan=plan, last_read=last_read)


_CACHE: dict[tuple, PlannedTransition] = {}
_RELAY_CACHE: dict[tuple, tuple[Layout, PlannedTransition, PlannedTransition]] = {}


def ranks_per_node() -> int:
    """Ranks sharing a node (the planner prefers same-node sources); torchrun says so, a local run is one node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size() if dist.is_initialized() else 1))


def planned(src_catalog: ModelCatalog, src_spec: ParallelSpec, dst_catalog: ModelCatalog, dst_spec: ParallelSpec,
            kinds: tuple[Kind, ...], budget_bytes: int, rank: int) -> PlannedTransition:
    key = (model_key(src_catalog), model_key(dst_catalog), src_spec, dst_spec, kinds, budget_bytes, rank, ranks_per_node())
    if key not in _CACHE:
        src = build_layout(src_catalog, src_spec, kinds)
        dst = build_layout(dst_catalog, dst_spec, kinds)
        _CACHE[key] = prepared(build_plan(src, dst, ranks_per_node()), budget_bytes, rank)
    return _CACHE[key]


def prepared(plan: Plan, budget_bytes: int, rank: int) -> PlannedTransition:
    """`plan` scheduled under the budget, and this rank's share of it cut into messages."""
    schedule = build_schedule(plan, budget_bytes)
    received = [int(b) for b in schedule.plan.pair_bytes().sum(axis=0)]
    return PlannedTransition(plan.src, plan.dst, schedule, prepare(for_rank(schedule, rank), budget_bytes=budget_bytes,
                                                                   received_by_rank=received))


def planned_relay(src_catalog: ModelCatalog, src_spec: ParallelSpec, dst_catalog: ModelCatalog, dst_spec: ParallelSpec,
                  kinds: tuple[Kind, ...], budget_bytes: int, rank: int,
                  first: frozenset[int]) -> tuple[Layout, PlannedTransition, PlannedTransition]:
    """The destination's whole layout and the two stages of a move relayed through the `first` ranks (vps.relay)."""
    key = (model_key(src_catalog), model_key(dst_catalog), src_spec, dst_spec, kinds, budget_bytes, rank,
           ranks_per_node(), first)
    if key not in _RELAY_CACHE:
        dst = build_layout(dst_catalog, dst_spec, kinds)
        first_stage, second_stage = relay_plans(build_layout(src_catalog, src_spec, kinds), dst, first, ranks_per_node())
        _RELAY_CACHE[key] = (dst, prepared(first_stage, budget_bytes, rank), prepared(second_stage, budget_bytes, rank))
    return _RELAY_CACHE[key]
