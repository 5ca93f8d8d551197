"""Rank order search: the destination rank order whose plan moves the fewest bytes, the default on ties."""
from __future__ import annotations

from transformers import LlamaConfig

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.rank_order import bytes_by_order, candidate_orders, least_moving_order
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from rlhf_dyna.vps.tensor import Kind

CATALOG = catalog_from_config(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=128), "float32")
KINDS = (Kind.PARAM, Kind.EXP_AVG, Kind.EXP_AVG_SQ)


def _src(**spec) -> object:
    return build_layout(CATALOG, ParallelSpec(Phase.TRAIN, **spec), KINDS)


def test_fsdp_to_dp_x_tp_prefers_tp_outer_and_moves_less():
    dst = ParallelSpec(Phase.TRAIN, dp=2, tp=2)
    by_order = bytes_by_order(_src(dp=4), CATALOG, dst, KINDS, 8)
    inner, outer = by_order[dst], by_order[ParallelSpec(Phase.TRAIN, dp=2, tp=2, tp_outer=True)]
    assert outer < 0.75 * inner  # column-parallel weights stay in place entirely
    assert least_moving_order(_src(dp=4), CATALOG, dst, KINDS, 8).tp_outer


def test_ties_and_single_candidates_keep_the_default_order():
    assert candidate_orders(ParallelSpec(Phase.TRAIN, dp=4)) == [ParallelSpec(Phase.TRAIN, dp=4)]
    assert candidate_orders(ParallelSpec(Phase.TRAIN, tp=4)) == [ParallelSpec(Phase.TRAIN, tp=4)]
    assert candidate_orders(ParallelSpec(Phase.ROLLOUT, tp=2, vllm_dp=2)) == [ParallelSpec(Phase.ROLLOUT, tp=2, vllm_dp=2)]
    same = ParallelSpec(Phase.TRAIN, dp=2, tp=2)  # already there: nothing moves in the default order
    assert not least_moving_order(_src(dp=2, tp=2), CATALOG, same, KINDS, 8).tp_outer


def test_tp_outer_places_tp_groups_on_strided_ranks():
    layout = build_layout(CATALOG, ParallelSpec(Phase.TRAIN, dp=2, tp=2, tp_outer=True), (Kind.PARAM,))
    q = "model.layers.0.self_attn.q_proj.weight"
    rows = {r: next(p.box.lo[0] for p in layout.pieces(r) if p.tensor.name == q) for r in range(4)}
    assert rows == {0: 0, 1: 16, 2: 32, 3: 48}  # rank r holds dim-0 chunk r, as FSDP dp4 does
