"""vLLM CPU worker whose shared-memory segments are named per run, so concurrent or crashed runs can't collide.

vLLM's CPUWorker names the TP communicator's /dev/shm segments after the last ':' field of
distributed_init_method, overwriting VLLM_DIST_IDENT. Under external_launcher that method is the constant
"env://", so every run on a host uses "//-tp:0-[0-1]-cpushm" and a second run (or any run after a crash)
fails with `create shm in SHMManager failed. errno: 17`. Our ranks already have torch.distributed
initialised, so the init method is not used to connect; we only give it a per-run last field.
"""
from __future__ import annotations

import os

from vllm.v1.worker.cpu_worker import CPUWorker


def shm_ident() -> str:
    """Per-run name: VLLM_DIST_IDENT if the launcher set one, else the run's (host-unique) master port."""
    return os.environ.get("VLLM_DIST_IDENT") or f"rlhfdyna-{os.environ.get('MASTER_PORT', os.getpid())}"


class ShmIdentCPUWorker(CPUWorker):
    def init_device(self) -> None:
        self.distributed_init_method = f"env://:{shm_ident()}"
        super().init_device()
