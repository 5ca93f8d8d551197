"""A rank that receives SIGTERM (how clouds announce a preemption) leaves the job at the next step boundary instead of
stopping the run (live part; elastic.leave_on_sigterm=true).

    requests = LeaveOnSigterm().install()     # every rank, once
    ...
    leaving = requests.agree()                # at each step boundary, collective: the ranks that received SIGTERM

The handler only records the signal; the ranks agree on who leaves by one all-reduce of a flag per rank, so every rank
starts the same change at the same boundary.
"""
from __future__ import annotations

import os
import signal
from types import FrameType

import torch
import torch.distributed as dist


class LeaveOnSigterm:
    def __init__(self) -> None:
        self.signals = 0  # SIGTERMs received: only the handler writes it
        self.answered = 0  # of those, the ones an agreement has answered

    def install(self) -> LeaveOnSigterm:
        signal.signal(signal.SIGTERM, self._record)
        print(f"rlhf_dyna: rank {dist.get_rank()} (pid {os.getpid()}): SIGTERM makes this rank leave the job at the "
              "next step boundary (elastic.leave_on_sigterm=true)", flush=True)
        return self

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1

    def agree(self) -> tuple[int, ...]:
        """Collective over the world: the ranks that have received SIGTERM (and not yet been answered). A signal that
        arrives during the all-reduce, where a rank waits for the others, is answered at the next boundary."""
        signals = self.signals
        flags = torch.zeros(dist.get_world_size(), dtype=torch.int32)
        flags[dist.get_rank()] = int(signals > self.answered)
        dist.all_reduce(flags)
        self.answered = signals  # the rank leaves now, or was refused with a message and stays
        return tuple(int(r) for r in flags.nonzero().flatten())
