"""Measurement probe: peak extra resident memory of a block (the rank probes: tests/ranks/bench/test_measure.py)."""
from __future__ import annotations

import time

import torch

from bench.measure import PeakExtraMemory


def test_peak_extra_memory_sees_a_buffer_freed_before_the_block_ends() -> None:
    before = torch.ones(128 * 2**20 // 4)  # a peak before the block is not the block's
    del before
    with PeakExtraMemory() as memory:
        buffer = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, freed at once
        del buffer
    assert memory._thread is None  # the kernel's high-water mark, no sampling thread
    assert 48 * 2**20 < memory.peak_extra_bytes < 96 * 2**20, memory.peak_extra_bytes
    with PeakExtraMemory() as idle:
        pass
    assert idle.peak_extra_bytes < 16 * 2**20


def test_peak_extra_memory_falls_back_to_sampling_where_the_reset_is_refused(monkeypatch) -> None:
    import builtins

    real_open = builtins.open

    def refusing(path, *args, **kwargs):
        if str(path) == "/proc/self/clear_refs":
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    with PeakExtraMemory(interval_s=0.001) as memory:
        buffer = torch.ones(64 * 2**20 // 4)
        time.sleep(0.05)  # several samples while it is alive
        del buffer
    assert memory._thread is not None
    assert 48 * 2**20 < memory.peak_extra_bytes < 96 * 2**20, memory.peak_extra_bytes
