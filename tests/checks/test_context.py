"""Context length and the KV cache minimum: the messages, and the minimum against vLLM itself."""
from __future__ import annotations

import subprocess
import sys

import pytest

from rlhf_dyna.checks.context import check_kv_cache, check_lengths, min_kv_cache_bytes
from rlhf_dyna.checks.errors import ConfigError
from rlhf_dyna.config import Config
from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from rlhf_dyna.rollout.context_length import max_model_len


def file_config(max_prompt_tokens: int = 256, max_new_tokens: int = 48, positions: int = 8192) -> Config:
    cfg = Config()
    cfg.task.name, cfg.task.max_prompt_tokens = "file", max_prompt_tokens
    cfg.rollout.max_new_tokens, cfg.model.max_position_embeddings, cfg.model.path = max_new_tokens, positions, "/ckpt"
    return cfg


def test_max_model_len_is_what_prompts_and_completions_need():
    assert max_model_len(file_config()) == 256 + 48  # not the checkpoint's 8192
    assert max_model_len(file_config(max_prompt_tokens=0)) == 8192  # unbounded prompts: the model's positions
    toy = Config()
    assert max_model_len(toy) == toy.model.max_position_embeddings
    explicit = file_config()
    explicit.rollout.max_model_len = 1000
    assert max_model_len(explicit) == 1000


@pytest.mark.parametrize("change,message", [
    (dict(positions=128), "task.max_prompt_tokens + rollout.max_new_tokens = 256 + 48 = 304 exceeds the model's "
                          "max_position_embeddings=128 (/ckpt/config.json)"),
    (dict(max_model_len=9000), "rollout.max_model_len=9000 exceeds the model's max_position_embeddings=8192"),
    (dict(max_model_len=300), "= 304 exceeds rollout.max_model_len=300 (vLLM's context); raise rollout.max_model_len "
                              "to at least 304"),
])
def test_lengths_that_cannot_fit_name_the_keys(change, message):
    cfg = file_config(positions=change.get("positions", 8192))
    cfg.rollout.max_model_len = change.get("max_model_len", 0)
    with pytest.raises(ConfigError) as err:
        check_lengths(cfg)
    assert message in str(err.value)


def test_kv_minimum_scales_with_layers_heads_dtype_and_blocks():
    cfg = file_config(max_prompt_tokens=100, max_new_tokens=28)  # 128 tokens: one CPU block (+ the pool's one)
    m = cfg.model
    m.num_hidden_layers, m.num_key_value_heads, m.head_dim = 30, 3, 64
    assert min_kv_cache_bytes(cfg, "cpu") == 30 * (2 * 128 * 3 * 64 * 4) * 2
    cfg.trainer.precision = "bf16"
    assert min_kv_cache_bytes(cfg, "cpu") == 30 * (2 * 128 * 3 * 64 * 2) * 2
    assert min_kv_cache_bytes(cfg, "cuda") == 30 * (2 * 16 * 3 * 64 * 2) * (8 + 1)
    cfg.rollout.tp = 3  # one KV head per rank
    assert min_kv_cache_bytes(cfg, "cuda") == 30 * (2 * 16 * 1 * 64 * 2) * (8 + 1)
    cfg.rollout.kv_cache_bytes = min_kv_cache_bytes(cfg, "cuda") - 1
    with pytest.raises(ConfigError, match=r"rollout.kv_cache_bytes=\d+ .* too small .* Set rollout.kv_cache_bytes >= "):
        check_kv_cache(cfg, "cuda")
    cfg.rollout.kv_cache_bytes = 0  # vLLM sizes it
    check_kv_cache(cfg, "cuda")


VLLM_START = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM
try:
    LLM(model=sys.argv[1], skip_tokenizer_init=True, enforce_eager=True, kv_cache_memory_bytes=int(sys.argv[2]),
        max_model_len=int(sys.argv[3]), dtype="float32")
    print("STARTED")
except ValueError as err:
    print("REFUSED", err)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_minimum_is_exactly_what_vllm_starts_with(tmp_path):
    """At the minimum vLLM's CPU engine starts; one byte less and it refuses (the check would have said so first)."""
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", num_hidden_layers=2)
    cfg = file_config(max_prompt_tokens=150, max_new_tokens=50)  # 200 tokens: two blocks of 128
    cfg.model.num_hidden_layers, cfg.model.num_key_value_heads, cfg.model.head_dim = 2, 2, 32
    need = min_kv_cache_bytes(cfg, "cpu")
    for kv, expected in ((need, "STARTED"), (need - 1, "REFUSED")):
        out = subprocess.run([sys.executable, "-c", VLLM_START, str(ckpt), str(kv), "200"], capture_output=True,
                             text=True, timeout=240, env={"PATH": "/usr/bin:/bin", "VLLM_LOGGING_LEVEL": "ERROR"})
        assert expected in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
