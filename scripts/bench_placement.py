"""Placement benchmark: each phase of the same PPO and GRPO workloads timed on rank sets of 1, 2 and 4 ranks
(colocate runs with parallel.world_size=1, 2, 4, one at a time, read from metrics.jsonl), fitted per phase
(serial + parallel / n), then the simulation of colocate / split / lend for ppo_tiny scaled to 8 GPUs and
grpo_70b on 128 GPUs, with transition times from the VPS cost model. Writes docs/bench/bench_placement.json
and docs/bench/bench_placement.png.

    python scripts/bench_placement.py --algos ppo     # measure (about 10 min on 2 cores) and simulate
    python scripts/bench_placement.py --simulate-only # re-simulate from the committed JSON's measurements
    python scripts/bench_placement.py --reward-model  # PPO with a reward model under each placement, live on 4 ranks:
                                                      # scoring (timing_s/reward_model) and its moves; kept beside
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.doc_tables import placement_table
from rlhf_dyna.elastic.placement import ACTOR, CRITIC, ROLLOUT
from rlhf_dyna.elastic.policies import PolicyRequest
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.elastic.simulate import PhaseModel, Workload, fit_phase, predict_policies, transition_seconds
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.models.hf_config import hf_config_from_fields
from rlhf_dyna.vps.cost import Cluster

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench"
# a llama of ~56M parameters (head_dim 64 for vLLM's CPU attention)
MODEL = dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
             intermediate_size=2048)
RECIPES = {"ppo": "ppo_tiny", "grpo": "grpo_tiny"}
PHASE_KEYS = {"generate": "timing_s/gen", "prepare": "timing_s/prepare", "train_actor": "timing_s/train_actor",
              "train_critic": "timing_s/train_critic", "weight_sync": "timing_s/weight_sync", "step": "timing_s/step"}
# grpo_70b: Llama-3-70B vs the bench model, per-step tokens of the recipe vs the bench's; an H100 vs one CPU rank
GPU_SPEEDUP = 2000.0  # ~400 TFLOP/s achieved bf16 on an H100 vs ~0.2 TFLOP/s fp32 on one CPU core


def measure(algo: str, world: int, steps: int, prompts: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench_placement_") as tmp:
        args = [sys.executable, "-m", "rlhf_dyna", f"recipe={RECIPES[algo]}", f"parallel.world_size={world}",
                *(f"model.{k}={v}" for k, v in MODEL.items()), f"trainer.total_steps={steps}",
                "trainer.sft_warmup_steps=0", "task.eval_every=100000", "task.eval_size=16",
                f"task.prompts_per_step={prompts}", "tracking.wandb_mode=disabled", "tracking.console=off",
                "tracking.transition_trace=false", f"hydra.run.dir={tmp}"]
        t0 = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1500, cwd=ROOT)
        if proc.returncode:
            raise SystemExit(f"{algo} on {world} ranks failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        rows = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing_s/step" in r][1:]  # the first step warms vLLM and the optimizer up
    out = {name: statistics.median(r[key] for r in rows) for name, key in PHASE_KEYS.items() if key in rows[0]}
    out["wall_s"] = time.perf_counter() - t0
    return out


# a reward model beside PPO's actor and critic, live on 4 ranks: where it sits changes what its phase and moves cost
RM_MODEL = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                intermediate_size=1024)
RM_PLACEMENTS = {
    "colocate": [],
    "colocate, offloaded": ["reward_model.offload=true"],
    "lend": ["placement=lend"],
    "lend, own set [2,3]": ["placement=lend", "+placement.roles.reward_model=[2,2]"],
    "lend, own set, offloaded": ["placement=lend", "+placement.roles.reward_model=[2,2]", "reward_model.offload=true"],
    "split": ["placement=split", "placement.max_staleness=0"],
}


def measure_reward_model(steps: int, prompts: int) -> dict:
    """Each RM placement's median step, scoring and reward-model move seconds (the first step warms up)."""
    from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint, make_tiny_reward_model

    out: dict = {"model": RM_MODEL, "world_size": 4, "steps": steps, "prompts_per_step": prompts, "placements": {}}
    with tempfile.TemporaryDirectory(prefix="bench_rm_") as tmp:
        sizes = dict(hidden_size=RM_MODEL["hidden_size"], intermediate_size=RM_MODEL["intermediate_size"],
                     num_hidden_layers=RM_MODEL["num_hidden_layers"], num_attention_heads=RM_MODEL["num_attention_heads"],
                     num_key_value_heads=RM_MODEL["num_key_value_heads"])
        policy, rm = make_tiny_checkpoint(Path(tmp) / "policy", **sizes), make_tiny_reward_model(Path(tmp) / "rm", **sizes)
        for name, extra in RM_PLACEMENTS.items():
            run_dir = Path(tmp) / re.sub(r"\W+", "_", name)  # Hydra reads brackets and commas in a value
            args = [sys.executable, "-m", "rlhf_dyna", "recipe=ppo_rm_tiny", f"model.path={policy}",
                    f"reward_model.path={rm}", "parallel.world_size=4", f"trainer.total_steps={steps}",
                    f"task.prompts_per_step={prompts}", "task.eval_every=100000", "tracking.wandb_mode=disabled",
                    "tracking.console=off", "tracking.transition_trace=false", *extra, f"hydra.run.dir={run_dir}"]
            proc = subprocess.run(args, capture_output=True, text=True, timeout=1500, cwd=ROOT)
            if proc.returncode:
                raise SystemExit(f"reward model, {name}, failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][2:]
            moves = [k for k in rows[0] if k.startswith("reshard/reward_model/") and k.endswith("/seconds")]
            out["placements"][name] = {
                "step_s": statistics.median(r["timing_s/step"] for r in rows),
                "reward_model_s": statistics.median(r["timing_s/reward_model"] for r in rows),
                "moves_s": statistics.median(sum(r[k] for k in moves) for r in rows),
                "moved_bytes": statistics.median(sum(r[k.replace("/seconds", "/bytes_moved")] for k in moves)
                                                 for r in rows)}
            print(f"reward model, {name}: {out['placements'][name]}", flush=True)
    return out


def workload(name: str, per_n: dict[int, dict[str, float]], scale: float = 1.0) -> Workload:
    def fit(phase: str) -> PhaseModel:
        if phase not in per_n[min(per_n)]:
            return PhaseModel(0.0, 0.0)
        m = fit_phase({n: t[phase] for n, t in per_n.items()})
        return PhaseModel(m.serial_s * scale, m.parallel_s * scale)
    return Workload(name, fit("generate"), fit("prepare"), fit("train_actor"), fit("train_critic"))


def bench_catalog():
    hf = hf_config_from_fields("llama", 32, MODEL["hidden_size"], MODEL["intermediate_size"],
                               MODEL["num_hidden_layers"], MODEL["num_attention_heads"], MODEL["num_key_value_heads"],
                               None, False, 0, 0, 0)
    return catalog_from_config(hf, param_dtype="float32")


def llama70b_catalog():
    hf = hf_config_from_fields("llama", 128256, 8192, 28672, 80, 64, 8, None, False, 0, 0, 0)
    return catalog_from_config(hf, param_dtype="bfloat16")


def simulate(measured: dict) -> dict:
    per = {algo: {int(n): t for n, t in runs.items()} for algo, runs in measured.items() if not algo.startswith("_")}
    tiny = workload("ppo (bench model) on 8 GPUs", per["ppo"])
    cluster8 = Cluster(1, 8, 360.0, 25.0)
    base8 = PolicyRequest("colocate", 8, (ACTOR, CRITIC, ROLLOUT), ParallelLayout(master_weights=False))
    cat = bench_catalog()
    ppo8 = predict_policies(tiny, base8, lambda r: transition_seconds(r, cat, cluster8))
    # grpo_70b: the measured GRPO phase models times (params x tokens ratio) / GPU speedup
    bench_params = sum(math.prod(t.shape) for t in cat.tensors)
    big = llama70b_catalog()
    tokens_ratio = (16 * 8 * 2048) / (measured_prompts(measured) * 8 * 6)  # prompts x n x new tokens per step
    scale = (sum(math.prod(t.shape) for t in big.tensors) / bench_params) * tokens_ratio / GPU_SPEEDUP
    grpo = workload("grpo_70b on 128 GPUs", per.get("grpo", per["ppo"]), scale)  # train_critic unused by GRPO
    grpo = Workload(grpo.name, grpo.generate, grpo.prepare, grpo.train_actor)
    cluster128 = Cluster(16, 8, 360.0, 25.0)
    base128 = PolicyRequest("colocate", 128, (ACTOR, ROLLOUT), ParallelLayout(tp=8, master_weights=True), rollout_tp=8)
    grpo128 = predict_policies(grpo, base128, lambda r: transition_seconds(r, big, cluster128))
    return {"ppo_tiny_8gpu": [pred_row(p) for p in ppo8], "grpo_70b_128gpu": [pred_row(p) for p in grpo128],
            "grpo_70b_scale": scale, "gpu_speedup": GPU_SPEEDUP}


def measured_prompts(measured: dict) -> int:
    return int(measured.get("_prompts_per_step", 16))


def pred_row(p) -> dict:
    return dict(policy=p.policy + (f" (staleness {p.staleness})" if p.policy == "split" else ""),
                step_s=round(p.step_s, 6), transition_s=round(p.transition_s, 6), sets=p.sets,
                phases_s={k: round(v, 6) for k, v in p.phases_s.items()})


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("measured", None), ("ppo_tiny_8gpu", "ppo (bench model), 8 GPUs"), ("grpo_70b_128gpu", "grpo_70b, 128 GPUs")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    phases = ("generate", "prepare", "train_actor", "train_critic")
    for ax, (key, title) in zip(axes, panels):
        if key == "measured":
            labels, rows = [], []
            for algo, runs in result["measured"].items():
                if algo.startswith("_"):
                    continue
                for n, t in sorted(runs.items(), key=lambda kv: int(kv[0])):
                    labels.append(f"{algo} n={n}")
                    rows.append([t.get(p, 0.0) for p in phases] + [t.get("weight_sync", 0.0)])
            title, bars = "measured per phase (colocate, this machine)", phases + ("weight_sync",)
        else:
            labels = [r["policy"] for r in result["simulation"][key]]
            rows = [[r["phases_s"][p] for p in phases] + [r["transition_s"]] for r in result["simulation"][key]]
            bars = phases + ("transitions",)
        bottom = [0.0] * len(rows)
        for i, name in enumerate(bars):
            vals = [r[i] for r in rows]
            ax.bar(labels, vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if key != "measured":  # the predicted step: phases that overlap (split staleness 1, lend) count once
            ax.scatter(labels, [r["step_s"] for r in result["simulation"][key]], color="black", marker="_", s=900,
                       label="predicted step", zorder=3)
            ax.legend(fontsize="small")
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel("seconds (phases stacked; overlap not shown)")
        ax.tick_params(axis="x", rotation=30, labelsize="small")
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--algos", default="ppo,grpo", help="ppo alone: GRPO's phases are taken from PPO's runs")
    ap.add_argument("--simulate-only", action="store_true")
    ap.add_argument("--merge", action="store_true", help="re-measure --ranks into the existing JSON, keep the rest")
    ap.add_argument("--reward-model", action="store_true", help="only (re-)measure the reward model's placements")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "bench_placement.json"
    if args.reward_model:
        result = json.loads(path.read_text())
        result["reward_model"] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                  **measure_reward_model(max(args.steps, 4), max(args.prompts, 8))}
        path.write_text(json.dumps(result, indent=2))
        print(placement_table(result))
        return
    if args.simulate_only:
        result = json.loads(path.read_text())
    else:
        old = json.loads(path.read_text())["measured"] if args.merge else {}
        measured: dict = {**old, "_prompts_per_step": args.prompts}
        for algo in args.algos.split(","):
            measured.setdefault(algo, {})
            for n in map(int, args.ranks.split(",")):
                measured[algo][str(n)] = measure(algo, n, args.steps, args.prompts)
                print(f"{algo} n={n}: {measured[algo][str(n)]}", flush=True)
        result = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      machine=f"{platform.node()} ({platform.processor() or platform.machine()}, 2 CPU cores shared)",
                      model=dict(MODEL, params=sum(math.prod(t.shape) for t in bench_catalog().tensors)), measured=measured)
    result["simulation"] = simulate(result["measured"])
    path.write_text(json.dumps(result, indent=2))
    plot(result, OUT / "bench_placement.png")
    for key in ("ppo_tiny_8gpu", "grpo_70b_128gpu"):
        print(key)
        for r in result["simulation"][key]:
            print(f"  {r['policy']:<22} step {r['step_s']:.4f} s  transitions {r['transition_s']:.4f} s  {r['sets']}")
    print(placement_table(result))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
