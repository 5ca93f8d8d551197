"""What FSDP2's dim-1 sharding of row-parallel weights (o_proj, down_proj: `train.parallelize.fsdp_shard_dim`)
costs per training step at tp=1, against FSDP2's default dim-0 sharding, on 4 gloo ranks.

Why it exists: with dim-1 shards a rank's shard of every row-parallel weight is the same column block under dp and
under dp x tp (TP outermost), so a layout switch keeps it in place. FSDP2 all-gathers a dim-1 shard as dim 0 and
then re-lays it out (a copy per gather), and the reduce-scatter of its gradient likewise, so every step pays. Both
variants run the same code (fully_shard per decoder layer + root, fp32, AdamW), alternating, `--steps` each.

    python scripts/bench_fsdp_dim1.py --size 60m --steps 10 --out docs/bench/bench_fsdp_dim1.json
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_reshard import SIZES  # noqa: E402  (the same model sizes as the resharding benchmark)

WORLD = 4


def build(size: str, dim1: bool, seed: int = 0):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaForCausalLM

    from rlhf_dyna.models.build import make_hf_config
    from rlhf_dyna.train.parallelize import decoder_layers, fsdp_shard_dim, row_parallel_weights

    torch.manual_seed(seed)
    model = LlamaForCausalLM(make_hf_config(SIZES[size]))
    mesh = init_device_mesh("cpu", (WORLD,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, shard_placement_fn=fsdp_shard_dim([layer], WORLD, row_parallel_weights(model.config)) if dim1 else None)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5)


def step_seconds(model, optimizer, batch: torch.Tensor) -> float:
    dist.barrier()
    start = time.perf_counter()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def rank_main(rank: int, port: int, size: str, steps: int, tokens: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    models = {name: build(size, dim1) for name, dim1 in (("dim0", False), ("dim1", True))}
    batch = torch.randint(0, SIZES[size].vocab_size, (2, tokens), generator=torch.Generator().manual_seed(rank))
    times: dict[str, list[float]] = {name: [] for name in models}
    for name, (model, optimizer) in models.items():  # warm-up: allocator, AdamW state
        step_seconds(model, optimizer, batch)
    for _ in range(steps):  # alternating: both see the same machine state
        for name, (model, optimizer) in models.items():
            times[name].append(step_seconds(model, optimizer, batch))
    if rank == 0:
        medians = {name: statistics.median(t) for name, t in times.items()}
        Path(out).write_text(json.dumps(dict(size=size, world=WORLD, tokens_per_rank=2 * tokens, steps=times,
                                             median_seconds=medians, dim1_over_dim0=medians["dim1"] / medians["dim0"],
                                             date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())), indent=1))
        print(json.dumps(medians), f"dim1/dim0 = {medians['dim1'] / medians['dim0']:.3f}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="60m", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128, help="sequence length; 2 sequences per rank")
    parser.add_argument("--out", default="bench_fsdp_dim1.json")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(port, args.size, args.steps, args.tokens, args.out), nprocs=WORLD, join=True,
                       start_method="spawn")


if __name__ == "__main__":
    main()
