"""Pre-spawn refusals of a run's devices and GPU memory (checks/gpu.py), one paragraph each: through the real CLI where
this machine can produce the condition, otherwise with the node's GPU count and memory given."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from rlhf_dyna.checks.errors import ConfigError
from rlhf_dyna.checks.gpu import check_gpu, check_gpus_per_node, check_kv_cache
from rlhf_dyna.config import Config
from tests.app.cli.test_bad_input import run_cli

CLI_CASES = [
    (["parallel.device=cuda"], "parallel.device=cuda: the run needs 2 CUDA devices but this machine shows none "
                               "(a CPU build of torch"),
    (["rollout.gpu_memory_utilization=0"], "rollout.gpu_memory_utilization=0.0 is outside (0, 1]"),
    (["rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization=1.5 is outside (0, 1]"),
    # the minimum vLLM 0.32 enforces for this model (tests/ranks/gpu/test_kv_minimum.py)
    (["rollout.kv_cache_bytes=262143"], "rollout.kv_cache_bytes=262,143 cannot hold one sequence: one sequence of "
                                        "rollout.max_model_len=64 tokens needs 262,144 bytes"),
]


@pytest.mark.parametrize("args,expected", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_refused_through_the_cli_before_spawning(args, expected, tmp_path) -> None:
    start = time.monotonic()
    proc = run_cli(*args, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
    assert not list((tmp_path / "run").glob("rank*.log")), "a rank was spawned"


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
