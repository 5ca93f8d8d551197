"""A frozen role's shards in host memory between the phases it computes in (reward_model.offload=true).

`park` copies every storage behind the engine's sharded parameters into host memory (pinned on a GPU, so the copy
back runs at full PCIe speed) and frees the device storage; `unpark` gives each storage its size back and copies its
bytes home. FSDP2 keeps each shard as a view of its padded storage, so the module's parameters are whole again after
`unpark` without any rebinding. On the CPU both ends are host memory: the copy is still made (the path is the one a
GPU takes), only the memory it frees is not a device's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from rlhf_dyna.train.engine import TrainEngine, refresh_fsdp_shards
from rlhf_dyna.transition.role_move import state_storages
from rlhf_dyna.transition.transport import release_cached_memory


@dataclass(frozen=True)
class CopyStats:
    seconds: float
    bytes_copied: int  # on this rank


class HostCopy:
    """One engine's parked shards: (its storage, the host bytes) pairs while parked."""

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine
        self._held: list[tuple[torch.UntypedStorage, torch.Tensor]] = []

    @property
    def parked(self) -> bool:
        return bool(self._held)

    def park(self) -> CopyStats:
        start, copied = time.perf_counter(), 0
        pinned = self.engine.device.type == "cuda"
        for storage in state_storages(self.engine).values():
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pinned)
            host.untyped_storage().copy_(storage)
            self._held.append((storage, host))
            copied += storage.nbytes()
            storage.resize_(0)
        release_cached_memory(self.engine.device)  # CUDA: the freed bytes go back to the driver for training
        return CopyStats(time.perf_counter() - start, copied)

    def unpark(self) -> CopyStats:
        start, copied = time.perf_counter(), 0
        for storage, host in self._held:
            storage.resize_(host.numel())
            storage.copy_(host.untyped_storage())
            copied += host.numel()
        self._held.clear()
        refresh_fsdp_shards(self.engine.model)  # FSDP2's all-gather inputs read the storages again
        return CopyStats(time.perf_counter() - start, copied)
