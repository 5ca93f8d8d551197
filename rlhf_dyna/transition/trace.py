"""Chrome trace (Perfetto-readable) of transitions: one complete event per round per rank.

Each rank records its own events with wall-clock start times; `gather_trace` collects them on rank 0, and
`write_chrome_trace` writes {"traceEvents": [...]} with ph "X", pid = rank, tid = 0, ts/dur in microseconds.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch.distributed as dist


@dataclass(frozen=True)
class TraceEvent:
    name: str  # e.g. the transition ("train_to_rollout")
    rank: int
    round: int
    start_s: float  # time.time() at the start: comparable across processes of one machine
    duration_s: float
    args: dict[str, float | int | str] = field(default_factory=dict)  # bytes sent/received, peers, ...


class TraceRecorder:
    """Collects this rank's events; `span` times one round. `max_transitions` keeps, per event name, only the
    first N transitions (a transition starts at its round 0); names it does not list are always kept."""

    def __init__(self, rank: int, max_transitions: Mapping[str, int] | None = None) -> None:
        self.rank = rank
        self.events: list[TraceEvent] = []
        self.max_transitions = dict(max_transitions or {})
        self.transitions: dict[str, int] = {}  # transitions seen per name, kept or not

    def add(self, name: str, round_index: int, start_s: float, duration_s: float,
            args: Mapping[str, float | int | str]) -> None:
        """Records one round that ran from start_s (time.time()) for duration_s."""
        if round_index == 0:
            self.transitions[name] = self.transitions.get(name, 0) + 1
        if self.transitions.get(name, 0) <= self.max_transitions.get(name, math.inf):
            self.events.append(TraceEvent(name, self.rank, round_index, start_s, duration_s, dict(args)))

    @contextmanager
    def span(self, name: str, round_index: int, **args: float | int | str) -> Iterator[dict[str, float | int | str]]:
        """Times the block; the yielded dict can take more args (e.g. bytes known only at the end)."""
        extra: dict[str, float | int | str] = dict(args)
        start = time.time()
        try:
            yield extra
        finally:
            self.add(name, round_index, start, time.time() - start, extra)


def chrome_trace(events: Iterable[TraceEvent]) -> dict[str, list[dict[str, object]]]:
    """Chrome trace JSON object; timestamps relative to the earliest event so the view starts at 0."""
    events = list(events)
    origin = min((e.start_s for e in events), default=0.0)
    trace = []
    for rank in sorted({e.rank for e in events}):  # name each rank's track
        trace.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
    for e in events:
        trace.append({
            "name": e.name, "cat": "phase" if e.name.startswith("phase/") else "transition",  # phases: the timeline
            "ph": "X", "pid": e.rank, "tid": 0,
            "ts": (e.start_s - origin) * 1e6, "dur": e.duration_s * 1e6, "args": {"round": e.round, **e.args},
        })
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(events: Iterable[TraceEvent], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(events)))
    return path


def gather_trace(recorder: TraceRecorder, dst: int = 0) -> list[TraceEvent]:
    """Collective: every rank's events on `dst` (empty list elsewhere)."""
    gathered: list[list[dict[str, object]]] | None = [[] for _ in range(dist.get_world_size())] if dist.get_rank() == dst else None
    dist.gather_object([asdict(e) for e in recorder.events], gathered, dst=dst)
    if gathered is None:
        return []
    return [TraceEvent(**e) for per_rank in gathered for e in per_rank]
