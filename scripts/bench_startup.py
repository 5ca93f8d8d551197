"""The ranks' heavy imports (rlhf_dyna.job.RANK_PRELOAD: the loop, vLLM, the CPU worker), each in a fresh interpreter,
with Python's cyclic garbage collector on (the default) and paused (launch/fork.imports_without_gc, what the launcher
and every rank do), alternating; prints the median seconds of each and their ratio.

    python scripts/bench_startup.py --pairs 5 --out docs/bench/startup_gc.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

from rlhf_dyna.job import QUIET_ENV, RANK_PRELOAD

PROGRAM = """
import gc, time
paused = {paused}
if paused:
    gc.disable()
start = time.perf_counter()
import torch
for name in {modules!r}:
    __import__(name.partition(":")[0])
print(time.perf_counter() - start)
"""


def timed_import(paused: bool) -> float:
    """Seconds a fresh interpreter takes to import torch and RANK_PRELOAD."""
    code = PROGRAM.format(paused=paused, modules=list(RANK_PRELOAD))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, **QUIET_ENV})
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    timed_import(True)  # warms the page cache for both
    runs: dict[str, list[float]] = {"gc_on": [], "gc_paused": []}
    for i in range(args.pairs):
        for paused in (False, True) if i % 2 == 0 else (True, False):
            runs["gc_paused" if paused else "gc_on"].append(timed_import(paused))
    medians = {k: statistics.median(v) for k, v in runs.items()}
    ratio = medians["gc_paused"] / medians["gc_on"]
    print(f"imports, gc on: {medians['gc_on']:.2f} s; gc paused: {medians['gc_paused']:.2f} s; ratio {ratio:.2f}x "
          f"(medians of {args.pairs})")
    if args.out:
        args.out.write_text(json.dumps({
            "what": "torch + rlhf_dyna.job.RANK_PRELOAD imported in a fresh interpreter, cyclic GC on vs paused",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "runs_s": runs, "median_s": medians, "ratio": ratio}, indent=2) + "\n")


if __name__ == "__main__":
    main()
