"""elastic.events: the forms parse, bad entries are refused naming the entry and the valid forms or numbers, and the
events are followed world by world (rank numbers of the world at that step; a regrow returns to the configured tp)."""
from __future__ import annotations

import pytest

from rlhf_dyna.elastic.events import Event, EventError, follow, joiner_slots, parse_event, parse_events
from rlhf_dyna.elastic.membership import GlobalBatch
from rlhf_dyna.elastic.placement import ACTOR, GENERATE, ROLLOUT, RankSet
from rlhf_dyna.elastic.policies import PolicyRequest, make_placement
from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.vps.spec import ParallelSpec


@pytest.mark.parametrize("text,event", [
    ("leave:3@5", Event("leave:3@5", 5, leaving=(3,))),
    ("leave:120-127@5", Event("leave:120-127@5", 5, leaving=tuple(range(120, 128)))),
    ("join@8", Event("join@8", 8, joining=1)),
    ("join:8@8", Event("join:8@8", 8, joining=8)),
])
def test_the_forms_parse(text, event):
    assert parse_event(text) == event


def test_each_joining_rank_is_one_launched_process_in_step_order():
    events = parse_events(["join:2@6", "leave:3@2", "join@4"], total_steps=10)
    slots = joiner_slots(events)
    assert [(e.text, i) for e, i in slots] == [("join@4", 0), ("join:2@6", 0), ("join:2@6", 1)]
    assert all(e is events[2] for e, _ in slots[1:])  # the same objects: a joiner finds its event by identity
    assert joiner_slots(parse_events(["leave:1@2"], total_steps=4)) == []


def test_names_say_who_and_when():
    assert parse_event("leave:120-127@5").name == "elastic/leave/120-127@5"
    assert parse_event("leave:3@5").name == "elastic/leave/3@5"
    assert parse_event("join:8@8").name == "elastic/join/+8@8"


@pytest.mark.parametrize("text,message", [
    ("leave@5", "elastic.events entry 'leave@5' is not an event. Valid forms: leave:R@S"),
    ("leave:3", "is not an event"),
    ("join:x@2", "is not an event"),
    ("leave:5-3@2", "names ranks 5-3, an empty range; write the lower rank first, e.g. leave:3-5@2"),
    ("join:0@2", "joins 0 ranks"),
])
def test_malformed_entries_are_refused(text, message):
    with pytest.raises(EventError, match=message):
        parse_event(text)


def test_steps_lie_between_two_steps_of_the_run():
    assert [e.step for e in parse_events(["join@8", "leave:3@5"], total_steps=20)] == [5, 8]
    for text in ("leave:3@25", "leave:3@20", "join@0"):
        with pytest.raises(EventError, match=rf"entry '{text}' changes the world after step \d+, but the run has steps "
                                             r"1..20 \(trainer.total_steps=20\).*valid S: 1..19"):
            parse_events([text], total_steps=20)


def grpo(world: int, tp: int = 1, rollout_tp: int = 1):
    req = PolicyRequest("colocate", world, (ACTOR, ROLLOUT), ParallelLayout(tp=tp), rollout_tp)
    return make_placement(req), req.train


def test_ranks_are_those_of_the_world_at_that_step():
    placement, layout = grpo(4)
    events = parse_events(["leave:1@3", "leave:2@4", "join@6"], total_steps=10)
    worlds = follow(events, placement, layout, 1, GlobalBatch(12, 24))
    assert [w.change.new_ranks for _, w in worlds] == [(0, 2, 3), (0, 1), (0, 1, 2)]
    assert [w.placement.world_size for _, w in worlds] == [3, 2, 3]
    with pytest.raises(EventError, match=r"entry 'leave:3@4' names rank 3, but at step 4 the world has 3 ranks "
                                         r"\(0..2\) after leave:1@3; name ranks that exist then"):
        follow(parse_events(["leave:1@3", "leave:3@4"], 10), placement, layout, 1, GlobalBatch(12, 24))


def test_a_regrow_returns_to_the_configured_layout():
    placement, layout = grpo(4, tp=2, rollout_tp=2)
    worlds = follow(parse_events(["leave:3@2", "join@4"], 10), placement, layout, 2, GlobalBatch(6, 12))
    (_, shrunk), (_, regrown) = worlds
    assert shrunk.layout.tp == 1 and shrunk.rollout_tp == 1  # 3 ranks: tp 2 does not fit
    assert regrown.layout.tp == 2 and regrown.rollout_tp == 2
    assert regrown.moves[0].src == ParallelSpec(dp=3) and regrown.moves[0].dst == ParallelSpec(dp=2, tp=2)
    assert regrown.placement.slot(GENERATE, ROLLOUT).ranks == RankSet(0, 4)


def test_a_change_that_cannot_happen_names_its_entry():
    placement, layout = grpo(4)
    with pytest.raises(EventError, match=r"entry 'leave:0-1@2' \(after step 2\): ranks 0-1 leave \(4 -> 2 ranks\): the "
                                         r"actor would train with dp=2.*do not split"):
        follow(parse_events(["leave:0-1@2"], 10), placement, layout, 1, GlobalBatch(3, 9))
