"""Train -> rollout weight synchronisation: the `WeightSync` interface and the `naive` baseline.

`NaiveSync` gathers every parameter whole on every rank (`DTensor.full_tensor()`) and streams the
full tensors, by HF name, into vLLM's checkpoint-format loader. It stays as the benchmark baseline.
"""
from __future__ import annotations

import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor

from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine, full_state_dict, reshard


@dataclass(frozen=True)
class SyncStats:
    seconds: float  # wall time on this rank, from the first gather to vLLM's caches being reset
    bytes_moved: int  # bytes received over the network, summed over all ranks
    rounds: int  # communication rounds (here: one gather per tensor)
    peak_extra_bytes: int  # most bytes of transfer buffers alive at once on this rank


class WeightSync(ABC):
    name: str

    @abstractmethod
    def sync(self, train_engine: TrainEngine, rollout: VLLMRollout) -> SyncStats:
        """Collective: every rank calls it; afterwards the rollout engine generates with the trained weights."""


class _LiveBytes:
    """Bytes of yielded tensors still referenced anywhere (vLLM buffers a layer's weights before loading)."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def track(self, tensor: Tensor) -> Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(tensor, self._release, nbytes)
        return tensor

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes


class NaiveSync(WeightSync):
    name = "naive"

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype  # cast after gathering (e.g. bf16 rollout from fp32 master weights); bytes count the gather

    def sync(self, train_engine: TrainEngine, rollout: VLLMRollout) -> SyncStats:
        start = time.perf_counter()
        reshard(train_engine.model)  # count what a rank holds in its training layout, not a leftover unsharded root
        local_bytes = {  # name -> (bytes of the local shard, bytes per element) in the training dtype
            name: ((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size(), p.element_size())
            for name, p in train_engine.model.named_parameters()
        }
        received, rounds, buffers = 0, 0, _LiveBytes()

        def stream() -> Iterator[tuple[str, Tensor]]:
            nonlocal received, rounds
            for name, full in full_state_dict(train_engine, self.dtype):
                if name in local_bytes:  # not a tied alias, which reuses the tensor just gathered
                    full_bytes = full.numel() * local_bytes[name][1]
                    received += full_bytes - local_bytes[name][0]  # the shard it already held isn't moved
                    rounds += 1
                    buffers.track(full)
                yield name, full

        rollout.load_weights(stream())
        seconds = time.perf_counter() - start
        total = torch.tensor([received], dtype=torch.int64, device=train_engine.device)
        dist.all_reduce(total)
        return SyncStats(seconds=seconds, bytes_moved=int(total), rounds=rounds, peak_extra_bytes=buffers.peak)
