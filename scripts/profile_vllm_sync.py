"""Where a VPS sync into the real CPU vLLM engine spends its time, next to its floor (wire + repack), 4 gloo ranks.

The same setup as bench_reshard.py's train_to_vllm row (FSDP2 dp4 fp32 random weights -> in-rank vLLM tp2 x dp2
bf16 from dummy weights). After a cold sync and a warm-up, every rank runs `--repeats` warm syncs, each right after
its floor probes (the plan's pair matrix replayed, vLLM's install from local memory), and prints `VpsSync.phases`
(seconds per step of the sync, summed over its layer groups: execute split into copy work and waiting) as each
phase's max over the ranks (one line's phases may come from different ranks) and for every rank. `--fresh-staging`
alternates pooled runs with runs whose vLLM staging is allocated fresh every group, as before the staging pool;
`--pack-order` with runs that send each message as soon as it is packed instead of packing a round's messages first;
`--relay` with runs that send to every vLLM replica directly instead of relaying through one;
`--memory-probe` with runs inside bench.measure.PeakExtraMemory, by its sampling thread and by the kernel's
high-water mark (what the bench's timed runs carry).
With `--cprofile`, rank 0 also profiles one more sync and prints the functions with the most cumulative time. JSON:
every run, to --out.

    PYTHONPATH=$PWD python scripts/profile_vllm_sync.py --size 300m --fresh-staging --repeats 4 --out DIR/profile.json
    PYTHONPATH=$PWD python scripts/profile_vllm_sync.py --size 300m --pack-order --repeats 4 --out DIR/profile.json
    PYTHONPATH=$PWD python scripts/profile_vllm_sync.py --size 300m --memory-probe --repeats 5 --out DIR/profile.json
    PYTHONPATH=$PWD python scripts/profile_vllm_sync.py --size 60m --cprofile
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import shutil
import statistics
import time
from pathlib import Path

import torch.distributed as dist

from bench.measure import PeakExtraMemory, pattern_seconds
from bench.ranks import init_rank, launch
from bench.vllm_rows import PROMPTS, capture_staged, dummy_rollout, repack_seconds
from bench_report import machine
from bench_reshard import ROLLOUT_TP, SIZES, WORLD, free_port, random_source
from rlhf_dyna.transition.relayout import MeshCache
from rlhf_dyna.transition.tensor_pool import TensorPool
from rlhf_dyna.transition.vps_sync import VpsSync


class FreshStagingPool(TensorPool):
    """Staging as before the pool: every take allocates, nothing given back is kept."""

    def give(self, tensors) -> None:
        pass


def max_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Per key, the largest value over the ranks (collective): the keys' maxima may come from different ranks."""
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    return {k: max(g[k] for g in gathered) for k in values}


def rank_main(rank: int, port: int, size: str, repeats: int, budget_bytes: int | None, variants: list[str], cprofile: bool,
              out: str) -> None:
    init_rank(rank, WORLD, port)
    engine = random_source(SIZES[size], MeshCache(), adamw_state=False)
    model_dir = Path(f"{out}.model")
    rollout = dummy_rollout(engine, model_dir, ROLLOUT_TP)
    budget = {} if budget_bytes is None else {"budget_bytes": budget_bytes}
    syncs = {"pooled": VpsSync(**budget), "fresh_staging": VpsSync(**budget, pool=FreshStagingPool()),
             "interleaved": VpsSync(**budget, pack_first=False), "direct": VpsSync(**budget, relay=False)}
    syncs["rss_sampled"] = syncs["rss_high_water"] = syncs["pooled"]  # the same sync, inside a memory probe
    probes = {"rss_sampled": dict(sampling=True), "rss_high_water": {}}
    for variant in variants:
        syncs[variant].sync(engine, rollout)  # cold: planning
    vps = syncs["pooled"]
    captured = capture_staged(vps, engine, rollout)
    repack_seconds(captured, engine, rollout, vps.budget_bytes)  # warm-up
    pairs = {variant: syncs[variant].pair_bytes() for variant in variants}  # a relay's two stages, summed
    runs = []
    for i in range(repeats * len(variants)):  # variants alternate, each run right after its own floor probes
        variant = variants[i % len(variants)]
        repack = repack_seconds(captured, engine, rollout, vps.budget_bytes)
        wire = pattern_seconds(pairs[variant])
        dist.barrier()
        sync = syncs[variant]
        if variant in probes:
            with PeakExtraMemory(**probes[variant]):
                stats = sync.sync(engine, rollout)
        else:
            stats = sync.sync(engine, rollout)
        phases = dict(sync.phases, execute_copy=sync.last.copy_seconds, execute_wait=sync.last.wait_seconds)
        by_rank: list[object] = [None] * WORLD
        dist.all_gather_object(by_rank, phases)
        run = max_over_ranks(dict(seconds=stats.seconds, **{f"phase/{k}": v for k, v in phases.items()}))
        runs.append(dict(variant=variant, wire=wire, repack=repack, ratio=run["seconds"] / (wire + repack), **run,
                         by_rank=by_rank))
        if rank == 0:
            print(f"[{size} {variant}] wire {wire:.3f} + repack {repack:.3f} = {wire + repack:.3f} s; vps "
                  f"{run['seconds']:.3f} s ({runs[-1]['ratio']:.2f}x)\n    per-phase max over ranks: "
                  + ", ".join(f"{k[6:]} {v:.3f}" for k, v in run.items() if k.startswith("phase/")), flush=True)
            for r, phases in enumerate(by_rank):
                print(f"    rank {r}: " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items() if k.startswith("execute")
                                                 or k.startswith("group_")), flush=True)
    if rank == 0:
        for variant in variants:
            ratios = [r["ratio"] for r in runs if r["variant"] == variant]
            print(f"[{size} {variant}] x floor (paired): median {statistics.median(ratios):.2f}, runs "
                  + ", ".join(f"{x:.2f}" for x in ratios), flush=True)
    profile_text = ""
    if cprofile:
        profiler = cProfile.Profile()
        dist.barrier()
        if rank == 0:
            profiler.enable()
        vps.sync(engine, rollout)
        if rank == 0:
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(45)
            profile_text = text.getvalue()
            print(profile_text, flush=True)
    tokens = [s[0].token_ids for s in rollout.generate(PROMPTS[rollout.dp_rank::rollout.dp_size], temperature=0.0,
                                                       max_tokens=4)]
    if rank == 0:
        Path(out).write_text(json.dumps(dict(size=size, budget_bytes=vps.budget_bytes, date=time.strftime(
            "%Y-%m-%d %H:%M UTC", time.gmtime()), machine=machine(), load_average=os.getloadavg(), runs=runs,
            tokens=tokens, cprofile=profile_text), indent=1))
    rollout.shutdown()
    if rank == 0:
        shutil.rmtree(model_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="60m", choices=sorted(SIZES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget-mib", type=int, default=None, help="VpsSync's budget (default: its own)")
    parser.add_argument("--fresh-staging", action="store_true", help="A/B: alternate runs whose vLLM staging is "
                        "allocated fresh every group (as before the staging pool) with pooled runs")
    parser.add_argument("--pack-order", action="store_true", help="A/B: alternate runs that send each message as "
                        "soon as it is packed (VpsSync(pack_first=False)) with pooled runs (all packed, then sent)")
    parser.add_argument("--memory-probe", action="store_true", help="A/B: alternate bare runs with runs inside "
                        "PeakExtraMemory, sampled by a thread every 2 ms and read from the kernel's high-water mark")
    parser.add_argument("--relay", action="store_true", help="A/B: alternate runs sent directly to every vLLM replica "
                        "(VpsSync(relay=False)) with runs relayed through one replica (the default)")
    parser.add_argument("--cprofile", action="store_true", help="rank 0 profiles one more sync with cProfile")
    parser.add_argument("--out", default="/tmp/profile_vllm_sync.json")
    args = parser.parse_args()
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed.tensor", "transformers"])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    port = free_port()
    budget = None if args.budget_mib is None else args.budget_mib << 20
    variants = ["pooled"] + (["fresh_staging"] if args.fresh_staging else []) + (["interleaved"] if args.pack_order else [])
    variants += ["rss_sampled", "rss_high_water"] if args.memory_probe else []
    variants += ["direct"] if args.relay else []
    launch(rank_main, (port, args.size, args.repeats, budget, variants, args.cprofile, args.out), WORLD, port)


if __name__ == "__main__":
    main()
