"""Move one role's training state (parameters and AdamW moments) between rank sets by VPS plan.

A role lent to a subset of the ranks trains there in its own engine (a sub-mesh); its state is planned from the
engine it left (train spec over the source set) to the engine it enters (train spec over the destination set),
and the executor moves exactly the bytes that must move, rank to rank. Ranks outside a set hold no engine for it:
they take part in the move with no source (or no destination) buffers, because the executor is collective over
the world. The plan is cached per (model, specs, kinds, budget, rank), so planning runs once per kind of move.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh

from rlhf_dyna.models.build import ValueModel
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.models.reward import is_reward_model
from rlhf_dyna.models.reward_catalog import reward_catalog_from_config
from rlhf_dyna.models.value_catalog import value_catalog_from_config
from rlhf_dyna.train.engine import TrainEngine, refresh_fsdp_shards
from rlhf_dyna.train.mesh import layout_of_mesh
from rlhf_dyna.transition.bind_train import DTYPE_NAMES, StateKey, bind_train_buffers, buffer_name, local_tensor
from rlhf_dyna.transition.executor import execute
from rlhf_dyna.transition.relayout import allocate_optimizer_state, bind_train_state, empty_engine_like, meta_skeleton
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.transition.transport import release_cached_memory, wire_device, world_transport
from rlhf_dyna.transition.vps_plans import DEFAULT_BUDGET_BYTES, planned
from rlhf_dyna.vps.model import ModelCatalog
from rlhf_dyna.vps.spec import ParallelSpec
from rlhf_dyna.vps.tensor import Kind

ALL_KINDS = (Kind.PARAM, Kind.EXP_AVG, Kind.EXP_AVG_SQ)


@dataclass(frozen=True)
class RoleMoveStats:
    seconds: float  # wall time on this rank, from planning to the destination engine being usable
    bytes_moved: int  # bytes received over the network, summed over the world
    rounds: int  # communication rounds of the schedule
    peak_extra_bytes: int  # most bytes of staging buffers alive at once on this rank


def engine_on(home: TrainEngine, mesh: DeviceMesh) -> TrainEngine:
    """`home`'s settings (optimizer hyper-parameters, precision, ZeRO stage, buffers) on `mesh`, parameters
    uninitialised: the destination of a move. Only the ranks of `mesh` build it."""
    layout = layout_of_mesh(mesh, home.zero)
    return empty_engine_like(home, layout, mesh, meta_skeleton(home.model))


def optimizer_step(engine: TrainEngine | None) -> float:
    """AdamW's step counter of the engine, -1 when it has none yet (before the first step, or no engine here)."""
    if engine is None or engine.optimizer is None:
        return -1.0
    step = next((s["step"] for s in engine.optimizer.state.values() if "step" in s), None)
    return -1.0 if step is None else float(step)


def shared_step(engine: TrainEngine | None, source_first_rank: int) -> float:
    """The source engine's step counter, on every rank (ranks outside the source set have no engine to read)."""
    value = torch.tensor([optimizer_step(engine)], dtype=torch.float64)
    dist.broadcast(value, src=source_first_rank)
    return float(value)


def prepare_optimizer(engine: TrainEngine, step: float) -> None:
    """Give the destination engine AdamW slots to receive into, at the source's step count."""
    if engine.optimizer is None or step < 0:
        return
    if not engine.optimizer.state:
        allocate_optimizer_state(engine, torch.tensor(step, dtype=torch.float32))
    for slots in engine.optimizer.state.values():
        slots["step"].fill_(step)


def role_catalog(engine: TrainEngine) -> ModelCatalog:
    """The VPS catalog of the engine's model in its live dtype (AdamW's moments share the parameters' dtype):
    a policy or reference, the critic's value model, or a reward model."""
    dtype = DTYPE_NAMES[next(engine.model.parameters()).dtype]
    make = value_catalog_from_config if isinstance(engine.model, ValueModel) else \
        reward_catalog_from_config if is_reward_model(engine.model) else catalog_from_config
    return make(engine.model.config, dtype, dtype)


def _of_kinds(state: Mapping[StateKey, Tensor], kinds: tuple[Kind, ...]) -> dict[StateKey, Tensor]:
    names = {k.value for k in kinds}
    return {key: t for key, t in state.items() if key[1] in names}


def move_role_state(source: TrainEngine | None, destination: TrainEngine | None,
                    src_spec: ParallelSpec, dst_spec: ParallelSpec, catalog: ModelCatalog,
                    budget_bytes: int = DEFAULT_BUDGET_BYTES, recorder: TraceRecorder | None = None,
                    trace_name: str = "role_move", step: float | None = None) -> RoleMoveStats:
    """Collective over the world. `source` / `destination`: this rank's engine in the source / destination set, or
    None where the rank is outside that set. `catalog`: the model's VPS catalog, the same on every rank
    (`role_catalog` of an engine every rank holds, or built from the config where some ranks hold none). Parameters
    always move; AdamW moments when the source has them. `step`: the source's AdamW step counter (`optimizer_step`,
    -1 without moments) where every rank knows it already; None: broadcast from the source set."""
    start, rank = time.perf_counter(), dist.get_rank()
    step = shared_step(source, src_spec.first_rank) if step is None else step
    kinds = ALL_KINDS if step >= 0 else (Kind.PARAM,)
    if destination is not None:
        prepare_optimizer(destination, step)
    t = planned(catalog, src_spec, catalog, dst_spec, kinds, budget_bytes, rank)
    dst = _of_kinds(bind_train_state(destination), kinds) if destination is not None else {}
    stats = _execute(source, bind_train_buffers(dst, t.dst, rank, t.dst_buffers), t, kinds, rank, recorder, trace_name)
    if destination is not None:
        _refresh(destination)
    return RoleMoveStats(time.perf_counter() - start, t.bytes_between_ranks, stats.rounds, stats.peak_extra_bytes)


def move_role_state_to_buffers(source: TrainEngine | None, receives: bool, src_spec: ParallelSpec,
                               dst_spec: ParallelSpec, catalog: ModelCatalog, device: torch.device,
                               budget_bytes: int = DEFAULT_BUDGET_BYTES, recorder: TraceRecorder | None = None,
                               trace_name: str = "role_move") -> tuple[dict[str, Tensor], float, RoleMoveStats]:
    """`move_role_state` into plain local tensors of the destination layout's shapes on this rank (where it
    `receives`; else {}), for an engine built later on another world's mesh (`fill_engine`): a leave moves over the old
    world into the layout of the new one. Returns (buffer name -> tensor, the source's AdamW step, stats)."""
    start, rank = time.perf_counter(), dist.get_rank()
    step = shared_step(source, src_spec.first_rank)
    kinds = ALL_KINDS if step >= 0 else (Kind.PARAM,)
    t = planned(catalog, src_spec, catalog, dst_spec, kinds, budget_bytes, rank)
    dst = {name: torch.empty(b.shape, dtype=TORCH_DTYPES[b.dtype], device=device)
           for name, b in t.dst_buffers.items()} if receives else {}
    stats = _execute(source, dst, t, kinds, rank, recorder, trace_name)
    return dst, step, RoleMoveStats(time.perf_counter() - start, t.bytes_between_ranks, stats.rounds,
                                    stats.peak_extra_bytes)


def _execute(source: TrainEngine | None, dst: dict[str, Tensor], t, kinds: tuple[Kind, ...], rank: int,
             recorder: TraceRecorder | None, trace_name: str):
    src = _of_kinds(bind_train_state(source), kinds) if source is not None else {}
    stats = execute(t.rank_plan, bind_train_buffers(src, t.src, rank, t.src_buffers), dst, trace=recorder,
                    trace_name=trace_name)
    release_cached_memory(wire_device(world_transport()))  # CUDA: the move's staging goes back to the driver
    return stats


def _refresh(engine: TrainEngine) -> None:
    """After its shards were written: FSDP's views of them, and ZeRO-1/2's replicas re-gathered."""
    refresh_fsdp_shards(engine.model)
    if engine.zero < 3:
        engine.materialize_replicas()


def fill_engine(engine: TrainEngine, buffers: Mapping[str, Tensor], step: float) -> None:
    """`move_role_state_to_buffers`' tensors into `engine` (built on the layout they were planned for), AdamW's step
    counter set: local copies only (no collective but ZeRO-1/2's re-gather of replicas)."""
    prepare_optimizer(engine, step)
    with torch.no_grad():
        for key, tensor in bind_train_state(engine).items():
            local, name = local_tensor(tensor), buffer_name(key)
            if name in buffers:
                local.copy_(buffers[name])
            elif local.numel():
                raise ValueError(f"{name}: the moved buffers lack this rank's {tuple(local.shape)} shard")
    _refresh(engine)


def state_storages(engine: TrainEngine) -> dict[int, torch.UntypedStorage]:
    """The distinct storages behind the engine's sharded parameters and AdamW moments (FSDP2 keeps a padded flat
    buffer per parameter; the local shard is a view of it)."""
    out = {}
    for (_, kind), tensor in bind_train_state(engine).items():
        local = tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor
        storage = local.untyped_storage()
        out.setdefault(storage.data_ptr(), storage)
    return out


class ParkedState:
    """Frees a role's home state while the role is lent (its bytes live on the lent set), and gives the storages
    their size back before the role moves home, where the move overwrites every element that matters."""

    def __init__(self) -> None:
        self._sizes: dict[int, tuple[torch.UntypedStorage, int]] = {}

    def park(self, engine: TrainEngine) -> int:
        freed = 0
        for storage in state_storages(engine).values():
            self._sizes[id(storage)] = (storage, storage.nbytes())
            freed += storage.nbytes()
            storage.resize_(0)
        release_cached_memory(wire_device(world_transport()))  # CUDA: the parked bytes really go to the lent role
        return freed

    def unpark(self) -> None:
        for storage, nbytes in self._sizes.values():
            storage.resize_(nbytes)
        self._sizes.clear()
