"""Packing (pure, one process): a region sent to several peers is cast once, local copies of a region that was
packed read the packed rows, and rows this rank keeps itself are cast straight into its destination and sent from
there, whatever rows the peers' streams cut; the result equals a plain cast copy."""
from __future__ import annotations

import random

import torch

from rlhf_dyna.transition.round_io import LocalCopies, RoundIO, run_copies
from rlhf_dyna.transition.streams import Message, Segment, align
from rlhf_dyna.vps.rank_plan import Transfer
from rlhf_dyna.vps.tensor import Kind

ROWS, COLS = 12, 6


def _transfer(dst_buffer: str, dst_offset: int = 0) -> Transfer:
    """Rows 2.. of a fp32 (14, 6) source moved as bf16 into a (12, 6) destination."""
    return Transfer("w", Kind.PARAM, "bfloat16", (ROWS, COLS), "src", 2 * COLS, (COLS, 1), dst_buffer, dst_offset,
                    (COLS, 1), ROWS * COLS * 2)


def _message(t: Transfer, r0: int, r1: int, packed: bool = True) -> Message:
    return Message((Segment(t, r0, r1),), (0,), (r1 - r0) * COLS * 2, packed)


def test_a_region_sent_to_two_peers_is_packed_once() -> None:
    src = {"src": torch.randn(14, COLS)}
    io = RoundIO(src, {}, torch.device("cpu"))
    to_a, to_b = _message(_transfer("a"), 0, 5), _message(_transfer("b"), 0, 5)  # same rows, other destinations
    first, second = io.pack(to_a), io.pack(to_b)
    assert first.data_ptr() == second.data_ptr()
    assert io.staged_bytes == align(to_a.nbytes)  # staging taken once
    other = io.pack(_message(_transfer("a"), 5, 9))  # other rows: packed anew
    assert other.data_ptr() != first.data_ptr()
    want = src["src"][2:7].to(torch.bfloat16)
    assert torch.equal(first[:to_a.nbytes].view(torch.bfloat16).view(5, COLS), want)


def test_local_copies_from_packed_rows_equal_a_cast_copy_for_any_cuts() -> None:
    rng = random.Random(0)
    for _ in range(50):
        src = {"src": torch.randn(14, COLS)}
        io = RoundIO(src, {}, torch.device("cpu"))
        for peer in ("a", "b"):  # two peers' streams, cut at different rows, may overlap and leave gaps
            cuts = sorted({rng.randint(0, ROWS) for _ in range(rng.randint(0, 4))} | {0, ROWS})
            for r0, r1 in zip(cuts, cuts[1:]):
                if rng.random() < 0.6:
                    io.pack(_message(_transfer(peer), r0, r1))
        local = _transfer("local", dst_offset=COLS)  # into rows 1.. of a (13, 6) destination
        dst = {"local": torch.full((ROWS + 1, COLS), float("nan"), dtype=torch.bfloat16)}
        run_copies([local], src, dst, io.packed_rows)
        assert torch.equal(dst["local"][1:], src["src"][2:].to(torch.bfloat16))
        assert dst["local"][0].isnan().all()  # nothing outside the region written


def test_local_copies_read_the_packed_rows_not_the_source() -> None:
    src = {"src": torch.randn(14, COLS)}
    io = RoundIO(src, {}, torch.device("cpu"))
    io.pack(_message(_transfer("a"), 0, 5))
    (r0, r1, piece), = io.packed_rows[next(iter(io.packed_rows))]
    piece.fill_(7)  # the packed rows now differ from a cast of the source: a copy from the source would not show 7
    dst = {"local": torch.zeros(ROWS, COLS, dtype=torch.bfloat16)}
    run_copies([_transfer("local")], src, dst, io.packed_rows)
    assert (r0, r1) == (0, 5) and (dst["local"][:5] == 7).all()
    assert torch.equal(dst["local"][5:], src["src"][7:].to(torch.bfloat16))


def test_rows_kept_locally_are_cast_into_the_destination_and_sent_from_there() -> None:
    src = {"src": torch.randn(14, COLS)}
    local = _transfer("local")
    dst = {"local": torch.zeros(ROWS, COLS, dtype=torch.bfloat16)}
    io = RoundIO(src, dst, torch.device("cpu"), LocalCopies([local]))
    buf = io.pack(_message(_transfer("a"), 0, 5, packed=False))
    assert io.staged_bytes == 0 and buf.data_ptr() == dst["local"].data_ptr()
    assert torch.equal(dst["local"][:5], src["src"][2:7].to(torch.bfloat16))
    assert io.pack(_message(_transfer("b"), 0, 5, packed=False)).data_ptr() == buf.data_ptr()  # the other replica
    dst["local"][:5].fill_(7)  # a copy from the source would overwrite the 7s
    run_copies([local], src, dst, io.packed_rows)
    assert (dst["local"][:5] == 7).all()
    assert torch.equal(dst["local"][5:], src["src"][7:].to(torch.bfloat16))


def test_kept_rows_sent_after_the_local_copies_ran_are_not_cast_again() -> None:
    src = {"src": torch.randn(14, COLS)}
    local = _transfer("local")
    dst = {"local": torch.zeros(ROWS, COLS, dtype=torch.bfloat16)}
    copies = LocalCopies([local])
    run_copies([local], src, dst)
    copies.copied = True
    dst["local"][3:6].fill_(7)  # a new cast would overwrite the 7s
    io = RoundIO(src, dst, torch.device("cpu"), copies)
    buf = io.pack(_message(_transfer("a"), 3, 6, packed=False))
    assert (buf.view(torch.bfloat16) == 7).all() and io.staged_bytes == 0


def test_kept_packed_and_copied_rows_mixed_equal_a_cast_copy_for_any_cuts() -> None:
    rng = random.Random(1)
    for _ in range(50):
        src = {"src": torch.randn(14, COLS)}
        local = _transfer("local", dst_offset=COLS)
        dst = {"local": torch.full((ROWS + 1, COLS), float("nan"), dtype=torch.bfloat16)}
        io = RoundIO(src, dst, torch.device("cpu"), LocalCopies([local]))
        sent = []
        for peer in ("a", "b"):
            cuts = sorted({rng.randint(0, ROWS) for _ in range(rng.randint(0, 4))} | {0, ROWS})
            for r0, r1 in zip(cuts, cuts[1:]):
                if rng.random() < 0.6:
                    sent.append((r0, r1, io.pack(_message(_transfer(peer), r0, r1, packed=rng.random() < 0.5))))
        run_copies([local], src, dst, io.packed_rows)
        want = src["src"][2:].to(torch.bfloat16)
        assert torch.equal(dst["local"][1:], want)
        assert dst["local"][0].isnan().all()
        for r0, r1, buf in sent:  # what went on the wire is the cast rows too
            assert torch.equal(buf[:(r1 - r0) * COLS * 2].view(torch.bfloat16).view(r1 - r0, COLS), want[r0:r1])
