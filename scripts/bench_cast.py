"""The fp32 -> bf16 cast a train -> vLLM sync does while packing, alone: one process, then `--procs` at once.

A sync from fp32 training shards into a bf16 engine casts every source element once (scripts/bench_reshard.py's
train_to_vllm rows: each of 4 ranks casts its 1/4 shard). The floor (wire + repack) leaves that cast out; this
measures what it costs on the machine, from DRAM (caches evicted before each cast), with one rank casting and with
every rank casting at once as in the sync. JSON to --out.

    python scripts/bench_cast.py --elements 78500000 --procs 4 --out docs/bench/runs/bench_cast_300m.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from pathlib import Path

import torch

from bench_report import machine

REPEATS = 5


def cast_seconds(elements: int, start: multiprocessing.Barrier, out: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)
    src, dst = torch.randn(elements), torch.empty(elements, dtype=torch.bfloat16)
    evict = torch.zeros(64 << 20)  # 256 MiB touched between casts: the shard is read from DRAM, as in the sync
    dst.copy_(src)
    samples = []
    for _ in range(REPEATS):
        evict.add_(1)
        start.wait()
        begin = time.perf_counter()
        dst.copy_(src)
        samples.append(time.perf_counter() - begin)
    out.put(samples)


def run(elements: int, procs: int) -> list[list[float]]:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=cast_seconds, args=(elements, start, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    samples = [out.get() for _ in workers]
    for w in workers:
        w.join()
        if w.exitcode:
            raise RuntimeError(f"a cast worker exited with code {w.exitcode}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=78_500_000, help="fp32 elements per process (a rank's shard)")
    parser.add_argument("--procs", type=int, default=4, help="processes casting at once (the sync's ranks)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.elements < 1 or args.procs < 1:
        parser.error("--elements and --procs must be at least 1")
    alone = run(args.elements, 1)
    together = run(args.elements, args.procs)
    median_alone = statistics.median(alone[0])
    median_together = statistics.median(s for per_proc in together for s in per_proc)
    print(f"cast of {args.elements:,} fp32 elements -> bf16: alone {median_alone:.3f} s, {args.procs} at once "
          f"{median_together:.3f} s each ({median_together / median_alone:.2f}x), medians of {REPEATS}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(
        elements=args.elements, procs=args.procs, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        machine=machine(), load_average=os.getloadavg(), alone_seconds=alone[0], together_seconds=together,
        median_alone=median_alone, median_together=median_together), indent=1))


if __name__ == "__main__":
    main()
