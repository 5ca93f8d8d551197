"""Two settings of rlhf_dyna on bench_peer's shapes, runs interleaved (A, B, A, B, ...) in one invocation.

Each run is bench_peer's rlhf_dyna run (`recipe=grpo_file` on 2 local ranks, the shape's checkpoint, prompts and
sizes) with the A or the B overrides added; a run's phase times are the medians of its steps after the first, and
each pair's ratio is B / A. Prints the pairs and writes the JSON, with the load average after every run.

    python scripts/bench_ab.py --shape real --precision fp32 --pairs 2 \
        --a parallel.shm_collectives=false --b parallel.shm_collectives=true --out docs/bench/shm_collectives.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_peer import SHAPES, dyna_run  # scripts/ is on the path when run as a script

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("step", "generate", "train", "weight_sync")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="real")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--a", nargs="+", required=True, help="overrides of run A")
    parser.add_argument("--b", nargs="+", required=True, help="overrides of run B")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = make_tiny_checkpoint(work / "ckpt", **shape["checkpoint"])
        for pair in range(args.pairs):
            runs = {side: dyna_run(ckpt, shape, args.precision, args.steps, work / f"{side}{pair}", overrides)
                    for side, overrides in (("a", args.a), ("b", args.b))}
            pairs.append({**runs, **{f"{p}_ratio": runs["b"][f"{p}_s"] / runs["a"][f"{p}_s"] for p in PHASES}})
            print(f"pair {pair}: " + ", ".join(
                f"{p} {runs['a'][f'{p}_s']:.2f} -> {runs['b'][f'{p}_s']:.2f} s ({pairs[-1][f'{p}_ratio']:.2f}x)"
                for p in PHASES), flush=True)
    report = {"date": start, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cpus",
              "commit": commit.strip(), "command": " ".join(sys.argv), "shape": args.shape, **shape,
              "precision": args.precision, "a": args.a, "b": args.b, "pairs": pairs,
              **{f"{p}_ratio_median": statistics.median(x[f"{p}_ratio"] for x in pairs) for p in PHASES}}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(" | ".join(f"{p} B/A {report[f'{p}_ratio_median']:.2f}x" for p in PHASES) + f"  -> {args.out}")


if __name__ == "__main__":
    main()
