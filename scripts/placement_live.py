"""Measure live placements in the loop: runs the app with each placement given (same seed and workload) and writes
what each placement change cost, the background build and wait, and the step's phases, per step, into a JSON.

    python scripts/placement_live.py --placements colocate lend --out docs/bench/placement_live.json -- \
        recipe=ppo_tiny parallel.world_size=4 trainer.total_steps=5 task.prompts_per_step=32 rollout.n=4

A placement may carry its own overrides after its name, in one quoted word, e.g.
`"split placement.rebalance=true placement.rollout_ranks=3"`; its rebalancing moves are summarised under "moves".
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

KEPT = ("placement/", "timing_s/", "reshard/", "rebalance/")
QUIET = ["tracking.wandb_mode=disabled", "trainer.save_last=false", "trainer.export_policy=false"]


def run(placement: str, overrides: list[str], run_dir: Path) -> list[dict]:
    name, *own = placement.split()
    cmd = [sys.executable, "-m", "rlhf_dyna", *overrides, *QUIET, f"placement={name}", *own, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"placement={placement} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(rows: list[dict]) -> dict:
    """Per RL step: the kept metrics; and over the steps after the first (which also builds the lent engines and
    plans each move once): mean step, mean share of the step the placement changes cost, worst single change."""
    steps = [{k: v for k, v in r.items() if k == "step" or k.startswith(KEPT)} for r in rows if r["step"] > 0]
    later = steps[1:] or steps
    changes = sorted({k[: -len("/seconds")] for r in later for k in r if k.startswith("reshard/")
                      and k.endswith("/seconds") and k.count("/") == 3 and "/rebalance/" not in k})  # every step's
    out = {"steps": steps, "mean_step_s": sum(r["timing_s/step"] for r in later) / len(later)}
    if changes:
        out["changes"] = changes
        out["mean_change_share"] = sum(r["placement/change_share"] for r in later) / len(later)
        out["worst_single_change_share"] = max(r[f"{c}/seconds"] / r["timing_s/step"] for r in later for c in changes)
        out["build_s"] = max(r.get("placement/build_seconds", 0.0) for r in steps)  # logged by steps that switch
        out["max_wait_s"] = max(r.get("placement/wait_seconds", 0.0) for r in steps)
    moves = [r for r in steps if r.get("rebalance/moved")]
    if moves:
        by_step = {r["step"]: r for r in steps}
        total = sum(r["timing_s/step"] + r.get("rebalance/lost_seconds", 0.0) for r in steps)
        out["moves"] = []
        for r in moves:  # a move's cost is logged in the step it served, the one after it
            served = by_step[r["step"] + 1]
            out["moves"].append({
                "after_step": r["step"], "from_rollout_ranks": r["rebalance/from_rollout_ranks"],
                "to_rollout_ranks": r["rebalance/rollout_ranks"],
                "predicted_gain_s_per_step": r["rebalance/predicted_gain_s"],
                "predicted_cost_s": r["rebalance/predicted_cost_s"],
                "transition_s": served["rebalance/transition_seconds"],
                "lost_s": served["rebalance/lost_seconds"],
                "parts_s": {k: v for k, v in served.items() if (k.startswith("rebalance/") or "/rebalance/" in k)
                            and k.endswith("seconds") and k not in ("rebalance/transition_seconds",
                                                                     "rebalance/lost_seconds")},
                "served_step_s": served["timing_s/step"],
                "share_of_its_step": served["rebalance/transition_share"],
                "amortized_share_of_run": served["rebalance/lost_seconds"] / total,
            })
        gains = [r["rebalance/measured_gain_s"] for r in steps if "rebalance/measured_gain_s" in r]
        # the last step's rebalance/measured_gain_s: mean step on the split left last minus on the current one, the
        # first step of each stay on a split left out (Rebalancer.measured_gain); the move's own seconds not in it
        out["measured_gain_s"] = gains[-1] if gains else None
        out["rollout_ranks_after_step"] = [r["rebalance/rollout_ranks"] for r in steps]  # each step's decision made
    return out


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--placements", nargs="+", default=["colocate", "lend"])
    parser.add_argument("--out", type=Path, default=Path("docs/bench/placement_live.json"))
    parser.add_argument("overrides", nargs="*", help="app overrides after --")
    args = parser.parse_args()
    result = {"date": datetime.date.today().isoformat(), "machine": f"{platform.node()} ({platform.processor() or 'cpu'})",
              "started_utc": utc_now(), "load_average_at_start": os.getloadavg(), "overrides": args.overrides,
              "placements": {}}
    with tempfile.TemporaryDirectory(prefix="placement_live_") as tmp:
        for i, placement in enumerate(args.placements):  # run dirs by index: a placement may carry overrides
            result["placements"][placement] = summary(run(placement, args.overrides, Path(tmp) / f"run{i}"))
    result.update(ended_utc=utc_now(), load_average_at_end=os.getloadavg())  # 1, 5, 15 min: how shared the machine was
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for placement, s in result["placements"].items():
        line = f"{placement}: step {s['mean_step_s']:.3f} s"
        if "changes" in s:
            line += (f", changes {100 * s['mean_change_share']:.1f}% of the step (worst single change "
                     f"{100 * s['worst_single_change_share']:.1f}%), build {s['build_s']:.3f} s, wait {s['max_wait_s']:.4f} s")
        for m in s.get("moves", []):
            line += (f"\n  rebalance after step {m['after_step']}: {m['from_rollout_ranks']:.0f} -> "
                     f"{m['to_rollout_ranks']:.0f} rollout ranks, predicted "
                     f"{m['predicted_gain_s_per_step']:.3f} s/step for {m['predicted_cost_s']:.3f} s; took "
                     f"{m['transition_s']:.3f} s, the step it served lost {m['lost_s']:.3f} s "
                     f"({100 * m['share_of_its_step']:.1f}% of that step, {100 * m['amortized_share_of_run']:.2f}% of the run); measured gain "
                     f"{s['measured_gain_s']}")
        print(line)


if __name__ == "__main__":
    main()
