"""Stream cutting (pure): rounds' byte ranges snapped to rows, segments and messages that tile the stream exactly."""
from __future__ import annotations

import random

from rlhf_dyna.transition.streams import PACK_ALIGN, StreamCutter, row_bytes
from rlhf_dyna.vps.rank_plan import Transfer
from rlhf_dyna.vps.tensor import Kind


def _transfer(shape: tuple[int, ...], itemsize: int, name: str = "w") -> Transfer:
    n = 1
    for s in shape:
        n *= s
    dtype = {4: "float32", 2: "bfloat16"}[itemsize]
    return Transfer(name, Kind.PARAM, dtype, shape, "a", 0, (1,) * len(shape), "b", 0, (1,) * len(shape), n * itemsize)


def test_random_cuts_tile_every_stream_exactly_once():
    rng = random.Random(0)
    for _ in range(200):
        transfers = [_transfer(tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3))), rng.choice((2, 4)), f"w{i}")
                     for i in range(rng.randint(1, 6))]
        cutter = StreamCutter(transfers)
        cuts = sorted({0, cutter.total, *(rng.randint(0, cutter.total) for _ in range(rng.randint(0, 6)))})
        covered = [0] * len(transfers)
        prev_end = 0
        for lo, hi in zip(cuts, cuts[1:]):
            assert cutter.snap(lo) == prev_end  # consecutive rounds continue where the last one stopped
            messages = cutter.messages(lo, hi, direct_bytes=rng.choice((1, 16, 1 << 30)))
            for m in messages:
                assert all(at % PACK_ALIGN == 0 for at in m.offsets)
                assert m.nbytes >= sum(s.nbytes for s in m.segments)
                for s in m.segments:
                    i = transfers.index(s.transfer)
                    assert s.r0 * row_bytes(s.transfer) == covered[i]  # rows arrive in order, none skipped
                    covered[i] = s.r1 * row_bytes(s.transfer)
            prev_end = cutter.snap(hi)
        assert covered == [t.nbytes for t in transfers]


def test_snap_moves_cuts_down_to_row_starts():
    cutter = StreamCutter([_transfer((3, 5), 4), _transfer((2,), 2)])  # rows of 20 bytes, then of 2 bytes
    assert [cutter.snap(x) for x in (0, 19, 20, 59, 60, 61, 63, 64)] == [0, 0, 20, 40, 60, 60, 62, 64]
