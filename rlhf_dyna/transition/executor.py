"""Execute one rank's share of a VPS schedule over a torch.distributed group (gloo on CPU, NCCL on GPU).

    stats = execute(prepare(for_rank(schedule, rank)), src_buffers, dst_buffers, group, verify=True, trace=recorder)

Buffers are this rank's local tensors keyed by the layout's buffer names (flat or shaped, contiguous); every
transfer is a strided view (`as_strided`) at an element offset of one. `prepare` cuts the peer streams into
messages once per plan (`streams.StreamCutter`, identically on both ends); callers that cache plans cache it.
On gloo each message is posted the moment it is ready, with its index in its peer stream as tag: receives
first, then zero-copy sends, then sends that need a pack copy, then the local copies, and each staged receive is
unpacked as soon as it has arrived, so copying overlaps what is still on the wire; consecutive rounds run together
while their staging fits the schedule's budget (zero-copy messages need none), so mostly zero-copy rounds do not
wait for each other. On NCCL a round is one
`batch_isend_irecv` (grouped, in the same order on both ends), and consecutive rounds are posted together in the
same way, so a round's packing runs on the compute stream while the previous round is on NCCL's stream; the
round's times there come from CUDA events, not from the host's clock that only sees the enqueue. The transport is
the world's (transition/transport.py), never a rank's own guess from its buffers. Sources whose dtype
differs from the destination's (fp32 masters -> bf16 rollout) are cast while packing, so the wire carries
destination bytes. A round's staging lives for that round only: the schedule's budget bounds it (plus one row
per stream); on the CPU its memory is reused from round to round (`round_io.StagingArena`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.transition.gpu_windows import GpuWindows
from rlhf_dyna.transition.round_io import STAGING, LocalCopies, PeerMessages, RoundIO, run_copies
from rlhf_dyna.transition.streams import DIRECT_BYTES, Message, StreamCutter
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.transport import GLOO, ensure_warm, wire_device, world_transport
from rlhf_dyna.transition.verify import check_destination, source_sums
from rlhf_dyna.transition.views import TORCH_DTYPES, peer_rank
from rlhf_dyna.vps.rank_plan import RankPlan, Transfer

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


def check_buffers(p: PreparedPlan, src: Mapping[str, Tensor], dst: Mapping[str, Tensor],
                  device: torch.device | None = None) -> None:
    """Every buffer the plan names exists, destinations have the plan's dtype, views stay inside the buffers, and
    every buffer lives on the transport's `device` (the CPU for gloo, this rank's GPU for NCCL)."""
    for side, needs, buffers in (("source", p.src_needs, src), ("destination", p.dst_needs, dst)):
        for name, need in needs.items():
            t = need.transfer
            if name in buffers and device is not None and buffers[name].device != device:
                raise ValueError(f"{side} buffer {name!r} (for {t.tensor}/{t.kind.value}) is on "
                                 f"{buffers[name].device} but this world's transport moves {device.type} tensors: "
                                 f"allocate every buffer of a transition on {device} (transport.wire_device)")
            if name not in buffers:
                raise KeyError(f"{side} buffer {name!r} (for {t.tensor}/{t.kind.value}) is not bound on rank {p.plan.rank}")
            if need.last >= buffers[name].numel():
                raise ValueError(f"{t.tensor}/{t.kind.value}: {side} view ends at element {need.last} of {name!r} "
                                 f"({buffers[name].numel()} elements); the bound tensor does not match the layout")
            if need.dtype is not None and buffers[name].dtype != TORCH_DTYPES[need.dtype]:
                raise TypeError(f"destination buffer {name!r} is {buffers[name].dtype}, the plan moves {need.dtype}")


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
    transport: str | None = None,
) -> ExecStats:
    """Collective over `group`: every rank runs its own plan of the same schedule, over `transport` ("gloo" |
    "nccl"; None: the group's, transport.world_transport).

    `release(name)` (in-place transitions) is called once per source buffer right after the last round that
    reads it, so its storage can be freed while later rounds still run. With `verify`, every destination
    region is checked against a checksum of its source afterwards (see `verify.check_destination`).
    `first_round` numbers the traced rounds of a transition run as several plans (layer groups) as one; `pack_first`:
    see post_streaming (gloo only)."""
    p = plan if isinstance(plan, PreparedPlan) else prepare(plan)
    transport = transport or world_transport(group)
    device = wire_device(transport)
    check_buffers(p, src_buffers, dst_buffers, device)
    gloo = transport == GLOO  # otherwise CUDA tensors over NCCL, in one grouped call per round
    post = partial(post_streaming, pack_first=pack_first) if gloo else post_batched
    ensure_warm(group, transport)  # NCCL: the group's first call, which every rank joins, is not a round's
    sums = source_sums(p.plan, src_buffers) if verify else None  # taken before any source is released
    releases = {i: list(names) for i, names in p.last_read.items()} if release is not None else {}
    start = time.perf_counter()
    sent = received = messages = peak = 0
    copying = waiting = 0.0
    local = LocalCopies(p.plan.copies)
    streaming = p.budget_bytes is not None
    windows = GpuWindows() if device.type == "cuda" else None
    i, n = 0, len(p.plan.rounds)
    while i < n:
        window_start, io, works = time.time(), RoundIO(src_buffers, dst_buffers, device, local), []
        if windows is not None:
            windows.open()
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
        if gloo:  # unpack what has arrived while the rest is on the wire
            waiting += io.finish()
        wait_start = time.perf_counter()
        for w in (w for round_works in works for w in round_works if id(w) not in io.arrived):
            w.wait()
        waiting += time.perf_counter() - wait_start
        if not gloo:  # NCCL: once the grouped call completed
            io.finish()
        copying += io.copy_seconds
        if device.type == "cpu":
            STAGING.fit(io.staged_bytes)
        duration = time.time() - window_start
        if windows is not None:
            windows.close(window_start)
        for r, round_works in zip(range(i, j), works):
            for name in releases.pop(r, []):
                release(name)
            out_bytes, in_bytes = sum(map(payload, p.sends[r].values())), sum(map(payload, p.recvs[r].values()))
            sent, received, messages = sent + out_bytes, received + in_bytes, messages + len(round_works)
            if trace is not None:  # rounds run together share their window's span
                event = (trace_name, first_round + r, window_start, duration, dict(bytes_sent=out_bytes, bytes_received=in_bytes,
                         messages=len(round_works), staged_bytes=io.staged_bytes, window=f"{i}-{j - 1}"))
                if windows is None:
                    trace.add(*event)
                else:  # CUDA: timed by the window's events once the device has synchronised
                    windows.trace(event)
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
    if windows is not None and trace is not None:
        windows.add_to(trace)
    if verify:
        check_destination(p.plan, sums, dst_buffers, group, transport)
    return ExecStats(seconds, sent, received, sum(t.nbytes for t in p.plan.copies), len(p.plan.rounds), messages, peak,
                     copying, waiting)
