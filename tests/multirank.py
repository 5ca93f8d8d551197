"""Run a function on N real ranks (gloo over loopback), as the launcher would, and clean up after vLLM."""
from __future__ import annotations

import glob
import multiprocessing
import os
import socket
import uuid
from collections.abc import Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, ident: str, fn: Callable, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_DIST_IDENT=ident, OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)  # two shared cores: one thread per rank avoids oversubscription
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        if dist.is_initialized():  # VLLMRollout.shutdown() already tears it down
            dist.destroy_process_group()


# Ranks fork from a server that imported these once: re-importing them per rank costs ~5 s each on 2 cores.
PRELOAD = ["torch", "torch.distributed.tensor", "transformers", "rlhf_dyna.models.build", "rlhf_dyna.train.engine", "vllm"]


def run_ranks(fn: Callable, world: int, *args) -> None:
    """Start `world` ranks running fn(rank, world, *args); re-raises the first failure."""
    ident = f"rlhfdyna-{uuid.uuid4().hex[:10]}"  # vLLM names its /dev/shm segments from this
    multiprocessing.set_forkserver_preload(PRELOAD)
    try:
        mp.start_processes(_rank_main, args=(world, _free_port(), ident, fn, args), nprocs=world, join=True,
                           start_method="forkserver")
    finally:
        for path in glob.glob(f"/dev/shm/*{ident}*"):
            os.remove(path)
