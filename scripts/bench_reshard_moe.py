"""MoE train -> rollout benchmark: a Qwen3-MoE (random fp32 weights, FSDP2 dp4, every expert sharded over dp) into a
real in-rank vLLM engine (CPU, tp4, bf16), `naive` (rollout.sync=naive: every full tensor gathered on every rank,
loaded by name) against `vps` (rollout.sync=vps) side by side, 4 gloo ranks, vLLM's install (the CPU repack)
included, greedy tokens checked after every sync (bench/vllm_rows.py: vps must give naive's tokens, both must differ
from the dummy weights'). Targets: `train_to_vllm_moe` (vLLM TP slices every expert) and `train_to_vllm_moe_ep`
(vLLM's expert parallelism: each rank holds whole experts).

Floor of a run (as bench_reshard.py's real-vLLM row): the VPS plan's own pair matrix replayed right before it, plus
vLLM's install of the rank's shard from local memory. Bytes: what each rollout rank receives over the wire (vps: the
plan; naive: full tensors less the shard it trains) and the expert bytes it ends up holding, against an independent
count from the live vLLM engine (its MoE layers' expert maps and per-partition widths).

    python scripts/bench_reshard_moe.py --sizes moe100m --out bench_out   # then copy bench_out/bench_reshard_moe.json
    python scripts/bench_reshard_moe.py --quick --out /tmp/bench_moe      # moe1m, a few minutes
    python scripts/docs_tables.py   # then the table in docs/bench/moe.md
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench.doc_tables import moe_table
from bench.ranks import init_rank, launch
from bench.vllm_rows import whole_plan, bench_to_vllm
from bench_report import machine, replace_table, run_stamp, summarize
from bench_reshard import count_params, free_port, moe_spec, random_source
from rlhf_dyna.models.build import ModelSpec
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.transition.bind_vllm import vllm_model
from rlhf_dyna.transition.relayout import MeshCache
from rlhf_dyna.rollout.vllm_moe_cpu import owns_w13
from rlhf_dyna.vps.model import EXPERT_ROLES, ModelCatalog
from rlhf_dyna.vps.plan import Plan

WORLD = 4
ROLLOUT_TP = 4  # vLLM 0.32's CPU MoE layers cannot run DP replicas (checks.moe): one TP group over the world
REPEATS = 3
TARGETS = {"train_to_vllm_moe": False, "train_to_vllm_moe_ep": True}  # name -> vLLM's enable_expert_parallel
BEGIN, END = "<!-- bench_reshard_moe:begin -->", "<!-- bench_reshard_moe:end -->"


SIZES: dict[str, ModelSpec] = {  # moe_intermediate_size / 4 a multiple of 32: vLLM's CPU kernel (checks.moe)
    # bench_reshard_pp.py's tiny_moe but for the (unused: every layer sparse) dense width, 4 x hidden here
    "moe1m": moe_spec(128, 2, 4, 2, experts=8, top_k=2, moe_inter=128, vocab=1024),  # 1.1M
    "moe100m": moe_spec(512, 8, 8, 4, experts=32, top_k=4, moe_inter=256, vocab=32000),  # 140M, 72% of it experts
}


def live_expert_share(rollout: VLLMRollout) -> dict:
    """Independent of VPS: which experts this rank's vLLM MoE layers hold (their expert map; None: all of them) and
    their per-partition width, read from the live engine; bytes = experts x 3 x width x hidden x itemsize per layer."""
    layers = [m for m in vllm_model(rollout).modules() if owns_w13(m)]
    config = layers[0].moe_config
    expert_map = layers[0].expert_map
    held = list(range(config.num_experts)) if expert_map is None else torch.nonzero(expert_map >= 0).flatten().tolist()
    itemsize = torch.empty((), dtype=rollout.llm.llm_engine.model_config.dtype).element_size()
    per_layer = len(held) * 3 * config.intermediate_size_per_partition * config.hidden_dim * itemsize
    return dict(experts=held, width=config.intermediate_size_per_partition, expert_bytes=per_layer * len(layers))


def planned_expert_share(plan: Plan, catalog: ModelCatalog) -> tuple[list[float], list[float]]:
    """The plan's expert bytes (its tensors of an expert role in `catalog`) landing on each rank: over the wire, and
    by local copy from the shard it trains."""
    experts = Plan(plan.src, plan.dst, plan.world_size, plan.ranks_per_node,
                   [c for c in plan.classes if catalog[c.members[0].tensor.name].role in EXPERT_ROLES])
    return experts.pair_bytes().sum(axis=0).tolist(), experts.local_bytes_by_rank().tolist()


def rank_main(rank: int, world: int, port: int, size: str, target: str, out: str) -> None:
    init_rank(rank, world, port)
    engine = random_source(SIZES[size], MeshCache(), adamw_state=False)
    records, floor, rollout = bench_to_vllm(engine, Path(f"{out}.model"), ROLLOUT_TP, REPEATS, TARGETS[target])
    for record in records:
        record["transition"] = target
    wire, local = planned_expert_share(whole_plan(engine, rollout, floor["budget_bytes"]).schedule.plan,
                                       catalog_from_config(engine.model.config))
    report = dict(rank=rank, records=records, floor={target: floor}, live_share=live_expert_share(rollout),
                  planned_expert_wire=wire, planned_expert_local=local)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    rollout.shutdown()  # destroys the default process group itself
    if rank == 0:
        shutil.rmtree(f"{out}.model", ignore_errors=True)


def measure(size: str, target: str, out: Path) -> list[dict]:
    """One target in fresh ranks: rows (bench_report.summarize) plus the bytes and shares each rollout rank got."""
    result, port = out / f"ranks_moe_{size}_{target}.json", free_port()
    launch(rank_main, (WORLD, port, size, target, str(result)), WORLD, port)
    per_rank = json.loads(result.read_text())
    result.unlink()
    rows = summarize(size, per_rank, None)
    floor = next(r for r in rows if r["method"] == "floor")
    received = per_rank[0]["floor"][target]["received_by_rank"]
    live = [r["live_share"] for r in per_rank]
    planned = [w + l for w, l in zip(per_rank[0]["planned_expert_wire"], per_rank[0]["planned_expert_local"])]
    naive = next(r for r in rows if r["method"] == "naive")
    floor.update(expert_parallel=TARGETS[target], vps_received_by_rank=received,
                 naive_received_per_rank=naive["bytes_moved"] / WORLD,  # every rank gathers all but its own shard
                 experts_by_rank=[s["experts"] for s in live], expert_width_by_rank=[s["width"] for s in live],
                 live_expert_bytes_by_rank=[s["expert_bytes"] for s in live], planned_expert_bytes_by_rank=planned,
                 planned_expert_wire_by_rank=per_rank[0]["planned_expert_wire"],
                 share_matches_live=planned == [float(s["expert_bytes"]) for s in live])
    for row in rows:
        row["correct"] = row["correct"] and floor["share_matches_live"]
    vps = next(r for r in rows if r["method"] == "vps")
    print(f"[{size}] {target}: vps {vps['seconds']:.3f} s ({vps['x_floor']:.2f}x floor {floor['seconds']:.3f} s = wire "
          f"{floor['wire_seconds']:.3f} + repack {floor['repack_seconds']:.3f}), naive {naive['seconds']:.3f} s: "
          f"{naive['seconds'] / vps['seconds']:.1f}x; MiB per rollout rank: vps {max(received) / 2**20:.1f}, naive "
          f"{floor['naive_received_per_rank'] / 2**20:.1f}; experts per rank {[len(e) for e in floor['experts_by_rank']]} "
          f"(as the live engine: {floor['share_matches_live']}); tokens checked: {all(r['correct'] for r in rows)}",
          flush=True)
    return rows


def write_readme(report_path: Path, readme: Path) -> None:
    replace_table(readme, BEGIN, END, moe_table(json.loads(report_path.read_text())))
    print(f"{readme}: table regenerated from {report_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="moe100m", help=f"comma-separated, from {sorted(SIZES)}")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated subset of {sorted(TARGETS)}")
    parser.add_argument("--quick", action="store_true", help="tiny MoE only (moe1m)")
    parser.add_argument("--out", default="bench_out", help="directory for bench_reshard_moe.json")
    parser.add_argument("--report", type=Path, help="a bench_reshard_moe.json to print (or put into --readme); runs nothing")
    parser.add_argument("--readme", type=Path, help=f"with --report: replace the text between {BEGIN} and {END}")
    args = parser.parse_args()
    if args.report:
        return write_readme(args.report, args.readme) if args.readme else print(moe_table(json.loads(args.report.read_text())))
    sizes, targets = ["moe1m"] if args.quick else args.sizes.split(","), args.targets.split(",")
    bad = [s for s in sizes if s not in SIZES] + [t for t in targets if t not in TARGETS]
    if bad:
        parser.error(f"unknown {bad}; sizes: {sorted(SIZES)}, targets: {sorted(TARGETS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed.tensor", "transformers", "vllm"])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    started = run_stamp("start")
    rows = [row for size in sizes for target in targets for row in measure(size, target, out)]
    report = dict(world=WORLD, rollout_tp=ROLLOUT_TP, rollout_dtype="bfloat16", source="FSDP2 dp4, fp32, random weights",
                  params={s: count_params(SIZES[s]) for s in sizes}, specs={s: vars(SIZES[s]) for s in sizes},
                  targets=targets, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=machine(),
                  **started, **run_stamp("end"),
                  floor="per vps run: the plan's pair matrix replayed right before it (one contiguous message per pair) "
                        "+ vLLM's install (repack) of the rank's shard from local memory", rows=rows)
    (out / "bench_reshard_moe.json").write_text(json.dumps(report, indent=1))
    print(moe_table(report))
    print(f"wrote {out / 'bench_reshard_moe.json'}")


if __name__ == "__main__":
    main()
