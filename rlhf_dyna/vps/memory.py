"""Peak memory per rank during a schedule, with and without in-place release of source storage.

Granularity: one rank's piece of one tensor.  In place, a destination piece is allocated at the
first round that writes it (round 0 for local copies) and a source piece is freed after the last
round that reads it; otherwise all destination pieces exist from the start.  Bytes in flight (send
and receive staging of the round) come on top.  Reported: peak minus the rank's source bytes.
"""
from __future__ import annotations

import numpy as np

from .schedule import Schedule


def inflight(schedule: Schedule) -> np.ndarray:
    """[rounds, world] staging bytes (sent + received) per rank and round."""
    w = schedule.plan.world_size
    out = np.zeros((max(1, schedule.num_rounds), w))
    for i in range(schedule.num_rounds):
        s, d, b = schedule.round_pairs(i)
        np.add.at(out[i], s, b)
        np.add.at(out[i], d, b)
    return out


def held_bytes(geo_ptr_flat, vol_per_shard: np.ndarray, weight: int, world: int) -> np.ndarray:
    ptr, flat = geo_ptr_flat
    out = np.zeros(world)
    np.add.at(out, flat, np.repeat(vol_per_shard, np.diff(ptr)) * float(weight))
    return out


def peak_extra_bytes(schedule: Schedule, in_place: bool) -> np.ndarray:
    """[world] peak bytes above each rank's source bytes."""
    plan, w = schedule.plan, schedule.plan.world_size
    n = max(1, schedule.num_rounds)
    src_total = np.zeros(w)
    src_delta = np.zeros((n + 1, w))  # freed after round t -> subtract at t+1
    dst_delta = np.zeros((n + 1, w))  # allocated at round t
    for c in plan.classes:
        src_vol = np.array([s.box.volume for s in c.src.shards], dtype=np.float64)
        dst_vol = np.array([s.box.volume for s in c.dst.shards], dtype=np.float64)
        src_held = held_bytes(c.src.holder_arrays(), src_vol, c.weight, w)
        dst_held = held_bytes(c.dst.holder_arrays(), dst_vol, c.weight, w)
        src_total += src_held
        if not in_place:
            dst_delta[0] += dst_held
            continue
        stream = schedule.stream_index(c.send_src, c.send_dst)
        release = np.zeros(w, dtype=np.int64)
        np.maximum.at(release, c.send_src, schedule.last_round[stream] + 1)
        np.add.at(src_delta, (np.minimum(release, n), np.arange(w)), -src_held)
        alloc = np.full(w, n, dtype=np.int64)
        np.minimum.at(alloc, c.send_dst, schedule.first_round[stream])
        alloc[c.copy_rank] = 0
        np.add.at(dst_delta, (np.minimum(alloc, n), np.arange(w)), dst_held)
    live = src_total + np.cumsum(src_delta, axis=0)[:n] + np.cumsum(dst_delta, axis=0)[:n] + inflight(schedule)
    before_rounds = src_total + dst_delta[0]  # local copies run first, with all sources still held
    peak = np.maximum(live.max(axis=0), before_rounds)
    return np.maximum(peak - src_total, 0.0)
