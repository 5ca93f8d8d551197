"""The VPS executor on real gloo ranks, on synthetic buffers filled from a seeded logical state.

Every destination element is compared with the logical state (a torch reference of what each rank must hold),
the executor's verification mode is on, and byte counts are compared with the plan's minimum.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.transition.executor import execute, prepare
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.verify import TransitionMismatch, check_destination, source_sums
from rlhf_dyna.transition.views import dst_view
from rlhf_dyna.transition.vps_plans import without_copies
from rlhf_dyna.vps.adopt import adoptable
from rlhf_dyna.vps.rank_plan import for_rank
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from tests.multirank import run_ranks
from tests.seeded_transition import expect_destination, seeded_transition


def sum_over_ranks(value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t)


def _move_and_check(rank: int, world: int, src_spec: ParallelSpec, dst_spec: ParallelSpec, budget: int,
                    dst_param_dtype: str, min_rounds: int, config: str = "kv2") -> None:
    src, dst, schedule, state, src_bufs, dst_bufs = seeded_transition(rank, src_spec, dst_spec, budget, dst_param_dtype, config)
    plan = for_rank(schedule, rank)
    largest = max((t.nbytes for s in plan.recvs.values() for t in s.transfers), default=0)
    # one round at a time, then gloo's windows: consecutive rounds together while their staging fits the budget
    # (every segment its own message, so contiguous ones need no staging and their rounds do merge)
    windows = TraceRecorder(rank)
    for runnable, trace in ((plan, None), (prepare(plan, direct_bytes=1, budget_bytes=budget), windows)):
        for buf in dst_bufs.values():
            buf.zero_()
        stats = execute(runnable, src_bufs, dst_bufs, verify=True, trace=trace)
        expect_destination(dst, state, rank, dst_bufs)
        assert sum_over_ranks(stats.bytes_received) == sum_over_ranks(stats.bytes_sent) == schedule.plan.min_bytes == schedule.plan.moved_bytes
        assert stats.rounds == schedule.num_rounds >= min_rounds
        assert stats.peak_extra_bytes <= budget + largest, (stats.peak_extra_bytes, budget, largest)
    merged = torch.tensor([any(e.args["window"].split("-")[0] != e.args["window"].split("-")[1] for e in windows.events)])
    dist.all_reduce(merged)  # some rank ran rounds together: the windowed path was exercised
    assert int(merged) > 0


@pytest.mark.timeout(120)
def test_fsdp_dp4_to_rollout_tp2_dp2_bf16_in_many_rounds():
    """Train dp4 (fp32 params + Adam moments) -> vLLM fused tp2 x dp2 in bf16: qkv with KV replication, padded vocab,
    casts on the wire; a 2 KiB budget forces many rounds."""
    run_ranks(_move_and_check, 4, ParallelSpec(dp=4), ParallelSpec(Phase.ROLLOUT, tp=2, vllm_dp=2), 2048, "bfloat16", 5,
              "kv1")


@pytest.mark.timeout(120)
def test_fsdp_dp4_to_dp2_tp2_with_adam_state():
    run_ranks(_move_and_check, 4, ParallelSpec(dp=4), ParallelSpec(dp=2, tp=2), 4096, "float32", 3)


@pytest.mark.timeout(120)
def test_three_ranks_zero3_to_zero1_and_to_rollout_replicas():
    """A non-power-of-two world: uneven and empty FSDP chunks; ZeRO-3 -> ZeRO-1 (params all-gathered)."""
    run_ranks(_move_and_check, 3, ParallelSpec(dp=3), ParallelSpec(dp=3, zero=1), 1536, "float32", 3)


def _detect_corruption(rank: int, world: int) -> None:
    src, dst, schedule, state, src_bufs, dst_bufs = seeded_transition(rank, ParallelSpec(dp=2), ParallelSpec(dp=1, tp=2), 1 << 20)
    plan = for_rank(schedule, rank)
    sums = source_sums(plan, src_bufs)
    execute(plan, src_bufs, dst_bufs)
    check_destination(plan, sums, dst_bufs)  # intact: passes
    wrong = for_rank(schedule, 1).recvs[0].transfers[0]  # the first piece rank 1 receives from rank 0
    if rank == 1:
        dst_view(dst_bufs, wrong).view(-1)[0] += 1.0
    with pytest.raises(TransitionMismatch) as err:
        check_destination(plan, sums, dst_bufs)
    assert f"{wrong.tensor}/{wrong.kind.value}: region of shape {wrong.shape} from rank 0" in str(err.value)
    assert "to rank 1" in str(err.value)


@pytest.mark.timeout(90)
def test_verification_names_the_first_wrong_piece_on_every_rank():
    run_ranks(_detect_corruption, 2)


def _release_early(rank: int, world: int) -> None:
    src, dst, schedule, state, src_bufs, dst_bufs = seeded_transition(rank, ParallelSpec(dp=2), ParallelSpec(dp=1, tp=2), 256)
    plan = for_rank(schedule, rank)
    recorder = TraceRecorder(rank)
    released_in_round: dict[str, int] = {}

    def release(name: str) -> None:
        released_in_round[name] = len(recorder.events)  # rounds finished so far
        src_bufs[name].untyped_storage().resize_(0)  # what an in-place transition does with a consumed source

    stats = execute(plan, src_bufs, dst_bufs, trace=recorder, release=release)
    expect_destination(dst, state, rank, dst_bufs)
    read = {t.src_buffer for t in plan.copies} | {t.src_buffer for s in plan.sends.values() for t in s.transfers}
    assert set(released_in_round) == read
    assert stats.rounds > 2 and min(released_in_round.values()) < stats.rounds - 1  # some freed while rounds remain
    assert len(recorder.events) == stats.rounds and [e.round for e in recorder.events] == list(range(stats.rounds))


@pytest.mark.timeout(90)
def test_in_place_release_frees_sources_and_keeps_results():
    run_ranks(_release_early, 2)


def _adopt_kept_shards(rank: int, world: int) -> None:
    """dp2 -> tp2 keeps every column-parallel shard and (FSDP on dim 1) every row-parallel one on its rank: those
    destinations take over the source storage (no copy), the norms (sharded -> replicated) still arrive, adopted
    sources are never released, and every element is right."""
    src, dst, schedule, state, src_bufs, dst_bufs = seeded_transition(rank, ParallelSpec(dp=2), ParallelSpec(dp=1, tp=2), 1024)
    prepared = prepare(for_rank(schedule, rank))
    adopted = adoptable(prepared.plan, src.buffers(rank), dst.buffers(rank))
    assert 0 < len(adopted) < len(dst_bufs)
    assert any(t.dst_buffer == "model.layers.0.self_attn.q_proj.weight:param" for t in prepared.plan.copies)
    assert "model.layers.0.self_attn.q_proj.weight:param" in adopted
    assert "model.layers.0.self_attn.o_proj.weight:param" in adopted  # row-parallel: column blocks both ways
    assert "model.norm.weight:param" not in adopted  # dp-sharded -> replicated over tp
    for d, s in adopted.items():
        dst_bufs[d] = src_bufs[s]
    released: set[str] = set()

    def release(name: str) -> None:
        released.add(name)
        src_bufs[name].untyped_storage().resize_(0)

    stats = execute(without_copies(prepared, adopted), src_bufs, dst_bufs, verify=True, release=release)
    expect_destination(dst, state, rank, dst_bufs)
    assert released.isdisjoint(adopted.values()) and released
    assert stats.local_bytes == sum(t.nbytes for t in prepared.plan.copies if t.dst_buffer not in adopted)


@pytest.mark.timeout(90)
def test_in_place_adopts_shards_that_stay():
    run_ranks(_adopt_kept_shards, 2)
