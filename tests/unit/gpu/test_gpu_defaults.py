"""vLLM's settings per device (rollout/gpu_defaults.py): fast on CUDA, unchanged on the CPU."""
from __future__ import annotations

from rlhf_dyna.config import Config
from rlhf_dyna.rollout.gpu_defaults import (
    CPU_KV_CACHE_CEILING, KvShape, cpu_kv_cache_bytes, engine_args, enforce_eager, memory_args, replica_sequences,
    rollout_dtype, sequence_kv_bytes,
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
    assert sequence_kv_bytes(shape, 64, "cpu") == 3 * 32 * shape.bytes_per_token  # 32-token blocks on the CPU
    assert KvShape(28, 4, 128, tp=8, dtype="bfloat16").bytes_per_token == shape.bytes_per_token // 4  # 1 head a rank


def test_engine_args_from_the_config() -> None:
    cfg = Config()
    cpu = engine_args(cfg, "cpu", colocated=True, replicas=4)
    assert cpu == dict(dtype="float32", kv_cache_bytes=cpu_kv_cache_bytes(cfg, 4), gpu_memory_utilization=0.5,
                       enforce_eager=True, block_size=32, sleep_level=0)  # no sleep mode on the CPU
    cfg.rollout.kv_cache_bytes = 64 << 20
    assert engine_args(cfg, "cpu", colocated=True, replicas=4)["kv_cache_bytes"] == 64 << 20  # a set size is kept
    cuda = engine_args(cfg, "cuda", colocated=True, replicas=4)
    assert (cuda["dtype"], cuda["enforce_eager"], cuda["sleep_level"], cuda["block_size"]) == ("bfloat16", False, 1, None)
    assert "sleep_level" not in engine_args(cfg, "cuda", colocated=False, replicas=4)  # a split engine has its GPU
    cfg.rollout.kv_cache_bytes = 0
    assert engine_args(cfg, "cuda", colocated=True, replicas=4)["kv_cache_bytes"] == 0  # vLLM sizes it on a GPU


def test_the_derived_cpu_kv_cache_holds_a_replicas_sequences() -> None:
    cfg = Config()
    cfg.model.num_hidden_layers, cfg.model.num_key_value_heads, cfg.model.head_dim = 2, 2, 32  # fp32: 1 KiB a token
    cfg.model.max_position_embeddings = 64  # max_model_len: two blocks
    assert max(cfg.task.prompts_per_step * cfg.rollout.n, cfg.task.eval_size) == 128
    assert replica_sequences(cfg, 4) == 32 and replica_sequences(cfg, 3) == 43 and replica_sequences(cfg, 1) == 128
    block = 32 * 1024
    assert cpu_kv_cache_bytes(cfg, 4) == (32 * 2 + 1) * block  # each sequence's two blocks, one kept back by vLLM
    cfg.task.eval_size = 512  # the eval's share is the larger one
    assert cpu_kv_cache_bytes(cfg, 4) == (128 * 2 + 1) * block
    cfg.model.num_hidden_layers = 2_000  # 1,000x the bytes: the ceiling
    assert cpu_kv_cache_bytes(cfg, 4) == CPU_KV_CACHE_CEILING
    cfg.model.max_position_embeddings = 64 * 1024  # one sequence past the ceiling: vLLM's minimum, one sequence
    one = sequence_kv_bytes(KvShape(2_000, 2, 32, tp=1, dtype="float32"), 64 * 1024, "cpu")
    assert one > CPU_KV_CACHE_CEILING and cpu_kv_cache_bytes(cfg, 4) == one
