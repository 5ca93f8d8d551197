"""Measurement probes on real gloo ranks: point-to-point bandwidth and the replay of a pair matrix."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from bench.measure import p2p_bandwidth, pattern_seconds
from tests.multirank import run_ranks


def _bandwidth(rank: int, world: int) -> None:
    rates = [p2p_bandwidth(4 * 2**20, repeats=2, concurrent=c) for c in (True, False)]
    agreed = torch.tensor(rates, dtype=torch.float64)
    dist.broadcast(agreed, src=0)
    assert rates == agreed.tolist()  # every rank returns the same (max-reduced) figure
    assert all(1e6 < rate < 1e12 for rate in rates), rates


@pytest.mark.timeout(120)
def test_p2p_bandwidth_is_positive_and_agreed_by_all_ranks() -> None:
    run_ranks(_bandwidth, 4)


def _pattern(rank: int, world: int) -> None:
    one_pair = np.zeros((world, world))
    one_pair[0, 1] = 16 * 2**20  # only rank 0 -> rank 1 is active: the others post nothing
    everyone = np.full((world, world), 4 * 2**20) - np.diag([4 * 2**20] * world)
    times = [pattern_seconds(m) for m in (one_pair, everyone, np.zeros((world, world)))]
    agreed = torch.tensor(times, dtype=torch.float64)
    dist.broadcast(agreed, src=0)
    assert times == agreed.tolist()  # the slowest rank's time, on every rank
    assert 16 * 2**20 / times[0] < 1e11 and 12 * 2**20 / times[1] < 1e11, times  # bytes really crossed
    assert times[2] < min(times[:2]), times  # nothing to move is faster than something


@pytest.mark.timeout(120)
def test_pattern_probe_replays_a_pair_matrix_on_every_rank() -> None:
    run_ranks(_pattern, 4)
