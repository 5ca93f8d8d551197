"""Layouts cached per (model, spec, kinds), plans per (model, source spec, destination spec, ranks per node)."""
from __future__ import annotations

import hashlib

import numpy as np

from .layout import Layout, build_layout
from .model import ModelCatalog
from .plan import Plan, build_plan
from .spec import ParallelSpec
from .tensor import Kind

_LAYOUTS: dict[tuple, Layout] = {}
_PLANS: dict[tuple, Plan] = {}


def model_key(catalog: ModelCatalog) -> tuple:
    # the names: a sub-catalog (vps.layer_groups) of one layer group must not share a plan with another's
    return (catalog.arch, catalog.dims, catalog.param_dtype, catalog.state_dtype, tuple(t.name for t in catalog.tensors))


def cached_layout(catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...] | None = None) -> Layout:
    key = (model_key(catalog), spec, kinds)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = build_layout(catalog, spec, kinds)
    return _LAYOUTS[key]


def cached_plan(catalog: ModelCatalog, src: ParallelSpec, dst: ParallelSpec, ranks_per_node: int = 8) -> Plan:
    key = (model_key(catalog), src, dst, ranks_per_node)
    if key not in _PLANS:
        _PLANS[key] = build_plan(build_layout(catalog, src), build_layout(catalog, dst), ranks_per_node)
    return _PLANS[key]


def plan_digest(plan: Plan) -> str:
    """A fingerprint of every region and source choice: equal digests mean identical plans."""
    h = hashlib.sha256()
    for c in plan.classes:
        h.update(repr([(m.tensor.name, m.tensor.kind.value, m.src_buffers, m.dst_buffers) for m in c.members]).encode())
        for a in (c.lo, c.hi, c.send_region, c.send_src, c.send_dst, c.copy_region, c.copy_rank):
            h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return h.hexdigest()
