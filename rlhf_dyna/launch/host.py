"""The machine a run starts on: whether this process is already a launched rank, what the machine can hold (cores,
memory, GPUs), a run's name and a free port. Imports torch only to count GPUs: the launcher checks a run before it
pays for torch. GPUs are counted without initialising CUDA (launch/devices.py says why that matters)."""
from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

RANKS_PER_CORE_LIMIT = 4
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"  # "True": env:// makes every rank a client of a launcher's store


class LaunchError(RuntimeError):
    """A run that cannot start as asked; the message says what is wrong and what would work."""


def under_torchrun() -> bool:
    """True when this process already is a rank of a launched world (torchrun, or any launcher
    that sets RANK/WORLD_SIZE/MASTER_ADDR, spawn_ranks included), so it must not spawn."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return True
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def store_host_rank(launching: bool) -> int | None:
    """The rank whose process serves the job's TCPStore, or None where a launcher does: python -m rlhf_dyna's
    (launch/spawn.py; `launching`: asked in it, before it spawns) or torchrun's agent with its agent store. Without
    one (env:// rendezvous) rank 0 serves it, and cannot leave the job while it runs."""
    return None if launching or os.environ.get(AGENT_STORE_ENV) == str(True) else 0


def shared_memory_domain() -> str:
    """This machine as vLLM tells machines apart (processes that open each other's /dev/shm segments): the kernel's
    boot id and /dev/shm's filesystem; where either cannot be read, this process alone (vLLM's test fails there too)."""
    try:
        shm = os.stat("/dev/shm")
        return f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()}:{shm.st_dev}:{shm.st_ino}"
    except OSError:
        return f"{socket.gethostname()}:{os.getpid()}"


def visible_gpu_count() -> int:
    """GPUs this process may use (CUDA_VISIBLE_DEVICES applied). Before CUDA is initialised torch counts them through
    NVML, which leaves forked children free to use CUDA; `torch.cuda.is_available()` would ask the driver and poison
    every later fork. 0 on a CPU build of torch or when the driver cannot be reached."""
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 -- a broken driver or NVML counts as no GPU, as torch's own check does
        return 0


def local_device_kind() -> str:
    return "cuda" if visible_gpu_count() > 0 else "cpu"


def cpu_computes_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """The CPU has bf16 dot-product instructions (AVX512-BF16 or AMX), so bf16 matmuls run at twice fp32's rate there
    instead of being converted to fp32 and back. Read from /proc/cpuinfo: no torch import before the checks."""
    try:
        flags = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):  # not Linux, or no flags line: assume the slow path
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def resolve_precision(precision: str, cuda: bool) -> str:
    """trainer.precision=auto: bf16 where the device computes it natively, else fp32; other values as given."""
    if precision != "auto":
        return precision
    return "bf16" if cuda or cpu_computes_bf16() else "fp32"


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def _available_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise LaunchError("cannot read MemAvailable from /proc/meminfo")


def check_capacity(world_size: int, device: str, mem_per_rank_bytes: int = 0) -> None:
    """Refuse a local world this machine cannot hold, before anything is spawned.

    For `cuda`, `world_size` counts the ranks on this node (one GPU each).
    """
    if world_size < 1:
        raise LaunchError(f"world_size={world_size} is not a valid number of ranks; it must be 1 or more.")
    if device == "cpu":
        cores = usable_cores()
        limit = RANKS_PER_CORE_LIMIT * cores
        if world_size > limit:
            raise LaunchError(
                f"world_size={world_size} CPU ranks is more than this machine can hold: it has {cores} usable "
                f"core(s) and at most {RANKS_PER_CORE_LIMIT} ranks per core ({limit} ranks) are allowed. "
                f"Use world_size <= {limit}, or run under torchrun across several nodes."
            )
        if mem_per_rank_bytes > 0:
            available = _available_memory_bytes()
            if world_size * mem_per_rank_bytes > available:
                fits = available // mem_per_rank_bytes
                raise LaunchError(
                    f"world_size={world_size} CPU ranks need about {world_size * mem_per_rank_bytes / 2**30:.1f} GiB "
                    f"({mem_per_rank_bytes / 2**30:.2f} GiB each) but only {available / 2**30:.1f} GiB is available; "
                    f"at most {fits} rank(s) fit. Use a smaller world_size or a smaller model."
                )
    elif device == "cuda":
        gpus = visible_gpu_count()
        if world_size > gpus:
            raise LaunchError(
                f"world_size={world_size} ranks on this node need one GPU each but {gpus} GPU(s) are visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Use at most {gpus} "
                f"rank(s) per node, or spread the world over more nodes with torchrun."
            )
    else:
        raise LaunchError(f"device={device!r} is not supported; use 'cpu' or 'cuda'.")


def new_run_ident() -> str:
    # Becomes part of /dev/shm file names: no '/' allowed, short, unique per run.
    return f"rlhfdyna-{uuid.uuid4().hex[:12]}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
