"""Syncs of a trained tiny Qwen3-MoE into real in-rank vLLM (CPU): `naive` after the first step, `vps` after the
second; HF per-expert weights land in vLLM's fused `w13` / `w2` expert tensors (TP slices of every expert, or whole
experts under vLLM's expert parallelism), and vLLM's greedy tokens then equal HF `generate` on the trained weights.

The tokens before the sync must differ from the synced ones, so a sync that moved nothing (or the wrong experts)
fails; verification checksums every received piece against its source, and the staged expert tensors of each rank
are compared with the experts and widths the live vLLM layers hold (their expert map)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.models.build import ModelSpec, build_policy, make_hf_config, save_hf_dir
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.bind_vllm import vllm_model
from rlhf_dyna.transition.sync import NaiveSync
from rlhf_dyna.transition.vps_sync import VpsSync
from rlhf_dyna.vps.cache import cached_plan
from rlhf_dyna.vps.spec import ParallelSpec, rollout_spec
from tests.ranks.tiny_models import VOCAB, hf_greedy_of, nll_loss, random_batch
from tests.multirank import run_ranks

SPEC = ModelSpec(arch="qwen3_moe", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.2,
                 num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
PROMPTS = [[(7 * i + 3) % 64 for i in range(20)], [5, 9, 3], [17, 2, 44, 8, 30], [60, 1], [12, 50, 33, 21, 9, 4]]
NEW_TOKENS = 8


def _hf_greedy(weights: dict[str, torch.Tensor], prompts: list[list[int]]) -> list[list[int]]:
    return hf_greedy_of(SPEC, weights, prompts, NEW_TOKENS)


def _check_staged_experts(staged: dict[str, torch.Tensor], rollout: VLLMRollout, weights: dict[str, torch.Tensor],
                          dtype: torch.dtype) -> int:
    """Each staged w13 / w2 holds exactly the experts (and the intermediate slice) its live vLLM layer holds."""
    checked = 0
    for name, tensor in staged.items():
        prefix, _, attr = name.rpartition(".")
        if attr not in ("w13_weight", "w2_weight"):
            continue
        layer = vllm_model(rollout).get_submodule(prefix)
        config = layer.moe_config
        held = torch.arange(config.num_experts) if layer.expert_map is None else torch.nonzero(layer.expert_map >= 0).flatten()
        width, part = config.intermediate_size_per_partition, config.moe_parallel_config.tp_rank
        cols = slice(part * width, (part + 1) * width)
        experts = prefix[: prefix.index(".experts.") + len(".experts")]  # vLLM: ...mlp.experts.routed_experts
        hf = f"{experts}.{'gate_up_proj' if attr == 'w13_weight' else 'down_proj'}"
        full = weights[hf][held].to(dtype)
        if attr == "w13_weight":  # HF [gate; up] rows per expert -> vLLM [gate_r; up_r]
            gate, up = full.chunk(2, dim=1)
            want = torch.cat([gate[:, cols], up[:, cols]], dim=1)
        else:
            want = full[:, :, cols]
        assert torch.equal(tensor, want), f"{name}: staged experts differ from the live layer's {held.tolist()}"
        checked += 1
    return checked


def _sync_and_compare(rank: int, world: int, model_dir: str, rollout_tp: int, expert_parallel: bool = False) -> None:
    engine = TrainEngine(build_policy(SPEC, seed=0), build_mesh(ParallelLayout(world, 1)), lr=3e-2)
    if rank == 0:
        save_hf_dir(build_policy(SPEC, seed=0), make_hf_config(SPEC), model_dir)  # vLLM starts from the initial weights
    dist.barrier()
    rollout = VLLMRollout(model_dir, tp=rollout_tp, seed=0, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32,
                          expert_parallel=expert_parallel)
    prompts = PROMPTS[rollout.dp_rank :: rollout.dp_size]
    initial = [s[0].token_ids for s in rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)]
    assert initial == _hf_greedy(dict(full_state_dict(engine)), prompts), "vLLM differs from HF before any training"
    plan = cached_plan(catalog_from_config(engine.model.config, "float32", "float32"), ParallelSpec(dp=world),
                       rollout_spec(rollout_tp, world // rollout_tp, expert_parallel=expert_parallel), world)
    vps = VpsSync(budget_bytes=1 << 14, verify=True)
    staged: list[dict[str, torch.Tensor]] = []
    vps.on_staged = lambda group: staged.append({n: t.clone() for n, t in group.items()})  # staging is reused
    for step, sync in enumerate((NaiveSync(), vps)):  # naive: vLLM's own loader by per-expert names, then repacked
        engine.step(random_batch(seed=10 * step + rank, batch=2), nll_loss)
        stale = [s[0].token_ids for s in rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)]
        stats = sync.sync(engine, rollout)
        tokens = [s[0].token_ids for s in rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)]
        weights = dict(full_state_dict(engine))
        want = _hf_greedy(weights, prompts)
        assert tokens == want, {"sync": sync.name, "vllm": tokens, "hf": want, "before_sync": stale}
        assert stale != want, "the trained step did not change greedy tokens: the test cannot tell a sync from none"
    assert stats.bytes_moved == plan.min_bytes and (world == 1 or plan.min_bytes > 0)  # one rank: local copies only
    checked = sum(_check_staged_experts(group, rollout, weights, torch.float32) for group in staged)
    assert checked == 2 * SPEC.num_hidden_layers, checked
    rollout.shutdown()


@pytest.mark.timeout(240)
def test_vps_sync_moe_fsdp_dp2_to_vllm_tp2_greedy_matches_hf(tmp_path: Path) -> None:
    """vLLM TP splits every expert's intermediate dim: each rank gets its rows of w13 (gate and up) and cols of w2."""
    run_ranks(_sync_and_compare, 2, str(tmp_path / "ckpt"), 2)


@pytest.mark.timeout(120)
def test_vps_sync_moe_single_rank_vllm_tp1_greedy_matches_hf(tmp_path: Path) -> None:
    """One rank: the whole of every expert lands in w13 / w2, re-prepacked for vLLM's CPU MoE kernel."""
    run_ranks(_sync_and_compare, 1, str(tmp_path / "ckpt"), 1)


@pytest.mark.timeout(240)
def test_vps_sync_moe_into_vllm_expert_parallel_tp2_greedy_matches_hf(tmp_path: Path) -> None:
    """vLLM's expert parallelism (enable_expert_parallel, tp2): each rank holds 2 of the 4 experts whole; FSDP2's dp2
    shards hold the same experts, so the experts move by local copy and only the dense part crosses the wire."""
    run_ranks(_sync_and_compare, 2, str(tmp_path / "ckpt"), 2, True)
