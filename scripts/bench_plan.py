"""Cold VPS planning time on one CPU core: layouts + plan + schedule, training -> rollout layout.

Reported: CPU seconds of this (single-threaded) process, so that other load on a shared machine
does not count; wall seconds beside them.

    python scripts/bench_plan.py            # both settings of the issue, best of 3 cold runs each
    python scripts/bench_plan.py --out docs/bench/bench_plan.json   # and the figures as JSON (date, machine, load)
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: no threaded numpy kernels
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from rlhf_dyna.models.catalog_presets import preset_catalog  # noqa: E402
from rlhf_dyna.vps.layout import build_layout  # noqa: E402
from rlhf_dyna.vps.plan import build_plan  # noqa: E402
from rlhf_dyna.vps.schedule import build_schedule  # noqa: E402
from rlhf_dyna.vps.spec import ParallelSpec, Phase  # noqa: E402

CASES = {
    # 1024 ranks: train PP 8 x FSDP 32 x TP 4, EP 8 -> 64 vLLM engines of (vllm_dp 2 x TP 8) with EP 16.
    "qwen3_235b_a22b@1024": ("qwen3_235b_a22b", ParallelSpec(pp=8, dp=32, tp=4, ep=8, zero=3),
                             ParallelSpec(Phase.ROLLOUT, dp=64, vllm_dp=2, tp=8, ep=16), 1.0),
    # 128 ranks: train FSDP 16 x TP 8 -> 16 vLLM engines of TP 8.
    "llama3_70b@128": ("llama3_70b", ParallelSpec(dp=16, tp=8, zero=3),
                       ParallelSpec(Phase.ROLLOUT, dp=16, tp=8), 0.3),
}


def cold_plan(model: str, src: ParallelSpec, dst: ParallelSpec) -> tuple[float, dict]:
    catalog = preset_catalog(model)
    start, cpu = time.perf_counter(), time.process_time()
    plan = build_plan(build_layout(catalog, src), build_layout(catalog, dst), ranks_per_node=8)
    schedule = build_schedule(plan, 4 << 30)
    return time.process_time() - cpu, dict(wall_s=round(time.perf_counter() - start, 3),classes=len(plan.classes), rounds=schedule.num_rounds,
                         moved_GB=plan.moved_bytes / 1e9, min_GB=plan.min_bytes / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the figures as JSON to this file")
    args = parser.parse_args()
    load_start, cases = os.getloadavg(), {}
    cold_plan("llama3_8b", ParallelSpec(dp=2), ParallelSpec(Phase.ROLLOUT, tp=2))  # warm the interpreter only
    for name, (model, src, dst, target) in CASES.items():
        times, info = [], {}
        for _ in range(args.repeat):
            t, info = cold_plan(model, src, dst)
            times.append(t)
        best = min(times)
        print(f"{name:<22} {src.describe()} -> {dst.describe()}")
        print(f"{'':<22} cold planning best {best:.3f} CPU s (runs: {', '.join(f'{t:.3f}' for t in times)}), "
              f"target < {target} s: {'met' if best < target else 'MISSED'}; {info}")
        cases[name] = dict(src=src.describe(), dst=dst.describe(), cpu_s_runs=times, best_cpu_s=best, target_s=target, **info)
    if args.out:
        report = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=f"{os.cpu_count()} CPU cores",
                      load_average_start=load_start, load_average_end=os.getloadavg(), cases=cases)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
