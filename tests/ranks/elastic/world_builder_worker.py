"""One rank of the world builder test: build three placements' groups in the background while the main thread
runs a phase of collectives and compute on the default group; then use every built group."""
from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.elastic.placement import ACTOR, CRITIC, ROLLOUT
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement
from rlhf_dyna.elastic.world_builder import WorldBuilder, placement_specs


def phase_of_compute(seconds: float) -> int:
    """Main-thread work: matmuls and all_reduces on the default group, for `seconds` (the slowest rank's clock,
    so that every rank runs the same number of collectives)."""
    x, n, t0 = torch.randn(256, 256), 0, time.perf_counter()
    while True:
        y = torch.ones(1 << 16)
        y[-1] = time.perf_counter() - t0
        dist.all_reduce(y, op=dist.ReduceOp.MAX)
        x = torch.tanh(x @ x)
        n += 1
        if y[-1].item() >= seconds:
            return n


def main() -> None:
    compute_s = float(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ppo = (ACTOR, CRITIC, ROLLOUT)
    placements = [make_placement(PolicyRequest("split", world, ppo)),
                  make_placement(PolicyRequest("lend", world, ppo)),
                  make_placement(PolicyRequest("colocate", world, ppo, ParallelLayout(tp=2), rollout_tp=2))]
    builder = WorldBuilder(placements).start()
    rounds = phase_of_compute(compute_s)
    built = [builder.get(p.key(), timeout=120) for p in placements]
    checked = 0
    for placement, w in zip(placements, built):  # every built group and mesh works
        specs, sets = placement_specs(placement)
        for ranks in sets:
            if rank in ranks.ranks:
                y = torch.tensor([float(rank)])
                dist.all_reduce(y, group=w.group(ranks))
                assert y.item() == sum(ranks.ranks), (placement.key(), ranks, y.item())
                checked += 1
        for spec in specs:
            mesh = w.mesh(spec)
            if rank in spec.ranks:
                for dim in ("dp", "tp"):
                    y = torch.tensor([1.0])
                    dist.all_reduce(y, group=mesh.get_group(dim))
                    assert y.item() == mesh.size(mesh.mesh_dim_names.index(dim)), (spec.describe(), dim)
                    checked += 1
    builder.join()
    dist.barrier()
    print("RESULT " + json.dumps(dict(rank=rank, rounds=rounds, checked=checked,
                                      build_s=[w.build_seconds for w in built], wait_s=[w.wait_seconds for w in built])))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
