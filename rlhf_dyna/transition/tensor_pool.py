"""Tensors kept for reuse by (shape, dtype, device): the CPU staging of the vLLM install, group after group and sync
after sync. A fresh CPU tensor of this size is mmap'd: its pages fault in (and are zeroed) while the wire writes into
it, and go back to the system when it is freed, which on 4 ranks sharing 2 cores cost more than the wire itself
(scripts/profile_vllm_sync.py). Layers of one model repeat their shapes, so the pool holds about one group of
layers' staging (two while one installs and the next arrives)."""
from __future__ import annotations

import threading
from collections.abc import Iterable

import torch
from torch import Tensor

PoolKey = tuple[tuple[int, ...], torch.dtype, torch.device]


class TensorPool:
    def __init__(self) -> None:
        self._free: dict[PoolKey, list[Tensor]] = {}
        self._lock = threading.Lock()  # the install thread gives back while the caller takes

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """A tensor of that shape with unspecified contents: a kept one, else a new one."""
        with self._lock:
            kept = self._free.get((tuple(shape), dtype, device))
            if kept:
                return kept.pop()
        return torch.empty(shape, dtype=dtype, device=device)

    def give(self, tensors: Iterable[Tensor]) -> None:
        """Keep `tensors` for later takes; the caller must hold no other reference that it still reads or writes."""
        with self._lock:
            for t in tensors:
                self._free.setdefault((tuple(t.shape), t.dtype, t.device), []).append(t)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(t.numel() * t.element_size() for kept in self._free.values() for t in kept)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
