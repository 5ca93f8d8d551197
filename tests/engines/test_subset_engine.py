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

from rlhf_dyna.models.build import build_policy, save_hf_dir
from rlhf_dyna.rollout.subset_engine import SubsetVLLMRollout
from tests.engines._common import tiny_spec
from tests.engines._dist import run_ranks
from tests.engines.test_weight_sync_greedy import NEW_TOKENS, PROMPTS, _hf_greedy


def _children(pid: int) -> set[int]:
    """Live child processes, but multiprocessing's resource tracker (the spawn start method keeps one per process)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
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
        assert greedy == _hf_greedy(first.state_dict(), "llama", False, PROMPTS)
        engine.load_weights(second.state_dict().items())  # across the process boundary, through /dev/shm
        installed = [s[0].token_ids for s in engine.generate(PROMPTS, temperature=0.0, max_tokens=NEW_TOKENS)]
        assert installed == _hf_greedy(second.state_dict(), "llama", False, PROMPTS) and installed != greedy
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
