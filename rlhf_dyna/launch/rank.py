"""Inside a rank (ours or torchrun's, single or multi node): join the default process group from the environment."""
from __future__ import annotations

import atexit
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType

import torch
import torch.distributed as dist

from .devices import RankDevice, rank_device, world_backend
from .host import LaunchError, new_run_ident
from .shm import clean_shm_segments, pin_vllm_shm_ident


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    device: torch.device
    run_ident: str


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise LaunchError(f"{name} is not set: start ranks with rlhf_dyna.launch.spawn_ranks or torchrun.")
        return default
    return int(value)


def _agree_on_run_ident(device: torch.device) -> str:
    ident = os.environ.get("VLLM_DIST_IDENT")
    if ident:
        return ident
    # torchrun gives no per-run name every rank shares; rank 0 makes one.
    box = [new_run_ident() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0, device=device)
    return str(box[0])


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)  # SystemExit runs atexit, which removes this run's shm segments


def use_device(chosen: RankDevice, tf32: bool) -> torch.device:
    """Make `chosen` this thread's current device (CUDA), with fp32 matmuls in TF32 when `tf32`; a CPU rank touches
    nothing of CUDA."""
    if chosen.type != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", chosen.index)
    torch.cuda.set_device(device)
    # the legacy switch, not torch.backends.cuda.matmul.fp32_precision: inductor (vLLM's compile) reads the legacy
    # getter, which raises once the two APIs are mixed
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    return device


def init_distributed(timeout: timedelta | None = None, device: str = "auto", tf32: bool = True) -> DistInfo:
    """Join the default process group from the env that spawn_ranks or torchrun set, on the device `device`
    (parallel.device: auto | cpu | cuda, see devices.rank_device). On CUDA the NCCL communicator is created now, on
    this thread (`device_id`), and so is every later group's (elastic/world_builder.py relies on it)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise LaunchError(
            f"{', '.join(missing)} not set: this process is not a launched rank. Start it through "
            f"rlhf_dyna.launch.spawn_ranks (python -m rlhf_dyna) or torchrun."
        )
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
    node_rank = _env_int("GROUP_RANK", rank // local_world_size)
    gpus = torch.cuda.device_count() if device != "cpu" else 0
    chosen = rank_device(device, local_rank, local_world_size, gpus)
    backend, torch_device = world_backend(chosen.type), use_device(chosen, tf32)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                                device_id=torch_device if chosen.type == "cuda" else None)
    run_ident = _agree_on_run_ident(torch_device)
    pin_vllm_shm_ident(run_ident)
    atexit.register(clean_shm_segments, run_ident)
    if "TORCHELASTIC_RUN_ID" in os.environ and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return DistInfo(rank, world_size, local_rank, local_world_size, node_rank, backend, torch_device, run_ident)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
