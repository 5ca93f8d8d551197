"""A joining rank and the running world meet on the job's store (live part of a join; docs/elastic.md).

    store = job_client_store()                            # every process: a client of the job's TCPStore
    enter_private_world(store, index, "gloo")             # a world of one, so vLLM can start before the join
    ... prepare (task, skeletons, vLLM engine) ...
    announce_ready(store, index, build_seconds)
    admission = wait_admission(store, index)              # blocks until the world admits it (None: the job ended)

    waited, built = wait_ready(store, [index])            # the old world at the boundary: every rank
    admit(store, index, Admission(generation, rank, world_size, step))   # rank 0

Every process (ranks and joiners) opens its own client of the job's TCPStore (MASTER_ADDR:MASTER_PORT, served from
rank 0's process), under one prefix, so all name the same keys whatever worlds they have been through (torch nests
a default group's store under prefixes of its own); each new world is a default group over
`rlhf_dyna/world<generation>` of it (elastic.world_switch.enter_new_world).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch.distributed as dist

JOB_PREFIX = "rlhf_dyna/job"
JOB_DONE_KEY = "rlhf_dyna/job/done"  # set by rank 0 when the run ends: a waiting joiner stops
STORE_TIMEOUT = timedelta(hours=24)  # a joiner may wait for its boundary as long as a run lasts
POLL_S = 0.05


@dataclass(frozen=True)
class Admission:
    """What rank 0 tells a joiner at the boundary: the new world's store generation, its rank and size, and the step
    after which it joins (its first step is step + 1)."""

    generation: int
    rank: int
    world_size: int
    step: int


def ready_key(index: int) -> str:
    return f"rlhf_dyna/joiner{index}/ready"


def admission_key(index: int) -> str:
    return f"rlhf_dyna/joiner{index}/admit"


def job_client_store(host: str | None = None, port: int | None = None) -> dist.Store:
    """A client of the job's store (the launcher's MASTER_ADDR:MASTER_PORT by default), under the job's prefix."""
    host = host if host is not None else os.environ["MASTER_ADDR"]
    port = port if port is not None else int(os.environ["MASTER_PORT"])
    client = dist.TCPStore(host, port, is_master=False, timeout=STORE_TIMEOUT, wait_for_workers=False)
    return dist.PrefixStore(JOB_PREFIX, client)


def enter_private_world(store: dist.Store, index: int, backend: str) -> None:
    """A default group of one over the joiner's own prefix: vLLM's external launcher builds its engine inside a
    torch.distributed world, and `rollout.reform` later moves it into the DP group of the world it joins."""
    dist.init_process_group(backend, store=dist.PrefixStore(f"rlhf_dyna/joiner{index}", store), rank=0, world_size=1)
    os.environ.update(RANK="0", WORLD_SIZE="1")  # vLLM's external launcher reads its rank there


def announce_ready(store: dist.Store, index: int, build_seconds: float) -> None:
    store.set(ready_key(index), json.dumps({"build_seconds": build_seconds}))


def wait_ready(store: dist.Store, indices: list[int]) -> tuple[float, float]:
    """Block until every joiner in `indices` is prepared; (seconds waited here, the longest preparation)."""
    started = time.perf_counter()
    keys = [ready_key(i) for i in indices]
    store.wait(keys, STORE_TIMEOUT)
    waited = time.perf_counter() - started
    return waited, max(json.loads(store.get(k))["build_seconds"] for k in keys)


def admit(store: dist.Store, index: int, admission: Admission) -> None:
    store.set(admission_key(index), json.dumps(asdict(admission)))


def mark_job_done(store: dist.Store) -> None:
    store.set(JOB_DONE_KEY, "1")


def wait_admission(store: dist.Store, index: int) -> Admission | None:
    """Block until rank 0 admits joiner `index`; None when the job ends first (it marked itself done, or its store,
    served from rank 0's process, went away)."""
    key = admission_key(index)
    while True:
        try:
            if store.check([key]):
                return Admission(**json.loads(store.get(key)))
            if store.check([JOB_DONE_KEY]):
                return None
        except (RuntimeError, dist.DistStoreError):  # the store's server (rank 0) is gone: the job has ended
            return None
        time.sleep(POLL_S)
