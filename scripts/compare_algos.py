"""Compare advantage estimators on the default task: one `python -m rlhf_dyna` run per estimator, same recipe and
seeds (so the same warm-up, prompts and eval set), greedy eval accuracy per step read from each run's
metrics.jsonl. Writes a markdown table to stdout and docs/bench/compare_algos.{json,png}.

    python scripts/compare_algos.py                      # every estimator at the recipe's steps (about 4 min each)
    python scripts/compare_algos.py --steps 40 --eval-every 10 --estimators grpo rloo   # a short look
    python scripts/compare_algos.py --replot             # the PNG and table again from the committed JSON

gae runs as algorithm=ppo (it needs the critic); every other estimator runs on the recipe's GRPO settings with
only algorithm.adv_estimator changed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae")


def overrides_for(estimator: str) -> list[str]:
    if estimator == "gae":
        return ["algorithm=ppo"]
    return [f"algorithm.adv_estimator={estimator}"]


def run_one(estimator: str, args, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "rlhf_dyna", f"recipe={args.recipe}", f"hydra.run.dir={run_dir}",
           "tracking.wandb_mode=disabled", "tracking.transition_trace=false", "trainer.save_last=false",
           "trainer.export_policy=false", f"trainer.seed={args.seed}", *overrides_for(estimator), *args.extra]
    if args.steps is not None:
        cmd.append(f"trainer.total_steps={args.steps}")
    if args.eval_every is not None:
        cmd.append(f"task.eval_every={args.eval_every}")
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"{estimator}: `{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    return {"overrides": overrides_for(estimator) + list(args.extra), "wall_s": round(wall, 1),
            "eval_accuracy": {str(k): round(v, 4) for k, v in sorted(evals.items())},
            "train_reward_last_20": round(sum(rewards[-20:]) / max(len(rewards[-20:]), 1), 4)}


def table(results: dict) -> str:
    steps = sorted({int(s) for r in results.values() for s in r["eval_accuracy"]})
    head = "| estimator | " + " | ".join(f"step {s}" for s in steps) + " | RL lift | wall s |"
    lines = [head, "|" + "---|" * (len(steps) + 3)]
    for name, r in results.items():
        acc = r["eval_accuracy"]
        cells = [f"{acc[str(s)]:.3f}" if str(s) in acc else "" for s in steps]
        lift = acc[str(steps[-1])] - acc[str(steps[0])] if str(steps[-1]) in acc and str(steps[0]) in acc else float("nan")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {lift:+.3f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(results: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        steps = [int(s) for s in r["eval_accuracy"]]
        ax.plot(steps, list(r["eval_accuracy"].values()), marker="o", markersize=3, label=name)
    ax.set_xlabel("RL step (0 = after the supervised warm-up)")
    ax.set_ylabel("greedy eval accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    parser.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the recipe's)")
    parser.add_argument("--eval-every", type=int, default=None, help="steps between evals (default: the recipe's)")
    parser.add_argument("--recipe", default="grpo_tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=1500, help="seconds per run")
    parser.add_argument("--out", type=Path, default=OUT / "compare_algos.json")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG and table from --out")
    parser.add_argument("extra", nargs="*", help="more key=value overrides for every run")
    args = parser.parse_args()
    if args.replot:
        data = json.loads(args.out.read_text())
    else:
        results = {}
        with tempfile.TemporaryDirectory(prefix="compare_algos_") as tmp:
            for estimator in args.estimators:
                print(f"compare_algos: {estimator} ...", flush=True)
                results[estimator] = run_one(estimator, args, Path(tmp) / estimator)
        data = {
            "what": "greedy eval accuracy per RL step, one run per advantage estimator, same recipe and seeds",
            "recipe": args.recipe, "seed": args.seed, "steps": args.steps, "extra_overrides": args.extra,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.node()}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
            "command": " ".join(["python scripts/compare_algos.py", *sys.argv[1:]]),
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    plot(data["results"], args.out.with_suffix(".png"), f"{data['recipe']}: eval accuracy per estimator ({data['date']})")
    print(table(data["results"]))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
