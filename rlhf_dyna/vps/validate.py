"""Refuse invalid parallel specs with errors that name the wrong number and the valid choices."""
from __future__ import annotations

from .model import ModelDims
from .spec import ParallelSpec, Phase
from .split import vllm_padded_vocab


class SpecError(ValueError):
    pass


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def require_divides(name: str, value: int, what: str, total: int) -> None:
    if value < 1 or total % value:
        valid = ", ".join(map(str, divisors(total)))
        raise SpecError(f"{name}={value} does not divide {what}={total}; valid {name}: {valid}")


def require_positive(spec: ParallelSpec) -> None:
    for name in ("dp", "tp", "pp", "cp", "ep", "etp", "dp_replicate", "vllm_dp"):
        if getattr(spec, name) < 1:
            raise SpecError(f"{name}={getattr(spec, name)} must be >= 1")


def require_ranks(spec: ParallelSpec) -> None:
    """A rank map names one distinct, non-negative rank per position of the spec, starting at first_rank."""
    ranks = spec.rank_map
    if ranks is None:
        return
    if len(ranks) != spec.world_size:
        raise SpecError(f"rank_map has {len(ranks)} ranks but the spec spans world_size={spec.world_size}; give one "
                        f"rank per position")
    if len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise SpecError(f"rank_map={list(ranks)} must name distinct ranks >= 0")
    if ranks[0] != spec.first_rank:
        raise SpecError(f"first_rank={spec.first_rank} but rank_map starts at {ranks[0]}; valid first_rank: {ranks[0]} "
                        f"(vps.spec.placed_on sets both)")


def stage_layers(spec: ParallelSpec, num_layers: int) -> list[tuple[int, int]]:
    """Contiguous layer range per pipeline stage: explicit `pp_layers`, else vLLM's get_pp_indices rule."""
    if spec.pp > num_layers:
        raise SpecError(f"pp={spec.pp} exceeds num_hidden_layers={num_layers}; valid pp: 1..{num_layers}")
    if spec.pp_layers is not None:
        sizes = list(spec.pp_layers)
        if len(sizes) != spec.pp:
            raise SpecError(f"pp_layers has {len(sizes)} stages but pp={spec.pp}; give one count per stage")
        if sum(sizes) != num_layers or min(sizes) < 1:
            raise SpecError(f"pp_layers={sizes} sums to {sum(sizes)}; each stage >= 1 and the sum must be {num_layers}")
    else:
        sizes = [num_layers // spec.pp] * spec.pp
        for i in range(2, num_layers % spec.pp + 2):
            sizes[-i] += 1
    bounds, lo = [], 0
    for s in sizes:
        bounds.append((lo, lo + s))
        lo += s
    return bounds


def validate(spec: ParallelSpec, dims: ModelDims) -> None:
    require_positive(spec)
    require_ranks(spec)
    require_divides("tp", spec.tp, "num_attention_heads", dims.num_heads)
    if dims.intermediate and any(i not in dims.moe_layers for i in range(dims.num_layers)):
        require_divides("tp", spec.tp, "intermediate_size", dims.intermediate)
    stage_layers(spec, dims.num_layers)
    if spec.phase == Phase.TRAIN:
        validate_train(spec, dims)
    else:
        validate_rollout(spec, dims)


def validate_train(spec: ParallelSpec, dims: ModelDims) -> None:
    require_divides("tp", spec.tp, "num_key_value_heads", dims.num_kv_heads)
    if spec.zero not in (0, 1, 2, 3):
        raise SpecError(f"zero={spec.zero} is not a ZeRO stage; valid zero: 0, 1, 2, 3")
    if dims.num_experts:
        group = spec.dp * spec.cp * spec.tp
        require_divides("ep*etp", spec.ep * spec.etp, "dp*cp*tp", group)
        if spec.ep > dims.num_experts:
            raise SpecError(f"ep={spec.ep} exceeds num_experts={dims.num_experts}; valid ep: 1..{dims.num_experts}")
        require_divides("etp", spec.etp, "moe_intermediate_size", dims.moe_intermediate)
    elif spec.ep != 1 or spec.etp != 1:
        raise SpecError(f"ep={spec.ep}, etp={spec.etp} on a dense model; valid: ep=1, etp=1")


def validate_rollout(spec: ParallelSpec, dims: ModelDims) -> None:
    if spec.cp != 1 or spec.dp_replicate != 1 or spec.etp != 1:
        raise SpecError("rollout specs take dp, vllm_dp, pp, tp, ep only; valid cp, dp_replicate, etp: 1")
    if spec.tp_outer:
        raise SpecError("tp_outer is a train rank order; vLLM's TP groups are consecutive ranks: valid tp_outer: False")
    kv = dims.num_kv_heads
    if spec.tp % kv and kv % spec.tp:
        valid = [t for t in divisors(dims.num_heads) if t % kv == 0 or kv % t == 0]
        raise SpecError(f"tp={spec.tp} neither divides nor is a multiple of num_key_value_heads={kv} "
                        f"(vLLM replicates KV heads only when tp is a multiple); valid tp: {', '.join(map(str, valid))}")
    require_divides("tp", spec.tp, "padded vocab_size", vllm_padded_vocab(dims.vocab))
    moe_group = spec.vllm_dp * spec.tp
    if dims.num_experts:
        if spec.ep not in (1, moe_group):
            raise SpecError(f"ep={spec.ep}: vLLM's expert parallel spans vllm_dp*tp ranks; valid ep: 1, {moe_group}")
        if spec.ep > dims.num_experts:  # vLLM would leave a rank without experts
            raise SpecError(f"ep={spec.ep} exceeds num_experts={dims.num_experts}; valid ep: 1, or a rollout of at most "
                            f"{dims.num_experts} ranks")
        if spec.ep == 1:
            require_divides("vllm_dp*tp", moe_group, "moe_intermediate_size", dims.moe_intermediate)
    elif spec.ep != 1:
        raise SpecError(f"ep={spec.ep} on a dense model; valid ep: 1")
