"""Resharding benchmark: the same live state moved by every method, side by side, on 4 gloo ranks.

Transitions (source: FSDP2 dp=world, ZeRO-3, fp32, random weights; train -> train with full AdamW state):
  train_to_vllm       params -> a real in-rank bf16 vLLM engine (CPU, tp2 x dp2), end to end with its install, greedy
                      tokens checked afterwards (bench/vllm_rows.py); methods naive and vps
  train_to_vllm_like  params -> vLLM-like buffers with no engine behind them (bench/rollout_target.py: the VPS
                      rollout layout's fused qkv_proj / gate_up_proj, tp2 x dp2): the wire part alone
  dp4_to_dp2tp2       params + exp_avg + exp_avg_sq (+ step) -> a TrainEngine on a dp2 x tp2 mesh (tp innermost)
  dp4_to_dp2tp2_searched   the same into the mesh rank order VPS's plan search picks (tp outermost: fewer bytes)
Methods: vps (rlhf_dyna.transition: planner + executor), naive, redistribute, checkpoint (DCP save + load, same processes),
checkpoint_restart (DCP save, then fresh processes: init, build, load). Floor of a run: the VPS plan's own pair
matrix (bytes rank i sends rank j) replayed as one contiguous message per pair right before that run
(bench.measure.pattern_seconds: the same pattern of exchanges, a single pair where one pair is active), plus, into
real vLLM, vLLM's own install of the rank's shard from local memory (the repack). `vps` runs 3 times, each paired
with its floor probe: the table shows the median run, the median floor and the median paired ratio (x floor);
the other methods run once (JSON: every run). Train -> train, vps runs in place as `relayout` does (the old state
is consumed): each run gets a fresh source (rebuilt untimed, same values); shards that stay are adopted, not copied.

    python scripts/bench_reshard.py --sizes 60m,300m --out bench_out
    python scripts/bench_reshard.py --quick --out /tmp/bench      # tiny model, ~2 min
    python scripts/docs_tables.py   # after copying bench_out/bench_reshard.json to docs/bench/: the tables of the docs
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from bench.ranks import init_rank, launch
from bench_report import run_stamp, same_fingerprint, summarize, write_report
from rlhf_dyna.models.build import ModelSpec, make_hf_config
from rlhf_dyna.models.meta_init import meta_policy
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.train.engine import TrainEngine
from bench import baselines
from rlhf_dyna.transition.bind_train import buffer_name
from bench.measure import PeakExtraMemory, copy_bandwidth, p2p_bandwidth, pattern_seconds
from rlhf_dyna.transition.movers import MoveStats, local_of, move_by_full_tensors
from rlhf_dyna.transition.relayout import (MeshCache, allocate_optimizer_state, bind_train_state,
                                           empty_engine_like, meta_skeleton)
from bench.rollout_target import RolloutTarget
from rlhf_dyna.transition.vps_mover import least_moving_layout, make_vps_mover, planned_relayout
from bench.vllm_rows import VLLM_REPEATS, bench_to_vllm
from bench.vps_targets import move_to_rollout_target, rollout_target_plan

# VPS (planner + executor) moves the same state into the same target: `vps_cold` once, planning included, then `vps`
# VPS_REPEATS times with the cached plan, as every transition after a run's first does, each right after its own
# floor probe: on a shared 2-core VM the p2p rate drifts by +-30% within minutes, so the floor of a run is taken
# in the same machine state. The table shows medians (runs, their floors, paired ratios); the JSON every run.
VPS_REPEATS = 3

WORLD = 4
ROLLOUT_TP = 2
DST_LAYOUT = ParallelLayout(dp=2, tp=2, zero=3)
SEARCHED = "dp4_to_dp2tp2_searched"  # the same change in the rank order the VPS plan search picks
VLLM_LIKE = "train_to_vllm_like"
TRANSITIONS = ("train_to_vllm", VLLM_LIKE, "dp4_to_dp2tp2", SEARCHED)  # PP rows append here
SETUP = dict(world=WORLD, rollout_tp=ROLLOUT_TP, dst_layout=DST_LAYOUT.describe())  # recorded in the JSON


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int = 32000) -> ModelSpec:
    return ModelSpec(arch="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048)


def moe_spec(hidden: int, layers: int, heads: int, kv: int, experts: int, top_k: int, moe_inter: int,
             vocab: int = 32000, inter: int | None = None) -> ModelSpec:
    """A Qwen3-MoE, every layer sparse; `inter`: the dense MLP width (unused when every layer is sparse; default 4 x
    hidden). bench_reshard_pp.py and bench_reshard_moe.py size their MoE models with it."""
    return ModelSpec(arch="qwen3_moe", vocab_size=vocab, hidden_size=hidden,
                     intermediate_size=4 * hidden if inter is None else inter, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048, num_experts=experts,
                     num_experts_per_tok=top_k, moe_intermediate_size=moe_inter)


SIZES: dict[str, ModelSpec] = {  # parameter counts, untied 32k-token embeddings included
    "tiny": _llama(128, 256, 2, 4, 2, vocab=1024),  # 0.56M
    "60m": _llama(512, 1536, 8, 8, 4),  # 58M
    "150m": _llama(768, 2048, 16, 12, 4),  # 150M
    "300m": _llama(1024, 2816, 22, 16, 4),  # 313M
    "500m": _llama(1280, 3456, 25, 20, 4),  # 512M
}


def random_source(spec: ModelSpec, meshes: MeshCache, adamw_state: bool) -> TrainEngine:
    """dp=world FSDP2 engine with random weights (and AdamW state), built shard by shard (no full model per rank);
    any arch of `spec` (bench_reshard_moe.py builds Qwen3-MoE sources with it)."""
    skeleton = meta_policy(make_hf_config(spec), torch.float32)
    engine = TrainEngine(skeleton, meshes.get(ParallelLayout(dist.get_world_size(), 1)), lr=1e-4)
    engine.model.to_empty(device=engine.device)
    if adamw_state:
        allocate_optimizer_state(engine, torch.tensor(10.0))
    with torch.no_grad():
        for (name, kind), tensor in sorted(bind_train_state(engine).items()):
            seed = zlib.crc32(f"{name}/{kind}/{dist.get_rank()}".encode())
            local_of(tensor).normal_(generator=torch.Generator().manual_seed(seed))
            if kind == "exp_avg_sq":
                local_of(tensor).abs_()
    return engine


@torch.no_grad()
def fingerprint(tensors: dict[object, Tensor]) -> list[float]:
    """Position-weighted sums per tensor: equal fingerprints <=> same values in the same places (NaN: unfilled)."""
    out = []
    for key in sorted(tensors):
        flat = local_of(tensors[key]).detach().reshape(-1).double()
        weights = torch.arange(flat.numel(), dtype=torch.float64).remainder_(97).add_(1)
        out.append(float(flat.sum()) + float((flat * weights).sum()))
    return out


Probe = Callable[[], float]  # seconds of a run's floor, measured right before it


def _run(method: str, transition: str, fn: Callable[[], MoveStats], dst: dict[object, Tensor], reference: list[float] | None,
         repeats: int = 1, probe: Probe | None = None, setup: Callable[[], list[object]] | None = None) -> dict:
    """`repeats` timed runs, each into a NaN-filled destination and checked against `reference`; with `probe`, each
    run is paired with a floor probe right before it (same machine state). `setup` runs untimed before each run (an
    in-place move: fresh source and destination) and names the destination entries to fill (the others are
    replaced by the move)."""
    seconds, floors, peak, correct = [], [], 0, True
    for _ in range(repeats):
        to_fill = setup() if setup is not None else list(dst)
        with torch.no_grad():
            for key in to_fill:
                local_of(dst[key]).fill_(float("nan"))
        if probe is not None:
            floors.append(probe())
        dist.barrier()
        with PeakExtraMemory() as memory:
            stats = fn()
        dist.barrier()
        got = fingerprint(dst)
        seconds.append(stats.seconds)
        peak = max(peak, memory.peak_extra_bytes, stats.peak_extra_bytes)  # RSS misses reused staging (StagingArena)
        correct = correct and (reference is None or same_fingerprint(got, reference))
    return dict(method=method, transition=transition, seconds=seconds, floors=floors, bytes_received=stats.bytes_received,
                rounds=stats.rounds, peak_extra_bytes=peak, correct=correct, fingerprint=got)


def _vps_records(transition: str, move: Callable[[], MoveStats], dst: dict[object, Tensor], reference: list[float],
                 probe: Probe, setup: Callable[[], list[object]] | None = None) -> list[dict]:
    """`vps_cold` once (planning included), then `vps` VPS_REPEATS times, each after its paired floor probe."""
    return [_run("vps_cold", transition, move, dst, reference, setup=setup),
            _run("vps", transition, move, dst, reference, VPS_REPEATS, probe, setup)]


def _floor(pairs) -> tuple[Probe, dict]:
    """The plan's pair matrix as a probe and as the floor's record: bytes every rank receives."""
    return (lambda: pattern_seconds(pairs)), dict(received_by_rank=[int(x) for x in pairs.sum(axis=0)])


def _vps_in_place_records(transition: str, make_source: Callable[[], TrainEngine], layout: ParallelLayout, mesh,
                          destination: dict[object, Tensor], reference: list[float]) -> tuple[list[dict], dict]:
    """vps as relayout runs it: in place, from a fresh source (same values) into a fresh empty engine, both built
    untimed: shards that stay are adopted (never touched here, as in relayout), the rest freed as soon as sent."""
    held: dict[str, object] = {}  # the next run's source and mover

    def setup() -> list[object]:
        cold = not held
        held.clear()
        destination.clear()
        gc.collect()  # the previous run's engines go before the next ones are built
        source_engine = make_source()
        dst_engine = empty_engine_like(source_engine, layout, mesh, meta_skeleton(source_engine.model))
        allocate_optimizer_state(dst_engine, torch.tensor(0.0))
        held["source"], config = bind_train_state(source_engine), source_engine.model.config
        held["config"] = config
        destination.update(bind_train_state(dst_engine))
        held["mover"] = make_vps_mover(config, in_place=True)
        if cold:  # asking which buffers are adopted would plan before the cold run
            return list(destination)
        adopted, _ = planned_relayout(config, held["source"], destination).in_place
        return [key for key in destination if buffer_name(key) not in adopted]

    cold = _run("vps_cold", transition, lambda: held["mover"](held.pop("source"), destination), destination, reference,
                setup=setup)
    setup()  # untimed: the plan is cached now, its pair matrix is the floor
    probe, floor = _floor(planned_relayout(held["config"], held["source"], destination).schedule.plan.pair_bytes())
    warm = _run("vps", transition, lambda: held["mover"](held.pop("source"), destination), destination, reference,
                VPS_REPEATS, probe, setup)
    return [cold, warm], floor


def _train_destination(source_engine: TrainEngine, layout: ParallelLayout, mesh) -> tuple[TrainEngine, dict]:
    """An empty engine in `layout` with AdamW state, and its bound state."""
    dst_engine = empty_engine_like(source_engine, layout, mesh, meta_skeleton(source_engine.model))
    allocate_optimizer_state(dst_engine, torch.tensor(0.0))
    return dst_engine, bind_train_state(dst_engine)


def bench_to_vllm_like(source_engine: TrainEngine, mesh2d) -> tuple[list[dict], dict]:
    params = {name: t for (name, kind), t in bind_train_state(source_engine).items() if kind == "param"}
    target = RolloutTarget(source_engine.model.config, ROLLOUT_TP, dist.get_rank() % ROLLOUT_TP)
    probe, floor = _floor(rollout_target_plan(source_engine.model.config, params, target).schedule.plan.pair_bytes())
    naive = _run("naive", VLLM_LIKE, lambda: baselines.naive_to_rollout(params, target), target.buffers, None)
    records = [naive, _run("redistribute", VLLM_LIKE, lambda: baselines.redistribute_to_rollout(params, target, mesh2d),
                           target.buffers, naive["fingerprint"])]
    records += _vps_records(VLLM_LIKE, lambda: move_to_rollout_target(source_engine.model.config, params, target),
                            target.buffers, naive["fingerprint"], probe)  # not in place: training keeps its state
    return records, floor


def bench_train_to_train(make_source: Callable[[], TrainEngine], mesh2d, ckpt: str) -> tuple[list[dict], dict, dict]:
    """naive, redistribute and DCP from one source; then vps in place, each run from a fresh copy of it."""
    source_engine = make_source()
    source = bind_train_state(source_engine)
    dst_engine, destination = _train_destination(source_engine, DST_LAYOUT, mesh2d)
    naive = _run("naive", "dp4_to_dp2tp2", lambda: move_by_full_tensors(source, destination), destination, None)
    records = [naive, _run("redistribute", "dp4_to_dp2tp2", lambda: baselines.redistribute_train(source, destination, mesh2d),
                           destination, naive["fingerprint"])]
    saved: dict[str, float] = {}

    def checkpoint() -> MoveStats:
        saved["seconds"] = baselines.checkpoint_save(source_engine, Path(ckpt))
        loaded = baselines.checkpoint_load(dst_engine, Path(ckpt))
        written = sum(t.numel() * t.element_size() for t in map(local_of, source.values()))
        read = sum(t.numel() * t.element_size() for t in map(local_of, destination.values()))
        return MoveStats(saved["seconds"] + loaded, written + read, 2, 0)

    records.append(_run("checkpoint", "dp4_to_dp2tp2", checkpoint, destination, naive["fingerprint"]))
    del source_engine, source, dst_engine  # memory: the in-place runs hold one source and one destination at a time
    vps, floor = _vps_in_place_records("dp4_to_dp2tp2", make_source, DST_LAYOUT, mesh2d, destination, naive["fingerprint"])
    return records + vps, floor, dict(save_seconds=saved["seconds"], reference=naive["fingerprint"])


def bench_searched_order(make_source: Callable[[], TrainEngine], meshes: MeshCache) -> tuple[list[dict], dict, str]:
    """dp4 -> dp2 x tp2 in the mesh rank order the VPS search picks (TP outermost here: each rank keeps its chunk
    of every column-parallel weight), into one destination engine built on that mesh: floor, naive, vps in place."""
    source_engine = make_source()
    layout = least_moving_layout(source_engine, DST_LAYOUT)
    mesh = meshes.get(layout)
    source = bind_train_state(source_engine)
    _, destination = _train_destination(source_engine, layout, mesh)
    naive = _run("naive", SEARCHED, lambda: move_by_full_tensors(source, destination), destination, None)
    del source_engine, source
    vps, floor = _vps_in_place_records(SEARCHED, make_source, layout, mesh, destination, naive["fingerprint"])
    return [naive, *vps], floor, layout.describe()


def rank_main(rank: int, world: int, port: int, size: str, transitions: list[str], bw_bytes: int, ckpt: str, out: str) -> None:
    init_rank(rank, world, port)
    meshes = MeshCache()
    mesh2d = meshes.get(DST_LAYOUT)
    bandwidth = {"concurrent": p2p_bandwidth(bw_bytes, concurrent=True), "single_pair": p2p_bandwidth(bw_bytes, concurrent=False),
                 "copy": copy_bandwidth(bw_bytes)}  # context only: floors come from each plan's own pattern
    def make_source(adamw_state: bool = False) -> TrainEngine:  # the same values every time (seeded per tensor and rank)
        return random_source(SIZES[size], meshes, adamw_state)

    with_adamw = partial(make_source, True)  # train -> train moves the optimizer's moments too

    report: dict = dict(rank=rank, records=[], floor={}, bandwidth=bandwidth)
    rollout = None
    if "train_to_vllm" in transitions:
        records, report["floor"]["train_to_vllm"], rollout = bench_to_vllm(make_source(), Path(f"{out}.model"), ROLLOUT_TP,
                                                                          VLLM_REPEATS)
        report["records"] += records
    if VLLM_LIKE in transitions:
        records, report["floor"][VLLM_LIKE] = bench_to_vllm_like(make_source(), mesh2d)
        report["records"] += records
        gc.collect()
    if "dp4_to_dp2tp2" in transitions:
        records, report["floor"]["dp4_to_dp2tp2"], checkpoint = bench_train_to_train(with_adamw, mesh2d, ckpt)
        report["records"] += records
        report.update(checkpoint)
        gc.collect()  # the default-order destination engine goes before the searched one is built
    if SEARCHED in transitions:
        records, report["floor"][SEARCHED], report["searched_layout"] = bench_searched_order(with_adamw, meshes)
        report["records"] += records
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    if rollout is not None:
        rollout.shutdown()  # destroys the default process group itself
        if rank == 0:
            shutil.rmtree(f"{out}.model", ignore_errors=True)
    else:
        dist.destroy_process_group()


def merge_reports(earlier: list[dict], later: list[dict]) -> list[dict]:
    """Per-rank reports of separate launches as one: records and floors appended, the first launch's bandwidths."""
    if not earlier:
        return later
    return [{**b, **a, "records": a["records"] + b["records"], "floor": {**a["floor"], **b["floor"]}}
            for a, b in zip(earlier, later)]


def restart_worker(size: str, ckpt: str, out: str) -> None:
    """A fresh process of the restarted job: init, build the new layout, load the checkpoint, report its time."""
    restart_load(lambda: TrainEngine(meta_policy(make_hf_config(SIZES[size]), torch.float32),
                                     MeshCache().get(DST_LAYOUT), lr=1e-4, zero=DST_LAYOUT.zero),
                 ckpt, out)


def restart_load(build: Callable[[], TrainEngine], ckpt: str, out: str) -> None:
    """The restarted job's rank (RANK and the rest from the environment: time_restart): init, `build` the destination
    engine (on the meta device), allocate it with AdamW state, load the checkpoint; writes when all ranks were done
    and the loaded state's fingerprint to `out`.RANK."""
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    engine = build()
    engine.model.to_empty(device=engine.device)
    allocate_optimizer_state(engine, torch.tensor(0.0))
    baselines.checkpoint_load(engine, Path(ckpt))
    dist.barrier()
    done = time.time()
    Path(f"{out}.{rank}").write_text(json.dumps({"done": done, "fingerprint": fingerprint(bind_train_state(engine))}))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_restart(size: str, ckpt: str, work: Path, script: str = __file__, tag: str = "restart") -> tuple[float, list[list[float]]]:
    """Seconds from launching fresh ranks of `script --restart-worker` to the checkpoint loaded in all of them,
    and their fingerprints."""
    port, out = free_port(), work / f"{tag}_{size}"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1"}
    start = time.time()
    procs = [subprocess.Popen([sys.executable, script, "--restart-worker", "--sizes", size, "--ckpt", ckpt, "--out", str(out)],
                              env={**env, "RANK": str(r)}) for r in range(WORLD)]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("a restart worker failed")
    reports = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(WORLD)]
    for r in range(WORLD):
        Path(f"{out}.{r}").unlink()
    return max(r["done"] for r in reports) - start, [r["fingerprint"] for r in reports]


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def estimated_bytes(params: int, transitions: list[str]) -> int:
    """All ranks together at the largest phase: source + destination fp32 state, plus ~1 GB per process (torch,
    transfer buffers, allocator slack: measured ~0.9-1.4 GB above the state at 500M)."""
    per_rank = []
    if VLLM_LIKE in transitions:
        per_rank.append(params * 4 / WORLD + params * 4 / ROLLOUT_TP)
    if "train_to_vllm" in transitions:  # bf16 vLLM weights, the repack probe's captured copy, ~0.5 GB more of vLLM
        per_rank.append(params * 4 / WORLD + 2 * params * 2 / ROLLOUT_TP + 0.5e9)
    if "dp4_to_dp2tp2" in transitions or SEARCHED in transitions:
        per_rank.append(2 * 3 * params * 4 / WORLD)
    return int(WORLD * (max(per_rank) + 1.0e9))


def count_params(spec: ModelSpec) -> int:
    return sum(p.numel() for p in meta_policy(make_hf_config(spec), torch.float32).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="60m,150m,500m", help=f"comma-separated, from {sorted(SIZES)}")
    parser.add_argument("--quick", action="store_true", help="tiny model only, small bandwidth probe (< 1 min)")
    parser.add_argument("--out", default="bench_out", help="directory for bench_reshard.json and bench_reshard.png")
    parser.add_argument("--ckpt", default=None, help="checkpoint directory for the DCP baselines (default: under --out)")
    parser.add_argument("--keep-ckpt", action="store_true", help="keep each size's DCP checkpoint (default: deleted once "
                        "measured; 500M with AdamW state is ~6 GB)")
    parser.add_argument("--transitions", default=",".join(TRANSITIONS), help=f"comma-separated subset of {TRANSITIONS}")
    parser.add_argument("--bw-mib", type=int, default=256, help="message size of the bandwidth probes (start and paired)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="combine earlier bench_reshard.json files (sizes run "
                        "separately, e.g. when memory was short) into one table, JSON and chart; runs nothing")
    parser.add_argument("--restart-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restart_worker:
        return restart_worker(args.sizes, args.ckpt, args.out)
    if args.merge:
        reports = [json.loads(Path(path).read_text()) for path in args.merge]
        transitions = [t for t in TRANSITIONS if any(t in r.get("transitions", TRANSITIONS) for r in reports)]
        dates = ", ".join(dict.fromkeys(r.get("date", "undated") for r in reports))  # when the runs were measured
        return write_report(Path(args.out), [row for r in reports for row in r["rows"]],
                            {k: v for r in reports for k, v in r["params"].items()}, transitions, SETUP, TRANSITIONS, dates)
    sizes = ["tiny"] if args.quick else args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown sizes {unknown}; valid: {sorted(SIZES)}")
    transitions = args.transitions.split(",")
    if not set(transitions) <= set(TRANSITIONS):
        parser.error(f"--transitions {args.transitions}: valid are {', '.join(TRANSITIONS)}")
    bw_bytes = (8 if args.quick else args.bw_mib) * 2**20
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed.tensor", "transformers", "bench.baselines"])
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    params = {s: count_params(SIZES[s]) for s in sizes}
    started = run_stamp("start")
    rows: list[dict] = []
    for size in sizes:
        need, free = estimated_bytes(params[size], transitions), available_bytes()
        if need > 0.9 * free:  # the machine is shared: never push it into the OOM killer
            print(f"[{size}] skipped: needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available", flush=True)
            continue
        ckpt_root = Path(args.ckpt or out / "ckpt")
        ckpt_root.mkdir(parents=True, exist_ok=True)
        ckpt = str(ckpt_root / size)
        disk_need, disk_free = 3 * params[size] * 4, shutil.disk_usage(ckpt_root).free  # fp32 params + 2 moments
        if "dp4_to_dp2tp2" in transitions and disk_need > 0.9 * disk_free:
            print(f"[{size}] skipped: its DCP checkpoint needs ~{disk_need / 1e9:.1f} GB, {disk_free / 1e9:.1f} GB free "
                  f"under {ckpt_root} (--ckpt puts it elsewhere)", flush=True)
            continue
        per_rank: list[dict] = []
        # fresh ranks per transition: memory a phase leaves behind cannot add up (--quick's tiny model: one launch)
        for group in [transitions] if args.quick else [[t] for t in transitions]:
            result, port = out / f"ranks_{size}_{group[0]}.json", free_port()
            launch(rank_main, (WORLD, port, size, group, bw_bytes, ckpt, str(result)), WORLD, port)
            per_rank = merge_reports(per_rank, json.loads(result.read_text()))
        restart = time_restart(size, ckpt, out) if "dp4_to_dp2tp2" in transitions else None
        if not args.keep_ckpt:  # a full sweep leaves ~12 GB of checkpoints otherwise
            shutil.rmtree(ckpt, ignore_errors=True)
        rows += summarize(size, per_rank, restart)
        bandwidth = per_rank[0]["bandwidth"]
        print(f"[{size}] gloo p2p: {bandwidth['concurrent'] / 1e9:.2f} GB/s per rank with all ranks exchanging, "
              f"{bandwidth['single_pair'] / 1e9:.2f} GB/s one pair alone", flush=True)
    if not rows:
        raise SystemExit("every size was skipped: not enough memory available")
    write_report(out, rows, params, transitions, SETUP, TRANSITIONS, stamps={**started, **run_stamp("end")})


if __name__ == "__main__":
    main()
