"""Timeline of a run: per rank, the phases and roles it served (generate / prepare / train actor / train critic)
next to the transitions' rounds, as events of the run's Chrome trace and as `timeline.png`.

The loop times its phases one after another (`timing_s/<phase>` of a step); `record_step_phases` turns one
step's timings back into events on the trace recorder, so the loop needs no extra timing code; a rank that times
a phase itself records it with `record_phase`. `write_run_trace` writes both files of a run.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch.distributed as dist

from ..transition.trace import gather_trace, write_chrome_trace

PHASE_PREFIX = "phase/"
TIMELINE_FILE = "timeline.png"
TRACE_FILE = "transition_trace.json"
# phase timed by the loop -> (event name, roles it serves); in the order the loop runs them
STEP_PHASES = (
    ("timing_s/gen", "generate", "rollout"),
    ("timing_s/prepare", "prepare", "actor, reference, critic"),
    ("timing_s/train_actor", "train_actor", "actor"),
    ("timing_s/train_critic", "train_critic", "critic"),
)
COLORS = {"generate": "tab:green", "prepare": "tab:orange", "train_actor": "tab:blue", "train_critic": "tab:purple"}
TRANSITION_COLOR = "tab:red"
BACKGROUND_COLOR = "tab:gray"  # a new world's groups built on a thread while the step runs (elastic/world_prebuild.py)


def record_phase(recorder, phase: str, step: int, wall: float, seconds: float, roles: str) -> None:
    """One phase this rank served, from `wall` (time.time()) for `seconds`, for the timeline (None: no trace)."""
    if recorder is not None:
        recorder.add(PHASE_PREFIX + phase, 0, wall, seconds, {"step": step, "roles": roles})


def record_step_phases(recorder, step: int, start_s: float, timings: Mapping[str, float]) -> None:
    """Adds one event per phase of a step that started at `start_s` (time.time()), phases back to back; a phase the
    rank recorded itself for this step (placed training: the sets train at once, each rank only its role's phase)
    replaces the loop's timings of both training phases on that rank."""
    t = start_s
    own = any(is_phase(e.name) and e.args.get("step") == step for e in recorder.events)
    for key, phase, roles in STEP_PHASES:
        if key in timings and not (own and phase in ("train_actor", "train_critic")):
            record_phase(recorder, phase, step, t, timings[key], roles)
            t += timings[key]


def is_phase(name: str) -> bool:
    return name.startswith(PHASE_PREFIX)


def write_run_trace(recorder, out_dir: Path, title: str) -> None:
    """Collective: every rank's phases and transition rounds -> transition_trace.json and timeline.png (rank 0)."""
    events = gather_trace(recorder)
    if dist.get_rank() == 0:
        write_chrome_trace(events, out_dir / TRACE_FILE)
        write_timeline_png(events, out_dir / TIMELINE_FILE, title=title)


def write_timeline_png(events: Iterable, path: str | Path, title: str = "rlhf_dyna timeline") -> Path:
    """One row per rank: phases as coloured bars, transition rounds in red on top, background builds of a new world
    (events with the arg background=1) as a thin grey bar above them."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on ranks or CI
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = list(events)
    origin = min((e.start_s for e in events), default=0.0)
    ranks = sorted({e.rank for e in events})
    fig, ax = plt.subplots(figsize=(12, 1.8 + 0.6 * max(len(ranks), 1)))
    for row, rank in enumerate(ranks):
        mine = [e for e in events if e.rank == rank]
        for e in mine:
            if is_phase(e.name):
                phase = e.name[len(PHASE_PREFIX):]
                ax.broken_barh([(e.start_s - origin, e.duration_s)], (row - 0.4, 0.8), color=COLORS.get(phase, "grey"))
        background = [e for e in mine if not is_phase(e.name) and e.args.get("background") == 1]
        transitions = [(e.start_s - origin, e.duration_s) for e in mine if not is_phase(e.name) and e not in background]
        ax.broken_barh(transitions, (row - 0.15, 0.3), color=TRANSITION_COLOR)
        ax.broken_barh([(e.start_s - origin, e.duration_s) for e in background], (row + 0.2, 0.12),
                       color=BACKGROUND_COLOR)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_xlabel("seconds since the first event")
    ax.set_title(title)
    legend = [Patch(color=c, label=p.replace("_", " ")) for p, c in COLORS.items()]
    ax.legend(handles=[*legend, Patch(color=TRANSITION_COLOR, label="transition"),
                       Patch(color=BACKGROUND_COLOR, label="new world, background")], loc="upper center", ncol=6,
              fontsize="small", bbox_to_anchor=(0.5, -0.25))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
