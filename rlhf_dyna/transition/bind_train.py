"""Bind a TrainEngine's live state (FSDP2 [+ DTensor TP] params, AdamW exp_avg / exp_avg_sq) to VPS train buffers.

Live state is keyed (HF name, kind) as `relayout.bind_train_state` returns it, after FSDP's replicas are
dropped, so what is bound is always the sharded state: FSDP2 shards the TP-local tensor over dp (dim 0, or dim 1
of row-parallel weights: train.parallelize.fsdp_shard_dim), which is the VPS layout ParallelSpec(TRAIN, dp, tp,
zero=3) whatever the engine's ZeRO stage (ZeRO-1/2 only add replicas that the engine re-gathers). Each local shard
(the DTensor's local tensor) becomes the buffer "<name>:<kind>"; its shape is checked against the layout, so a
model the layout does not describe is refused instead of silently mis-moved.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.train.mesh import layout_of_mesh
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.vps.layout import Layout, build_layout
from rlhf_dyna.vps.layout_types import Buffer
from rlhf_dyna.vps.model import ModelCatalog
from rlhf_dyna.vps import spec as vps_spec
from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.tensor import Kind

StateKey = tuple[str, str]  # (HF parameter name, kind), as transition.movers keys live state
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def local_tensor(t: Tensor) -> Tensor:
    """The shard itself: `to_local()`'s autograd wrapper costs ~0.1 ms a call, 0.15 s for a 500M model's state."""
    return t._local_tensor if isinstance(t, DTensor) else t.detach()


def mesh_order(state: Mapping[StateKey, Tensor]) -> tuple[int, int, bool, int]:
    """(dp, tp, tp_outer, first_rank) of the engine's mesh, read from the DTensors: TP'd params live on the 2-D (dp, tp)
    mesh, the rest (and every param without TP) on the 1-D dp mesh. The mesh must cover a contiguous rank range in one
    of the VPS train rank orders (tp innermost, or outermost: see train.mesh.build_mesh)."""
    mesh = None
    for t in state.values():
        if isinstance(t, DTensor) and "ep" in (t.device_mesh.mesh_dim_names or ()):
            continue  # experts: (edp, ep); the other params show the (flattened) dp mesh
        if isinstance(t, DTensor) and (mesh is None or t.device_mesh.ndim > mesh.ndim):
            mesh = t.device_mesh
            if mesh.ndim > 1:  # the first TP'd param has the full mesh: no need to look at ~1,700 more
                break
    if mesh is None:
        raise ValueError("no DTensor in the live state: not an FSDP2 engine")
    return _order_of(mesh)


@functools.lru_cache(maxsize=32)  # DeviceMesh.mesh rebuilds its tensor (~2 ms a read); a mesh's hash is cached by torch
def _order_of(mesh: DeviceMesh) -> tuple[int, int, bool, int]:
    ranks = mesh.mesh.flatten().tolist()
    first = min(ranks)
    if mesh.ndim > 2 or sorted(ranks) != list(range(first, first + len(ranks))):
        raise ValueError(f"mesh {mesh.mesh_dim_names} over ranks {ranks}: VPS binding needs a (dp[, tp]) mesh over a "
                         f"contiguous rank range")
    if mesh.ndim == 1:
        return mesh.size(0), 1, False, first
    layout = layout_of_mesh(mesh)
    return layout.dp, layout.tp, layout.tp_outer, first


def pipeline_order(state: Mapping[StateKey, Tensor]) -> tuple[int, int]:
    """(pp, first rank of the whole pipeline mesh): a pipeline stage's DTensors live on the dp slice of a
    ("pp", "dp", "tp") mesh (train.mesh.build_mesh); (1, -1) for a state without pipeline stages."""
    t = next((t for t in state.values() if isinstance(t, DTensor)), None)
    root = t.device_mesh._get_root_mesh() if t is not None else None
    names = (root.mesh_dim_names or ()) if root is not None else ()
    if "pp" not in names:
        return 1, -1
    if names != ("pp", "dp", "tp"):
        raise ValueError(f"pipeline mesh {names}: VPS binding needs dims ('pp', 'dp', 'tp'), pp outermost")
    return root.size(0), int(root.mesh.min())


def expert_parallel_size(state: Mapping[StateKey, Tensor]) -> int:
    """ep of the experts' ("edp", "ep") DTensors (train.expert_parallel on train.mesh.build_mesh); 1 without EP."""
    for t in state.values():
        names = (t.device_mesh.mesh_dim_names or ()) if isinstance(t, DTensor) else ()
        if "ep" in names:
            return t.device_mesh.size(names.index("ep"))
    return 1


def train_spec(state: Mapping[StateKey, Tensor]) -> ParallelSpec:
    dp, tp, tp_outer, first_rank = mesh_order(state)
    pp, pipeline_first = pipeline_order(state)
    if pp > 1:  # the stage's own mesh starts at its stage; the layout's ranks start at the pipeline's first
        return vps_spec.train_spec(dp, tp, pp=pp, first_rank=pipeline_first)
    return vps_spec.train_spec(dp, tp, ep=expert_parallel_size(state), tp_outer=tp_outer, first_rank=first_rank)


def state_kinds(state: Mapping[StateKey, Tensor]) -> tuple[Kind, ...]:
    present = {kind for _, kind in state}
    return tuple(k for k in (Kind.PARAM, Kind.EXP_AVG, Kind.EXP_AVG_SQ) if k.value in present)


def train_catalog(hf_config: object, state: Mapping[StateKey, Tensor]) -> ModelCatalog:
    """Catalog with the live dtypes: params as FSDP stores them (fp32 masters under bf16 compute), Adam's moments."""
    param = next(t for (_, kind), t in state.items() if kind == Kind.PARAM.value)
    moment = next((t for (_, kind), t in state.items() if kind == Kind.EXP_AVG.value), param)
    return catalog_from_config(hf_config, DTYPE_NAMES[param.dtype], DTYPE_NAMES[moment.dtype])


def train_layout(hf_config: object, state: Mapping[StateKey, Tensor]) -> Layout:
    return build_layout(train_catalog(hf_config, state), train_spec(state), state_kinds(state))


def buffer_name(key: StateKey) -> str:
    return f"{key[0]}:{key[1]}"


def bind_train_buffers(state: Mapping[StateKey, Tensor], layout: Layout, rank: int,
                       expected: Mapping[str, Buffer] | None = None) -> dict[str, Tensor]:
    """buffer name -> this rank's local shard, checked against the layout (shape, dtype, contiguity, coverage);
    `expected`: the layout's buffers of this rank, when the caller has them cached."""
    expected = layout.buffers(rank) if expected is None else expected
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        local, name = local_tensor(tensor), buffer_name(key)
        want = expected.get(name)
        if want is None:
            if local.numel():
                raise ValueError(f"rank {rank}: {name} holds {tuple(local.shape)}, the VPS layout {layout.spec.describe()} "
                                 f"gives this rank nothing of it")
            continue  # an empty trailing FSDP chunk
        if tuple(local.shape) != want.shape or local.dtype != TORCH_DTYPES[want.dtype]:
            raise ValueError(f"rank {rank}: live {name} is {tuple(local.shape)} {local.dtype}, the VPS layout "
                             f"{layout.spec.describe()} expects {want.shape} {want.dtype}")
        if not local.is_contiguous():
            raise ValueError(f"rank {rank}: live {name} is not contiguous (strides {local.stride()})")
        out[name] = local
    missing = sorted(set(expected) - set(out))
    if missing:
        raise ValueError(f"rank {rank}: the VPS layout has buffers the engine lacks: {missing[:5]}")
    return out


@torch.no_grad()
def release_storage(buffers: Mapping[str, Tensor]):
    """A `release` callback for in-place transitions: frees a consumed source shard's storage at once."""
    def release(name: str) -> None:
        buffers[name].untyped_storage().resize_(0)
    return release


def adopt_storage(destination: Tensor, source_local: Tensor) -> None:
    """Point a destination shard (a DTensor's local tensor) at a consumed source shard's storage (vps.adopt);
    FSDP2 params must then be re-read by FSDP (train.engine.refresh_fsdp_shards), which keeps its own flat view."""
    shape = local_tensor(destination).shape
    local = source_local.detach() if source_local.requires_grad else source_local
    local = local if local.shape == shape else local.view(shape)
    if isinstance(destination, DTensor):
        destination._local_tensor = local  # what FSDP2 itself does when it re-pads a shard
    else:
        destination.data = local
