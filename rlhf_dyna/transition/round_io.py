"""Staging of one round of a VPS transition on one rank: what it sends (the source slice itself, or packed and cast
into staging once per region), where it receives (the destination slice itself, or staging unpacked once arrived),
and the rank-local copies, which read rows already packed for a peer instead of casting them again.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from rlhf_dyna.transition.streams import Message, Segment, align, region_shape
from rlhf_dyna.transition.views import TORCH_DTYPES, as_bytes, dst_view, src_view
from rlhf_dyna.vps.rank_plan import Transfer

PeerMessages = dict[int, list[Message]]


class StagingArena:
    """Staging memory kept between rounds and transitions on the CPU, where fresh pages cost about 5x the copy that
    fills them (fault + zeroing; CUDA's caching allocator already keeps GPU blocks). It grows to the largest round's
    staging seen (at most the schedule's budget plus a row per stream) and stays allocated."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel()

    def fit(self, nbytes: int) -> None:
        if nbytes > self.nbytes:
            self.buffer = None  # drop the old block before taking the larger one
            self.buffer = torch.empty(nbytes, dtype=torch.uint8).fill_(0)  # fault the pages in now, not in the next round


STAGING = StagingArena()  # one per process: ranks run one transition at a time


class RoundIO:
    """Staging of one round: what to send (packed or direct views) and where to receive (unpacked once arrived)."""

    def __init__(self, src: Mapping[str, Tensor], dst: Mapping[str, Tensor], device: torch.device,
                 local: LocalCopies | None = None) -> None:
        self.src, self.dst, self.device = src, dst, device
        self.local = local
        self.arena = STAGING.buffer if device.type == "cpu" else None
        self.staged_bytes = 0
        self.unpack: list[tuple[Message, Tensor, object]] = []  # staged receives: message, buffer, its work (gloo)
        self.arrived: set[int] = set()  # ids of works `finish` waited for: a gloo work must not be waited twice
        # a region sent to several peers (vLLM's DP replicas) is packed (cast) once, and local copies of it read
        # the packed rows: casting fp32 -> bf16 is most of a sender's CPU time on the CPU
        self.packed: dict[tuple, Tensor] = {}
        self.packed_rows: dict[tuple, list[tuple[int, int, Tensor]]] = {}
        self.copy_seconds = 0.0

    def _staging(self, nbytes: int) -> Tensor:
        at = self.staged_bytes
        self.staged_bytes += align(nbytes)
        if self.arena is not None and self.staged_bytes <= self.arena.numel():
            return self.arena[at:at + nbytes]
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # the arena grows after this round

    def direct(self, m: Message) -> Tensor | None:
        """The message as the source slice itself (zero-copy), or None when it must be packed."""
        if m.packed:
            return None
        s = m.segments[0]
        view = src_view(self.src, s.transfer)[s.r0:s.r1]
        return as_bytes(view) if view.dtype == TORCH_DTYPES[s.transfer.dtype] and view.is_contiguous() else None

    def kept_rows(self, m: Message) -> Tensor | None:
        """Where this rank keeps the rows of a single-segment message itself (a local copy reads the same source
        region into a contiguous destination slice of the message's dtype): sent from there, they need no staging."""
        if m.packed or self.local is None:
            return None
        s = m.segments[0]
        t = self.local.by_region.get(source_region(s.transfer))
        if t is None:
            return None
        out = dst_view(self.dst, t)[s.r0:s.r1]
        return out if out.is_contiguous() and out.dtype == TORCH_DTYPES[s.transfer.dtype] else None

    def pack(self, m: Message) -> Tensor:
        key = tuple((source_region(s.transfer), s.r0, s.r1) for s in m.segments)
        if key in self.packed:
            return self.packed[key]
        start = time.perf_counter()
        kept = self.kept_rows(m)
        if kept is not None:  # cast once into the local destination, which is then the send buffer
            s = m.segments[0]
            if not self.local.copied:
                kept.copy_(src_view(self.src, s.transfer)[s.r0:s.r1])
                self.packed_rows.setdefault(source_region(s.transfer), []).append((s.r0, s.r1, kept))
            buf = as_bytes(kept)
        else:
            buf = self._staging(m.nbytes)
            for s, at in zip(m.segments, m.offsets):
                piece = staged_rows(buf, s, at)
                piece.copy_(src_view(self.src, s.transfer)[s.r0:s.r1])  # casts when the source dtype differs
                self.packed_rows.setdefault(source_region(s.transfer), []).append((s.r0, s.r1, piece))
        self.packed[key] = buf
        self.copy_seconds += time.perf_counter() - start
        return buf

    def outgoing(self, m: Message) -> Tensor:
        view = self.direct(m)
        return view if view is not None else self.pack(m)

    def landing(self, m: Message) -> Tensor | None:
        """The destination slice itself as the receive buffer (zero-copy), or None when it must be unpacked."""
        if m.packed:
            return None
        s = m.segments[0]
        view = dst_view(self.dst, s.transfer)[s.r0:s.r1]
        return as_bytes(view) if view.is_contiguous() else None

    def incoming(self, m: Message) -> Tensor:
        """NCCL: the receive buffer; staged ones are unpacked by `finish` once the grouped call completed."""
        view = self.landing(m)
        if view is not None:
            return view
        buf = self._staging(m.nbytes)
        self.unpack.append((m, buf, None))
        return buf

    def receive(self, m: Message, post: Callable[[Tensor], object]) -> object:
        """gloo: `post(buffer)` (an irecv) into the destination slice, or into staging that `finish` unpacks as soon as
        this message's work completes."""
        view = self.landing(m)
        if view is not None:
            return post(view)
        buf = self._staging(m.nbytes)
        work = post(buf)
        self.unpack.append((m, buf, work))
        return work

    def staging_need(self, sends: PeerMessages, recvs: PeerMessages) -> int:
        """Bytes a round would stage: packed or strided sends and receives (zero-copy ones need none)."""
        out = sum(align(m.nbytes) for msgs in sends.values() for m in msgs
                  if self.direct(m) is None and self.kept_rows(m) is None)
        return out + sum(align(m.nbytes) for msgs in recvs.values() for m in msgs if self.landing(m) is None)

    def finish(self) -> float:
        """Unpack the staged receives, each as soon as it has arrived where it has its own work (gloo: while later
        ones are still on the wire); returns the seconds spent waiting for them."""
        waited = 0.0
        for m, buf, work in self.unpack:
            if work is not None:
                wait_start = time.perf_counter()
                work.wait()
                waited += time.perf_counter() - wait_start
                self.arrived.add(id(work))
            start = time.perf_counter()
            for s, at in zip(m.segments, m.offsets):
                dst_view(self.dst, s.transfer)[s.r0:s.r1].copy_(staged_rows(buf, s, at))
            self.copy_seconds += time.perf_counter() - start
        self.unpack.clear()
        return waited


class LocalCopies:
    """A plan's rank-local copies by the source region they read, and whether `run_copies` has run yet (or there is
    nothing to copy)."""

    def __init__(self, copies: list[Transfer]) -> None:
        self.by_region: dict[tuple, Transfer] = {}
        for t in copies:
            self.by_region.setdefault(source_region(t), t)
        self.copied = not copies


def staged_rows(buf: Tensor, s: Segment, at: int) -> Tensor:
    """Segment `s`'s rows inside a staging buffer, at byte offset `at`, in the dtype and shape they travel in."""
    return buf[at:at + s.nbytes].view(TORCH_DTYPES[s.transfer.dtype]).view(s.r1 - s.r0, *region_shape(s.transfer)[1:])


def source_region(t: Transfer) -> tuple:
    """What a transfer reads, in the dtype it carries: transfers with equal keys carry the same bytes."""
    return t.src_buffer, t.src_offset, t.src_strides, t.shape, t.dtype


def run_copies(copies: list[Transfer], src: Mapping[str, Tensor], dst: Mapping[str, Tensor],
               packed_rows: Mapping[tuple, list[tuple[int, int, Tensor]]] | None = None) -> None:
    """The rank-local transfers; rows already packed for a peer (`RoundIO.packed_rows`) are copied from there."""
    for t in copies:
        out, at = dst_view(dst, t), 0
        for r0, r1, piece in sorted((packed_rows or {}).get(source_region(t), ()), key=lambda rows: rows[0]):
            if r1 <= at:  # rows packed twice (for peers whose streams are cut differently): done already
                continue
            if r0 > at:
                out[at:r0].copy_(src_view(src, t)[at:r0])
            rows, packed = out[max(r0, at):r1], piece[max(at - r0, 0):]
            if rows.data_ptr() != packed.data_ptr():  # rows cast straight into the destination are there already
                rows.copy_(packed)
            at = r1
        if at < out.shape[0]:
            out[at:].copy_(src_view(src, t)[at:])
