"""vLLM sampling seeds are global prompt indices: a replica that serves prompts [k, n) of a step draws, for each of
them, the samples the whole list draws (so any replica count or placement gives the same samples)."""
from __future__ import annotations

from pathlib import Path

import pytest
from torch._dynamo.utils import counters

from rlhf_dyna.models.build import build_policy, save_hf_dir
from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from tests.ranks.tiny_models import PROMPTS, tiny_spec
from tests.multirank import run_ranks


def _slices_draw_what_the_whole_list_draws(rank: int, world: int, model_dir: str) -> None:
    model = build_policy(tiny_spec("llama", False), seed=0)
    save_hf_dir(model, model.config, model_dir)
    rollout = VLLMRollout(model_dir, max_model_len=64, kv_cache_bytes=16 << 20, block_size=32)
    draw = lambda prompts, first: [[s.token_ids for s in outs] for outs in rollout.generate(
        prompts, n=2, temperature=1.0, max_tokens=8, seed=1234, first_index=first)]
    whole = draw(PROMPTS, 0)
    assert counters["frames"]["total"] == 0, "vLLM's sampler compiled a function at the first generation (cpu_worker)"
    assert draw(PROMPTS[3:], 3) == whole[3:] and draw(PROMPTS[:3], 0) == whole[:3]
    assert draw(PROMPTS[3:], 0) != whole[3:], "local indices would draw other samples: the check can fail"
    rollout.shutdown()


@pytest.mark.timeout(180)
def test_a_replica_slice_draws_the_samples_of_the_whole_list(tmp_path: Path) -> None:
    run_ranks(_slices_draw_what_the_whole_list_draws, 1, str(tmp_path / "model"))


def _prompts_over_one_step_budget(rank: int, world: int, model_dir: str) -> None:
    model = build_policy(tiny_spec("llama", False), seed=0)
    save_hf_dir(model, model.config, model_dir)
    rollout = VLLMRollout(model_dir, max_model_len=128, kv_cache_bytes=32 << 20)
    prompts = [[(7 * i + j) % 63 + 1 for j in range(100)] for i in range(24)]  # 24 x 2 x 100 > 4096 tokens a step
    draw = lambda ps, first: [[s.token_ids for s in outs] for outs in rollout.generate(
        ps, n=2, temperature=1.0, max_tokens=4, seed=99, first_index=first)]
    whole = draw(prompts, 0)  # vLLM 0.32 on the CPU crashed here when it cut a seeded prompt across two steps
    assert draw(prompts[20:], 20) == whole[20:]  # a prompt that waited for a later step drew its own samples
    rollout.shutdown()


@pytest.mark.timeout(180)
def test_seeded_prompts_beyond_one_step_of_tokens_generate(tmp_path: Path) -> None:
    run_ranks(_prompts_over_one_step_budget, 1, str(tmp_path / "model"))
