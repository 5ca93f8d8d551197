"""Pipeline step time against dp-only at the same size: the real app, recipe grpo_tiny_pp, on 4 local ranks, once in
pp2 x dp2 (1F1B) and once in dp4 (parallel.train.pp=1), same seed. Records the per-phase seconds of the steps after
the first (which compiles / warms up) and the bubble fraction the schedule predicts; writes a JSON.

    python scripts/bench_pp_step.py --steps 5 --out docs/bench/bench_pp_step.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("timing_s/step", "timing_s/gen", "timing_s/prepare", "timing_s/train_actor", "timing_s/weight_sync")
LAYOUTS = {"pp2_dp2": ["parallel.train.pp=2"], "dp4": ["parallel.train.pp=1"]}


def run(layout: str, steps: int, work: Path) -> dict:
    run_dir = work / layout
    args = [sys.executable, "-m", "rlhf_dyna", "recipe=grpo_tiny_pp", *LAYOUTS[layout], f"trainer.total_steps={steps}",
            "trainer.sft_warmup_steps=0", "task.eval_every=1000", "task.eval_size=16", "tracking.wandb_mode=disabled",
            f"hydra.run.dir={run_dir}"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{layout} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][2:]  # steps 2..N
    out = {phase: statistics.median(r[phase] for r in rows) for phase in PHASES}
    out["pp/bubble_fraction"] = rows[-1].get("pp/bubble_fraction", 0.0)
    out["steps_measured"] = len(rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="docs/bench/bench_pp_step.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        results = {layout: run(layout, args.steps, Path(work)) for layout in LAYOUTS}
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    report = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpus=os.cpu_count(), load_average_after=load,
                  recipe="grpo_tiny_pp (3-layer tiny Llama, 256 rows per step, micro_batch_size 16, rollout.tp 2)",
                  layouts=results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    for layout, r in results.items():
        print(f"{layout}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if k != "steps_measured"))


if __name__ == "__main__":
    main()
