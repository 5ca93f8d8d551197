"""Starting and supervising the ranks of a run.

Outside torchrun, `spawn_ranks` (launch/spawn.py) starts `world_size` local ranks itself and supervises them; inside
a rank (ours or torchrun's), `init_distributed` (launch/rank.py) joins the default process group on the device
`devices.py` chooses. `host.py` checks what the machine can hold before anything starts (GPUs counted without
initialising CUDA); `shm.py` names and removes vLLM's /dev/shm segments, `scratch.py` the run's node-local
files; `threads.py` gives a rank's worker threads
its device; `output.py` routes the ranks' output to log files and `failure.py` records and picks the failure to show.
Only rank.py and threads.py import torch, and neither is imported here (rank.py on first use of its names): a
launcher refuses a bad run before it pays for torch."""
from __future__ import annotations

from .failure import record_failure
from .host import (
    RANKS_PER_CORE_LIMIT, LaunchError, check_capacity, free_port, local_device_kind, new_run_ident, resolve_precision,
    under_torchrun, usable_cores,
)
from .output import route_rank_output
from .shm import SHM_DIR, clean_shm_segments, pin_vllm_shm_ident, run_segments
from .spawn import ERROR_TAIL_LINES, TERMINATE_GRACE_S, group_members, spawn_ranks

_IN_RANK = ("DistInfo", "init_distributed", "shutdown_distributed")  # launch/rank.py, imported when first asked for


def __getattr__(name: str):
    if name in _IN_RANK:
        from . import rank

        return getattr(rank, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DistInfo", "ERROR_TAIL_LINES", "LaunchError", "RANKS_PER_CORE_LIMIT", "SHM_DIR", "TERMINATE_GRACE_S",
    "check_capacity", "clean_shm_segments", "free_port", "group_members", "init_distributed", "local_device_kind",
    "new_run_ident", "pin_vllm_shm_ident", "record_failure", "resolve_precision", "route_rank_output", "run_segments",
    "shutdown_distributed", "spawn_ranks", "under_torchrun", "usable_cores",
]
