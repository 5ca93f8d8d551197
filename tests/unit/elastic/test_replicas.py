"""Replicas as a VPS layout and the recovery from lost ranks (elastic/replicas.py), checked against independent counts:
the ring layout gives each holder its predecessor's buffers; the snapshot moves, element by element, what the holder
does not hold itself; the served recovery plans, run by the numpy executor below with the survivors' own buffers and
the holders' replicas, rebuild the new world's state exactly, each element from the rank an element-by-element count
expects (the survivor that held it, else the lost rank's replica holder), moving the bytes that count gives."""
from __future__ import annotations


import numpy as np
import pytest

from rlhf_dyna.elastic.membership import GlobalBatch, WorldChange, world_after
from rlhf_dyna.elastic.placement import ACTOR, CRITIC, REFERENCE, ROLLOUT
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement
from rlhf_dyna.elastic.replicas import (REPLICA, Served, bytes_between_ranks, holder_of, ring_spec, served_rank_plans,
                                        unrecoverable)
from rlhf_dyna.models.value_catalog import value_catalog
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.plan import build_plan
from rlhf_dyna.vps.schedule import build_schedule
from rlhf_dyna.vps.spec import placed_on

from ..vps.reference_executor import NUMPY, check_destination, materialise, pack, put, random_state, take, view
from .test_membership_bytes import masks

BATCH = GlobalBatch(prompts=420, rows=840)
PPO = (ACTOR, CRITIC, REFERENCE, ROLLOUT)


def test_the_ring_and_what_cannot_be_recovered():
    assert [holder_of(r, 4) for r in range(4)] == [1, 2, 3, 0]
    assert unrecoverable((2,), 4) == () and unrecoverable((1, 3), 4) == ()
    assert unrecoverable((1, 2), 4) == (1,)  # rank 2 held rank 1's replica
    assert unrecoverable((3, 0), 4) == (3,)
    with pytest.raises(ValueError, match=r"\[1\] lost with their replica holders"):
        Served((1, 2), 4)
    assert Served((2,), 4).new_rank(2) == 2 and Served((2,), 4).played_by(2) == (3, 2)


@pytest.mark.parametrize("layout", [ParallelLayout(), ParallelLayout(tp=2)], ids=["fsdp4", "fsdp2 x tp2"])
def test_the_snapshot_moves_what_the_holder_lacks(tiny, layout):
    spec = layout.fill(4).spec()
    own, ring = build_layout(tiny, spec), build_layout(tiny, ring_spec(spec, 4))
    itemsize = {(e.tensor.name, e.tensor.kind): e.tensor.itemsize for e in own.entries}
    expected = 0
    for r in range(4):
        h = holder_of(r, 4)
        assert ring.buffers(h) == own.buffers(r)  # the holder's replica buffers are its predecessor's, same offsets
        held = masks(own, h)
        for key, need in masks(own, r).items():
            expected += int((need & ~held.get(key, np.zeros_like(need))).sum()) * itemsize[key]
    plan = build_plan(own, ring, ranks_per_node=4)
    assert plan.moved_bytes == expected
    if layout.tp == 1:  # FSDP alone holds every element once: the whole state crosses to the next rank
        assert expected == own.total_bytes()


def run_served(plans, src_bufs, dst_bufs):
    """Every new rank's served plan on numpy buffers (both ends of a stream must list the same transfers); the
    writes per destination element."""
    writes = [{n: np.zeros(b.size, np.int64) for n, b in bufs.items()} for bufs in dst_bufs]
    for p in plans:
        for t in p.copies:
            put(dst_bufs[p.rank], writes[p.rank], t, take(src_bufs[p.rank], t))
    for p in plans:
        for peer, stream in p.sends.items():
            incoming = plans[peer].recvs[p.rank]
            assert [t.nbytes for t in incoming.transfers] == [t.nbytes for t in stream.transfers]
            data, at = pack(src_bufs[p.rank], stream.transfers), 0
            for t in incoming.transfers:
                chunk = np.frombuffer(data[at:at + t.nbytes], NUMPY[t.dtype]).reshape(t.shape)
                put(dst_bufs[peer], writes[peer], t, chunk)
                at += t.nbytes
    assert all(set(p.recvs) == {q.rank for q in plans if p.rank in q.sends} for p in plans)
    return writes


def held_buffers(old_layout, state, served: Served, fill=None):
    """New rank -> its own old buffers plus the replica of the lost rank it holds (filled from `state`, or with
    `fill(new rank)` everywhere: then a destination element shows which rank it came from)."""
    out = []
    for new, old in enumerate(served.survivors):
        bufs = dict(materialise(old_layout, state, old, True))
        for lost in served.played_by(new)[1:]:
            bufs.update({REPLICA + n: b for n, b in materialise(old_layout, state, lost, True).items()})
        if fill is not None:
            bufs = {n: np.full_like(b, fill(new)) for n, b in bufs.items()}
        out.append(bufs)
    return out


def expected_sources(old_layout, new_layout, served: Served):
    """(new rank, tensor, kind) -> per element the new rank it must come from, -1 where it may come from several; the
    bytes of elements with one possible source that must cross ranks, and the bytes of those with several."""
    out, moved, choices = {}, 0, 0
    itemsize = {(e.tensor.name, e.tensor.kind): e.tensor.itemsize for e in old_layout.entries}
    holders = {old: masks(old_layout, old) for old in range(served.world_size)}
    for q in range(len(served.survivors)):
        own = holders[served.survivors[q]]
        for key, need in masks(new_layout, q).items():
            source = np.full(need.shape, -1)
            count = np.zeros(need.shape, int)
            for old, held in holders.items():
                mask = held.get(key, np.zeros_like(need)) & need
                source[mask], count[mask] = served.new_rank(old), count[mask] + 1
            mine = own.get(key, np.zeros_like(need)) & need
            source[mine], count[mine] = q, 1  # a survivor's own element is a local copy
            source[count > 1] = -1
            out[(q, *key)] = source
            moved += int(((source != q) & (source != -1) & need).sum()) * itemsize[key]
            choices += int(((source == -1) & need).sum()) * itemsize[key]
    return out, moved, choices


@pytest.mark.parametrize("layout,lost", [(ParallelLayout(), (2,)), (ParallelLayout(), (3,)), (ParallelLayout(), (1, 3)),
                                         (ParallelLayout(tp=2), (2,)), (ParallelLayout(tp=2), (1, 3))],
                         ids=["fsdp4 lost 2", "fsdp4 lost 3", "fsdp4 lost 1 and 3", "fsdp2xtp2 lost 2 (tp 1 after)",
                              "fsdp2xtp2 lost 1 and 3 (dp1 x tp2 after)"])
def test_recovery_restores_every_piece_from_the_counted_rank(tiny, layout, lost):
    world, req = 4, PolicyRequest("colocate", 4, PPO, layout)
    new = world_after(make_placement(req), req.train, 1, BATCH, WorldChange(world, lost))
    served = Served(lost, world)
    for move in new.moves:
        catalog = value_catalog(tiny) if move.role == CRITIC else tiny
        old_layout, dst = build_layout(catalog, move.src, move.kinds), build_layout(catalog, move.dst, move.kinds)
        plain = placed_on(move.dst, [served.survivors.index(r) for r in move.dst.ranks])
        new_layout = build_layout(catalog, plain, move.kinds)
        plans = served_rank_plans(build_schedule(build_plan(old_layout, dst, ranks_per_node=4), 1 << 30), lost, world)
        state = random_state(old_layout)
        dst_bufs = [materialise(new_layout, state, q, False) for q in range(len(served.survivors))]
        writes = run_served(plans, held_buffers(old_layout, state, served), dst_bufs)
        check_destination(new_layout, state, dst_bufs, writes, len(served.survivors))  # exact, each element once
        ids = [materialise(new_layout, state, q, False) for q in range(len(served.survivors))]
        run_served(plans, held_buffers(old_layout, state, served, fill=lambda q: q + 1), ids)
        want, moved, choices = expected_sources(old_layout, new_layout, served)
        for q in range(len(served.survivors)):
            for p in new_layout.pieces(q):
                got = view(ids[q][p.buffer], p.offset, p.strides, p.box.shape) - 1
                expect = want[(q, p.tensor.name, p.tensor.kind)][tuple(slice(a, b) for a, b in zip(p.box.lo, p.box.hi))]
                choice = expect == -1  # several holders: the planner chose one of them
                assert np.array_equal(got[~choice], expect[~choice]), (move.role, q, p.tensor.name)
        if layout.tp == 1:  # FSDP alone: every element has one holder, so one possible source
            assert choices == 0 and bytes_between_ranks(plans) == moved
        else:  # tp-replicated elements have several holders, of which the planner picks one
            assert moved <= bytes_between_ranks(plans) <= moved + choices

