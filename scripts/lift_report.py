"""How much the RL stage of a run lifts greedy eval accuracy over where it starts after the supervised warm-up.

    python scripts/lift_report.py                      # runs `python -m rlhf_dyna` (the default recipe), times it
    python scripts/lift_report.py --runs DIR [DIR...]  # summarises finished run dirs (wall time from file times)

Writes docs/bench/grpo_tiny_lift.json (or --out): per run the overrides, eval accuracy per step, pre-warm-up / step-0
/ final accuracy, the RL lift (final - step 0), wall time, the median seconds of each timed phase of the RL steps and
the load average seen.
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
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def summarise(run_dir: Path, wall_s: float | None, how: str) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    pre = next((r["pre_warmup/accuracy"] for r in rows if "pre_warmup/accuracy" in r), None)
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = [line[2:].strip() for line in overrides_file.read_text().splitlines() if line.startswith("- ")] \
        if overrides_file.exists() else []
    if wall_s is None:  # from the run dir's first file to the last metrics line
        wall_s = (run_dir / "metrics.jsonl").stat().st_mtime - (run_dir / ".hydra").stat().st_mtime
    start, last = min(evals), max(evals)
    phases = sorted({k for r in rows for k in r if k.startswith("timing_s/") and "step" in r and k != "timing_s/eval"})
    timings = {k: round(statistics.median(r[k] for r in rows if k in r), 4) for k in phases}
    return {"run_dir": run_dir.name, "overrides": overrides, "pre_warmup_accuracy": pre,
            "accuracy_after_warmup": evals[start], "final_step": last, "final_accuracy": evals[last],
            "rl_lift": round(evals[last] - evals[start], 4), "best_accuracy": max(evals.values()),
            "wall_s": round(wall_s, 1), "wall_from": how, "median_timing_s": timings,
            "eval_accuracy": {str(k): round(v, 4) for k, v in sorted(evals.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="*", type=Path, default=[])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "grpo_tiny_lift.json")
    parser.add_argument("--note", default="", help="free text stored with the figures (how the runs ended, load)")
    parser.add_argument("extra", nargs="*", help="key=value overrides for the run this script starts")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    runs = []
    if args.runs:
        runs = [summarise(d, None, "file times") for d in args.runs]
    else:
        with tempfile.TemporaryDirectory(prefix="lift_") as tmp:
            run_dir = Path(tmp) / "default"
            start = time.time()
            cmd = [sys.executable, "-m", "rlhf_dyna", f"hydra.run.dir={run_dir}", *args.extra]
            subprocess.run(cmd, cwd=ROOT, check=True, timeout=3000)
            runs = [summarise(run_dir, time.time() - start, "measured around `python -m rlhf_dyna`")]
    data = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}: {os.cpu_count()} CPUs",
            "load_average_start_end": [round(load_start, 1), round(os.getloadavg()[0], 1)],
            "command": " ".join(["python scripts/lift_report.py", *sys.argv[1:]]), "note": args.note, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for r in runs:
        print(f"{r['run_dir']}: {r['accuracy_after_warmup']:.3f} after the warm-up -> {r['final_accuracy']:.3f} at "
              f"step {r['final_step']} (RL lift {r['rl_lift']:+.3f}), {r['wall_s']:.0f} s wall ({r['wall_from']})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
