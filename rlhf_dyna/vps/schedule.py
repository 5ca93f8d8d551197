"""Schedule: rounds of batched point-to-point messages under a per-rank memory budget, deadlock-free.

All bytes a source rank sends to a destination rank form one stream (one packed message per pair
and round).  Each round gives every rank at most budget/2 bytes to send and budget/2 to receive:
a rank's remaining streams share its allowance in proportion to their remaining bytes (the stricter
of the sender's and the receiver's shares wins), so the busiest ranks are saturated every round and
the round count is close to max(bytes per rank) / (budget / 2).  Every stream travels in order, as
consecutive byte ranges.  Every rank derives the same rounds from the same plan (integer and
float64 arithmetic in a fixed order), and a round's sends and receives are matched pairs, so posting
them all together (batched P2P) cannot deadlock, whatever the world size.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import Plan


@dataclass(eq=False)
class Round:
    """Messages of one round: stream (src -> dst) bytes [lo, hi)."""

    src: np.ndarray
    dst: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


@dataclass(eq=False)
class Schedule:
    plan: Plan
    budget_bytes: int
    rounds: list[Round]
    stream_src: np.ndarray  # one entry per (src, dst) stream, sorted by (src, dst)
    stream_dst: np.ndarray
    stream_bytes: np.ndarray
    first_round: np.ndarray  # per stream: first and last round carrying it
    last_round: np.ndarray

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def round_pairs(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bytes) of the messages of round i."""
        r = self.rounds[i]
        return r.src, r.dst, (r.hi - r.lo).astype(np.float64)

    def stream_index(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        w = self.plan.world_size
        keys = self.stream_src * w + self.stream_dst
        return np.searchsorted(keys, np.asarray(src) * w + np.asarray(dst))


def build_schedule(plan: Plan, budget_bytes: int = 4 << 30) -> Schedule:
    w = plan.world_size
    pairs = plan.pair_bytes()
    src, dst = np.nonzero(pairs)
    total = np.rint(pairs[src, dst]).astype(np.int64)
    done = np.zeros_like(total)
    first, last = np.full(len(total), -1, np.int64), np.full(len(total), -1, np.int64)
    half = max(1, budget_bytes // 2)
    rounds: list[Round] = []
    idx = np.arange(len(total))  # streams still carrying bytes, compacted as they finish
    s, d, rem = src, dst, total.astype(np.float64)  # float64 is exact for byte counts < 2**53
    while len(idx):
        send_room = half / np.bincount(s, rem, minlength=w).clip(min=1)
        recv_room = half / np.bincount(d, rem, minlength=w).clip(min=1)
        share = np.minimum(send_room[s], recv_room[d])
        # (1 - 1e-12): float rounding must never push a rank above its allowance
        take = np.where(share >= 1.0, rem, np.floor(rem * share * (1 - 1e-12)))
        if not take.any():  # allowances smaller than the stream count: one stream at a time
            take[0] = min(rem[0], half)
        moving = np.flatnonzero(take)
        streams = idx[moving]
        lo = done[streams]
        hi = lo + take[moving].astype(np.int64)
        first[streams] = np.where(first[streams] < 0, len(rounds), first[streams])
        last[streams] = len(rounds)
        rounds.append(Round(src[streams], dst[streams], lo, hi))
        done[streams] = hi
        rem = rem - take
        alive = rem > 0
        if not alive.all():
            idx, s, d, rem = idx[alive], s[alive], d[alive], rem[alive]
    return Schedule(plan, budget_bytes, rounds, src, dst, total, first, last)
