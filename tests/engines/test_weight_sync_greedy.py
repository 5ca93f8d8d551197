"""Train one FSDP2 step, NaiveSync the weights into in-rank vLLM, and check vLLM against HF and the train engine."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlhf_dyna.models.build import build_policy, save_hf_dir
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.train.engine import TrainEngine, full_state_dict
from rlhf_dyna.train.mesh import build_mesh
from rlhf_dyna.transition.sync import make_sync
from tests.engines._common import nll_loss, random_batch, tiny_spec
from tests.engines._dist import run_ranks

LONG = [(7 * i + 3) % 64 for i in range(40)]  # > one 32-token block: its KV lands in the prefix cache
PROMPTS = [LONG, LONG[:35] + [1, 2], [5, 9, 3], [17, 2, 44, 8, 30], [60, 1], [12, 50, 33, 21, 9, 4]]
NEW_TOKENS = 8


def _hf_greedy(weights: dict[str, torch.Tensor], arch: str, tie: bool, prompts: list[list[int]]) -> list[list[int]]:
    model = build_policy(tiny_spec(arch, tie)).eval()
    model.load_state_dict(weights)
    out = []
    for prompt in prompts:  # one at a time: no padding in the reference
        ids = torch.tensor([prompt])  # explicit mask: without one HF treats every pad_token_id in the prompt as padding
        ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        out.append(ids[0, len(prompt):].tolist())
    return out


def _engine_logprobs(engine: TrainEngine, prompts: list[list[int]], responses: list[list[int]]) -> list[torch.Tensor]:
    """The train engine's log-probs of each response token, from one left-padded batch."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    logp = engine.logprobs(ids, mask)
    return [logp[i, width - len(r):] for i, r in enumerate(responses)]


def _sync_and_compare(rank: int, world: int, model_dir: str, arch: str, tie: bool, rollout_tp: int) -> None:
    spec = tiny_spec(arch, tie)
    engine = TrainEngine(build_policy(spec, seed=0), build_mesh(world, 1), lr=1e-2)
    if rank == 0:
        save_hf_dir(build_policy(spec, seed=0), build_policy(spec).config, model_dir)  # vLLM starts from the initial weights
    dist.barrier()
    engine.step(random_batch(seed=rank, batch=2), nll_loss)
    rollout = VLLMRollout(model_dir, tp=rollout_tp, seed=0, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32)
    prompts = PROMPTS[rollout.dp_rank :: rollout.dp_size]  # each rollout replica its own shard, TP peers the same

    stale = rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)  # fills the prefix cache with old KV
    stats = make_sync("naive").sync(engine, rollout)
    full = {name: t.clone() for name, t in full_state_dict(engine)}
    param_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())  # tied counted once
    assert stats.rounds == len(list(engine.model.parameters()))
    assert stats.bytes_moved == (world - 1) * param_bytes  # dp-sharded: each rank receives the other (W-1)/W
    assert 0 < stats.peak_extra_bytes <= param_bytes

    greedy = rollout.generate(prompts, temperature=0.0, max_tokens=NEW_TOKENS)
    vllm_tokens = [s[0].token_ids for s in greedy]
    hf_tokens = _hf_greedy(full, arch, tie, prompts)
    assert vllm_tokens == hf_tokens, {"vllm": vllm_tokens, "hf": hf_tokens, "vllm_before_sync": [s[0].token_ids for s in stale]}

    sampled = rollout.generate(prompts, n=2, temperature=1.0, max_tokens=NEW_TOKENS, seed=1234)
    for samples in (greedy, sampled):
        flat = [(p, s) for p, group in zip(prompts, samples) for s in group]
        for (_, sample), ref in zip(flat, _engine_logprobs(engine, [p for p, _ in flat], [s.token_ids for _, s in flat])):
            torch.testing.assert_close(torch.tensor(sample.logprobs), ref, atol=2e-4, rtol=1e-4)
    rollout.shutdown()


@pytest.mark.timeout(180)
def test_llama_fsdp_dp2_to_vllm_tp2_greedy_matches_hf(tmp_path: Path) -> None:
    run_ranks(_sync_and_compare, 2, str(tmp_path / "ckpt"), "llama", False, 2)


@pytest.mark.timeout(180)
def test_qwen2_tied_fsdp_dp2_to_vllm_tp1_x2_greedy_matches_hf(tmp_path: Path) -> None:
    run_ranks(_sync_and_compare, 2, str(tmp_path / "ckpt"), "qwen2", True, 1)
