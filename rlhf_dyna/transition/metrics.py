"""Per-transition metrics under the names the trackers use: reshard/<transition>/{seconds, bytes_moved, rounds, peak_extra_bytes}."""
from __future__ import annotations

import torch
import torch.distributed as dist

from rlhf_dyna.transition.movers import MoveStats


def transition_metrics(stats: MoveStats, transition: str) -> dict[str, float]:
    """Collective: seconds, rounds and peak of the slowest / largest rank; bytes summed over all ranks."""
    maxima = torch.tensor([stats.seconds, stats.rounds, stats.peak_extra_bytes], dtype=torch.float64)
    total = torch.tensor([stats.bytes_received], dtype=torch.float64)
    dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
    dist.all_reduce(total)
    seconds, rounds, peak = maxima.tolist()
    return {
        f"reshard/{transition}/seconds": seconds,
        f"reshard/{transition}/bytes_moved": float(total),
        f"reshard/{transition}/rounds": rounds,
        f"reshard/{transition}/peak_extra_bytes": peak,
    }
