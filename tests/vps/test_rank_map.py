"""Specs over explicit rank maps (the survivors of a leave, a world with joiners): a layout over a rank map is the
plain layout with its ranks renamed, plain and mapped specs of the same ranks are one spec, bad maps are refused."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.plan import build_plan
from rlhf_dyna.vps.schedule import build_schedule
from rlhf_dyna.vps.spec import ParallelSpec, Phase, describe_ranks, placed_on
from rlhf_dyna.vps.validate import SpecError

from .reference_executor import brute_force_min_bytes, check_destination, execute, random_state


@pytest.fixture(scope="module")
def tiny():
    cfg = SimpleNamespace(model_type="qwen3", num_hidden_layers=2, hidden_size=8, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=2, intermediate_size=12, vocab_size=37,
                          tie_word_embeddings=False, attention_bias=False)
    return catalog_from_config(cfg, param_dtype="float32")


def pieces_by_rank(layout, ranks):
    return {r: sorted((p.tensor.name, p.tensor.kind.value, p.box.lo, p.box.hi, p.buffer, p.offset, p.strides)
                      for p in layout.pieces(r)) for r in ranks}


@pytest.mark.parametrize("spec", [
    ParallelSpec(dp=3, zero=3),
    ParallelSpec(dp=2, tp=2, zero=3),
    ParallelSpec(dp=2, tp=2, zero=3, tp_outer=True),
    ParallelSpec(pp=2, dp=2, zero=1, master_weights=True),
    ParallelSpec(Phase.ROLLOUT, vllm_dp=2, tp=2),
])
def test_a_layout_over_a_rank_map_is_the_plain_layout_renamed(tiny, spec):
    ranks = (0, 2, 3, 7)[:spec.world_size]
    plain, mapped = build_layout(tiny, spec), build_layout(tiny, placed_on(spec, ranks))
    renamed = {ranks[i]: held for i, held in pieces_by_rank(plain, range(spec.world_size)).items()}
    assert pieces_by_rank(mapped, ranks) == renamed
    assert all(mapped.pieces(r) == [] for r in (1, 4, 5, 6))


def test_consecutive_ranks_give_the_plain_spec():
    spec = ParallelSpec(dp=2, tp=2)
    assert placed_on(spec, [4, 5, 6, 7]) == ParallelSpec(dp=2, tp=2, first_rank=4)
    mapped = placed_on(spec, [0, 2, 3, 5])
    assert mapped.rank_map == (0, 2, 3, 5) and mapped.first_rank == 0 and mapped.rank_bound == 6
    assert list(mapped.ranks) == [0, 2, 3, 5] and mapped.describe() == "train[dp=2,tp=2,zero=3]@0,2-3,5"
    assert describe_ranks([0, 1, 2, 9, 11, 12]) == "0-2,9,11-12"


@pytest.mark.parametrize("spec,message", [
    (ParallelSpec(dp=3, rank_map=(0, 2)), "rank_map has 2 ranks but the spec spans world_size=3"),
    (ParallelSpec(dp=3, rank_map=(0, 2, 2)), r"rank_map=\[0, 2, 2\] must name distinct ranks >= 0"),
    (ParallelSpec(dp=2, rank_map=(1, 3)), "first_rank=0 but rank_map starts at 1; valid first_rank: 1"),
])
def test_bad_rank_maps_are_refused(tiny, spec, message):
    with pytest.raises(SpecError, match=message):
        build_layout(tiny, spec)


def test_a_leave_of_a_middle_rank_moves_the_hand_counted_rows():
    """FSDP over 4 ranks of a [12, 1] tensor holds rows 0-2, 3-5, 6-8, 9-11. Over 3 ranks they need 0-3, 4-7, 8-11:
    rank 3 leaving, ranks 0, 1, 2 lack 1 + 2 + 3 rows; rank 1 leaving, survivors 0, 2, 3 lack 1 + 2 + 1."""
    cfg = SimpleNamespace(model_type="llama", num_hidden_layers=1, hidden_size=1, num_attention_heads=1,
                          num_key_value_heads=1, head_dim=1, intermediate_size=1, vocab_size=12,
                          tie_word_embeddings=True, attention_bias=False)
    catalog = catalog_from_config(cfg, param_dtype="float32")
    only_embedding = (catalog.tensors[0].name,)
    assert only_embedding == ("model.embed_tokens.weight",)
    old = build_layout(catalog, ParallelSpec(dp=4), kinds=(ParallelSpec().kinds[0],))
    for survivors, rows in (((0, 1, 2), 6), ((0, 2, 3), 4)):
        new = build_layout(catalog, placed_on(ParallelSpec(dp=3), survivors), kinds=(ParallelSpec().kinds[0],))
        plan = build_plan(old, new)
        embedding = [c for c in plan.classes if c.members[0].tensor.name in only_embedding]
        moved = sum(int(c.vol[c.send_region].sum()) * c.weight for c in embedding)
        assert moved == rows * 4  # float32
        schedule = build_schedule(plan, 1 << 20)
        state = random_state(old)
        dst_bufs, writes = execute(schedule, old, new, state)
        check_destination(new, state, dst_bufs, writes, plan.world_size)
        assert plan.moved_bytes == plan.min_bytes == brute_force_min_bytes(old, new, plan.world_size)
