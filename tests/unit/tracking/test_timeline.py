"""The timeline: a step's phase timings become per-rank events of the Chrome trace and bars of timeline.png."""
from __future__ import annotations

import json

import pytest

from rlhf_dyna.tracking.timeline import record_step_phases, write_timeline_png
from rlhf_dyna.transition.trace import TraceRecorder, write_chrome_trace

TIMINGS = {"timing_s/gen": 0.5, "timing_s/prepare": 0.2, "timing_s/train_actor": 0.3, "timing_s/train_critic": 0.1,
           "timing_s/train": 0.4, "reward/mean": 1.0}


def test_phases_become_back_to_back_events_per_rank(tmp_path):
    events = []
    for rank in (0, 1):
        rec = TraceRecorder(rank)
        record_step_phases(rec, 1, 100.0, TIMINGS)
        rec.add("train_to_rollout", 0, 101.1, 0.05, {"bytes_sent": 10})
        events += rec.events
    names = [e.name for e in events if e.rank == 1]
    assert names == ["phase/generate", "phase/prepare", "phase/train_actor", "phase/train_critic", "train_to_rollout"]
    starts = [e.start_s for e in events if e.rank == 0][:4]
    assert starts == pytest.approx([100.0, 100.5, 100.7, 101.0])
    trace = json.loads(write_chrome_trace(events, tmp_path / "t.json").read_text())["traceEvents"]
    phases = [e for e in trace if e.get("cat") == "phase"]
    assert {e["pid"] for e in phases} == {0, 1} and len(phases) == 8
    assert phases[0]["args"]["roles"] == "rollout" and phases[0]["dur"] == pytest.approx(0.5e6)
    png = write_timeline_png(events, tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_grpo_step_has_no_critic_phase():
    rec = TraceRecorder(0)
    record_step_phases(rec, 1, 0.0, {k: v for k, v in TIMINGS.items() if "critic" not in k})
    assert [e.name for e in rec.events] == ["phase/generate", "phase/prepare", "phase/train_actor"]
