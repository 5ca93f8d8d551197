"""How one peer stream of a rank plan is cut into messages, identically on the sending and the receiving rank.

A stream is the concatenation, in order, of its transfers' regions (C order, destination dtype). The schedule
cuts it at byte offsets; we snap every cut down to a row boundary (dim 0 of a transfer's region), so that each
round carries whole sub-boxes `region[r0:r1]` that are plain strided views on both ranks. A snapped round moves
at most one row more than the schedule gave it. Within a round, segments of at least `direct_bytes` travel as
their own message (zero-copy where the rank's view is contiguous); smaller ones are packed into one message.
Both ranks derive the same messages from the same transfers, so their sizes match without any negotiation.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

from rlhf_dyna.vps.rank_plan import Transfer

PACK_ALIGN = 16  # packed segments start 16-byte aligned: uint8 storage can then be viewed as any dtype
DIRECT_BYTES = 64 << 10  # segments this large get a message of their own (no pack copy when contiguous)


@dataclass(frozen=True, slots=True)
class Segment:
    """Rows [r0, r1) along dim 0 of one transfer's region."""

    transfer: Transfer
    r0: int
    r1: int

    @property
    def nbytes(self) -> int:
        return (self.r1 - self.r0) * row_bytes(self.transfer)


@dataclass(frozen=True, slots=True)
class Message:
    """One point-to-point message: a single segment (`packed=False`) or several packed back to back."""

    segments: tuple[Segment, ...]
    offsets: tuple[int, ...]  # byte offset of each segment in the message
    nbytes: int
    packed: bool


def region_shape(t: Transfer) -> tuple[int, ...]:
    return t.shape if t.shape else (1,)  # a 0-d region is one row of one element


def row_bytes(t: Transfer) -> int:
    return t.nbytes // region_shape(t)[0]


def align(n: int) -> int:
    return -(-n // PACK_ALIGN) * PACK_ALIGN


class StreamCutter:
    """Snapped cuts and segments of one peer stream."""

    def __init__(self, transfers: list[Transfer]) -> None:
        self.transfers = transfers
        self.starts = [0, *accumulate(t.nbytes for t in transfers)]
        self.total = self.starts[-1]

    def snap(self, cut: int) -> int:
        if cut >= self.total:
            return self.total
        i = bisect_right(self.starts, cut) - 1
        row = row_bytes(self.transfers[i])
        return self.starts[i] + (cut - self.starts[i]) // row * row

    def segments(self, lo: int, hi: int) -> list[Segment]:
        """Segments covering stream bytes [lo, hi) (both snapped)."""
        out = []
        i = bisect_right(self.starts, lo) - 1
        while lo < hi:
            t, start = self.transfers[i], self.starts[i]
            end = min(hi, self.starts[i + 1])
            row = row_bytes(t)
            out.append(Segment(t, (lo - start) // row, (end - start) // row))
            lo, i = end, i + 1
        return out

    def messages(self, lo: int, hi: int, direct_bytes: int = DIRECT_BYTES) -> list[Message]:
        """The messages carrying stream bytes [snap(lo), snap(hi)): the packed small segments first, then each large one."""
        segs = self.segments(self.snap(lo), self.snap(hi))
        small = [s for s in segs if s.nbytes < direct_bytes]
        out = []
        if small:
            offsets = list(accumulate((align(s.nbytes) for s in small[:-1]), initial=0))
            out.append(Message(tuple(small), tuple(offsets), offsets[-1] + align(small[-1].nbytes), True))
        out += [Message((s,), (0,), s.nbytes, False) for s in segs if s.nbytes >= direct_bytes]
        return out
