"""Pre-spawn refusals of a run's devices and GPU memory (checks/gpu.py), one paragraph each, with the node's GPU count
and memory given (those this machine can produce, through the real CLI: tests/app/gpu/test_gpu_checks.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from rlhf_dyna.errors import ConfigError
from rlhf_dyna.checks.gpu import check_gpu, check_gpus_per_node, check_kv_cache
from rlhf_dyna.config import Config


def gpu_config(**rollout) -> Config:
    cfg = Config()
    cfg.parallel.device, cfg.parallel.world_size = "cuda", 4
    cfg.rollout = replace(cfg.rollout, **rollout)
    return cfg


def test_more_ranks_than_gpus_without_torchrun() -> None:
    with pytest.raises(ConfigError, match=r"4 ranks on this node need one GPU each but 2 GPU\(s\) are visible .* "
                                          r"torchrun on several nodes"):
        check_gpus_per_node(gpu_config(), gpus=2, under_torchrun=False)
    check_gpus_per_node(gpu_config(), gpus=4, under_torchrun=False)
    cfg = gpu_config()
    cfg.parallel.device = "cpu"
    check_gpus_per_node(cfg, gpus=2, under_torchrun=False)  # a CPU run on a GPU node needs no GPU


def test_a_gpu_budget_without_room_for_one_sequence_names_the_minimum() -> None:
    cfg = gpu_config(kv_cache_bytes=0, gpu_memory_utilization=0.05)
    cfg.model = replace(cfg.model, num_hidden_layers=28, hidden_size=3584, num_attention_heads=28,
                        num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768)
    # Qwen2.5-7B-shaped in bf16 on an 80 GB card: ~15 GB of weights do not fit in 5 % of it
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization=0.05 of a 74.5 GiB GPU leaves vLLM 0.00 GiB after "
                                          r"its 14.\d+ GiB of weights .* Raise rollout.gpu_memory_utilization above 0.2"):
        check_kv_cache(cfg, "cuda", gpu_bytes=80 * 10**9)
    check_kv_cache(replace(cfg, rollout=replace(cfg.rollout, gpu_memory_utilization=0.5)), "cuda", gpu_bytes=80 * 10**9)
    check_kv_cache(cfg, "cuda", gpu_bytes=None)  # memory unknown (no NVML): nothing to say before spawn


def test_all_checks_pass_a_fitting_gpu_run() -> None:
    check_gpu(gpu_config(kv_cache_bytes=0), under_torchrun=False, gpus=4, gpu_bytes=80 * 10**9)
    check_gpu(Config(), under_torchrun=False)  # the default recipe on this CPU machine
