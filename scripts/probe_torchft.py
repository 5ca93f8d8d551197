"""Does torchft 0.2.0 run with torch 2.13 (CPU) and gloo? Two probes with local processes, one of them killed.

Needs a venv of its own (torchft is no dependency of rlhf_dyna; pin torch first so no CUDA build comes):
    python3 -m venv /tmp/torchft-venv && /tmp/torchft-venv/bin/pip install torch==2.13.0 torchft==0.2.0 numpy
    /tmp/torchft-venv/bin/python scripts/probe_torchft.py --out docs/bench/probe_torchft.json

1. Reconfigurable gloo process group (torchft.ProcessGroupGloo): 3 processes all-reduce; rank 2 is SIGKILLed; the
   survivors' next all-reduce fails (how long it takes to say so); they re-configure over a fresh store prefix as a
   world of 2 and all-reduce; a new process joins and the three re-configure as a world of 3, all-reduce, and send a
   tensor point to point from rank 0 to the joiner, by the group's own send / recv and by torch.distributed's
   batch_isend_irecv (what rlhf_dyna's transition executor calls) with the group passed in.
2. Quorum (torchft's Lighthouse): 3 replicas ask for a quorum; replica 2 is SIGKILLed; the survivors' next quorum
   (how long until it forms without it); a new replica joins and the next quorum has 3 members again.
3. torch's own `dist.shrink_group` (no torchft) on a gloo world of 3, excluding rank 2.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

TIMEOUT = timedelta(seconds=10)


def pg_worker(rank: int, port: int, joiner: bool, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import AllreduceOptions, TCPStore
    from torchft import ProcessGroupGloo

    store = TCPStore("localhost", port, is_master=False, wait_for_workers=False, timeout=TIMEOUT)
    pg = ProcessGroupGloo(timeout=TIMEOUT)

    def allreduce(label: str) -> None:
        t, start = torch.ones(4), time.perf_counter()
        try:
            pg.allreduce([t], AllreduceOptions()).wait()
            out.put((rank, label, "ok", float(t[0]), time.perf_counter() - start))
        except Exception as err:  # the failure itself is what the probe records
            out.put((rank, label, f"{type(err).__name__}: {str(err)[:160]}", None, time.perf_counter() - start))

    def configure(label: str, prefix: str, new_rank: int, world: int) -> None:
        start = time.perf_counter()
        pg.configure(f"localhost:{port}/{prefix}", f"replica_{rank}", new_rank, world)
        out.put((rank, label, "configured", world, time.perf_counter() - start))

    if not joiner:
        configure("configure world 3", "q1", rank, 3)
        allreduce("all_reduce world 3")
        store.set(f"q1_done_{rank}", "1")
        if rank == 2:
            store.wait(["killed_soon"])
            time.sleep(60)  # the parent kills this process here
        store.wait(["rank2_killed"])
        allreduce("all_reduce after the kill")
        configure("re-configure world 2", "q2", rank, 2)
        allreduce("all_reduce world 2")
        store.set(f"q2_done_{rank}", "1")
    store.wait(["joiner_started"])
    configure("re-configure world 3 with a joiner", "q3", rank, 3)
    allreduce("all_reduce world 3 with the joiner")
    t = torch.arange(4.0) if rank == 0 else torch.zeros(4)
    start = time.perf_counter()
    if rank == 0:
        pg.send([t], 2, 0).wait()
    elif joiner:
        pg.recv([t], 0, 0).wait()
        out.put((rank, "recv from rank 0 (point to point)", "ok", t.tolist(), time.perf_counter() - start))
    if rank == 0 or joiner:  # the transition executor's call: torch.distributed's batched P2P with group=pg
        start = time.perf_counter()
        try:
            op = dist.P2POp(dist.isend if rank == 0 else dist.irecv, t, 2 if rank == 0 else 0, group=pg)
            for work in dist.batch_isend_irecv([op]):
                work.wait()
            out.put((rank, "dist.batch_isend_irecv(group=pg)", "ok", t.tolist(), time.perf_counter() - start))
        except Exception as err:  # what torch.distributed says about a group it did not create
            out.put((rank, "dist.batch_isend_irecv(group=pg)", f"{type(err).__name__}: {str(err)[:160]}", None,
                     time.perf_counter() - start))
    store.set(f"q3_done_{rank}", "1")
    store.wait(["q3_done_0", "q3_done_1", "q3_done_2"])
    pg.shutdown()


def probe_process_group() -> list:
    from torch.distributed import TCPStore

    ctx = mp.get_context("spawn")
    master = TCPStore("localhost", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=pg_worker, args=(r, master.port, False, out)) for r in range(3)]
    for p in procs:
        p.start()
    master.wait(["q1_done_0", "q1_done_1", "q1_done_2"], timedelta(seconds=120))
    master.set("killed_soon", "1")
    os.kill(procs[2].pid, signal.SIGKILL)
    procs[2].join()
    master.set("rank2_killed", "1")
    master.wait(["q2_done_0", "q2_done_1"], timedelta(seconds=120))
    joiner = ctx.Process(target=pg_worker, args=(2, master.port, True, out))
    joiner.start()
    master.set("joiner_started", "1")
    for p in (procs[0], procs[1], joiner):
        p.join(timeout=120)
    return drain(out)


def quorum_worker(replica: int, addr: str, commands: mp.Queue, out: mp.Queue) -> None:
    import threading

    from torchft._torchft import LighthouseClient

    client = LighthouseClient(addr, connect_timeout=TIMEOUT)
    name = f"replica_{replica}"

    def beat() -> None:  # the lighthouse drops a replica whose heartbeats stop
        while True:
            client.heartbeat(name)
            time.sleep(0.1)

    client.heartbeat(name)  # known to the lighthouse before it says so: a quorum forming without it would not wait
    threading.Thread(target=beat, daemon=True).start()
    out.put((replica, "heartbeating", "ok", None, 0.0))
    while (step := commands.get()) is not None:
        start = time.perf_counter()
        try:
            q = client.quorum(replica_id=name, timeout=timedelta(seconds=10), step=step)
            members = sorted(p.replica_id for p in q.participants)
            out.put((replica, f"quorum {step}", "ok", members, time.perf_counter() - start))
        except Exception as err:  # a quorum that does not form in time is a result too
            out.put((replica, f"quorum {step}", f"{type(err).__name__}: {err}", None, time.perf_counter() - start))


def probe_quorum() -> list:
    from torchft._torchft import LighthouseServer

    ctx = mp.get_context("spawn")
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=500, heartbeat_timeout_ms=1000)
    out: mp.Queue = ctx.Queue()
    commands = {r: ctx.Queue() for r in range(4)}
    procs = {r: ctx.Process(target=quorum_worker, args=(r, lighthouse.address(), commands[r], out)) for r in range(3)}
    for p in procs.values():
        p.start()
    seen = drain(out, until=3)  # all three heartbeating
    # the joiner asks first: once every member of the previous quorum has asked, the lighthouse forms the next one
    # at once from those who asked (a joiner asking later waits for the quorum after it)
    for step, replicas in ((0, (0, 1, 2)), (1, (0, 1)), (2, (3, 0, 1))):
        if step == 1:  # replica 2 dies; the survivors ask at once
            os.kill(procs.pop(2).pid, signal.SIGKILL)
            seen.append(("parent", "SIGKILL replica_2", "sent", None, 0.0))
        if step == 2:  # a new replica comes up and asks with them
            procs[3] = ctx.Process(target=quorum_worker, args=(3, lighthouse.address(), commands[3], out))
            procs[3].start()
            seen += drain(out, until=1)
        for r in replicas:
            commands[r].put(step)
            time.sleep(0.2 if r == 3 else 0.0)
        seen += drain(out, until=len(replicas))
    for r, p in procs.items():
        commands[r].put(None)
        p.join(timeout=60)
    lighthouse.shutdown()
    return seen


def shrink_worker(rank: int, port: int, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    out.put((rank, "gloo supports_shrinking", "read", getattr(backend, "supports_shrinking", None), 0.0))
    if rank < 2:  # the excluded rank does not take part
        start = time.perf_counter()
        try:
            dist.shrink_group([2])
            out.put((rank, "dist.shrink_group([2])", "ok", dist.get_world_size(), time.perf_counter() - start))
        except Exception as err:  # what torch says for gloo
            out.put((rank, "dist.shrink_group([2])", f"{type(err).__name__}: {err}", None, time.perf_counter() - start))
    dist.barrier()
    dist.destroy_process_group()


def probe_shrink() -> list:
    """torch's own dist.shrink_group on a gloo world of 3 (no torchft)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=shrink_worker, args=(r, port, out)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    return drain(out)


def drain(out: mp.Queue, until: int | None = None) -> list:
    got = []
    while until is None or len(got) < until:
        try:
            got.append(out.get(timeout=60 if until else 1))
        except Exception:  # queue.Empty: nothing more
            break
    return got


def main() -> None:
    import torch
    import torchft

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=f"{os.cpu_count()} CPU cores",
                  torch=torch.__version__, torchft=getattr(torchft, "__version__", "0.2.0"))
    probes = (("process_group", probe_process_group), ("quorum", probe_quorum), ("shrink_group", probe_shrink))
    for name, probe in probes:
        rows = probe()
        report[name] = [dict(who=w, what=what, result=res, value=v, seconds=round(s, 3)) for w, what, res, v, s in rows]
        for r in report[name]:
            print(f"{name:<14} {r['who']}  {r['what']:<38} {r['result'][:90]:<90} {r['value']!s:<40} {r['seconds']} s")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
