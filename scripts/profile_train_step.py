"""Where a GRPO step's engine time goes at a real model's shape: the prepare phase (`compute_advantages`: old
log-probs where needed, advantages) and the actor's training step (forward, loss, backward, optimizer), on 2 gloo
ranks built as the app builds them. Version-agnostic (it calls only what the loop calls): run it against another
checkout with PYTHONPATH=THAT_CHECKOUT to compare.

The step's rollouts are `--rows` x 2 random samples (n=2) of prompt (`--prompt` tokens, +-8) + `--response` tokens,
laid out by `orchestrator.batch.pack` and split over the ranks as the loop splits them. Prints per phase the median
wall and CPU seconds of `--repeats` runs after a warm-up, the train phase's peak resident memory per rank, and with
`--trace` torch.profiler's top operators of rank 0.

    python -m rlhf_dyna.models.tiny_checkpoint /tmp/smollm --size smollm-135m
    PYTHONPATH=. python scripts/profile_train_step.py /tmp/smollm [--precision bf16] [--trace] [--out FILE.json]   # --out appends a run
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist
from bench.measure import PeakExtraMemory, resident_bytes
from bench.ranks import init_rank, launch

import rlhf_dyna
from rlhf_dyna.config import AlgorithmConfig, Config, RolloutConfig
from rlhf_dyna.models.meta_init import checkpoint_config, checkpoint_loader, meta_policy
from rlhf_dyna.orchestrator.advantages import compute_advantages
from rlhf_dyna.orchestrator.batch import Sample, pack, rank_rows
from rlhf_dyna.orchestrator.objectives import actor_loss
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.train.pipeline_engine import make_engine

if "layout" in inspect.signature(build_mesh).parameters:  # the one parallel-layout type
    from rlhf_dyna.parallel_layout import ParallelLayout
else:  # a checkout from before it (19690cd and older), to compare with
    ParallelLayout = None

WORLD = 2


def samples_of(count: int, prompt: int, response: int, vocab: int) -> list[Sample]:
    rng = random.Random(0)
    return [Sample(i // 2, [rng.randrange(1, vocab) for _ in range(prompt + rng.randint(-8, 8))],
                   [rng.randrange(1, vocab) for _ in range(response)], reward=float(rng.random() < 0.5))
            for i in range(count)]


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def prepare_fn(cfg: Config, batch: dict, samples: list[Sample], rank: int, engine):
    """The loop's prepare call, in this checkout's signature."""
    if ParallelLayout is not None:
        return lambda: compute_advantages(cfg, batch, samples, engine, None, None, 0.0)
    from rlhf_dyna.orchestrator.setup import RankContext

    ctx = RankContext(rank=rank, world=WORLD, dp=WORLD, tp=1, rollout_tp=1)
    return lambda: compute_advantages(cfg, batch, samples, ctx, engine, None, None, 0.0)


def rank_main(rank: int, port: int, args: argparse.Namespace, out_path: str) -> None:
    init_rank(rank, WORLD, port)
    config = checkpoint_config(args.checkpoint)
    mesh = build_mesh(ParallelLayout(WORLD, 1)) if ParallelLayout is not None else build_mesh(WORLD, 1)
    engine = make_engine(meta_policy(config, torch.float32), mesh,
                         materialize=checkpoint_loader(args.checkpoint, torch.device("cpu")), precision=args.precision,
                         micro_batch_size=args.micro_batch_size, zero=args.zero, lr=1e-6, **args.engine)
    cfg = Config(algorithm=AlgorithmConfig(**args.algorithm), rollout=RolloutConfig(n=2, max_new_tokens=args.response))
    loss_fn = actor_loss(cfg.algorithm, temperature=1.0, max_new_tokens=args.response)
    samples = samples_of(args.rows * WORLD, args.prompt, args.response, config.vocab_size)
    runs: dict[str, list[tuple[float, float]]] = {"prepare": [], "train": []}
    peak = 0
    for repeat in range(args.repeats + 1):
        batch = rank_rows(pack(samples, pad_id=0), rank, WORLD, cfg.algorithm.mini_batches)
        dist.barrier()
        wall, cpu, _ = timed(prepare_fn(cfg, batch, samples, rank, engine))
        if repeat:
            runs["prepare"].append((wall, cpu))
        dist.barrier()
        with PeakExtraMemory() as memory:
            base = resident_bytes()
            wall, cpu, _ = timed(lambda: engine.step(batch, loss_fn))
        peak = max(peak, base + memory.peak_extra_bytes)
        if repeat:
            runs["train"].append((wall, cpu))
    if args.trace and rank == 0:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine.step(batch, loss_fn)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    elif args.trace:
        engine.step(batch, loss_fn)
    result = {phase: {"wall_s": statistics.median(w for w, _ in r), "cpu_s": statistics.median(c for _, c in r)}
              for phase, r in runs.items()}
    result["train_peak_rss_mib"] = peak / 2**20
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--rows", type=int, default=8, help="rows per rank (8 prompts x n=2 over 2 ranks)")
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--zero", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine", type=json.loads, default={}, help="more TrainEngine keywords, as JSON")
    parser.add_argument("--algorithm", type=json.loads, default={}, help="AlgorithmConfig keys, as JSON")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = f"/tmp/profile_train_step_{os.getpid()}.json"
    launch(rank_main, (port, args, out_path), WORLD, port)
    ranks = json.loads(Path(out_path).read_text())
    os.remove(out_path)
    for rank, r in enumerate(ranks):
        print(f"rank {rank}: " + ", ".join(f"{p} {r[p]['wall_s']:.2f} s wall / {r[p]['cpu_s']:.2f} s cpu"
                                           for p in ("prepare", "train")) + f", train peak RSS {r['train_peak_rss_mib']:.0f} MiB")
    if args.out:  # one run appended to the file's "runs"
        out = Path(args.out)
        report = json.loads(out.read_text()) if out.exists() else {"machine": f"{platform.node()}: {os.cpu_count()} cpus",
                                                                    "runs": []}
        checkout = subprocess.run(["git", "-C", str(Path(rlhf_dyna.__file__).parent), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
        report["runs"].append(dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), checkout=checkout,
                                   args={k: v for k, v in vars(args).items() if k != "out"},
                                   load_average=open("/proc/loadavg").read().split()[:3], ranks=ranks))
        out.write_text(json.dumps(report, indent=1))

if __name__ == "__main__":
    main()
