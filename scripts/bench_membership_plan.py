"""Cold planning time of membership changes at cluster scale, as scripts/bench_plan.py times a weight sync: the actor's
state (bf16 parameters, fp32 master weights, AdamW moments) from the old world into the new one, on one CPU core.

The new world comes from rlhf_dyna.elastic.membership (colocate, the recipe's layout, the same global batch), so the
specs are those the dry run plans: a node leaving last or in the middle, a node joining, a single rank leaving
(127 ranks: tp 8 no longer divides, so tp drops to 1) for Llama-3-70B; a node of Qwen3-235B-A22B.

    python scripts/bench_membership_plan.py --out docs/bench/bench_membership_plan.json
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: no threaded numpy kernels
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench_plan import cold_plan  # noqa: E402  (scripts/ is on the path when run as a script)

from rlhf_dyna.elastic.membership import GlobalBatch, WorldChange, world_after  # noqa: E402
from rlhf_dyna.elastic.placement import ACTOR, ROLLOUT  # noqa: E402
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement  # noqa: E402
from rlhf_dyna.parallel_layout import ParallelLayout  # noqa: E402

NODE = 8
BATCH = GlobalBatch(prompts=127 * 240, rows=127 * 240 * 8)  # splits over every world below
TP8 = ParallelLayout(tp=8)
CASES = {  # name: (model, world, training layout, change, target CPU s)
    "llama3_70b last node leaves": ("llama3_70b", 128, TP8, WorldChange(128, tuple(range(120, 128))), 1.0),
    "llama3_70b middle node leaves": ("llama3_70b", 128, TP8, WorldChange(128, tuple(range(56, 64))), 1.0),
    "llama3_70b node joins": ("llama3_70b", 120, TP8, WorldChange(120, (), NODE), 1.0),
    "llama3_70b middle rank leaves": ("llama3_70b", 128, TP8, WorldChange(128, (61,)), 1.0),
    "qwen3_235b_a22b middle node leaves": ("qwen3_235b_a22b", 128, ParallelLayout(tp=4, ep=8),
                                           WorldChange(128, tuple(range(56, 64))), 2.0),
}


def actor_move(world: int, layout: ParallelLayout, change: WorldChange):
    layout = ParallelLayout(layout.dp, layout.tp, ep=layout.ep, master_weights=True)
    req = PolicyRequest("colocate", world, (ACTOR, ROLLOUT), layout, rollout_tp=8)
    (move,) = world_after(make_placement(req), req.train, 8, BATCH, change).moves
    return move


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the figures as JSON to this file")
    args = parser.parse_args()
    load_start, cases = os.getloadavg(), {}
    for name, (model, world, layout, change, target) in CASES.items():
        move = actor_move(world, layout, change)
        cold_plan(model, move.src, move.dst)  # warm the interpreter and the catalog only
        times, info = [], {}
        for _ in range(args.repeat):
            t, info = cold_plan(model, move.src, move.dst)
            times.append(t)
        best = min(times)
        print(f"{name:<36} {move.src.describe()} -> {move.dst.describe()}")
        print(f"{'':<36} cold planning best {best:.3f} CPU s (runs: {', '.join(f'{t:.3f}' for t in times)}), "
              f"target < {target} s: {'met' if best < target else 'MISSED'}; {info}")
        cases[name] = dict(change=change.describe(), src=move.src.describe(), dst=move.dst.describe(), cpu_s_runs=times,
                           best_cpu_s=best, target_s=target, **info)
    if args.out:
        report = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=f"{os.cpu_count()} CPU cores",
                      load_average_start=load_start, load_average_end=os.getloadavg(), cases=cases)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
