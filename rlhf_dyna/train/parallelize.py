"""Apply a (dp, tp) or (dp, ep) training layout to an HF decoder (policy or value model) with torch's own parallel APIs."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from rlhf_dyna.models.architectures import architecture
from rlhf_dyna.train import shm_collectives
from rlhf_dyna.train.expert_parallel import apply_expert_parallel, moe_experts
from rlhf_dyna.vps.train_layout import row_sharded_on_cols

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
WHOLE_MODEL_UNIT_BYTES = 64 << 20


def layer_tp_plan(config) -> dict[str, ParallelStyle]:
    """The architecture's decoder-layer TP plan (models/architectures.py) as torch parallel styles."""
    return {module: STYLES[style]() for module, style in architecture(config.model_type).tp_plan}


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Both the causal LM and the ValueModel keep the HF backbone at `.model`; a pipeline stage keeps its layers in a
    ModuleDict keyed by the global layer index (train.pp_stage)."""
    layers = model.model.layers
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    config = model.config
    tp = tp_mesh.size()
    if getattr(config, "num_experts", 0):
        raise ValueError(f"tp={tp} on an MoE model ({config.model_type}, num_experts={config.num_experts}): the TP plan "
                         f"has no styles for the fused expert tensors; train MoE models with tp=1 (FSDP2 over dp)")
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        if getattr(config, name) % tp:
            raise ValueError(f"tp={tp} does not divide {name}={getattr(config, name)}")
    plan = layer_tp_plan(config)
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)
    # Vocab-parallel embedding / lm_head only when untied: tying one Parameter to two TP styles would
    # distribute it twice and break the tie, so tied models keep both replicated over tp.
    if not config.tie_word_embeddings:
        plan: dict[str, ParallelStyle] = {}
        if getattr(model.model, "embed_tokens", None) is not None:  # a pipeline stage may hold neither (train.pp_stage)
            plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if getattr(model, "lm_head", None) is not None:
            plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())  # full logits: losses need the whole vocab
        if plan:
            parallelize_module(model, tp_mesh, plan)


ZERO_STAGES = (1, 2, 3)


def row_parallel_weights(config) -> list[str]:
    """The decoder-layer weights the architecture's TP plan splits by rows' inputs (their dim 1)."""
    return [f"{module}.weight" for module, style in architecture(config.model_type).tp_plan if style == "rowwise"]


def fsdp_shard_dim(layers: list[nn.Module], dp: int, row_parallel: list[str]) -> Callable[[nn.Parameter], Shard | None]:
    """Row-parallel weights shard on dim 1 (their TP dim) where the VPS train layout says so
    (`vps.train_layout.row_sharded_on_cols`: the TP-local columns split evenly over dp), so a rank's shard is a column
    block under dp and dp x tp alike and a relayout between them keeps it in place; everything else keeps dim 0."""
    on_cols = set()
    for layer in layers:
        own = dict(layer.named_parameters())
        for name in (n for n in row_parallel if n in own):  # MoE layers have no dense mlp.down_proj
            weight = own[name]
            tp = weight.device_mesh.size() if isinstance(weight, DTensor) else 1
            if row_sharded_on_cols(weight.shape[1], tp, dp):
                on_cols.add(id(weight))
    return lambda param: Shard(1) if id(param) in on_cols else None


def per_layer_units(model: nn.Module) -> bool:
    """FSDP units per decoder layer, or one for the whole model below WHOLE_MODEL_UNIT_BYTES of parameters: a unit
    costs two all-gathers and a reduce-scatter per step, a whole small model gathered at once little memory. FSDP2
    shards each parameter alone, so the grouping moves no shard (the VPS layout is the same)."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) > WHOLE_MODEL_UNIT_BYTES


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, precision: str, zero: int = 3,
               expert_mesh: DeviceMesh | None = None, per_layer: bool | None = None) -> None:
    """FSDP2 per decoder layer plus the root (the root alone for a small model: per_layer_units); bf16 computes in
    bf16 on fp32 master params, reduces grads in fp32.

    ZeRO stages on FSDP2 (its sharded parameter is the fp32 master shard that AdamW updates):
      zero=3: fully_shard defaults: params, grads and optimizer state sharded; params gathered per forward/backward.
      zero=2: params kept unsharded (replicated over dp) across forward, backward and steps; grads reduce-scattered
              (sharded); optimizer state and master shards sharded; the engine re-gathers the replicas after each step.
      zero=1: mapped to the same FSDP2 configuration as zero=2. FSDP2 always reduce-scatters grads, so ZeRO-1's
              full-gradient residency cannot be expressed; grads never cross a step or a transition, so the state
              that persists (replicated params, sharded master + AdamW state) is exactly ZeRO-1's.

    With expert_mesh ("edp" of an EP mesh), each MoE layer's experts (DTensors on "ep") are their own FSDP unit over
    it; their grads, summed over the EP group by the all-to-all's backward and over edp by the reduce-scatter, are
    divided by the whole dp size, as every other grad is (torchtitan's scheme). `per_layer`: None = by the model's
    size (per_layer_units). On the CPU the units' all-gathers and reduce-scatters go through shared memory where the
    group is on one host (train/shm_collectives.py)."""
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero={zero}; valid: {ZERO_STAGES}")
    if precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    elif precision == "fp32":
        mp = MixedPrecisionPolicy()
    else:
        raise ValueError(f"precision={precision!r}; valid: 'fp32', 'bf16'")
    keep_replicas, row_parallel = zero < 3, row_parallel_weights(model.config)
    layers = decoder_layers(model)
    per_layer = per_layer_units(model) if per_layer is None else per_layer
    for layer in layers:
        experts = moe_experts(layer) if expert_mesh is not None else None
        if experts is not None:
            fully_shard(experts, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=not keep_replicas)
            experts.set_gradient_divide_factor(float(dp_mesh.size()))
            experts.set_force_sum_reduction_for_comms(True)  # sum, then divide: gloo has no PREMUL_SUM
        if per_layer:
            fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=not keep_replicas,
                        shard_placement_fn=fsdp_shard_dim([layer], dp_mesh.size(), row_parallel))
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=not keep_replicas,
                shard_placement_fn=None if per_layer else fsdp_shard_dim(layers, dp_mesh.size(), row_parallel))
    if dp_mesh.device_type == "cpu" and dp_mesh.size() > 1:
        shm_collectives.install([*layers, model] if per_layer else [model])
    if keep_replicas:
        model.set_reshard_after_backward(False)  # recurses: every FSDP module keeps its gathered params


def parallelize(model: nn.Module, mesh: DeviceMesh, precision: str, zero: int = 3) -> nn.Module:
    """EP over mesh["ep"] (an ("edp", "ep", "tp") mesh, train.mesh.build_mesh), TP over mesh["tp"] (if > 1), then
    FSDP2 over mesh["dp"] (experts over mesh["edp"]) at ZeRO stage `zero`; parameters keep their HF names."""
    expert_mesh = None
    if "ep" in (mesh.mesh_dim_names or ()):
        apply_expert_parallel(decoder_layers(model), mesh["ep"])
        expert_mesh = mesh["edp"]
    if mesh["tp"].size() > 1:
        apply_tensor_parallel(model, mesh["tp"])
    apply_fsdp(model, mesh["dp"], precision, zero, expert_mesh)
    return model
