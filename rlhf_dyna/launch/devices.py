"""Which device a run and each of its ranks use, decided without initialising CUDA in the launcher.

`torch.cuda.is_available()` asks the CUDA driver (`cudaGetDeviceCount`), and torch then marks the process so that a
child forked from it can never use CUDA ("Cannot re-initialize CUDA in forked subprocess": `poison_fork()` in
torch/csrc/cuda/Module.cpp, `_lazy_init` in torch/cuda/__init__.py). The launcher therefore counts GPUs through NVML
(`host.visible_gpu_count`), and forks its ranks only when no GPU is visible
and CUDA was never initialised in it (`forks_ranks`); otherwise every rank starts as a fresh interpreter. Only
`gpu_memory_bytes` imports anything: the rest are pure functions of their arguments.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .host import LaunchError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class RankDevice:
    """The device one rank computes on: ("cpu", None) or ("cuda", index among the rank's visible GPUs)."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA (then a forked child cannot use it); False without torch loaded."""
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def forks_ranks(gpus: int, cuda_initialised: bool) -> bool:
    """Ranks may be forked from the launcher only when none of them can use CUDA and the launcher never initialised
    it: a CUDA context does not survive fork, and a CUDA rank forked from a launcher that asked the driver anything
    fails at its first CUDA call."""
    return gpus == 0 and not cuda_initialised


def run_device(requested: str, gpus: int) -> str:
    """The device type of a run: `parallel.device` with auto resolved (CUDA whenever a GPU is visible)."""
    if requested not in DEVICES:
        raise LaunchError(f"parallel.device={requested!r} is not a device; valid: {', '.join(DEVICES)}.")
    if requested == "auto":
        return "cuda" if gpus > 0 else "cpu"
    return requested


def rank_device(requested: str, local_rank: int, local_world_size: int, gpus: int) -> RankDevice:
    """This rank's device from `parallel.device`: a CPU run never touches CUDA; a CUDA rank takes the GPU of its local
    rank, or GPU 0 where the scheduler shows each rank its own single GPU (SLURM's --gpus-per-task=1)."""
    kind = run_device(requested, gpus)
    if kind == "cpu":
        return RankDevice("cpu")
    if gpus >= local_world_size and local_rank < gpus:
        return RankDevice("cuda", local_rank)
    if gpus == 1:
        return RankDevice("cuda", 0)
    raise LaunchError(
        f"local rank {local_rank} of {local_world_size} on this node needs a GPU of its own but {gpus} GPU(s) are "
        f"visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}, parallel.device={requested}). "
        f"Start at most {gpus} rank(s) per node, or set parallel.device=cpu to run on the CPU."
    )


def world_backend(device_type: str) -> str:
    """The default group's backend: gloo on the CPU; on CUDA NCCL for CUDA tensors and gloo for the CPU tensors of
    metrics and control messages."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def engine_visible_devices(parent_visible: str | None, index: int) -> str:
    """CUDA_VISIBLE_DEVICES for an engine process that must use the parent's GPU `index` as its only GPU (vLLM's
    `uni` executor takes device 0 of what it sees)."""
    if parent_visible is None or not parent_visible.strip():
        return str(index)
    visible = [d.strip() for d in parent_visible.split(",") if d.strip()]
    if index >= len(visible):
        raise LaunchError(f"GPU {index} is not among CUDA_VISIBLE_DEVICES={parent_visible} ({len(visible)} visible).")
    return visible[index]


def gpu_memory_bytes() -> int | None:
    """Total memory of the first visible GPU, read through NVML (no CUDA initialisation); None where unknown."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = engine_visible_devices(visible, 0) if visible is None or visible.strip() else None
    if first is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(first))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 -- no NVML (CPU machine, MIG, missing package): the budget check is skipped
        return None
