"""`sync=vps` into real in-rank vLLM: the same trained weights give the same greedy tokens and log-probs as `naive`,
and (fp32) those are HF's greedy tokens and the train engine's log-probs.

Both syncs run on the same trained engine, one after the other; the tokens before any sync must differ from the
synced ones, so a sync that moved nothing (or the wrong shard) fails. Verification is on: every piece a rank
receives is checksummed against its source. A 40-token prompt fills vLLM's prefix cache with the old weights' KV
before each sync, so a sync that left it stale would differ from HF.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.parallel_layout import ParallelLayout, RolloutLayout
from rlhf_dyna.models.build import build_policy, save_hf_dir
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.syncs import make_sync
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.vps_sync import VpsSync
from rlhf_dyna.vps.cache import cached_plan
from rlhf_dyna.transition.bind_train import train_spec
from rlhf_dyna.transition.bind_vllm import rollout_spec
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.vps.relay import RELAY_EXTRA_BYTES
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from tests.ranks.tiny_models import NEW_TOKENS, PROMPTS, hf_greedy, nll_loss, random_batch, tiny_spec
from tests.multirank import run_ranks


def _generate(rollout: VLLMRollout, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    out = rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)
    return [s[0].token_ids for s in out], torch.tensor([lp for s in out for lp in s[0].logprobs])


def _vps_vs_naive(rank: int, world: int, model_dir: str, arch: str, tie: bool, rollout_tp: int,
                  precision: str = "fp32", relayed: bool = False) -> None:
    spec = tiny_spec(arch, tie)
    engine = TrainEngine(build_policy(spec, seed=0), build_mesh(ParallelLayout(world, 1)), lr=3e-2, precision=precision)
    if rank == 0:
        save_hf_dir(build_policy(spec, seed=0), build_policy(spec).config, model_dir)
    dist.barrier()
    rollout = VLLMRollout(model_dir, tp=rollout_tp, seed=0, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32,
                          dtype="bfloat16" if precision == "bf16" else "float32")
    prompts = PROMPTS[rollout.dp_rank :: rollout.dp_size]
    # the live binding and the parallel layouts the dry run plans from name the same two layouts
    live = (train_spec(bind_train_state(engine)), rollout_spec(rollout))
    assert live == (ParallelLayout(world, 1).spec(), RolloutLayout(world, rollout_tp).spec()), live
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
        naive = make_sync("naive").sync(engine, rollout)
        want_tokens, want_logprobs = _generate(rollout, prompts)
        assert tokens == want_tokens, {"vps": tokens, "naive": want_tokens}
        torch.testing.assert_close(logprobs, want_logprobs, atol=1e-5, rtol=1e-5)
        assert stale != want_tokens, "the trained step did not change greedy tokens: the test cannot tell syncs apart"
        assert stats.bytes_moved == int(vps.pair_bytes().sum())
        if relayed:  # through one replica: up to 1% more (the second ranks' own slices of norms are sent too)
            assert vps.relayed and plan.min_bytes < stats.bytes_moved <= plan.min_bytes * (1 + RELAY_EXTRA_BYTES)
        else:
            assert not vps.relayed and stats.bytes_moved == plan.min_bytes > 0
        assert stats.rounds == vps.last.rounds >= 1
        assert stats.peak_extra_bytes >= vps.last.peak_extra_bytes
    assert len(recorder.events) == 2 * stats.rounds
    if precision == "fp32":
        _naive_is_hf(engine, rollout, prompts, naive, want_tokens, arch, tie, world)
    rollout.shutdown()


def _engine_logprobs(engine: TrainEngine, prompts: list[list[int]], responses: list[list[int]]) -> list[torch.Tensor]:
    """The train engine's log-probs of each response token, from one left-padded batch."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    logp = engine.logprobs(ids, mask)
    return [logp[i, width - len(r):] for i, r in enumerate(responses)]


def _naive_is_hf(engine, rollout, prompts, naive, tokens, arch: str, tie: bool, world: int) -> None:
    """After the naive sync: vLLM's greedy tokens are HF's on the gathered weights, greedy and sampled log-probs are
    the train engine's, and naive moved what a gather moves (each rank receives the other (W-1)/W, tensor by tensor)."""
    full = {name: t.clone() for name, t in full_state_dict(engine)}
    param_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())  # tied counted once
    assert naive.rounds == len(list(engine.model.parameters()))
    assert naive.bytes_moved == (world - 1) * param_bytes
    assert 0 < naive.peak_extra_bytes <= param_bytes
    assert tokens == hf_greedy(full, arch, tie, prompts), {"vllm": tokens}
    greedy = rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)
    sampled = rollout.generate(prompts, n=2, temperature=1.0, max_tokens=NEW_TOKENS, seed=1234)
    for samples in (greedy, sampled):
        flat = [(p, s) for p, group in zip(prompts, samples) for s in group]
        for (_, sample), ref in zip(flat, _engine_logprobs(engine, [p for p, _ in flat], [s.token_ids for _, s in flat])):
            torch.testing.assert_close(torch.tensor(sample.logprobs), ref, atol=2e-4, rtol=1e-4)


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


@pytest.mark.timeout(300)
def test_vps_sync_fsdp_dp4_to_vllm_tp2_dp2_relayed_through_one_replica_matches_naive(tmp_path: Path) -> None:
    """4 ranks, bf16 vLLM tp2 x dp2: ranks 0 and 3 assemble their TP shard (each holds a quarter of it), then pass
    their staging whole to the other replica's rank (vps.relay); every piece is checksummed against its source."""
    run_ranks(_vps_vs_naive, 4, str(tmp_path / "ckpt"), "llama", False, 2, "bf16", True)
