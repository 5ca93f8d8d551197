"""The one way tests run a function on N real ranks: fresh processes with the rank environment the launcher gives
(gloo over loopback), each rank's return value handed back, and vLLM's /dev/shm segments removed afterwards."""
from __future__ import annotations

import gc
import glob
import os
import pickle
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.forkserver import forkserver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, ident: str, results: str, fn: Callable, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_DIST_IDENT=ident, OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)  # two shared cores: one thread per rank avoids oversubscription
    gc.freeze()  # the server's imported heap: vLLM's collections at engine start then walk only this rank's objects
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
    finally:
        if dist.is_initialized():  # VLLMRollout.shutdown() already tears it down
            dist.destroy_process_group()
    (Path(results) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))


def run_ranks(fn: Callable, world: int, *args, timeout: float | None = None) -> list[Any]:
    """Start `world` ranks running fn(rank, world, *args) (fn and args must pickle: a module-level function) and
    return what each returned, in rank order. Re-raises the first rank's failure after stopping the others; with
    `timeout` (seconds), stops every rank and raises TimeoutError when they run longer."""
    ident = f"rlhfdyna-{uuid.uuid4().hex[:10]}"  # vLLM names its /dev/shm segments from this
    deadline = None if timeout is None else time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="rlhf_dyna_ranks_") as results:
        forkserver()  # ranks fork from the server that imported torch, transformers and vLLM once
        ranks = mp.start_processes(_rank_main, args=(world, _free_port(), ident, results, fn, args), nprocs=world,
                                   join=False, start_method="forkserver")
        try:
            while not ranks.join(timeout=None if deadline is None else max(0.0, deadline - time.monotonic())):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{world} ranks of {fn.__name__} still ran after {timeout} s")
        finally:
            for process in ranks.processes:  # after a timeout, or an interrupt of this process
                if process.is_alive():
                    process.kill()
                    process.join()
            for path in glob.glob(f"/dev/shm/*{ident}*"):
                os.remove(path)
        return [pickle.loads((Path(results) / f"rank{rank}.pkl").read_bytes()) for rank in range(world)]
