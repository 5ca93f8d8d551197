"""Schedule: rounds of batched point-to-point messages under a per-rank memory budget, deadlock-free.

Rank pairs are ordered by ring offset k = (dst - src) mod world (k = 1 .. world-1; any world size):
offset k pairs every rank with one send peer and one receive peer.  Consecutive offsets are packed
into one round while every rank's bytes in flight (sent + received) stay within the budget; an offset
too big for the budget alone is cut into equal byte chunks over several rounds.  Every rank derives
the same rounds from the same plan, and a round's sends and receives are matched pairs, so posting
them all together (batched P2P) cannot deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .plan import Plan


@dataclass(frozen=True)
class Round:
    offsets: tuple[int, ...]  # ring offsets k whose pair messages travel in this round
    chunk: int  # which byte chunk of those messages (0 .. chunks-1)
    chunks: int


@dataclass(eq=False)
class Schedule:
    plan: Plan
    budget_bytes: int
    rounds: list[Round]
    pair_bytes: np.ndarray  # [world, world]
    first_round: np.ndarray  # [world] per ring offset: first / last round carrying it (-1: unused)
    last_round: np.ndarray

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    def round_pairs(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bytes) of the messages of round i."""
        r, w = self.rounds[i], self.plan.world_size
        srcs, dsts, sizes = [], [], []
        for k in r.offsets:
            s = np.arange(w)
            d = (s + k) % w
            b = self.pair_bytes[s, d]
            keep = b > 0
            lo, hi = chunk_range(b[keep], r.chunk, r.chunks)
            srcs.append(s[keep])
            dsts.append(d[keep])
            sizes.append(hi - lo)
        if not srcs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate(srcs), np.concatenate(dsts), np.concatenate(sizes)


def chunk_range(nbytes, chunk: int, chunks: int):
    """Byte range [lo, hi) of chunk `chunk` when a message of `nbytes` is cut into `chunks` equal parts."""
    size = -(-np.asarray(nbytes) // chunks)
    lo = np.minimum(size * chunk, nbytes)
    return lo, np.minimum(size * (chunk + 1), nbytes)


def build_schedule(plan: Plan, budget_bytes: int = 1 << 30) -> Schedule:
    w = plan.world_size
    pairs = plan.pair_bytes()
    ranks = np.arange(w)
    rounds: list[Round] = []
    first = np.full(w, -1, dtype=np.int64)
    last = np.full(w, -1, dtype=np.int64)
    open_offsets: list[int] = []
    open_load = np.zeros(w)

    def close() -> None:
        nonlocal open_offsets, open_load
        if open_offsets:
            for k in open_offsets:
                first[k] = last[k] = len(rounds)
            rounds.append(Round(tuple(open_offsets), 0, 1))
        open_offsets, open_load = [], np.zeros(w)

    for k in range(1, w):
        out = pairs[ranks, (ranks + k) % w]
        if not out.any():
            continue
        load = out + out[(ranks - k) % w]  # bytes sent to rank+k plus received from rank-k
        peak = load.max()
        if peak > budget_bytes:
            close()
            chunks = int(-(-peak // budget_bytes))
            first[k] = len(rounds)
            rounds.extend(Round((k,), i, chunks) for i in range(chunks))
            last[k] = len(rounds) - 1
            continue
        if (open_load + load).max() > budget_bytes:
            close()
        open_offsets.append(k)
        open_load = open_load + load
    close()
    return Schedule(plan, budget_bytes, rounds, pairs, first, last)
