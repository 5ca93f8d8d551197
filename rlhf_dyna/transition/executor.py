"""Execute one rank's share of a VPS schedule over a torch.distributed group (gloo on CPU, NCCL on GPU).

    stats = execute(prepare(for_rank(schedule, rank)), src_buffers, dst_buffers, group, verify=True, trace=recorder)

Buffers are this rank's local tensors keyed by the layout's buffer names (flat or shaped, contiguous); every
transfer is a strided view (`as_strided`) at an element offset of one. `prepare` cuts the peer streams into
messages once per plan (`streams.StreamCutter`, identically on both ends); callers that cache plans cache it.
On gloo each message is posted the moment it is ready, with its index in its peer stream as tag: receives
first, then zero-copy sends, then sends that need a pack copy, then the local copies, and each staged receive is
unpacked as soon as it has arrived, so copying overlaps what is still on the wire; consecutive rounds run together while their staging fits the schedule's budget
(zero-copy messages need none), so mostly zero-copy rounds do not wait for each other. On NCCL a round is one
`batch_isend_irecv` (grouped, in the same order on both ends). Sources whose dtype
differs from the destination's (fp32 masters -> bf16 rollout) are cast while packing, so the wire carries
destination bytes. A round's staging lives for that round only: the schedule's budget bounds it (plus one row
per stream); on the CPU its memory is reused from round to round (`StagingArena`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.transition.streams import DIRECT_BYTES, Message, StreamCutter, align, region_shape
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.verify import check_destination, source_sums
from rlhf_dyna.transition.views import TORCH_DTYPES, as_bytes, dst_view, peer_rank, src_view
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer

PeerMessages = dict[int, list[Message]]


@dataclass(frozen=True)
class ExecStats:
    seconds: float  # wall time on this rank, local copies and all rounds (verification excluded)
    bytes_sent: int
    bytes_received: int
    local_bytes: int  # bytes copied rank-locally (no communication)
    rounds: int  # schedule rounds (this rank may be idle in some)
    messages: int  # point-to-point messages this rank posted (sends + receives)
    peak_extra_bytes: int  # most bytes of staging buffers (pack / receive) alive at once on this rank
    copy_seconds: float = 0.0  # of `seconds`: packing (casting), local copies, unpacking on this rank
    wait_seconds: float = 0.0  # of `seconds`: waiting for posted messages to complete


@dataclass(frozen=True)
class BufferNeed:
    """What the plan needs of one bound buffer: its last element, its dtype (destinations), and who needs it."""

    last: int
    dtype: str | None
    transfer: Transfer


@dataclass(frozen=True)
class PreparedPlan:
    """A rank plan cut into messages, ready to run many times: per round, peer -> messages to send / receive."""

    plan: RankPlan
    sends: list[PeerMessages]
    recvs: list[PeerMessages]
    send_tags: list[dict[int, int]]  # round -> peer -> tag of its first message (tags count a peer stream's messages)
    recv_tags: list[dict[int, int]]
    last_read: dict[int, list[str]]  # round -> source buffers read for the last time in it (-1: local copies)
    src_needs: dict[str, BufferNeed]
    dst_needs: dict[str, BufferNeed]
    budget_bytes: int | None  # staging allowed in flight when gloo runs consecutive rounds together; None: one round
    send_order: tuple[int, ...]  # peers to pack for first: those with the most to receive overall finish last


def _needs(pairs: list[tuple[Transfer, str, int, tuple[int, ...]]], with_dtype: bool) -> dict[str, BufferNeed]:
    out: dict[str, BufferNeed] = {}
    for t, name, offset, strides in pairs:
        last = offset + sum((n - 1) * s for n, s in zip(t.shape, strides))
        if name not in out or last > out[name].last:
            out[name] = BufferNeed(last, t.dtype if with_dtype else None, t)
    return out


def first_tags(per_round: list[PeerMessages]) -> list[dict[int, int]]:
    """Tag of each round's first message per peer: both ends count the same messages of the same stream."""
    seen: dict[int, int] = {}
    out = []
    for per_peer in per_round:
        out.append({p: seen.get(p, 0) for p in per_peer})
        for p, msgs in per_peer.items():
            seen[p] = seen.get(p, 0) + len(msgs)
    return out


def prepare(plan: RankPlan, direct_bytes: int = DIRECT_BYTES, budget_bytes: int | None = None,
            received_by_rank: Sequence[int] | None = None) -> PreparedPlan:
    """`received_by_rank`: bytes every rank receives in the whole schedule (Plan.pair_bytes().sum(0)); gloo then
    packs for the peers with the most to receive first, the ones that set the transition's end."""
    send_cut = {peer: StreamCutter(s.transfers) for peer, s in plan.sends.items()}
    recv_cut = {peer: StreamCutter(s.transfers) for peer, s in plan.recvs.items()}
    sends = [{p: send_cut[p].messages(lo, hi, direct_bytes) for p, (lo, hi) in r.sends.items()} for r in plan.rounds]
    recvs = [{p: recv_cut[p].messages(lo, hi, direct_bytes) for p, (lo, hi) in r.recvs.items()} for r in plan.rounds]
    last: dict[str, int] = {t.src_buffer: -1 for t in plan.copies}
    for i, per_peer in enumerate(sends):
        for m in (m for msgs in per_peer.values() for m in msgs):
            for s in m.segments:
                last[s.transfer.src_buffer] = i
    last_read: dict[int, list[str]] = {}
    for name, i in last.items():
        last_read.setdefault(i, []).append(name)
    outgoing = plan.copies + [t for s in plan.sends.values() for t in s.transfers]
    incoming = plan.copies + [t for s in plan.recvs.values() for t in s.transfers]
    src_needs = _needs([(t, t.src_buffer, t.src_offset, t.src_strides) for t in outgoing], with_dtype=False)
    dst_needs = _needs([(t, t.dst_buffer, t.dst_offset, t.dst_strides) for t in incoming], with_dtype=True)
    load = received_by_rank if received_by_rank is not None else [0] * (max([*plan.sends, plan.rank], default=0) + 1)
    # ties from the next rank on: with equal loads every rank packs for a different peer first, so no receiver gets
    # every sender's first message while another waits for all their last ones
    send_order = tuple(sorted(plan.sends, key=lambda peer: (-load[peer], (peer - plan.rank) % len(load))))
    return PreparedPlan(plan, sends, recvs, first_tags(sends), first_tags(recvs), last_read, src_needs, dst_needs,
                        budget_bytes, send_order)


def check_buffers(p: PreparedPlan, src: Mapping[str, Tensor], dst: Mapping[str, Tensor]) -> None:
    """Every buffer the plan names exists, destinations have the plan's dtype, views stay inside the buffers."""
    for side, needs, buffers in (("source", p.src_needs, src), ("destination", p.dst_needs, dst)):
        for name, need in needs.items():
            t = need.transfer
            if name not in buffers:
                raise KeyError(f"{side} buffer {name!r} (for {t.tensor}/{t.kind.value}) is not bound on rank {p.plan.rank}")
            if need.last >= buffers[name].numel():
                raise ValueError(f"{t.tensor}/{t.kind.value}: {side} view ends at element {need.last} of {name!r} "
                                 f"({buffers[name].numel()} elements); the bound tensor does not match the layout")
            if need.dtype is not None and buffers[name].dtype != TORCH_DTYPES[need.dtype]:
                raise TypeError(f"destination buffer {name!r} is {buffers[name].dtype}, the plan moves {need.dtype}")


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
    """Staging of one round: what to send (packed or direct views) and where to receive (and unpack later)."""

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
                piece = buf[at:at + s.nbytes].view(TORCH_DTYPES[s.transfer.dtype]).view(s.r1 - s.r0, *region_shape(s.transfer)[1:])
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
        view = self.landing(m)
        if view is not None:
            return view
        buf = self._staging(m.nbytes)
        self.unpack.append((m, buf, None))
        return buf

    def receive(self, m: Message, post: Callable[[Tensor], object]) -> object:
        """`post(buffer)` (an irecv) into the destination slice, or into staging that `finish` unpacks once it arrived."""
        view = self.landing(m)
        if view is not None:
            return post(view)
        work = post(self.incoming(m))
        self.unpack[-1] = (m, self.unpack[-1][1], work)
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
                piece = buf[at:at + s.nbytes].view(TORCH_DTYPES[s.transfer.dtype]).view(s.r1 - s.r0, *region_shape(s.transfer)[1:])
                dst_view(self.dst, s.transfer)[s.r0:s.r1].copy_(piece)
            self.copy_seconds += time.perf_counter() - start
        self.unpack.clear()
        return waited


def post_streaming(io: RoundIO, p: PreparedPlan, i: int, group: dist.ProcessGroup | None,
                   pack_first: bool = True) -> list:
    """gloo: receives, then zero-copy sends, then the packed ones; tags (a message's index in its peer stream) pair
    them up whatever order either end posts in. With `pack_first` every message is packed before the first packed
    send is posted: where ranks share cores, casting between sends slowed the exchange (scripts/profile_vllm_sync.py
    --pack-order); otherwise each is sent as soon as it is packed."""
    works = [io.receive(m, partial(dist.irecv, src=peer_rank(group, peer), group=group, tag=p.recv_tags[i][peer] + k))
             for peer, msgs in p.recvs[i].items() for k, m in enumerate(msgs)]
    to_pack = []
    for peer in (peer for peer in p.send_order if peer in p.sends[i]):
        for k, m in enumerate(p.sends[i][peer]):
            view = io.direct(m)
            if view is None:
                to_pack.append((peer, p.send_tags[i][peer] + k, m))
            else:
                works.append(dist.isend(view, peer_rank(group, peer), group, tag=p.send_tags[i][peer] + k))
    if pack_first:
        packed = [io.pack(m) for _, _, m in to_pack]
        works += [dist.isend(b, peer_rank(group, peer), group, tag=tag) for (peer, tag, _), b in zip(to_pack, packed)]
    else:
        works += [dist.isend(io.pack(m), peer_rank(group, peer), group, tag=tag) for peer, tag, m in to_pack]
    return works


def post_batched(io: RoundIO, p: PreparedPlan, i: int, group: dist.ProcessGroup | None) -> list:
    """NCCL: one grouped call per round (separate calls could deadlock), same message order on both ends."""
    ops = [dist.P2POp(dist.irecv, io.incoming(m), peer_rank(group, peer), group) for peer, msgs in p.recvs[i].items() for m in msgs]
    ops += [dist.P2POp(dist.isend, io.outgoing(m), peer_rank(group, peer), group) for peer, msgs in p.sends[i].items() for m in msgs]
    return dist.batch_isend_irecv(ops) if ops else []


def payload(msgs: list[Message]) -> int:
    return sum(s.nbytes for m in msgs for s in m.segments)


@torch.no_grad()
def execute(
    plan: RankPlan | PreparedPlan,
    src_buffers: Mapping[str, Tensor],
    dst_buffers: Mapping[str, Tensor],
    group: dist.ProcessGroup | None = None,
    verify: bool = False,
    trace: TraceRecorder | None = None,
    trace_name: str = "vps",
    release: Callable[[str], None] | None = None,
    first_round: int = 0,
    pack_first: bool = True,
) -> ExecStats:
    """Collective over `group`: every rank runs its own plan of the same schedule.

    `release(name)` (in-place transitions) is called once per source buffer right after the last round that
    reads it, so its storage can be freed while later rounds still run. With `verify`, every destination
    region is checked against a checksum of its source afterwards (see `verify.check_destination`).
    `first_round` numbers the traced rounds of a transition run as several plans (layer groups) as one; `pack_first`:
    see post_streaming (gloo only)."""
    p = plan if isinstance(plan, PreparedPlan) else prepare(plan)
    check_buffers(p, src_buffers, dst_buffers)
    some = next(iter({**src_buffers, **dst_buffers}.values()), None)
    device = some.device if some is not None else torch.device("cpu")
    gloo = device.type != "cuda"  # CUDA tensors travel over NCCL, in one grouped call per round
    post = partial(post_streaming, pack_first=pack_first) if gloo else post_batched
    sums = source_sums(p.plan, src_buffers) if verify else None  # taken before any source is released
    releases = {i: list(names) for i, names in p.last_read.items()} if release is not None else {}
    start = time.perf_counter()
    sent = received = messages = peak = 0
    copying = waiting = 0.0
    local = LocalCopies(p.plan.copies)
    streaming = gloo and p.budget_bytes is not None
    i, n = 0, len(p.plan.rounds)
    while i < n:
        window_start, io, works = time.time(), RoundIO(src_buffers, dst_buffers, device, local), []
        j = i
        while j == i or (streaming and j < n and io.staged_bytes + io.staging_need(p.sends[j], p.recvs[j]) <= p.budget_bytes):
            works.append(post(io, p, j, group))  # zero-copy rounds cost no staging: they run together
            j += 1
        if not local.copied:  # local copies overlap the first rounds' communication
            copy_start = time.perf_counter()
            run_copies(p.plan.copies, src_buffers, dst_buffers, io.packed_rows)
            copying += time.perf_counter() - copy_start
            local.copied = True
            for name in releases.pop(-1, []):
                release(name)
        waiting += io.finish() if gloo else 0.0  # gloo: unpacks what has arrived while the rest is on the wire
        wait_start = time.perf_counter()
        for w in (w for round_works in works for w in round_works if id(w) not in io.arrived):
            w.wait()
        waiting += time.perf_counter() - wait_start
        if not gloo:
            io.finish()  # NCCL: after the grouped call completed
        copying += io.copy_seconds
        if device.type == "cpu":
            STAGING.fit(io.staged_bytes)
        duration = time.time() - window_start
        for r, round_works in zip(range(i, j), works):
            for name in releases.pop(r, []):
                release(name)
            out_bytes, in_bytes = sum(map(payload, p.sends[r].values())), sum(map(payload, p.recvs[r].values()))
            sent, received, messages = sent + out_bytes, received + in_bytes, messages + len(round_works)
            if trace is not None:  # rounds run together share their window's span
                trace.add(trace_name, first_round + r, window_start, duration, dict(bytes_sent=out_bytes, bytes_received=in_bytes,
                          messages=len(round_works), staged_bytes=io.staged_bytes, window=f"{i}-{j - 1}"))
        peak = max(peak, io.staged_bytes)
        i = j
    if not local.copied:  # a plan without rounds
        copy_start = time.perf_counter()
        run_copies(p.plan.copies, src_buffers, dst_buffers)
        copying += time.perf_counter() - copy_start
        for name in releases.pop(-1, []):
            release(name)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if verify:
        check_destination(p.plan, sums, dst_buffers, group)
    return ExecStats(seconds, sent, received, sum(t.nbytes for t in p.plan.copies), len(p.plan.rounds), messages, peak,
                     copying, waiting)


class LocalCopies:
    """A plan's rank-local copies by the source region they read, and whether `run_copies` has run yet (or there is
    nothing to copy)."""

    def __init__(self, copies: list[Transfer]) -> None:
        self.by_region: dict[tuple, Transfer] = {}
        for t in copies:
            self.by_region.setdefault(source_region(t), t)
        self.copied = not copies


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
