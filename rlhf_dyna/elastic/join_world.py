"""A joining rank and the running world meet on the job's store (live part of a join; docs/elastic.md).

    store = joiner_store(host, port)                      # the joiner: a client of the job's TCPStore
    enter_private_world(store, index, "gloo")             # a world of one, so vLLM can start before the join
    ... prepare (task, skeletons, vLLM engine) ...
    announce_ready(store, index, build_seconds)
    admission = wait_admission(store, index)              # blocks until the world admits it (None: the job ended)

    waited, built = wait_ready(store, [index])            # the old world at the boundary: every rank
    admit(store, index, Admission(generation, rank, world_size, step))   # rank 0

Keys live under the job store's "default_pg" prefix, where the launcher's env:// rendezvous put the first world, so a
joiner's client and the ranks' `job_store()` name the same keys; each new world is a default group over
`rlhf_dyna/world<generation>` (elastic.world_switch.enter_new_world).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch.distributed as dist

FIRST_WORLD_PREFIX = "default_pg"  # torch's prefix of the default group's store under env:// rendezvous
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


def joiner_store(host: str, port: int) -> dist.Store:
    """The job's store as the ranks' `job_store()` sees it, from a process outside the world."""
    client = dist.TCPStore(host, port, is_master=False, timeout=STORE_TIMEOUT, wait_for_workers=False)
    return dist.PrefixStore(FIRST_WORLD_PREFIX, client)


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
