"""A transition's windows of rounds timed on the GPU (CUDA events), for its trace.

On CUDA the host only enqueues: packing, NCCL and unpacking run later on their streams, so the host's clock around
a window measures the enqueue. An event pair around each window on the compute stream (which waits for the window's
NCCL work before it unpacks) measures when the window really ran; they are read once the transition has
synchronised, so timing costs no extra wait.
"""
from __future__ import annotations

import torch

from rlhf_dyna.transition.trace import TraceRecorder

TraceEvent = tuple[str, int, float, float, dict]  # TraceRecorder.add's arguments


class GpuWindows:
    def __init__(self) -> None:
        self.spans: list[tuple[float, torch.cuda.Event, torch.cuda.Event]] = []  # host start, GPU start, GPU end
        self.pending: list[tuple[int, TraceEvent]] = []  # window index, the round's event with host times
        self._start: torch.cuda.Event | None = None

    def open(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def close(self, host_start: float) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.spans.append((host_start, self._start, end))

    def trace(self, event: TraceEvent) -> None:
        """Keep a round's event of the window just closed; its times are replaced by the GPU's in `add_to`."""
        self.pending.append((len(self.spans) - 1, event))

    def add_to(self, trace: TraceRecorder) -> None:
        """After the device has synchronised: every kept event, placed and sized by its window's CUDA events."""
        if not self.spans:
            return
        host0, first, _ = self.spans[0]
        for k, (name, round_index, _, _, info) in self.pending:
            _, start, end = self.spans[k]
            trace.add(name, round_index, host0 + first.elapsed_time(start) / 1e3, start.elapsed_time(end) / 1e3, info)
