"""Start vLLM (CPU, in this process) on the tiny Llama with a KV cache of exactly `nbytes`; print STARTED or REFUSED.

    python tests/ranks/gpu/kv_probe_worker.py NBYTES MODEL_DIR
"""
from __future__ import annotations

import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from vllm import LLM  # noqa: E402 -- after the environment above


def main() -> None:
    nbytes, model_dir = int(sys.argv[1]), sys.argv[2]
    try:
        LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, kv_cache_memory_bytes=nbytes,
            dtype="float32", max_model_len=64)
    except ValueError as err:
        print(f"REFUSED {err}", flush=True)
        return
    print("STARTED", flush=True)


if __name__ == "__main__":
    main()
