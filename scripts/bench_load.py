"""Peak resident memory of loading a >= 300M-parameter Llama checkpoint on 4 gloo ranks: per-shard vs full model.

(a) per shard: the model is built on the meta device, parallelized (FSDP2 over 4 dp ranks, or dp x tp), and every rank
    reads only its own slices from the bf16 safetensors files (rlhf_dyna.models.meta_init.checkpoint_loader);
(b) today's path: `from_pretrained` of the full fp32 model on every rank, then parallelize.
Each figure is the rank's peak RSS *increase* during the load over its RSS just before it (after imports, process
group and mesh): /proc/self/clear_refs "5" resets VmHWM, VmHWM is read after the load. The bound per rank is
(its fp32 shard + the largest single fp32 tensor) x 1.2. Loaded shards are checked to equal the full model's
corresponding local shards exactly. The checkpoint is made once and cached under --ckpt (deleted with --cleanup).

    python scripts/bench_load.py [--ckpt /tmp/rlhf_dyna_bench_load] [--tp 1,2] [--cleanup]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
MIB = 2**20
# ~334M parameters: vocab 32000 x hidden 1024 (untied), 16 layers, MLP 4096
MODEL = dict(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
             num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048)
MAX_SHARD_SIZE = "300MB"  # -> 3 files + model.safetensors.index.json, as real checkpoints ship


def make_checkpoint(ckpt: Path) -> Path:
    """A seeded random bf16 Llama saved in several safetensors files; reused when it is already there."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if (ckpt / "model.safetensors.index.json").exists() and json.loads((ckpt / "config.json").read_text())["hidden_size"] == MODEL["hidden_size"]:
        return ckpt
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**MODEL, architectures=["LlamaForCausalLM"]), dtype=torch.bfloat16)
    model.save_pretrained(ckpt, max_shard_size=MAX_SHARD_SIZE)
    del model
    return ckpt


def rss_hwm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(load):
    """(result, peak RSS increase in bytes during `load()`, seconds)."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    start, t0 = rss_bytes(), time.perf_counter()
    out = load()
    return out, rss_hwm_bytes() - start, time.perf_counter() - t0


def rank_main(rank: int, world: int, port: int, ckpt: str, tp: int, result: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    from torch.distributed.tensor import DTensor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    from rlhf_dyna.models.build import build_policy
    from rlhf_dyna.models.meta_init import checkpoint_config, checkpoint_loader, meta_policy
    from rlhf_dyna.parallel_layout import ParallelLayout
    from rlhf_dyna.train.engine import TrainEngine
    from rlhf_dyna.train.mesh import build_mesh

    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = build_mesh(ParallelLayout(world // tp, tp))
    cpu = torch.device("cpu")
    config = checkpoint_config(ckpt)
    sharded, sharded_peak, sharded_s = measured(
        lambda: TrainEngine(meta_policy(config, torch.float32), mesh, trainable=False, materialize=checkpoint_loader(ckpt, cpu)))
    dist.barrier()
    full, full_peak, full_s = measured(lambda: TrainEngine(build_policy(ckpt, torch.float32), mesh, trainable=False))
    local = lambda p: p.to_local() if isinstance(p, DTensor) else p
    full_params = dict(full.model.named_parameters())
    mismatched = [n for n, p in sharded.model.named_parameters() if not torch.equal(local(p), local(full_params[n]))]
    shard_bytes = sum(local(p).numel() * local(p).element_size() for p in sharded.model.parameters())
    largest = max(p.numel() * p.element_size() for p in sharded.model.parameters())
    row = dict(rank=rank, shard_mib=shard_bytes / MIB, largest_tensor_mib=largest / MIB,
               bound_mib=1.2 * (shard_bytes + largest) / MIB, per_shard_peak_mib=sharded_peak / MIB,
               full_model_peak_mib=full_peak / MIB, per_shard_s=sharded_s, full_model_s=full_s,
               bytes_read_mib=sharded.materialized.bytes_read / MIB, mismatched_tensors=mismatched)
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if rank == 0:
        Path(result).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", default="/tmp/rlhf_dyna_bench_load", help="where the checkpoint is made and cached")
    parser.add_argument("--tp", default="1,2", help="comma-separated tensor parallel sizes, one run each (dp = 4 / tp)")
    parser.add_argument("--out", default="docs/bench/bench_load.json")
    parser.add_argument("--cleanup", action="store_true", help="delete --ckpt at the end")
    args = parser.parse_args()
    tps = [int(t) for t in args.tp.split(",")]
    for tp in tps:
        if WORLD % tp or MODEL["num_key_value_heads"] % tp:
            parser.error(f"--tp={tp} must divide the {WORLD} ranks and the {MODEL['num_key_value_heads']} kv heads")
    ckpt = make_checkpoint(Path(args.ckpt))
    from rlhf_dyna.models.load_shards import SafetensorsCheckpoint

    stored = SafetensorsCheckpoint.open(ckpt)
    params = sum(torch.Size(stored.shape(name)).numel() for name in stored.file_of)
    result = Path(args.ckpt) / "result.json"
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed.tensor", "transformers", "rlhf_dyna.models.meta_init"])
    files = sorted(p.name for p in ckpt.glob("*.safetensors"))
    print(f"checkpoint {ckpt}: Llama, {params / 1e6:.0f}M parameters, bf16, {len(files)} safetensors files; "
          f"{WORLD} gloo ranks, fp32 master weights")
    print("peak RSS increase during the load over the rank's RSS just before it (after imports, process group, mesh)")
    layouts = []
    for tp in tps:
        mp.start_processes(rank_main, args=(WORLD, _free_port(), str(ckpt), tp, str(result)), nprocs=WORLD, join=True,
                           start_method="forkserver")
        rows = json.loads(result.read_text())
        result.unlink()
        print(f"dp={WORLD // tp} x tp={tp}")
        print(f"{'rank':>4} {'shard MiB':>10} {'largest MiB':>12} {'bound MiB':>10} {'per-shard MiB':>14} {'ratio':>6} "
              f"{'full-model MiB':>15} {'full/bound':>10}")
        for r in rows:
            print(f"{r['rank']:>4} {r['shard_mib']:>10.1f} {r['largest_tensor_mib']:>12.1f} {r['bound_mib']:>10.1f} "
                  f"{r['per_shard_peak_mib']:>14.1f} {r['per_shard_peak_mib'] / r['bound_mib']:>6.2f} "
                  f"{r['full_model_peak_mib']:>15.1f} {r['full_model_peak_mib'] / r['bound_mib']:>10.2f}")
        layouts.append(dict(dp=WORLD // tp, tp=tp, ranks=rows))
    within = all(r["per_shard_peak_mib"] <= r["bound_mib"] for lay in layouts for r in lay["ranks"])
    exact = all(not r["mismatched_tensors"] for lay in layouts for r in lay["ranks"])
    print(f"per-shard peak within bound on every rank: {within}; loaded shards equal the full model's exactly: {exact}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d"), machine="2-vCPU build VM, 4 gloo ranks (CPU)",
        model=dict(MODEL, parameters=params, dtype="bf16", files=files), world=WORLD,
        measure="peak RSS increase (VmHWM after resetting it via /proc/self/clear_refs) over the RSS just before the load",
        bound="1.2 x (rank's fp32 shard + largest fp32 tensor)", within_bound=within, exact=exact, layouts=layouts), indent=1) + "\n")
    print(f"wrote {out}")
    if args.cleanup:
        shutil.rmtree(args.ckpt)
    if not (within and exact):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
