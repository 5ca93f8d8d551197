"""Scripted membership changes (`elastic.events`), parsed and followed world by world (pure).

    events = parse_events(["leave:3@5", "join@8"], total_steps=20)   # rank 3 leaves after step 5, one joins after 8
    worlds = follow(events, placement, layout, rollout_tp, batch)    # [(event, NewWorld)], each from the one before

Forms: `leave:R@S` (rank R leaves after step S), `leave:A-B@S` (ranks A..B), `join@S` (one rank joins after step S),
`join:N@S` (N ranks, e.g. a node). Rank numbers are those of the world at that step: after `leave:1@3` on 4 ranks,
the old rank 3 is rank 2. Events apply in step order; events of one step apply in the order given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..parallel_layout import ParallelLayout
from ..vps.spec import describe_ranks
from .membership import GlobalBatch, MembershipError, NewWorld, WorldChange, world_after
from .placement import Placement

FORMS = ("leave:R@S (rank R leaves after step S), leave:A-B@S (ranks A..B), join@S (one rank joins after step S), "
         "join:N@S (N ranks)")
PATTERN = re.compile(r"^(?:leave:(\d+)(?:-(\d+))?|join(?::(\d+))?)@(\d+)$")


class EventError(ValueError):
    """An `elastic.events` entry that cannot run: one paragraph naming the entry and what would be valid."""


@dataclass(frozen=True)
class Event:
    text: str  # as written, for messages
    step: int  # the change happens after this step
    leaving: tuple[int, ...] = ()  # ranks of the world at that step
    joining: int = 0

    @property
    def kind(self) -> str:
        return "leave" if self.leaving else "join"

    @property
    def name(self) -> str:
        """elastic/leave/<ranks>@<step> or elastic/join/+<count>@<step>: the dry run's row, the metrics' prefix."""
        who = describe_ranks(self.leaving) if self.leaving else f"+{self.joining}"
        return f"elastic/{self.kind}/{who}@{self.step}"


def parse_event(text: str) -> Event:
    match = PATTERN.match(str(text).strip().replace(" ", ""))
    if not match:
        raise EventError(f"elastic.events entry {text!r} is not an event. Valid forms: {FORMS}; e.g. "
                         f"elastic.events=[leave:3@5,join@8].")
    first, last, count, step = match.groups()
    if first is not None:
        lo, hi = int(first), int(last if last is not None else first)
        if hi < lo:
            raise EventError(f"elastic.events entry {text!r} names ranks {lo}-{hi}, an empty range; write the lower "
                             f"rank first, e.g. leave:{hi}-{lo}@{step}.")
        return Event(text, int(step), leaving=tuple(range(lo, hi + 1)))
    joining = int(count) if count is not None else 1
    if joining < 1:
        raise EventError(f"elastic.events entry {text!r} joins {joining} ranks; join@S joins one, join:N@S N >= 1.")
    return Event(text, int(step), joining=joining)


def parse_events(texts: list[str], total_steps: int) -> list[Event]:
    """Every entry parsed and placed between two steps of the run, in step order (stable)."""
    events = [parse_event(t) for t in texts]
    for e in events:
        if not 1 <= e.step < total_steps:
            raise EventError(
                f"elastic.events entry {e.text!r} changes the world after step {e.step}, but the run has steps "
                f"1..{total_steps} (trainer.total_steps={total_steps}): a change comes after a step and before the "
                f"last one, so that steps run in the new world; valid S: 1..{total_steps - 1}.")
    return sorted(events, key=lambda e: e.step)


def follow(events: list[Event], placement: Placement, layout: ParallelLayout, rollout_tp: int,
           batch: GlobalBatch) -> list[tuple[Event, NewWorld]]:
    """The world after each event, each planned from the world before it, each preferring the configured `layout` and
    `rollout_tp` (a regrow returns to them); refuses the first event that cannot run."""
    out = []
    for e in events:
        world = placement.world_size
        missing = [r for r in e.leaving if r >= world]
        if missing:
            raise EventError(
                f"elastic.events entry {e.text!r} names rank {describe_ranks(missing)}, but at step {e.step} the world "
                f"has {world} ranks (0..{world - 1}){after(out)}; name ranks that exist then.")
        try:
            new = world_after(placement, layout, rollout_tp, batch, WorldChange(world, e.leaving, e.joining))
        except MembershipError as err:
            raise EventError(f"elastic.events entry {e.text!r} (after step {e.step}): {err}") from err
        out.append((e, new))
        placement = new.placement  # the configured layout and rollout tp stay the preference in every world
    return out


def joiner_slots(events: list[Event]) -> list[tuple[Event, int]]:
    """Joiner process k of a run (the launcher starts one per joining rank) -> (its event, its place among that
    event's joiners), in the order `parse_events` gives."""
    return [(e, i) for e in events for i in range(e.joining)]


def after(done: list[tuple[Event, NewWorld]]) -> str:
    return f" after {', '.join(e.text for e, _ in done)}" if done else ""
