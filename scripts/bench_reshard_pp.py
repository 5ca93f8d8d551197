"""Resharding benchmark, pipeline and expert-parallel rows, with full AdamW state, on 4 gloo ranks:
  dp4_to_pp2dp2   dense Llama sizes: dp4 (FSDP2, ZeRO-3) -> pp2 x dp2 (pipeline stages, FSDP2 inside each);
  dp4_to_ep2dp2   Qwen3-MoE sizes (*_moe): dp4 (FSDP2, every expert on every rank) -> ep2 x dp2 (experts over 2 ranks,
                  FSDP2 over the other 2, everything else FSDP2 over all 4: train.expert_parallel).
VPS in place (what `relayout` does online) against a DCP checkpoint with a restart (save, then fresh processes: init,
build the destination engine, load), and the bytes VPS moved against an independent count (torch's own DTensor
placements: `baselines.must_receive_train`).

    python scripts/bench_reshard_pp.py --sizes tiny,60m,tiny_moe,60m_moe --out bench_out   # bench_out/bench_reshard_pp.json
    python scripts/bench_reshard_pp.py --quick --out /tmp/bench_pp           # tiny and tiny_moe only

A separate script (not a row inside bench_reshard.py) while that one is being restructured; it reuses its model
sizes, random sources and fingerprints.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import bench_reshard
from bench_report import run_stamp
from bench_reshard import SIZES, count_params, fingerprint, free_port, moe_spec, random_source
from rlhf_dyna.models.build import ModelSpec, make_hf_config
from rlhf_dyna.models.meta_init import meta_policy
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.pipeline_engine import make_engine
from bench import baselines
from bench.ranks import init_rank, launch
from rlhf_dyna.transition.relayout import (MeshCache, allocate_optimizer_state, bind_train_state,
                                           empty_engine_like, meta_skeleton, relayout)
from rlhf_dyna.transition.vps_mover import make_vps_mover

WORLD = 4
PP_LAYOUT, EP_LAYOUT = ParallelLayout(dp=2, tp=1, pp=2), ParallelLayout(dp=4, tp=1, ep=2)
REPEATS = 3  # warm runs (cached plan) after the cold one


MOE_SIZES: dict[str, ModelSpec] = {  # every layer sparse, 8 experts (4 per EP rank), top-2
    "tiny_moe": moe_spec(128, 2, 4, 2, experts=8, top_k=2, moe_inter=128, vocab=1024, inter=128),  # 1.1M
    "60m_moe": moe_spec(512, 6, 8, 4, experts=8, top_k=2, moe_inter=384, inter=384),  # 66M
}
ALL_SIZES = {**SIZES, **MOE_SIZES}


def row_of(size: str) -> tuple[str, ParallelLayout]:
    """The transition a size is measured on: MoE sizes switch to expert parallel, dense ones to pipeline stages."""
    return ("dp4_to_ep2dp2", EP_LAYOUT) if size in MOE_SIZES else ("dp4_to_pp2dp2", PP_LAYOUT)


def skeleton(size: str):
    return meta_policy(make_hf_config(ALL_SIZES[size]), torch.float32)


def make_source(size: str, meshes: MeshCache) -> TrainEngine:
    """dp=world FSDP2 engine with random weights and AdamW state (same values every time), shard by shard."""
    return random_source(ALL_SIZES[size], meshes, adamw_state=True)


def _total(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def rank_main(rank: int, world: int, port: int, sizes: list[str], out: str) -> None:
    """Each of `sizes` measured in turn by this world's ranks (ranks_file and ckpt_dir under `out` name the files)."""
    init_rank(rank, world, port)
    meshes = MeshCache()
    for size in sizes:
        measure_ranks(rank, world, size, meshes, Path(out))
    dist.destroy_process_group()


def measure_ranks(rank: int, world: int, size: str, meshes: MeshCache, out: Path) -> None:
    """`size`'s move by VPS and its DCP save on this rank; rank 0 writes every rank's report to ranks_file."""
    _, layout = row_of(size)
    ckpt = ckpt_dir(out, size)
    source_engine = make_source(size, meshes)
    source = bind_train_state(source_engine)
    probe = empty_engine_like(source_engine, layout, meshes.get(layout),
                              meta_skeleton(source_engine.model))
    probe.model.to_empty(device=probe.device)
    allocate_optimizer_state(probe, torch.tensor(0.0))
    must = _total(baselines.must_receive_train(source, bind_train_state(probe)))  # independent of the VPS planner
    del probe
    save_seconds = baselines.checkpoint_save(source_engine, ckpt)
    del source_engine, source
    seconds, moved, prints = [], [], None
    for _ in range(1 + REPEATS):  # a fresh source each run: relayout consumes it
        engine = make_source(size, meshes)
        dist.barrier()
        start = time.perf_counter()
        new, stats = relayout(engine, layout, mover=make_vps_mover(engine.model.config, in_place=True), meshes=meshes)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
        moved.append(_total(stats.bytes_received))
        prints = fingerprint(bind_train_state(new))
        del engine, new
    report = dict(rank=rank, vps_seconds=seconds, vps_bytes=moved, must_receive=must, save_seconds=save_seconds,
                  fingerprint=prints)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        ranks_file(out, size).write_text(json.dumps(gathered))


def restart_worker(size: str, ckpt: str, out: str) -> None:
    """A fresh process of the restarted job: init, build the destination engine, load the dp4 checkpoint into it."""
    _, layout = row_of(size)
    bench_reshard.restart_load(lambda: make_engine(skeleton(size), MeshCache().get(layout), lr=1e-4), ckpt, out)


def time_restart(size: str, ckpt: str, work: Path) -> tuple[float, list[list[float]]]:
    return bench_reshard.time_restart(size, ckpt, work, script=__file__, tag="restart_pp")


def ckpt_dir(out: Path, size: str) -> Path:
    return out / f"ckpt_pp_{size}"


def ranks_file(out: Path, size: str) -> Path:
    return out / f"ranks_pp_{size}.json"


def measure(size: str, out: Path) -> dict:
    """The row of `size` from its ranks' report (rank_main ran) and the restart from its DCP checkpoint."""
    ckpt, result = ckpt_dir(out, size), ranks_file(out, size)
    ranks = json.loads(result.read_text())
    result.unlink()
    restart_seconds, restart_prints = time_restart(size, str(ckpt), out)
    shutil.rmtree(ckpt, ignore_errors=True)
    warm = statistics.median(ranks[0]["vps_seconds"][1:])
    dcp = max(r["save_seconds"] for r in ranks) + restart_seconds
    transition, _ = row_of(size)
    row = dict(size=size, params=count_params(ALL_SIZES[size]), transition=transition, state="params + AdamW exp_avg, exp_avg_sq",
               vps_cold_seconds=ranks[0]["vps_seconds"][0], vps_seconds=warm, vps_bytes_moved=ranks[0]["vps_bytes"][-1],
               independent_bytes=ranks[0]["must_receive"], dcp_save_seconds=max(r["save_seconds"] for r in ranks),
               dcp_restart_seconds=restart_seconds, dcp_with_restart_seconds=dcp, speedup=dcp / warm,
               correct=all(r["fingerprint"] == p for r, p in zip(ranks, restart_prints)))
    print(f"[{size}] {transition}: vps {warm:.3f} s (cold {row['vps_cold_seconds']:.3f} s), {row['vps_bytes_moved'] / 2**20:.1f} "
          f"MiB moved (independent count {row['independent_bytes'] / 2**20:.1f} MiB); DCP with restart {dcp:.2f} s "
          f"(save {row['dcp_save_seconds']:.2f} s): {row['speedup']:.1f}x; same values: {row['correct']}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="tiny,60m,tiny_moe,60m_moe", help=f"comma-separated, from {sorted(ALL_SIZES)}")
    parser.add_argument("--quick", action="store_true", help="tiny models only (tiny, tiny_moe)")
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--restart-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restart_worker:
        return restart_worker(args.sizes, args.ckpt, args.out)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed.tensor", "transformers", "bench.baselines"])
    started = run_stamp("start")
    sizes = ["tiny", "tiny_moe"] if args.quick else args.sizes.split(",")
    rows = []
    for group in [sizes] if args.quick else [[s] for s in sizes]:  # fresh ranks per size (--quick's tiny ones: one launch)
        port = free_port()
        launch(rank_main, (WORLD, port, group, str(out)), WORLD, port)
        rows += [measure(size, out) for size in group]
    machine = dict(date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count(), world=WORLD, backend="gloo", **started,
                   **run_stamp("end"))
    (out / "bench_reshard_pp.json").write_text(json.dumps(dict(machine=machine, rows=rows), indent=1))


if __name__ == "__main__":
    main()
