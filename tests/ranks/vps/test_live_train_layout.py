"""The VPS train layout agrees, element for element, with what FSDP2, DTensor TP and expert parallel hold on gloo ranks."""
from __future__ import annotations

from pathlib import Path

import pytest

from .spawn_ranks import run_ranks


@pytest.mark.timeout(300)
def test_layout_matches_fsdp2_and_dtensor_tp():
    """FSDP2 over 4 ranks (uneven and empty shards), FSDP2 x TP on (2, 2) (_StridedShard) in both rank orders,
    TP with DP replicas, tied embeddings under FSDP2 x TP, pipeline stages (uneven, tied embedding across stages)
    with FSDP2 inside each stage, and expert parallel (Qwen3-MoE experts over ep, FSDP2 over edp, uneven chunks)."""
    cases = ["fsdp4", "fsdp2_tp2", "ddp2_tp2", "fsdp2_tp2_tp_outer", "fsdp2_tp2_tied", "pp2_fsdp2", "pp2_fsdp2_tied", "pp2_tp2",
             "ep2_fsdp2", "ep4"]
    outs = run_ranks(Path(__file__).with_name("live_train_worker.py"), 4, cases)
    for case in cases:
        assert all(f"{case}: rank" in o and " 0 pieces" not in o for o in outs), outs
