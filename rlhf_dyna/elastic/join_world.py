"""A joining rank and the running world meet on the job's store (live part of a join; docs/elastic/join.md).

    store = job_client_store()                            # every process: a client of the job's TCPStore
    name = joiner_name(k)                                 # scripted joiner k; request_name(store) for elastic.join
    announce_pid(store, name, os.getpid())                # a request: the launcher watches it (launch/joiner_watch.py)
    enter_private_world(store, name, "gloo")              # a world of one, so vLLM can start before the join
    ... prepare (task, skeletons, vLLM engine) ...
    announce_ready(store, name, build_seconds)
    admission = wait_admission(store, name, on_plan)      # blocks until the world admits it (NotAdmitted: it won't);
                                                          # on_plan(plan) when rank 0 posts the new world's plan
    post_plan(store, name, plan)                          # rank 0, at the start of the step before the boundary
    waited, built = wait_settled(store, [name])           # the old world at the boundary: every rank
    if claim(store, name):                                # rank 0: admitted, unless the launcher dropped it first
        admit(store, name, Admission(generation, rank, world_size, step))
    drop(store, name)                                     # the launcher, when the process died: False once claimed
    mark_exited(store, name)                              # the process, when it ends without failing

A joiner's fate is one key, set once by whichever comes first (compare_set): rank 0 claiming it at the boundary
("admitted": from then on it is a rank of the new world, and its death a lost rank's), or the launcher finding the
process dead ("gone": it never entered, and the world goes on without it).

Every process (ranks and joiners) opens its own client of the job's TCPStore (MASTER_ADDR:MASTER_PORT, served from
the launcher's process: launch/spawn.py), under one prefix, so all name the same keys whatever worlds they have been
through (torch nests a default group's store under prefixes of its own); each new world is a default group over
`rlhf_dyna/world<generation>` of it (elastic.world_switch.enter_new_world).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch.distributed as dist

JOB_PREFIX = "rlhf_dyna/job"
JOB_DONE_KEY = "done"  # set by rank 0 when the run ends: a waiting joiner stops
REQUESTS_KEY = "requests"  # a counter: elastic.join=RUN_DIR processes that asked to join so far
STORE_TIMEOUT = timedelta(hours=24)  # a joiner may wait for its boundary as long as a run lasts
CONNECT_TIMEOUT = timedelta(seconds=30)  # a job whose store does not answer by then is not running
POLL_S = 0.05
ADMITTED, GONE = "admitted", "gone"  # a joiner's fate (fate_key)


@dataclass(frozen=True)
class Admission:
    """What rank 0 tells a joiner at the boundary: the new world's store generation, its rank and size, and the step
    after which it joins (its first step is step + 1)."""

    generation: int
    rank: int
    world_size: int
    step: int


class NotAdmitted(Exception):
    """The job ended, or refused this joiner at its boundary: the message says which and why."""


def joiner_name(index: int) -> str:
    """Joiner process `index` of the run's elastic.events (launch/spawn.py starts it)."""
    return f"joiner{index}"


def request(n: int) -> str:
    """The n-th elastic.join=RUN_DIR process of the job."""
    return f"request{n}"


def request_name(store: dist.Store) -> str:
    """A new name for an elastic.join=RUN_DIR process: the job's requests are counted on its store."""
    return request(store.add(REQUESTS_KEY, 1) - 1)


def requests_so_far(store: dist.Store) -> int:
    return store.add(REQUESTS_KEY, 0)


def ready_key(name: str) -> str:
    return f"{name}/ready"


def admission_key(name: str) -> str:
    return f"{name}/admit"


def refusal_key(name: str) -> str:
    return f"{name}/refused"


def plan_key(name: str) -> str:
    return f"{name}/plan"


def fate_key(name: str) -> str:
    return f"{name}/fate"


def pid_key(name: str) -> str:
    return f"{name}/pid"


def exited_key(name: str) -> str:
    return f"{name}/exited"


def job_client_store(host: str | None = None, port: int | None = None) -> dist.Store:
    """A client of the job's store (the launcher's MASTER_ADDR:MASTER_PORT by default), under the job's prefix."""
    host = host if host is not None else os.environ["MASTER_ADDR"]
    port = port if port is not None else int(os.environ["MASTER_PORT"])
    client = dist.TCPStore(host, port, is_master=False, timeout=CONNECT_TIMEOUT, wait_for_workers=False)
    client.set_timeout(STORE_TIMEOUT)
    return dist.PrefixStore(JOB_PREFIX, client)


def enter_private_world(store: dist.Store, name: str, backend: str) -> None:
    """A default group of one over the joiner's own prefix: vLLM's external launcher builds its engine inside a
    torch.distributed world, and `rollout.reform` later moves it into the DP group of the world it joins."""
    dist.init_process_group(backend, store=dist.PrefixStore(f"{name}/world", store), rank=0, world_size=1)
    os.environ.update(RANK="0", WORLD_SIZE="1")  # vLLM's external launcher reads its rank there


def announce_ready(store: dist.Store, name: str, build_seconds: float) -> None:
    store.set(ready_key(name), json.dumps({"build_seconds": build_seconds}))


def is_ready(store: dist.Store, name: str) -> bool:
    return store.check([ready_key(name)])


def fate(store: dist.Store, name: str) -> str | None:
    """ADMITTED, GONE, or None while neither has happened."""
    return store.get(fate_key(name)).decode() if store.check([fate_key(name)]) else None


def _set_once(store: dist.Store, name: str, value: str) -> bool:
    return store.compare_set(fate_key(name), "", value).decode() == value


def claim(store: dist.Store, name: str) -> bool:
    """Rank 0 at the boundary: whether joiner `name` is admitted (False: the launcher found it dead first)."""
    return _set_once(store, name, ADMITTED)


def drop(store: dist.Store, name: str) -> bool:
    """The launcher, on finding joiner `name` dead: whether it was dropped before admission (False: it was a rank)."""
    return _set_once(store, name, GONE) or fate(store, name) == GONE


def wait_settled(store: dist.Store, names: list[str]) -> tuple[float, float]:
    """Block until every joiner in `names` is prepared or gone (it died first); (seconds waited here, the longest
    preparation of those prepared, 0 where none is)."""
    started, keys = time.perf_counter(), [ready_key(n) for n in names]
    while not all(store.check([k]) or fate(store, n) == GONE for n, k in zip(names, keys)):
        time.sleep(POLL_S)
    built = [json.loads(store.get(k))["build_seconds"] for k in keys if store.check([k])]
    return time.perf_counter() - started, max(built, default=0.0)


def announce_pid(store: dist.Store, name: str, pid: int) -> None:
    store.set(pid_key(name), str(pid))


def announced_pid(store: dist.Store, name: str) -> int | None:
    return int(store.get(pid_key(name))) if store.check([pid_key(name)]) else None


def mark_exited(store: dist.Store, name: str) -> None:
    """The joiner ends without failing (refused, left, or the run done): its end is no loss."""
    store.set(exited_key(name), "1")


def has_exited(store: dist.Store, name: str) -> bool:
    return store.check([exited_key(name)])


def admit(store: dist.Store, name: str, admission: Admission) -> None:
    store.set(admission_key(name), json.dumps(asdict(admission)))


def post_plan(store: dist.Store, name: str, plan: dict) -> None:
    """The world joiner `name` will enter at the next boundary (elastic.world_prebuild: it builds its groups now)."""
    store.set(plan_key(name), json.dumps(plan))


def refuse(store: dist.Store, name: str, why: str) -> None:
    """Rank 0: joiner `name` does not enter (its fate GONE, even where rank 0 had claimed it)."""
    store.set(refusal_key(name), why)
    store.set(fate_key(name), GONE)


def is_refused(store: dist.Store, name: str) -> bool:
    return store.check([refusal_key(name)])


def mark_job_done(store: dist.Store) -> None:
    store.set(JOB_DONE_KEY, "1")


def wait_admission(store: dist.Store, name: str, on_plan: Callable[[dict], None] | None = None) -> Admission:
    """Block until rank 0 admits joiner `name`; NotAdmitted when it refuses it or the job ends first (it marked
    itself done, or its store, served from the launcher's process, went away). `on_plan`: called once with the plan
    rank 0 posts at the start of the step before the boundary."""
    key, refused, planned = admission_key(name), refusal_key(name), plan_key(name)
    while True:
        try:
            if on_plan is not None and store.check([planned]):
                on_plan(json.loads(store.get(planned)))
                on_plan = None
            if store.check([key]):
                return Admission(**json.loads(store.get(key)))
            if store.check([refused]):
                raise NotAdmitted(store.get(refused).decode())
            if store.check([JOB_DONE_KEY]):
                raise NotAdmitted("the job finished before a step boundary admitted this process")
        except (RuntimeError, dist.DistStoreError) as err:  # the store's server (the launcher) is gone: the job ended
            why = str(err).splitlines()[0] if str(err) else type(err).__name__  # torch appends its C++ stack
            raise NotAdmitted(f"the job ended before a step boundary admitted this process ({why})") from err
        time.sleep(POLL_S)
