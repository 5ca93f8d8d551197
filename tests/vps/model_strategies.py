"""Hypothesis strategies: small models with odd sizes and valid parallel specs for them."""
from __future__ import annotations

from itertools import product
from types import SimpleNamespace

from hypothesis import strategies as st

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.model import ModelCatalog
from rlhf_dyna.vps.spec import ParallelSpec, Phase, placed_on
from rlhf_dyna.vps.validate import SpecError, validate


@st.composite
def catalogs(draw) -> ModelCatalog:
    arch = draw(st.sampled_from(["llama", "qwen2", "qwen3", "qwen3_moe"]))
    heads = draw(st.sampled_from([2, 4, 6]))
    kv = draw(st.sampled_from([d for d in (1, 2, 3, 4, 6) if heads % d == 0]))
    moe = arch == "qwen3_moe"
    cfg = SimpleNamespace(
        model_type=arch, num_hidden_layers=draw(st.integers(1, 3)), hidden_size=draw(st.integers(3, 9)),
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=draw(st.sampled_from([1, 2, 3])),
        intermediate_size=draw(st.sampled_from([4, 6, 12])), vocab_size=draw(st.integers(5, 140)),
        tie_word_embeddings=draw(st.booleans()), attention_bias=False,
        num_experts=draw(st.integers(2, 5)) if moe else 0, moe_intermediate_size=draw(st.sampled_from([2, 4])),
        mlp_only_layers=[], decoder_sparse_step=1,
    )
    return catalog_from_config(cfg, param_dtype=draw(st.sampled_from(["bfloat16", "float32"])))


def valid_specs(catalog: ModelCatalog, max_world: int = 6) -> list[ParallelSpec]:
    out = []
    sizes = range(1, max_world + 1)
    for pp, dp, tp, cp, dpr, zero in product((1, 2), sizes, (1, 2, 3, 4), (1, 2), (1, 2), (0, 1, 2, 3)):
        for ep, etp in ((1, 1), (2, 1), (1, 2), (2, 2), (3, 1)):
            s = ParallelSpec(Phase.TRAIN, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, dp_replicate=dpr,
                             zero=zero, master_weights=zero == 1)
            out.append(s)
    for dp, vdp, pp, tp in product((1, 2), (1, 2), (1, 2), (1, 2, 3, 4)):
        for ep in (1, vdp * tp):
            out.append(ParallelSpec(Phase.ROLLOUT, dp=dp, vllm_dp=vdp, pp=pp, tp=tp, ep=ep))
    good = []
    for s in out:
        if s.world_size > max_world:
            continue
        try:
            validate(s, catalog.dims)
        except SpecError:
            continue
        good.append(s)
    return good


@st.composite
def placed(draw, spec: ParallelSpec, spare: int = 3) -> ParallelSpec:
    """`spec` from a random first rank, or over random distinct ranks (sorted, as survivors of a leave are, or in any
    order) among world_size + `spare`."""
    how = draw(st.sampled_from(["first_rank", "sorted", "any order"]))
    if how == "first_rank":
        return placed_on(spec, range(r := draw(st.integers(0, spare)), r + spec.world_size))
    ranks = draw(st.permutations(range(spec.world_size + spare)))[:spec.world_size]
    return placed_on(spec, sorted(ranks) if how == "sorted" else ranks)
