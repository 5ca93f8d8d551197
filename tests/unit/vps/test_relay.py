"""vps.relay: a move into vLLM's DP replicas relayed through one replica rebuilds every destination piece exactly, with
the bytes of the direct plan, and is chosen only where it moves no more than the direct plan."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlhf_dyna.models.build import ModelSpec, make_hf_config
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.plan import build_plan
from rlhf_dyna.vps.relay import relay_pays, relay_plans, relay_ranks, replica_groups, restricted
from rlhf_dyna.vps.schedule import build_schedule
from rlhf_dyna.vps.spec import Phase, rollout_spec, train_spec
from rlhf_dyna.vps.tensor import Kind

from .model_strategies import catalogs, valid_specs
from .reference_executor import check_destination, execute, random_state

SPEC = ModelSpec(arch="llama", vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
PARAM = (Kind.PARAM,)


def _relayed_exactly(src, dst, first, budget: int = 1 << 30) -> None:
    """Both stages on the reference executor: the first ranks' pieces, then every other rank's, rebuilt exactly."""
    first_plan, second_plan = relay_plans(src, dst, first, ranks_per_node=8)
    state = random_state(src)
    for plan in (first_plan, second_plan):
        bufs, writes = execute(build_schedule(plan, budget), plan.src, plan.dst, state)
        check_destination(plan.dst, state, bufs, writes, plan.world_size)
    for rank in dst.spec.ranks:  # every rank of the destination is filled by exactly one of the stages
        filled = first_plan.dst if rank in first else second_plan.dst
        assert filled.buffers(rank) == dst.buffers(rank)
        assert (first_plan.dst if rank not in first else second_plan.dst).buffers(rank) == {}


def test_fsdp_dp4_to_vllm_tp2_dp2_relays_through_the_rank_holding_most_with_the_direct_bytes() -> None:
    catalog = catalog_from_config(make_hf_config(SPEC), "bfloat16", "float32")
    src, dst = build_layout(catalog, train_spec(4), PARAM), build_layout(catalog, rollout_spec(2, 2), PARAM)
    assert replica_groups(dst) == [(0, 2), (1, 3)]  # vLLM's replicas of TP rank 0 and of TP rank 1
    direct = build_plan(src, dst)
    first, second = relay_ranks(direct)
    assert (first, second) == ({0, 3}, {1, 2})  # ranks 0 and 3 hold a quarter of their TP shard; 1 and 2 none
    stages = relay_plans(src, dst, first, ranks_per_node=8)
    received = sum(s.pair_bytes() for s in stages).sum(axis=0)
    assert relay_pays(direct, stages)
    assert sum(s.moved_bytes for s in stages) <= direct.moved_bytes * 1.01  # what is more: norms 1 and 2 held a slice of
    assert received.max() <= direct.pair_bytes().sum(axis=0).max() * 1.01
    assert stages[0].pair_bytes()[:, [1, 2]].sum() == 0  # the second ranks get everything from the first, whole
    assert set(stages[1].pair_bytes().nonzero()[0]) <= first
    _relayed_exactly(src, dst, first)


def test_a_single_replica_or_more_bytes_stays_direct() -> None:
    catalog = catalog_from_config(make_hf_config(SPEC), "bfloat16", "float32")
    src = build_layout(catalog, train_spec(4), PARAM)
    one = build_plan(src, build_layout(catalog, rollout_spec(4, 1), PARAM))
    assert relay_ranks(one) is None  # tp4: no replicas
    dst = build_layout(catalog, rollout_spec(1, 4), PARAM)
    four = build_plan(src, dst)
    first, _ = relay_ranks(four)
    assert not relay_pays(four, relay_plans(src, dst, first, ranks_per_node=8))  # one rank would send 4 copies


def test_restricted_keeps_only_the_named_ranks() -> None:
    catalog = catalog_from_config(make_hf_config(SPEC), "bfloat16", "float32")
    dst = build_layout(catalog, rollout_spec(2, 2), PARAM)
    part = restricted(dst, frozenset({0, 3}))
    assert part.buffers(0) == dst.buffers(0) and part.buffers(3) == dst.buffers(3)
    assert part.buffers(1) == part.buffers(2) == {}
    assert part.pieces(0) == dst.pieces(0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_relay_rebuilds_the_destination_exactly(data) -> None:
    catalog = data.draw(catalogs())
    specs = valid_specs(catalog, max_world=4)
    dst = data.draw(st.sampled_from([s for s in specs if s.phase == Phase.ROLLOUT and s.vllm_dp * s.dp > 1]))
    src = data.draw(st.sampled_from([s for s in specs if s.phase == Phase.TRAIN and s.world_size == dst.world_size]))
    src_layout, dst_layout = build_layout(catalog, src, PARAM), build_layout(catalog, dst, PARAM)
    ranks = relay_ranks(build_plan(src_layout, dst_layout))
    if ranks is None:  # expert parallelism: every rank holds other experts
        assert dst.ep > 1 or any(len(g) == 1 for g in replica_groups(dst_layout))
        return
    _relayed_exactly(src_layout, dst_layout, ranks[0], budget=data.draw(st.sampled_from([64, 1 << 30])))
