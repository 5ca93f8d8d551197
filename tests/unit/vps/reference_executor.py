"""A single-process executor of VPS schedules on numpy arrays: the tests' ground truth for plans."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from rlhf_dyna.vps.layout import Layout
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer, for_rank
from rlhf_dyna.vps.schedule import Schedule

NUMPY = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}


def view(buf: np.ndarray, offset: int, strides: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    return as_strided(buf[offset:], shape, tuple(s * buf.itemsize for s in strides), writeable=True)


def random_state(layout: Layout, seed: int = 0) -> dict[tuple[str, str], np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for e in layout.entries:
        dt = NUMPY[e.tensor.dtype]
        out[(e.tensor.name, e.tensor.kind.value)] = rng.integers(1, 30000, e.tensor.shape).astype(dt)
    return out


def materialise(layout: Layout, state, rank: int, fill: bool) -> dict[str, np.ndarray]:
    """Flat local buffers of `rank`; filled from the logical state, or zero (destination)."""
    bufs = {n: np.zeros(int(np.prod(b.shape)), NUMPY[b.dtype]) for n, b in layout.buffers(rank).items()}
    if fill:
        for p in layout.pieces(rank):
            full = state[(p.tensor.name, p.tensor.kind.value)]
            view(bufs[p.buffer], p.offset, p.strides, p.box.shape)[...] = full[tuple(slice(l, h) for l, h in zip(p.box.lo, p.box.hi))]
    return bufs


def execute(schedule: Schedule, src: Layout, dst: Layout, state) -> tuple[dict, dict]:
    """Run every rank's plan; returns (destination buffers, write counts) per rank."""
    w = schedule.plan.world_size
    plans: list[RankPlan] = [for_rank(schedule, r) for r in range(w)]
    src_bufs = [materialise(src, state, r, True) for r in range(w)]
    dst_bufs = [materialise(dst, state, r, False) for r in range(w)]
    writes = [{n: np.zeros(b.size, np.int64) for n, b in bufs.items()} for bufs in dst_bufs]
    for r, p in enumerate(plans):
        for t in p.copies:
            put(dst_bufs[r], writes[r], t, take(src_bufs[r], t))
    received = [{peer: bytearray() for peer in p.recvs} for p in plans]
    for i in range(schedule.num_rounds):
        for r, p in enumerate(plans):  # every send of the round must meet its receive in the same round
            for peer, (lo, hi) in p.rounds[i].sends.items():
                assert plans[peer].rounds[i].recvs.get(r) == (lo, hi), f"round {i}: {r}->{peer} unmatched"
                received[peer][r] += pack(src_bufs[r], p.sends[peer].transfers)[lo:hi]
            for peer in p.rounds[i].recvs:
                assert r in plans[peer].rounds[i].sends, f"round {i}: {peer}->{r} receive without send"
    for r, p in enumerate(plans):
        for peer, stream in p.recvs.items():
            data = bytes(received[r][peer])
            assert len(data) == stream.nbytes, f"rank {r} got {len(data)} of {stream.nbytes} bytes from {peer}"
            at = 0
            for t in stream.transfers:
                chunk = np.frombuffer(data[at:at + t.nbytes], NUMPY[t.dtype]).reshape(t.shape)
                put(dst_bufs[r], writes[r], t, chunk)
                at += t.nbytes
    return dst_bufs, writes


def take(bufs, t: Transfer) -> np.ndarray:
    return view(bufs[t.src_buffer], t.src_offset, t.src_strides, t.shape).copy()


def put(bufs, writes, t: Transfer, data: np.ndarray) -> None:
    view(bufs[t.dst_buffer], t.dst_offset, t.dst_strides, t.shape)[...] = data
    view(writes[t.dst_buffer], t.dst_offset, t.dst_strides, t.shape)[...] += 1


def pack(bufs, transfers: list[Transfer]) -> bytes:
    return b"".join(take(bufs, t).tobytes() for t in transfers)


def check_destination(dst: Layout, state, dst_bufs, writes, world: int) -> None:
    """Every destination piece rebuilt exactly, every element of it written exactly once, nothing else written."""
    for r in range(world):
        covered = {n: np.zeros(b.size, np.int64) for n, b in dst_bufs[r].items()}
        for p in dst.pieces(r):
            want = state[(p.tensor.name, p.tensor.kind.value)][tuple(slice(l, h) for l, h in zip(p.box.lo, p.box.hi))]
            got = view(dst_bufs[r][p.buffer], p.offset, p.strides, p.box.shape)
            assert np.array_equal(got, want), f"rank {r}: {p.tensor.name}/{p.tensor.kind.value} {p.box} differs"
            view(covered[p.buffer], p.offset, p.strides, p.box.shape)[...] += 1
        for n in covered:
            assert np.array_equal(writes[r][n], covered[n]), f"rank {r}: {n} written {writes[r][n]} vs pieces {covered[n]}"


def brute_force_min_bytes(src: Layout, dst: Layout, world: int) -> int:
    """Bytes each destination rank lacks: its destination pieces minus what it already holds (same kind)."""
    total, src_keys = 0, {(e.tensor.name, e.tensor.kind) for e in src.entries}
    for r in range(world):
        have = {}
        for p in src.pieces(r):
            have.setdefault((p.tensor.name, p.tensor.kind), []).append(p.box)
        for p in dst.pieces(r):
            if (p.tensor.name, p.tensor.kind) not in src_keys:
                continue
            overlaps = [b.intersect(p.box) for b in have.get((p.tensor.name, p.tensor.kind), [])]
            overlap = sum(o.volume for o in overlaps if o is not None)
            total += (p.box.volume - overlap) * p.tensor.itemsize
    return total
