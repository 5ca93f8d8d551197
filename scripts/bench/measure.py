"""Measuring transitions: peak extra resident memory of a block, gloo/NCCL point-to-point bandwidth, and the wire
floor of a plan: its own pair matrix (bytes rank i sends rank j) replayed as one contiguous message per pair."""
from __future__ import annotations

import os
import threading
import time
from types import TracebackType

import numpy as np
import torch
import torch.distributed as dist

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _peak_resident_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


class PeakExtraMemory:
    """Peak resident memory above the level at entry (CPU ranks), from the kernel's own high-water mark: reset at
    entry (`/proc/self/clear_refs` 5), read at exit. It sees every buffer a method allocates, torch's or a
    library's, however short-lived, and costs nothing while the block runs: a sampling thread waking every 2 ms
    made a timed sync 9% slower on ranks that share their cores (docs/bench/reshard.md). Where the reset is refused, a thread
    samples every `interval_s` instead (missing peaks shorter than that); `sampling=True` forces the thread."""

    def __init__(self, interval_s: float = 0.002, sampling: bool = False) -> None:
        self.interval_s, self.sampling = interval_s, sampling
        self.peak_extra_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_extra_bytes = max(self.peak_extra_bytes, resident_bytes() - self._base)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakExtraMemory:
        self._base = resident_bytes()
        if not self.sampling:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # the high-water mark restarts from the resident set now
                return self
            except OSError:
                pass
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        else:
            self.peak_extra_bytes = _peak_resident_bytes() - self._base
        self.peak_extra_bytes = max(self.peak_extra_bytes, resident_bytes() - self._base)


def probe_device() -> torch.device:
    """Where the backend's own tensors live: CUDA under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in dist.get_backend() else torch.device("cpu")


def p2p_bandwidth(nbytes: int, repeats: int = 3, concurrent: bool = True) -> float:
    """Collective: bytes/s one rank receives over the backend's point-to-point path (best of `repeats`).

    Ranks pair up (0<->1, 2<->3, ...) and exchange `nbytes` both ways in one batched call; with
    concurrent=False only ranks 0 and 1 exchange while the others wait, which is the uncontended rate."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError("point-to-point bandwidth needs at least 2 ranks")
    peer = rank ^ 1
    active = peer < world and (concurrent or rank < 2)
    device = probe_device()
    send = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    recv = torch.empty_like(send)
    best = float("inf")
    for attempt in range(repeats + 1):  # the first exchange sets up the connection: not timed
        dist.barrier()
        start = time.perf_counter()
        if active:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]):
                work.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest active pair sets the rate
        if attempt > 0:
            best = min(best, float(elapsed))
    return nbytes / best


def copy_bandwidth(nbytes: int, repeats: int = 3) -> float:
    """Collective: bytes/s one rank copies locally (`Tensor.copy_` between warm buffers) while every rank does the
    same (best of `repeats`): the rate of the rank-local part of a transition, on the ranks' own device."""
    device = probe_device()
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)  # both touched: page faults are not part of the rate
    best = float("inf")
    for attempt in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()  # from a common start to the last rank's end: ranks sharing cores do not overlap for free
        if attempt > 0:
            best = min(best, time.perf_counter() - start)
    return nbytes / best


def pattern_seconds(pair_bytes: np.ndarray, repeats: int = 1) -> float:
    """Collective: seconds (slowest rank, best of `repeats`) to exchange exactly `pair_bytes[i, j]` bytes from every
    rank i to every rank j, one contiguous message per pair, all posted at once as gloo posts a plan's messages.
    The same pattern of exchanges as the transition: a transition in which one pair is active gets a single-pair
    probe, one in which every rank exchanges gets the contended rate. What it leaves out (packing, strided views,
    per-message overheads) is what the transition adds over its floor."""
    rank = dist.get_rank()
    device = probe_device()
    outgoing = {int(j): int(n) for j, n in enumerate(pair_bytes[rank]) if n and j != rank}
    incoming = {int(i): int(n) for i, n in enumerate(pair_bytes[:, rank]) if n and i != rank}
    send = torch.ones(max(outgoing.values(), default=0), dtype=torch.uint8, device=device)  # read by every send
    recv = torch.empty(sum(incoming.values()), dtype=torch.uint8, device=device)
    landing, at = {}, 0
    for peer, n in incoming.items():
        landing[peer], at = recv[at:at + n], at + n
    best = float("inf")
    for attempt in range(repeats + 1):  # the first exchange sets up the connections: not timed
        dist.barrier()
        start = time.perf_counter()
        works = [dist.irecv(landing[peer], peer) for peer in incoming]
        works += [dist.isend(send[:n], peer) for peer, n in outgoing.items()]
        for work in works:
            work.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if attempt > 0:
            best = min(best, float(elapsed))
    return best
