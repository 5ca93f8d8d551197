"""Rows of scripts/bench_reshard.py into a real in-rank vLLM engine (CPU, external_launcher, tp x vllm_dp over the
world, bf16 weights from the fp32 training state): `naive` (rlhf_dyna.transition.sync.NaiveSync) and `vps` (VpsSync), end to end with vLLM's install, each
checked by greedy tokens afterwards (vps must give naive's tokens, and both must differ from the engine's dummy
weights before any sync).

Floor of a run = wire + repack, both measured right before that run in the same engine: the plan's own pair
matrix replayed (bench.measure.pattern_seconds), and vLLM's own install of this rank's shard from local memory
(the same staged tensors, captured once, installed again with no wire). vps installs each group after its wire
(VpsSync's default); `vps_overlap` (one run) installs on a worker thread while the next group is on the wire,
whose floor would be max(wire, repack). Peak extra memory: the larger of resident memory above the level at the
sync's start and VpsSync's own count (staged group + executor staging), since staging memory is kept between syncs
(the pool and the arena: `staging_kept_bytes`) and a warm sync's RSS does not grow by it.
"""
from __future__ import annotations

import time
from math import prod
from pathlib import Path

import torch
import torch.distributed as dist

from bench.measure import PeakExtraMemory, pattern_seconds
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.transition.bind_train import train_catalog, train_spec
from rlhf_dyna.transition.bind_vllm import STAGING_POOL, VllmDestination, rollout_dtype, rollout_spec
from rlhf_dyna.transition.round_io import STAGING
from rlhf_dyna.transition.movers import local_of
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.transition.sync import NaiveSync, WeightSync
from rlhf_dyna.transition.vllm_install import LayerwiseInstaller
from rlhf_dyna.transition.vps_plans import planned
from rlhf_dyna.transition.vps_sync import VpsSync
from rlhf_dyna.vps.tensor import Kind

TRANSITION = "train_to_vllm"
ROLLOUT_DTYPE = torch.bfloat16  # fp32 masters -> bf16 vLLM, as bf16 recipes run it (vps casts while packing)
REPACK_PROBES = 2  # installs per repack probe, the best kept
VLLM_REPEATS = 5  # paired vps runs: ranks share 2 cores, and runs of one size spread by about +-5%
PROMPTS = [[(7 * i + 3) % 97 + 1 for i in range(12)], [5, 9, 3, 44], [17, 2, 44, 8, 30], [60, 1, 7, 7]]


def _greedy(rollout: VLLMRollout) -> list[list[int]]:
    prompts = PROMPTS[rollout.dp_rank::rollout.dp_size]  # TP peers pass the same prompts
    return [s[0].token_ids for s in rollout.generate(prompts, temperature=0.0, max_tokens=8)]


def whole_plan(engine: TrainEngine, rollout: VLLMRollout, budget_bytes: int):
    """The cached plan of the whole move, sent directly to every rank (VpsSync plans it too): its destination layout."""
    params = {k: t for k, t in bind_train_state(engine).items() if k[1] == Kind.PARAM.value}
    config = engine.model.config
    return planned(train_catalog(config, params), train_spec(params), catalog_from_config(config, rollout_dtype(rollout)),
                   rollout_spec(rollout), (Kind.PARAM,), budget_bytes, dist.get_rank())


def _timed(sync: WeightSync, engine: TrainEngine, rollout: VLLMRollout) -> tuple[float, int, int, int]:
    dist.barrier()
    with PeakExtraMemory() as memory:
        stats = sync.sync(engine, rollout)
    seconds = torch.tensor([stats.seconds], dtype=torch.float64)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the end
    return float(seconds), stats.bytes_moved, stats.rounds, max(memory.peak_extra_bytes, stats.peak_extra_bytes)


def capture_staged(vps: VpsSync, engine: TrainEngine, rollout: VLLMRollout) -> list[dict]:
    """The staged groups of one (untimed) sync: this rank's shard in vLLM's model format, in local memory."""
    captured: list[dict] = []
    vps.on_staged = lambda staged: captured.append({n: t.clone() for n, t in staged.items()})  # staging is reused
    vps.sync(engine, rollout)
    vps.on_staged = None
    return captured


def repack_samples(captured: list[dict], engine: TrainEngine, rollout: VLLMRollout, budget_bytes: int,
                   repeats: int) -> list[float]:
    """vLLM's install of this rank's shard from local memory, `repeats` times back to back: the captured tensors
    installed again with no wire, group after group (slowest rank each time)."""
    destination = VllmDestination(rollout, whole_plan(engine, rollout, budget_bytes).dst, dist.get_rank())
    out = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        with LayerwiseInstaller(destination.model, rollout.llm.llm_engine.vllm_config, destination.aliases,
                                overlap=False) as installer:
            for staged in captured:
                installer.submit(staged)
        rollout.reset_prefix_cache()
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        out.append(float(seconds))
    return out


def repack_seconds(captured: list[dict], engine: TrainEngine, rollout: VLLMRollout, budget_bytes: int,
                   repeats: int = REPACK_PROBES) -> float:
    """The repack part of a floor: the best of `repeats` back-to-back installs from local memory (a floor is the
    least the work takes; single probes vary with what ran just before them)."""
    return min(repack_samples(captured, engine, rollout, budget_bytes, repeats))


class CastProbe:
    """The fp32 -> bf16 cast of this rank's whole training shard, every rank at once (slowest rank), into buffers
    allocated once: work a sync into a bf16 engine must do that neither the wire nor vLLM's repack contains. Reported
    beside the floor, not part of it."""

    def __init__(self, engine: TrainEngine) -> None:
        params = [t for (_, kind), t in bind_train_state(engine).items() if kind == Kind.PARAM.value]
        self.shards = [local_of(t) for t in params]
        self.casts = [torch.empty(s.shape, dtype=ROLLOUT_DTYPE) for s in self.shards]

    def seconds(self) -> float:
        dist.barrier()
        start = time.perf_counter()
        for out, shard in zip(self.casts, self.shards):
            out.copy_(shard)
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return float(seconds)


def dummy_rollout(engine: TrainEngine, model_dir: Path, tp: int, expert_parallel: bool = False) -> VLLMRollout:
    """The in-rank bf16 vLLM engine of the rows (tp x dp over the world) for `engine`'s model, from dummy weights:
    only the config is written (to `model_dir`, by rank 0)."""
    if dist.get_rank() == 0:
        engine.model.config.save_pretrained(model_dir)
    dist.barrier()
    return VLLMRollout(model_dir, tp=tp, seed=0, max_model_len=64, kv_cache_bytes=16 << 20, dtype="bfloat16",
                       load_format="dummy", block_size=32, expert_parallel=expert_parallel)


def bench_to_vllm(engine: TrainEngine, model_dir: Path, tp: int, repeats: int,
                  expert_parallel: bool = False) -> tuple[list[dict], dict, VLLMRollout]:
    """naive_cold and vps_cold once, then `repeats` times: the floor probes, vps, naive (paired with that vps run);
    then the repack probe and the greedy checks. Records in the shape bench_report.summarize reads; floor info: pair matrix bytes and repack.
    The engine is returned alive: its shutdown destroys the default process group, so the caller gathers first."""
    rollout = dummy_rollout(engine, model_dir, tp, expert_parallel)
    before = _greedy(rollout)
    records = []
    naive = NaiveSync(dtype=ROLLOUT_DTYPE)
    seconds, moved, rounds, peak = _timed(naive, engine, rollout)
    reference = _greedy(rollout)
    records.append(_record("naive_cold", [seconds], [], moved, rounds, peak, reference != before))
    vps = VpsSync()
    seconds, moved, rounds, peak = _timed(vps, engine, rollout)
    records.append(_record("vps_cold", [seconds], [], moved, rounds, peak, _greedy(rollout) == reference))
    pairs = vps.pair_bytes()  # what the sync sends: both stages where it relays through one replica
    captured = capture_staged(vps, engine, rollout)
    cast = CastProbe(engine)
    cast.seconds()  # warm-up, before the repack's: its buffers are faulted in before any probe counts
    repack_seconds(captured, engine, rollout, vps.budget_bytes)  # warm-up; the captured values must give naive's tokens
    correct = _greedy(rollout) == reference
    runs, floors, repacks, peaks, samples, casts = [], [], [], [], [], []
    naive_runs, naive_peaks, naive_correct = [], [], True
    for _ in range(repeats):  # each run right after its own floor: repack from local memory, then the wire pattern
        samples.append(repack_samples(captured, engine, rollout, vps.budget_bytes, REPACK_PROBES))
        repacks.append(min(samples[-1]))
        casts.append(cast.seconds())
        floors.append(pattern_seconds(pairs))
        seconds, moved, rounds, peak = _timed(vps, engine, rollout)
        runs.append(seconds)
        peaks.append(peak)
        correct = correct and _greedy(rollout) == reference
        # naive right after, in the same machine state: the speed of these VMs drifts by tens of % within minutes
        seconds, naive_moved, naive_rounds, peak = _timed(naive, engine, rollout)
        naive_runs.append(seconds)
        naive_peaks.append(peak)
        naive_correct = naive_correct and _greedy(rollout) == reference
    records.append(_record("vps", runs, floors, moved, rounds, max(peaks), correct, repacks))
    records.append(_record("naive", naive_runs, [], naive_moved, naive_rounds, max(naive_peaks), naive_correct))
    repack = repack_seconds(captured, engine, rollout, vps.budget_bytes)
    wire = pattern_seconds(pairs)
    seconds, moved, rounds, peak = _timed(VpsSync(overlap_install=True), engine, rollout)
    records.append(_record("vps_overlap", [seconds], [wire], moved, rounds, peak, _greedy(rollout) == reference, [repack]))
    del captured, cast
    received = [int(x) for x in pairs.sum(axis=0)]
    itemsize = torch.empty((), dtype=ROLLOUT_DTYPE).element_size()
    largest = max(prod(b.shape) * itemsize for b in whole_plan(engine, rollout, vps.budget_bytes).dst.buffers(dist.get_rank()).values())
    floor = dict(received_by_rank=received, budget_bytes=vps.budget_bytes,
                 largest_piece_bytes=largest, tokens_changed=reference != before,
                 install_overlapped=vps.overlap_install, relayed=vps.relayed, phases=vps.phases, repack_samples=samples, cast_runs=casts,
                 staging_kept_bytes=STAGING_POOL.nbytes + STAGING.nbytes)  # held between syncs, reused by the next
    return records, floor, rollout


def _record(method: str, seconds: list[float], floors: list[float], moved: int, rounds: int, peak: int,
            correct: bool, repacks: list[float] | None = None) -> dict:
    return dict(method=method, transition=TRANSITION, seconds=seconds, floors=floors, repacks=repacks or [],
                bytes_received=moved, bytes_total=True, rounds=rounds, peak_extra_bytes=peak, correct=bool(correct))
