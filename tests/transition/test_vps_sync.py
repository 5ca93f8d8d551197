"""`sync=vps` into real in-rank vLLM: the same trained weights give the same greedy tokens and log-probs as `naive`.

Both syncs run on the same trained engine, one after the other; the tokens before any sync must differ from the
synced ones, so a sync that moved nothing (or the wrong shard) fails. Verification is on: every piece a rank
receives is checksummed against its source.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.models.build import build_policy, save_hf_dir
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.sync import make_sync
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.vps_sync import VpsSync
from rlhf_dyna.vps.cache import cached_plan
from rlhf_dyna.parallel_dims import ParallelDims
from rlhf_dyna.transition.bind_train import train_spec
from rlhf_dyna.transition.bind_vllm import rollout_spec
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from tests.engines._common import nll_loss, random_batch, tiny_spec
from tests.engines._dist import run_ranks

PROMPTS = [[(7 * i + 3) % 64 for i in range(20)], [5, 9, 3], [17, 2, 44, 8, 30], [60, 1], [12, 50, 33, 21, 9, 4]]
NEW_TOKENS = 8


def _generate(rollout: VLLMRollout, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    out = rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)
    return [s[0].token_ids for s in out], torch.tensor([lp for s in out for lp in s[0].logprobs])


def _vps_vs_naive(rank: int, world: int, model_dir: str, arch: str, tie: bool, rollout_tp: int,
                  precision: str = "fp32") -> None:
    spec = tiny_spec(arch, tie)
    engine = TrainEngine(build_policy(spec, seed=0), build_mesh(world, 1), lr=3e-2, precision=precision)
    if rank == 0:
        save_hf_dir(build_policy(spec, seed=0), build_policy(spec).config, model_dir)
    dist.barrier()
    rollout = VLLMRollout(model_dir, tp=rollout_tp, seed=0, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32,
                          dtype="bfloat16" if precision == "bf16" else "float32")
    prompts = PROMPTS[rollout.dp_rank :: rollout.dp_size]
    # the live binding and the dry run's config mapping (parallel_dims) name the same two layouts
    live = (train_spec(bind_train_state(engine)), rollout_spec(rollout))
    assert live == ParallelDims(world_size=world, dp=world, tp=1, rollout_tp=rollout_tp).train_to_rollout(), live
    recorder = TraceRecorder(rank)
    vps = VpsSync(budget_bytes=1 << 10, verify=True, recorder=recorder)  # small budget: several rounds
    rollout_dtype = "bfloat16" if precision == "bf16" else "float32"  # the plan moves destination bytes
    plan = cached_plan(catalog_from_config(engine.model.config, rollout_dtype, "float32"), ParallelSpec(dp=world),
                       ParallelSpec(Phase.ROLLOUT, tp=rollout_tp, vllm_dp=world // rollout_tp), world)
    for step in range(2):  # the second sync reuses the cached plan
        engine.step(random_batch(seed=10 * step + rank, batch=2), nll_loss)
        stale, _ = _generate(rollout, prompts)
        stats = vps.sync(engine, rollout)
        tokens, logprobs = _generate(rollout, prompts)
        make_sync("naive").sync(engine, rollout)
        want_tokens, want_logprobs = _generate(rollout, prompts)
        assert tokens == want_tokens, {"vps": tokens, "naive": want_tokens}
        torch.testing.assert_close(logprobs, want_logprobs, atol=1e-5, rtol=1e-5)
        assert stale != want_tokens, "the trained step did not change greedy tokens: the test cannot tell syncs apart"
        assert stats.bytes_moved == plan.min_bytes > 0
        assert stats.rounds == vps.last.rounds >= 1
        assert stats.peak_extra_bytes >= vps.last.peak_extra_bytes
    assert len(recorder.events) == 2 * stats.rounds
    rollout.shutdown()


@pytest.mark.timeout(240)
def test_vps_sync_fsdp_dp2_to_vllm_tp2_matches_naive(tmp_path: Path) -> None:
    """Fused qkv_proj / gate_up_proj shards, padded vocabulary rows, row-parallel o_proj / down_proj columns."""
    run_ranks(_vps_vs_naive, 2, str(tmp_path / "ckpt"), "llama", False, 2)


@pytest.mark.timeout(240)
def test_vps_sync_tied_qwen2_to_two_vllm_replicas_matches_naive(tmp_path: Path) -> None:
    """qkv biases, tied embeddings (vLLM's lm_head repacked from the same received tensor), tp1 x dp2."""
    run_ranks(_vps_vs_naive, 2, str(tmp_path / "ckpt"), "qwen2", True, 1)


@pytest.mark.timeout(240)
def test_vps_sync_bf16_rollout_from_fp32_masters_matches_naive(tmp_path: Path) -> None:
    """bf16 compute on fp32 masters, bf16 vLLM: the masters are cast while packing, so half the bytes travel."""
    run_ranks(_vps_vs_naive, 2, str(tmp_path / "ckpt"), "llama", False, 2, "bf16")
