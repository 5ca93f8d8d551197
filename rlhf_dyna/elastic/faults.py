"""Fault injection for tests of failures at chosen moments (pure: the environment and the standard library).

    RLHF_DYNA_FAULT_AT="reshard/critic/prepare_to_train_actor@3"   # rank 3 raises right before that change
    RLHF_DYNA_KILL_AT="weight_sync/step_4@2"                       # launched rank 2 SIGKILLs itself there

A raised fault: the launcher must stop every rank and clean up, as for any other failing rank
(tests/app/runtimes/test_lend.py). A kill is a real `kill -9` at a moment a test could not hit from outside (a weight
sync takes milliseconds); the process is named by its launch rank, which survives renumbering, so a step redone after
a recovery does not fire it again on another process (tests/app/elastic/test_replica_recovery.py)."""
from __future__ import annotations

import os
import signal

FAULT_ENV = "RLHF_DYNA_FAULT_AT"
FAULT_TEXT = "injected fault"
KILL_ENV = "RLHF_DYNA_KILL_AT"
KILL_TEXT = "injected kill -9"


class InjectedFault(RuntimeError):
    pass


def fault_point(name: str, rank: int) -> None:
    """Raise if the environment asks this rank to fail at `name`."""
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted and wanted == f"{name}@{rank}":
        run = os.environ.get("VLLM_DIST_IDENT", "?")
        raise InjectedFault(f"{FAULT_TEXT} at {name} on rank {rank} (run {run}, {FAULT_ENV}={wanted})")


def kill_point(name: str, launched_rank: int, run_ident: str) -> None:
    """SIGKILL this process if the environment asks launched rank `launched_rank` to die at `name`; the line before it
    (in the rank's log) names the run, whose /dev/shm entries a test then checks."""
    wanted = os.environ.get(KILL_ENV, "")
    if wanted and wanted == f"{name}@{launched_rank}":
        print(f"rlhf_dyna: {KILL_TEXT} at {name} of launched rank {launched_rank} (pid {os.getpid()}, run {run_ident}, "
              f"{KILL_ENV}={wanted})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
