"""Fault injection for tests of failures during placement changes (pure: the environment and the standard library).

    RLHF_DYNA_FAULT_AT="reshard/critic/prepare_to_train_actor@3"   # rank 3 raises right before that change

The launcher must then stop every rank and clean up, as for any other failing rank (tests/app/runtimes/test_lend.py)."""
from __future__ import annotations

import os

FAULT_ENV = "RLHF_DYNA_FAULT_AT"
FAULT_TEXT = "injected fault"


class InjectedFault(RuntimeError):
    pass


def fault_point(name: str, rank: int) -> None:
    """Raise if the environment asks this rank to fail at `name`."""
    wanted = os.environ.get(FAULT_ENV, "")
    if wanted and wanted == f"{name}@{rank}":
        run = os.environ.get("VLLM_DIST_IDENT", "?")
        raise InjectedFault(f"{FAULT_TEXT} at {name} on rank {rank} (run {run}, {FAULT_ENV}={wanted})")
