"""Online change of the training layout: rebuild a TrainEngine on a new (dp, tp, zero) layout in the same
processes and carry parameters and AdamW state (exp_avg, exp_avg_sq, step) across.

The new model is built on the meta device, parallelized on the new mesh, materialised empty, and then filled
by a pluggable `StateMover` from the old engine's live state (`bind_train_state`); the VPS executor plugs in
there, behind the same call, in place of the torch-only movers of `transition.movers`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from transformers import PreTrainedModel

from rlhf_dyna.models.build import ValueModel
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine, refresh_fsdp_shards, reshard
from rlhf_dyna.train.mesh import build_mesh, layout_of_mesh
from rlhf_dyna.train.pipeline_engine import PipelineEngine
from rlhf_dyna.train.pp_stage import StageModule, meta_full_model
from rlhf_dyna.transition.movers import MoveStats, StateKey, StateMover, move_by_full_tensors
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.transport import release_cached_memory

OPTIMIZER_KINDS = ("exp_avg", "exp_avg_sq")


def layout_of(engine: TrainEngine) -> ParallelLayout:
    """The layout an engine trains in, read from its mesh."""
    schedule = engine.schedule_name if isinstance(engine, PipelineEngine) else "1F1B"
    return layout_of_mesh(engine.mesh, engine.zero, schedule)


def mesh_identity(layout: ParallelLayout) -> tuple:
    """What makes two layouts share a mesh: its shape and rank order (not the ZeRO stage or the schedule)."""
    return layout.dp, layout.tp, layout.tp_outer, layout.pp, layout.ep, layout.first_rank


class MeshCache:
    """One DeviceMesh per mesh identity: creating process groups is collective and gloo groups hold sockets and
    threads, so switching back and forth reuses the meshes already built."""

    def __init__(self) -> None:
        self._meshes: dict[tuple, DeviceMesh] = {}

    def add(self, mesh: DeviceMesh) -> None:
        self._meshes.setdefault(mesh_identity(layout_of_mesh(mesh)), mesh)

    def get(self, layout: ParallelLayout) -> DeviceMesh:
        key = mesh_identity(layout)
        if key not in self._meshes:
            self._meshes[key] = build_mesh(layout)
        return self._meshes[key]


MESHES = MeshCache()


def _unwrapped_class(model: nn.Module) -> type:
    """fully_shard swaps the class for FSDP<Class>(FSDPModule, Class); the first non-FSDP class is the original."""
    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def meta_skeleton(model: nn.Module) -> nn.Module:
    """An unparallelized copy of the model's architecture on the meta device (no memory, no init)."""
    cls = _unwrapped_class(model)
    if issubclass(cls, StageModule):
        return meta_full_model(model)  # the whole model: the new layout splits it its own way
    with torch.device("meta"):
        if issubclass(cls, PreTrainedModel):
            return cls(model.config)
        if cls is ValueModel:
            return ValueModel(model.config, next(model.parameters()).dtype)
    raise TypeError(f"no skeleton builder for {cls.__name__}; pass model_factory")


def bind_train_state(engine: TrainEngine) -> dict[StateKey, Tensor]:
    """(HF name, kind) -> the live sharded tensor: 'param' is FSDP's sharded (master) parameter, 'exp_avg' and
    'exp_avg_sq' AdamW's state of it. ZeRO-1/2 replicas are dropped first: they are re-gathered from the shards."""
    reshard(engine.model)
    state: dict[StateKey, Tensor] = {}
    for name, param in engine.model.named_parameters():
        state[(name, "param")] = param
        slots = engine.optimizer.state.get(param, {}) if engine.optimizer is not None else {}
        for kind in OPTIMIZER_KINDS:
            if kind in slots:
                state[(name, kind)] = slots[kind]
    return state


def _optimizer_step(engine: TrainEngine) -> Tensor | None:
    """AdamW's `step` counter (the same for every parameter, a replicated scalar); None before the first step."""
    if engine.optimizer is None:
        return None
    return next((s["step"] for s in engine.optimizer.state.values() if "step" in s), None)


def settings_of(engine: TrainEngine) -> dict:
    """The constructor settings an engine was made with (optimizer hyper-parameters, precision, micro-batching), to
    make another like it on another layout or in another process (a joining rank's)."""
    group = engine.optimizer.param_groups[0] if engine.optimizer is not None else {"lr": 0.0, "weight_decay": 0.0, "betas": (0.9, 0.999)}
    return dict(
        lr=group["lr"], weight_decay=group["weight_decay"], betas=tuple(group["betas"]),
        grad_clip=engine.grad_clip, precision=engine.precision, micro_batch_size=engine.micro_batch_size,
        micro_batch_tokens=engine.micro_batch_tokens, trainable=engine.optimizer is not None,
        loss_mask_key=engine.loss_mask_key, share_prompts=engine.share_prompts,
    )


def optimizer_groups(engine: TrainEngine) -> list[dict]:
    """Each optimizer param group's settings (lr schedules, per-group settings), without its parameters."""
    groups = engine.optimizer.param_groups if engine.optimizer is not None else []
    return [{k: v for k, v in group.items() if k != "params"} for group in groups]


def empty_engine(settings: dict, groups: list[dict], buffers: dict[str, Tensor], layout: ParallelLayout,
                 mesh: DeviceMesh, skeleton: nn.Module) -> TrainEngine:
    """An engine of `settings` (settings_of) on `layout`, uninitialised parameters (the mover fills them), the given
    buffers (replicated in every layout) and optimizer group settings."""
    if layout.pp > 1:
        new = PipelineEngine(skeleton, mesh, schedule=layout.pp_schedule, zero=layout.zero, **settings)
    else:
        new = TrainEngine(skeleton, mesh, zero=layout.zero, **settings)
    new.model.to_empty(device=new.device)  # DTensor params are swapped in place: the optimizer's references stay valid
    with torch.no_grad():  # buffers (rotary frequencies) are replicated in every layout: copy them locally
        for name, buffer in new.model.named_buffers():
            buffer.copy_(buffers[name])
    if new.optimizer is not None:
        for group, new_group in zip(groups, new.optimizer.param_groups):
            new_group.update(group)
    return new


def empty_engine_like(old: TrainEngine, layout: ParallelLayout, mesh: DeviceMesh, skeleton: nn.Module) -> TrainEngine:
    """`old`'s settings on `layout`, with uninitialised parameters (the mover fills them) and `old`'s buffers."""
    return empty_engine(settings_of(old), optimizer_groups(old), dict(old.model.named_buffers()), layout, mesh, skeleton)


def allocate_optimizer_state(engine: TrainEngine, step: Tensor) -> None:
    """AdamW state slots shaped like each (new) sharded param, uninitialised: the mover fills every element."""
    for param in (p for group in engine.optimizer.param_groups for p in group["params"]):
        engine.optimizer.state[param] = {
            "step": step.clone(),
            "exp_avg": torch.empty_like(param, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.empty_like(param, memory_format=torch.preserve_format),
        }


def relayout(
    engine: TrainEngine,
    layout: ParallelLayout,
    mover: StateMover = move_by_full_tensors,
    model_factory: Callable[[nn.Module], nn.Module] = meta_skeleton,
    meshes: MeshCache = MESHES,
    recorder: TraceRecorder | None = None,
) -> tuple[TrainEngine, MoveStats]:
    """Collective: every rank calls it with the same layout. Returns the engine rebuilt on `layout` holding the
    same parameters and AdamW state, and the mover's stats. The old engine is consumed (its state is freed).
    With a recorder, the move is one trace event (a round-level trace is the VPS executor's to record)."""
    meshes.add(engine.mesh)
    mesh = meshes.get(layout)
    new = empty_engine_like(engine, layout, mesh, model_factory(engine.model))
    step = _optimizer_step(engine)
    if step is not None:
        allocate_optimizer_state(new, step)
    source, destination = bind_train_state(engine), bind_train_state(new)
    if layout.pp == 1 and not isinstance(engine, PipelineEngine) and source.keys() != destination.keys():
        raise ValueError(f"state keys differ between layouts: {sorted(source.keys() ^ destination.keys())[:5]}")
    if recorder is None:
        stats = mover(source, destination)
    else:
        with recorder.span(f"relayout {layout_of(engine).describe()} -> {layout.describe()}", 0) as args:
            stats = mover(source, destination)
            args.update(bytes_received=stats.bytes_received, rounds=stats.rounds)
    refresh_fsdp_shards(new.model)  # an in-place mover may have handed old shards' storage to new params
    if engine.optimizer is not None:
        engine.optimizer.state.clear()
    del source
    if new.zero < 3:
        new.materialize_replicas()
    release_cached_memory(new.device)  # CUDA: the old layout's freed blocks go back to the driver
    return new, stats
