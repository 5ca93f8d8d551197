"""The KV minimum that checks/gpu.py names is the one vLLM 0.32 enforces: on the CPU with the tiny Llama of the
default recipe, one byte less is refused at start-up and the minimum starts."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlhf_dyna.checks.gpu import kv_shape
from rlhf_dyna.config import Config
from rlhf_dyna.models.build import ModelSpec, build_policy, make_hf_config, save_hf_dir
from rlhf_dyna.rollout.gpu_defaults import KV_BLOCK_TOKENS, sequence_kv_bytes
from tests.forkserver import forkserver


def _start_vllm(nbytes: int, model_dir: str, result: str) -> None:
    """In a process forked from the tests' forkserver (vLLM imported): start vLLM in it on the tiny Llama with a KV
    cache of exactly `nbytes`; STARTED or REFUSED into `result`."""
    from vllm import LLM

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, kv_cache_memory_bytes=nbytes,
            dtype="float32", max_model_len=64, block_size=KV_BLOCK_TOKENS["cpu"])
        outcome = "STARTED"
    except ValueError as err:
        outcome = f"REFUSED {err}"
    Path(result).write_text(outcome)
    os._exit(0)  # the engine goes with the process


def probe(nbytes: int, model_dir: Path) -> str:
    result = model_dir / f"probe_{nbytes}.txt"
    child = forkserver().Process(target=_start_vllm, args=(nbytes, str(model_dir), str(result)))
    child.start()
    child.join(300)
    assert child.exitcode == 0, f"the probe process ended with {child.exitcode}"
    return result.read_text()


@pytest.mark.timeout(600)
def test_vllm_starts_at_the_named_minimum_and_not_below(tmp_path: Path) -> None:
    cfg = Config()  # conf/model/tiny_llama.yaml: 2 layers, 2 KV heads of 32, fp32, max_model_len 64
    cfg.model.vocab_size, cfg.model.hidden_size, cfg.model.intermediate_size = 32, 128, 512
    m = cfg.model
    spec = ModelSpec(arch=m.arch, vocab_size=m.vocab_size, hidden_size=m.hidden_size,
                     intermediate_size=m.intermediate_size, num_hidden_layers=m.num_hidden_layers,
                     num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                     max_position_embeddings=m.max_position_embeddings)
    save_hf_dir(list(build_policy(spec, seed=0).state_dict().items()), make_hf_config(spec), tmp_path)
    need = sequence_kv_bytes(kv_shape(cfg, "cpu"), m.max_position_embeddings, "cpu")
    assert need == 98_304  # three 32-token blocks (the sequence's two and the one vLLM keeps back) of 1 KiB a token
    assert probe(need - 1, tmp_path).startswith("REFUSED")
    assert probe(need, tmp_path) == "STARTED"
