"""The tests' one forkserver: a process that imported torch, transformers, vLLM and the app once, from which rank
tests (tests/multirank.py) and app runs (tests/app/app_runs.py) fork, instead of each paying those imports again
(seconds per process on 2 cores). The server imports them as the app's launcher does before it forks ranks: under
the launcher's quiet environment (rlhf_dyna.job.QUIET_ENV), through `tests.warm_imports`."""
from __future__ import annotations

import multiprocessing
import os
from multiprocessing.context import ForkServerContext

PRELOAD = ["tests.warm_imports"]


def forkserver() -> ForkServerContext:
    """The forkserver context; its server starts, with PRELOAD imported, at the session's first use."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    return multiprocessing.get_context("forkserver")


def start_forkserver() -> None:
    """Start the server now (its imports take tens of seconds on 2 busy cores), not inside the first timed test."""
    child = forkserver().Process(target=os.getpid)  # the first fork waits for the server's imports
    child.start()
    child.join()
