"""A checkpoint keeps each rank's GPU RNG state too (orchestrator/resume.py). Without CUDA here, torch.cuda's
generator calls are stood in for by a recorder; the CPU generator is the real one."""
from __future__ import annotations

import pytest
import torch

from rlhf_dyna.orchestrator.resume import rank_rng_state, restore_rank_rng


def test_a_cpu_rank_saves_and_restores_its_generator() -> None:
    state = rank_rng_state()
    assert set(state) == {"torch"}
    first = torch.rand(3)
    restore_rank_rng(state)
    assert torch.equal(torch.rand(3), first)
    restore_rank_rng({**state, "cuda": torch.zeros(16, dtype=torch.uint8)})  # a GPU run resumed on the CPU


def test_a_cuda_rank_saves_and_restores_its_gpus_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_state = torch.arange(16, dtype=torch.uint8)
    restored: list[torch.Tensor] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: gpu_state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    state = rank_rng_state()
    assert torch.equal(state["cuda"], gpu_state)
    restore_rank_rng(state)
    assert len(restored) == 1 and torch.equal(restored[0], gpu_state)
