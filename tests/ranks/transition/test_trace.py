"""Transition traces gathered from real gloo ranks onto rank 0 (the recorder and the Chrome format:
tests/unit/transition/test_trace.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from rlhf_dyna.transition.trace import TraceRecorder, gather_trace, write_chrome_trace
from tests.multirank import run_ranks


def _gather(rank: int, world: int, out: str) -> None:
    recorder = TraceRecorder(rank)
    for rnd in range(rank + 1):  # ranks record different numbers of rounds
        with recorder.span("x", rnd):
            pass
    events = gather_trace(recorder)
    assert (len(events) == world * (world + 1) // 2) if rank == 0 else events == []
    if rank == 0:
        write_chrome_trace(events, out)
    dist.barrier()


@pytest.mark.timeout(120)
def test_gather_trace_collects_every_rank_on_rank0(tmp_path: Path) -> None:
    run_ranks(_gather, 3, str(tmp_path / "trace.json"))
    spans = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["pid"], e["args"]["round"]) for e in spans) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
