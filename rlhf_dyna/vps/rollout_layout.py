"""vLLM's rollout layout (vllm 0.32): fused qkv_proj [q_r; k_r; v_r] with KV-head replication when
tp > num_kv_heads, fused gate_up_proj [gate_r; up_r], vocabulary padded to a multiple of 64 and split
evenly, MoE w13 [E, 2I, H] / w2 [E, H, I] sharded by TP across vllm_dp*tp or by expert parallelism.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from .geometry import Geometry
from .layout_types import Entry
from .mesh import fused_placer, mesh_pieces
from .model import EXPERT_ROLES, CatalogTensor, ModelCatalog, ModelDims, Role
from .spec import ParallelSpec
from .split import even, linear, padded, replicated_groups, vllm_padded_vocab
from .tensor import Kind
from .validate import stage_layers, validate
from .train_layout import tensor_stages

def vllm_name(t: CatalogTensor, slot: int) -> str:
    return "lm_head.weight" if t.role == Role.EMBED and slot == 1 else t.rollout_buffer


def rollout_entries(catalog: ModelCatalog, spec: ParallelSpec, kinds: tuple[Kind, ...]) -> Iterator[Entry]:
    dims = catalog.dims
    validate(spec, dims)
    stages = stage_layers(spec, dims.num_layers)
    grid = np.array(spec.ranks, dtype=np.int64).reshape(spec.dp, spec.vllm_dp, spec.pp, spec.tp)
    memo: dict[tuple, Geometry] = {}
    for t in catalog.tensors:
        held_by = tensor_stages(t, stages, dims.tied_embeddings)
        key = (t.role, t.shape, held_by)
        if key not in memo:
            memo[key] = Geometry.from_pieces(t.shape, [
                p for slot, s in enumerate(held_by) for p in stage_pieces(t, dims, grid[:, :, s, :], spec, slot)
            ])
        names = tuple(vllm_name(t, slot) for slot in range(len(held_by)))
        for kind in kinds:
            yield Entry(catalog.logical(t, kind), memo[key], names)


def stage_pieces(t: CatalogTensor, dims: ModelDims, stage: np.ndarray, spec: ParallelSpec, slot: int):
    tp, axes = spec.tp, ("dp", "vdp", "tp")
    hd, h = dims.head_dim, dims.hidden
    q_r = dims.num_heads // tp * hd
    kv_r = max(1, dims.num_kv_heads // tp) * hd
    kv_rule = replicated_groups(dims.num_kv_heads) if tp >= dims.num_kv_heads else even
    role = t.role
    if role in (Role.EMBED, Role.LM_HEAD):
        vp = vllm_padded_vocab(dims.vocab)
        place = fused_placer((vp // tp, h), 0, 0)
        return mesh_pieces(t.shape, stage, axes, {0: [("tp", padded(vp))]}, slot, place)
    if role in (Role.Q, Role.K, Role.V, Role.Q_BIAS, Role.K_BIAS, Role.V_BIAS):
        is_bias = role in (Role.Q_BIAS, Role.K_BIAS, Role.V_BIAS)
        which = {Role.Q: 0, Role.Q_BIAS: 0, Role.K: 1, Role.K_BIAS: 1}.get(role, 2)
        buffer = (q_r + 2 * kv_r,) if is_bias else (q_r + 2 * kv_r, h)
        start = (0, q_r, q_r + kv_r)[which]
        rule = even if which == 0 else kv_rule
        return mesh_pieces(t.shape, stage, axes, {0: [("tp", rule)]}, slot, fused_placer(buffer, 0, start))
    if role in (Role.GATE, Role.UP):
        i_r = dims.intermediate // tp
        place = fused_placer((2 * i_r, h), 0, 0 if role == Role.GATE else i_r)
        return mesh_pieces(t.shape, stage, axes, {0: [("tp", even)]}, slot, place)
    if role in (Role.O, Role.DOWN):
        return mesh_pieces(t.shape, stage, axes, {1: [("tp", even)]}, slot)
    if role in EXPERT_ROLES:
        return expert_pieces(t, dims, stage, spec, slot)
    return mesh_pieces(t.shape, stage, axes, {}, slot)  # norms, router: replicated


def expert_pieces(t: CatalogTensor, dims: ModelDims, stage: np.ndarray, spec: ParallelSpec, slot: int):
    group = spec.vllm_dp * spec.tp
    mesh = stage.reshape(spec.dp, group)
    e, i, h = dims.num_experts, dims.moe_intermediate, dims.hidden
    down = t.role == Role.EXPERT_DOWN
    if spec.ep > 1:  # experts spread linearly over the group, each whole
        def place(box):
            local_e = box.shape[0]
            buffer = (local_e, h, i) if down else (local_e, 2 * i, h)
            return fused_placer(buffer, 1, 0 if t.role != Role.EXPERT_UP else i)(box)
        return mesh_pieces(t.shape, mesh, ("dp", "moe"), {0: [("moe", linear)]}, slot, place)
    i_r = i // group
    if down:
        return mesh_pieces(t.shape, mesh, ("dp", "moe"), {2: [("moe", even)]}, slot)
    place = fused_placer((e, 2 * i_r, h), 1, 0 if t.role == Role.EXPERT_GATE else i_r)
    return mesh_pieces(t.shape, mesh, ("dp", "moe"), {1: [("moe", even)]}, slot, place)
