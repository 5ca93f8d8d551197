"""vLLM on a rank subset (2 gloo ranks): rank 0 alone runs an engine (engine core in its own process) while rank 1
has none; greedy tokens match HF before and after a weight install through shared memory, the world's groups still
work afterwards, and shutdown leaves no engine process and no shm file."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import build_policy, save_hf_dir
from rlhf_dyna.rollout.subset_engine import SubsetVLLMRollout
from tests.ranks.tiny_models import NEW_TOKENS, PROMPTS, hf_greedy, tiny_spec
from tests.multirank import run_ranks


def _children(pid: int) -> set[int]:
    """Live child processes, but multiprocessing's resource tracker (the spawn start method keeps one per process)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:  # the thread exited since the listing (vLLM's threads end during shutdown)
            continue
        for child in children:
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
                state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                continue
            if b"resource_tracker" not in cmdline and state != "Z":
                out.add(int(child))
    return out


def _wait_gone(pids: set[int], timeout_s: float = 20.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        pids = {p for p in pids if Path(f"/proc/{p}").exists() and _children(os.getpid()) & {p}}
        time.sleep(0.2)
    return pids


def _engine_on_rank0(rank: int, world: int, model_dir: str) -> None:
    spec = tiny_spec("llama", False)
    first, second = build_policy(spec, seed=0), build_policy(spec, seed=5)
    if rank == 0:
        save_hf_dir(first, first.config, model_dir)
        before = _children(os.getpid())
        engine = SubsetVLLMRollout(model_dir, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32, rank=0)
        engine_procs = _children(os.getpid()) - before
        assert engine_procs, "no engine process"
        greedy = [s[0].token_ids for s in engine.generate(PROMPTS, temperature=0.0, max_tokens=NEW_TOKENS)]
        assert greedy == hf_greedy(first.state_dict(), "llama", False, PROMPTS)
        engine.load_weights(second.state_dict().items())  # across the process boundary, through /dev/shm
        installed = [s[0].token_ids for s in engine.generate(PROMPTS, temperature=0.0, max_tokens=NEW_TOKENS)]
        assert installed == hf_greedy(second.state_dict(), "llama", False, PROMPTS) and installed != greedy
        shm = engine.shm_path
        engine.shutdown()
        assert not shm.exists()
        assert _wait_gone(engine_procs) == set(), "engine process left behind"
    dist.barrier()  # rank 1 waited here the whole time: it has no engine
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # the world's groups are untouched by the engine
    assert total.item() == world * (world + 1) / 2


@pytest.mark.timeout(240)
def test_engine_on_one_rank_of_two_generates_installs_weights_and_shuts_down(tmp_path: Path) -> None:
    run_ranks(_engine_on_rank0, 2, str(tmp_path / "model"))


def _train_set_to_rollout_rank(rank: int, world: int, model_dir: str) -> None:
    from rlhf_dyna.train.engine import TrainEngine, full_state_dict
    from rlhf_dyna.train.mesh import build_mesh
    from rlhf_dyna.transition.subset_sync import SubsetSync
    from tests.ranks.tiny_models import nll_loss, random_batch

    spec = tiny_spec("llama", False)
    initial = build_policy(spec, seed=0)
    if rank == 0:
        save_hf_dir(initial, initial.config, model_dir)
    mesh = build_mesh(ParallelLayout(2, 1, first_rank=1))  # the training set: ranks 1-2; every rank builds it
    engine, trained = None, {}
    if rank > 0:
        engine = TrainEngine(build_policy(spec, seed=0), mesh, lr=1e-2)
        engine.step(random_batch(seed=rank, batch=2), nll_loss)
        trained = {k: v.clone() for k, v in full_state_dict(engine)}  # collective over the training set only
    everyone: list = [None] * world
    dist.all_gather_object(everyone, trained)  # rank 0 gets the reference weights for its HF check
    rollout = SubsetVLLMRollout(model_dir, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32) if rank == 0 else None
    sync = SubsetSync(initial.config, ParallelLayout(2, 1, first_rank=1).spec(), rollout_first=0, rollout_ranks=1)
    stats = sync.sync(engine, rollout)
    params = sum(p.numel() * 4 for p in initial.parameters())
    assert stats.bytes_moved == params  # rank 0 held nothing: every byte of one copy, sent once
    if rank == 0:
        greedy = [s[0].token_ids for s in rollout.generate(PROMPTS, temperature=0.0, max_tokens=NEW_TOKENS)]
        assert greedy == hf_greedy(everyone[1], "llama", False, PROMPTS)
        assert greedy != hf_greedy(initial.state_dict(), "llama", False, PROMPTS)  # the trained weights, not the initial
        rollout.shutdown()
    dist.barrier()


@pytest.mark.timeout(240)
def test_vps_sync_from_a_training_set_into_an_engine_on_another_rank(tmp_path: Path) -> None:
    run_ranks(_train_set_to_rollout_rank, 3, str(tmp_path / "model"))
