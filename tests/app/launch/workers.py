"""Rank programs for the launch tests, run as `python workers.py MODE OUT_DIR`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import torch
import torch.distributed as dist

from rlhf_dyna.elastic.join_world import job_client_store
from rlhf_dyna.errors import ConfigError
from rlhf_dyna.launch import SHM_DIR, init_distributed, record_failure, shutdown_distributed, under_torchrun
from rlhf_dyna.launch.lost_ranks import lost_key

CRASH_TEXT = "rank one blew up on purpose (launch test)"
CONFIG_ERROR_TEXT = "reward 'x:y' raised on purpose (launch test); its traceback would follow"


def all_reduce(out_dir: Path) -> None:
    """Sum of (rank + 1) over the world, and each rank's view of itself, to out_dir/rank{r}.json."""
    info = init_distributed()
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    (out_dir / f"rank{info.rank}.json").write_text(json.dumps(dict(
        sum=total.item(), rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
        local_world_size=info.local_world_size, node_rank=info.node_rank, backend=info.backend,
        run_ident=info.run_ident, omp=os.environ.get("OMP_NUM_THREADS"), under_torchrun=under_torchrun(),
        torch_threads=torch.get_num_threads(), pythonpath=os.environ.get("PYTHONPATH"),
    )))
    shutdown_distributed()


def _leave_traces(out_dir: Path) -> int:
    """What a killed vLLM rank leaves: a segment named by the run, on rank 0 also an untracked psm_
    segment (a reader's view, as vLLM's shm_broadcast makes) and a grandchild process."""
    info = init_distributed()
    (SHM_DIR / f"{info.run_ident}-tp:0-[0-1]-cpushm_{info.rank}").write_bytes(b"\0" * 4096)
    pids = [os.getpid()]
    if info.rank == 0:
        segment = shared_memory.SharedMemory(create=True, size=4096)
        resource_tracker.unregister(segment._name, "shared_memory")  # nobody but the launcher may clean it
        (out_dir / "psm_name").write_text(segment.name)
        (out_dir / "run_ident").write_text(info.run_ident)
        pids.append(subprocess.Popen(["sleep", "300"]).pid)
        globals()["_keep_mapped"] = segment
    (out_dir / f"rank{info.rank}.pids").write_text(" ".join(map(str, pids)))
    dist.barrier()
    return info.rank


def crash(out_dir: Path) -> None:
    """Rank 1 raises; rank 0 never notices (it sleeps), so the launcher has to stop it."""
    if _leave_traces(out_dir) == 1:
        (out_dir / "crash_time").write_text(str(time.time()))
        raise RuntimeError(CRASH_TEXT)
    time.sleep(300)


def config_error(out_dir: Path) -> None:
    """As rlhf_dyna.worker does: rank 1 records a ConfigError and tears down, after which it prints the noise vLLM's
    exit handlers print; rank 0 then fails in its collective and records that later."""
    rank = init_distributed().rank
    (out_dir / f"rank{rank}.pids").write_text(str(os.getpid()))
    try:
        if rank == 1:
            raise ConfigError(CONFIG_ERROR_TEXT)
        dist.barrier()  # never completes: rank 1 is gone
    except Exception as err:
        record_failure(err, rank)
        raise
    finally:
        shutdown_distributed()
        print("ValueError: Invalid process group specified", file=sys.stderr, flush=True)


def hang(out_dir: Path) -> None:
    _leave_traces(out_dir)
    (out_dir / f"ready{dist.get_rank()}").touch()
    time.sleep(300)


def exit_3(out_dir: Path) -> None:
    sys.exit(3)


def exit_text(out_dir: Path) -> None:
    sys.exit("stopping with a message")


def cuda_state(out_dir: Path) -> None:
    """Whether this rank started with the launcher's CUDA state and its mark on torch: a forked rank inherits both,
    a fresh interpreter neither."""
    (out_dir / f"cuda_state{os.environ['RANK']}.json").write_text(json.dumps(dict(
        inherited_cuda_state=bool(torch.cuda._initialized), forked=hasattr(torch, "_launch_test_mark"))))


def rank0_leaves(out_dir: Path) -> None:
    """Rank 0 leaves the job (its process exits 0) while rank 1 goes on: once rank 0's process is gone, rank 1 uses
    the job's store (the launcher serves it) and prints a line of rlhf_dyna's own, for the console to show."""
    info = init_distributed()
    print(f"rlhf_dyna: rank {info.rank} speaks before rank 0 leaves", flush=True)
    (out_dir / f"rank{info.rank}.pids").write_text(str(os.getpid()))
    dist.barrier()
    shutdown_distributed()
    if info.rank == 0:
        return
    rank0 = int((out_dir / "rank0.pids").read_text())
    while Path(f"/proc/{rank0}").exists():  # until the launcher has reaped it
        time.sleep(0.05)
    time.sleep(0.5)  # the launcher's loop takes the exit from its queue
    store = job_client_store()
    store.set("after_rank0", "still served")
    print(f"rlhf_dyna: rank 1 speaks after rank 0 left; the job's store says {store.get('after_rank0').decode()}",
          flush=True)


def rank0_lost(out_dir: Path) -> None:
    """Rank 0 kills itself (SIGKILL) while rank 1 goes on: a launcher that recovers lost ranks announces the loss on
    the job's store instead of stopping the run, and rank 1, rank 0 of the next world, prints a line of rlhf_dyna's
    own once it reads the announcement."""
    info = init_distributed()
    print(f"rlhf_dyna: rank {info.rank} speaks before rank 0 is lost", flush=True)
    dist.barrier()
    shutdown_distributed()
    if info.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    store = job_client_store()
    store.wait([lost_key(1)], timedelta(seconds=30))
    print(f"rlhf_dyna: rank 1 speaks after rank 0 was lost; announced {json.loads(store.get(lost_key(1)))['lost']}",
          flush=True)


def kill_self(out_dir: Path) -> None:
    print("printed before the kill", flush=True)
    os.kill(os.getpid(), 9)


if __name__ == "__main__":
    mode, out = sys.argv[1:]
    modes = {"all_reduce": all_reduce, "crash": crash, "config_error": config_error, "hang": hang, "exit_3": exit_3,
             "exit_text": exit_text, "kill_self": kill_self, "cuda_state": cuda_state, "rank0_leaves": rank0_leaves,
             "rank0_lost": rank0_lost}
    modes[mode](Path(out))
