"""How a rank blocked in a gloo collective gets out when a peer is lost (torch 2.13, CPU): real processes, a real kill.

Three ranks form a gloo world; rank 2 is killed with SIGKILL; rank 0 then waits in an all-reduce of a group of ranks 0
and 1, where rank 1 is alive but does not join it (as a survivor busy recovering would not): a rank waiting on a live
peer gets no "Connection closed by peer" from the dead one. A watchdog thread in rank 0 tries one way out
after 1 s, and the probe records whether the all-reduce returned and how long it took:

- `abort`: the default group's `abort()` (ProcessGroup::abort -> each backend's; gloo's Backend::abort is a no-op);
- `shutdown`: the default group's `shutdown()` (likewise a no-op for gloo);
- `sockets`: rlhf_dyna.launch.sockets.shut_connections (shutdown(2) of the process's TCP connections, the store's
  kept): the pending operation fails with gloo's connection error.
- `none`: nothing, to show the all-reduce waits (until the 8 s group timeout set here; torch's default is 30 min).

    python scripts/probe_gloo_abort.py            # prints one JSON line per way
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from datetime import timedelta

WAYS = ("none", "abort", "shutdown", "sockets")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, way: str, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from rlhf_dyna.launch.sockets import shut_connections

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=3, timeout=timedelta(seconds=8))
    dist.all_reduce(torch.ones(1))  # every pair connected and used once
    pair = dist.new_group([0, 1])
    if rank < 2:
        dist.all_reduce(torch.ones(1), group=pair)
    out.put(("ready", rank, os.getpid()))
    if rank == 2:
        time.sleep(60)  # killed by the parent
        return
    time.sleep(1.0)  # rank 2 is dead by now
    if rank == 1:
        time.sleep(20)  # alive, but not in rank 0's all-reduce
        return

    def watchdog() -> None:
        time.sleep(1.0)
        pg = pair
        try:
            if way == "abort":
                pg.abort()
            elif way == "shutdown":
                pg.shutdown()
            elif way == "sockets":
                out.put(("shut", way, shut_connections({port})))
        except Exception as err:  # noqa: BLE001 - the probe records what each way does
            out.put(("watchdog_error", way, f"{type(err).__name__}: {err}"))

    threading.Thread(target=watchdog, daemon=True).start()
    start = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1), group=pair)
        result = "returned"
    except Exception as err:  # noqa: BLE001
        result = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    out.put(("result", way, {"seconds": round(time.perf_counter() - start, 2), "outcome": result}))
    out.close()
    out.join_thread()  # the queue's feeder thread flushes before the hard exit
    os._exit(0)


def probe(way: str) -> dict:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, way, out)) for r in range(3)]
    for p in procs:
        p.start()
    pids = {}
    while len(pids) < 3:
        kind, rank, pid = out.get(timeout=120)
        pids[rank] = pid
    os.kill(pids[2], signal.SIGKILL)
    record = {"way": way}
    deadline = time.monotonic() + 40
    while "outcome" not in record and time.monotonic() < deadline:
        try:
            kind, _, value = out.get(timeout=1)
        except Exception:  # noqa: BLE001 - queue.Empty
            continue
        if kind == "result":
            record.update(value)
        else:
            record[kind] = value
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    record.setdefault("outcome", "no result in 40 s (hung)")
    return record


if __name__ == "__main__":
    for way in WAYS:
        print(json.dumps(probe(way)), flush=True)
