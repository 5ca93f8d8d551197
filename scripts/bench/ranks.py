"""The benchmark scripts' gloo ranks on this machine: each rank's process group (with the environment vLLM's
external_launcher reads), and the launch of a world of them, with vLLM's CPU TP shared-memory segments cleaned up."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def init_rank(rank: int, world: int, port: int) -> None:
    """This process as gloo rank `rank` of `world` on 127.0.0.1:`port`, one thread."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))  # vLLM's external_launcher reads them
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def launch(rank_main: Callable[..., None], args: tuple, world: int, port: int) -> None:
    """`rank_main(rank, *args)` in `world` fresh forkserver processes, joined; whatever happens, the /dev/shm segments
    vLLM's CPU TP groups name after `port` (rollout/cpu_worker.py) are removed."""
    try:
        mp.start_processes(rank_main, args=args, nprocs=world, join=True, start_method="forkserver")
    finally:
        for path in Path("/dev/shm").glob(f"*rlhfdyna-{port}-*"):
            path.unlink(missing_ok=True)
