"""vLLM's settings per device (rollout/gpu_defaults.py): fast on CUDA, unchanged on the CPU."""
from __future__ import annotations

from rlhf_dyna.config import Config
from rlhf_dyna.rollout.gpu_defaults import (
    KvShape, engine_args, enforce_eager, memory_args, rollout_dtype, sequence_kv_bytes,
)


def test_cuda_rolls_out_in_the_models_low_precision_and_the_cpu_as_before() -> None:
    assert rollout_dtype("cuda", "fp32", "bfloat16") == "bfloat16"  # fp32 masters, bf16 vLLM (FlashAttention)
    assert rollout_dtype("cuda", "fp32", "float16") == "float16"
    assert rollout_dtype("cuda", "fp32", "float32") == "float32"
    assert rollout_dtype("cpu", "fp32", "bfloat16") == "float32"  # the CPU path's choice is the trainer's precision
    assert rollout_dtype("cpu", "bf16", "bfloat16") == "bfloat16"


def test_cuda_graphs_on_cuda_unless_asked_eager_on_the_cpu() -> None:
    assert enforce_eager("cuda", None) is False
    assert enforce_eager("cpu", None) is True
    assert enforce_eager("cuda", True) is True


def test_memory_keywords_per_device() -> None:
    assert memory_args("cpu", 64 << 20, 0.5) == {"kv_cache_memory_bytes": 64 << 20}  # never a NUMA-node share
    assert memory_args("cuda", 0, 0.4) == {"gpu_memory_utilization": 0.4, "kv_cache_memory_bytes": None}
    assert memory_args("cuda", 1 << 30, 0.4) == {"gpu_memory_utilization": 0.4, "kv_cache_memory_bytes": 1 << 30}


def test_one_sequence_of_kv_in_whole_blocks() -> None:
    # Qwen2.5-7B: 28 layers, 4 KV heads of 128, bf16: 57,344 bytes a token on one rank
    shape = KvShape(layers=28, kv_heads=4, head_dim=128, tp=1, dtype="bfloat16")
    assert shape.bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert sequence_kv_bytes(shape, 4096, "cuda") == (4096 + 16) * shape.bytes_per_token  # + vLLM's null block
    assert sequence_kv_bytes(shape, 4097, "cuda") == (4112 + 16) * shape.bytes_per_token  # 16-token blocks
    assert sequence_kv_bytes(shape, 64, "cpu") == 2 * 128 * shape.bytes_per_token  # the CPU backend's 128-token blocks
    assert KvShape(28, 4, 128, tp=8, dtype="bfloat16").bytes_per_token == shape.bytes_per_token // 4  # 1 head a rank


def test_engine_args_from_the_config() -> None:
    cfg = Config()
    cpu = engine_args(cfg, "cpu", colocated=True)
    assert cpu == dict(dtype="float32", kv_cache_bytes=64 << 20, gpu_memory_utilization=0.5, enforce_eager=True,
                       sleep_level=0)  # what the CPU engine got before, and no sleep mode
    cuda = engine_args(cfg, "cuda", colocated=True)
    assert (cuda["dtype"], cuda["enforce_eager"], cuda["sleep_level"]) == ("bfloat16", False, 1)
    assert "sleep_level" not in engine_args(cfg, "cuda", colocated=False)  # a split engine has its GPU to itself
