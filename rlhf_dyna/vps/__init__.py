"""Virtual Parameter Space: pure planning of any-to-any transitions of distributed training state.

Shapes and specs in, plans and schedules out; no torch, no torch.distributed, no model code.

    layout = build_layout(catalog, ParallelSpec(...))           # per (tensor, kind): geometry + live buffers
    plan = build_plan(src_layout, dst_layout, ranks_per_node)   # or cached_plan(catalog, src, dst)
    schedule = build_schedule(plan, budget_bytes)               # rounds, identical on every rank
    mine = for_rank(schedule, rank)                             # copies, peer streams, per-round byte ranges
    predict_seconds(schedule, Cluster(...)); peak_extra_bytes(schedule, in_place)
"""
from .box import Box
from .cache import cached_plan, plan_digest
from .cost import Cluster, predict_seconds
from .dryrun import Transition, format_table, summarize, write_summary
from .layout import Layout, build_layout
from .memory import peak_extra_bytes
from .model import CatalogTensor, ModelCatalog, ModelDims, Role
from .plan import Plan, build_plan
from .rank_plan import RankPlan, Transfer, for_rank
from .schedule import Schedule, build_schedule
from .spec import ParallelSpec, Phase
from .tensor import Kind, LogicalTensor
from .validate import SpecError

__all__ = [
    "Box", "CatalogTensor", "Cluster", "Kind", "Layout", "LogicalTensor", "ModelCatalog", "ModelDims", "ParallelSpec",
    "Phase", "Plan", "RankPlan", "Role", "Schedule", "SpecError", "Transfer", "Transition", "build_layout",
    "build_plan", "build_schedule", "cached_plan", "for_rank", "format_table", "peak_extra_bytes", "plan_digest",
    "predict_seconds", "summarize", "write_summary",
]
