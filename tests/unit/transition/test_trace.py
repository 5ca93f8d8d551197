"""Chrome trace writer: the JSON Perfetto opens, from one recorder (gathered from real gloo ranks:
tests/ranks/transition/test_trace.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rlhf_dyna.transition.trace import TraceEvent, TraceRecorder, chrome_trace, write_chrome_trace


def test_chrome_trace_has_one_complete_event_per_round_per_rank_in_microseconds(tmp_path: Path) -> None:
    events = [TraceEvent("train_to_rollout", rank, rnd, 100.0 + rnd * 0.5 + rank * 0.001, 0.25, {"bytes_received": 8})
              for rank in range(2) for rnd in range(3)]
    path = write_chrome_trace(events, tmp_path / "t" / "transition.json")
    trace = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert len(spans) == 6
    assert {(e["pid"], e["args"]["round"]) for e in spans} == {(r, n) for r in range(2) for n in range(3)}
    assert all(e["tid"] == 0 and e["dur"] == pytest.approx(250_000.0) for e in spans)
    first = min(spans, key=lambda e: e["ts"])
    assert first["ts"] == 0.0 and (first["pid"], first["args"]["round"]) == (0, 0)
    later = next(e for e in spans if e["pid"] == 1 and e["args"]["round"] == 2)
    assert later["ts"] == pytest.approx((1.0 + 0.001) * 1e6)
    assert {e["args"]["name"] for e in trace if e["ph"] == "M"} == {"rank 0", "rank 1"}


def test_recorder_span_times_the_block_and_keeps_late_args() -> None:
    recorder = TraceRecorder(rank=3)
    with recorder.span("relayout", 0, peer=1) as args:
        time.sleep(0.02)
        args["bytes_received"] = 1024
    (event,) = recorder.events
    assert event.rank == 3 and event.round == 0 and event.duration_s >= 0.02
    assert event.args == {"peer": 1, "bytes_received": 1024}
    assert chrome_trace([])["traceEvents"] == []


def test_recorder_keeps_only_the_first_transitions_of_a_bounded_name() -> None:
    recorder = TraceRecorder(rank=0, max_transitions={"train_to_rollout": 2})
    for _ in range(3):  # three transitions of two rounds each, a relayout after each
        for rnd in range(2):
            with recorder.span("train_to_rollout", rnd):
                pass
        with recorder.span("train_relayout", 0):
            pass
    names = [(e.name, e.round) for e in recorder.events]
    assert names.count(("train_to_rollout", 0)) == names.count(("train_to_rollout", 1)) == 2
    assert names.count(("train_relayout", 0)) == 3
