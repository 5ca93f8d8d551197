"""The VPS train layout agrees, element for element, with what FSDP2 and DTensor TP hold on gloo ranks."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("live_train_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, args: list[str]) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{out[-3000:]}"
    return outs


@pytest.mark.timeout(300)
def test_layout_matches_fsdp2_and_dtensor_tp():
    """FSDP2 over 4 ranks (uneven and empty shards), FSDP2 x TP on (2, 2) (_StridedShard), TP with DP replicas."""
    cases = ["fsdp4", "fsdp2_tp2", "ddp2_tp2"]
    outs = run_ranks(4, cases)
    for case in cases:
        assert all(f"{case}: rank" in o and " 0 pieces" not in o for o in outs), outs
