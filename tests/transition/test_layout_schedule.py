"""The layout schedule a recipe lists: which layout applies at which step, and refusal of bad schedules."""
from __future__ import annotations

import pytest

from rlhf_dyna.transition.relayout import LayoutSwitch, TrainLayout, switch_at, validate_schedule

SCHEDULE = [LayoutSwitch(step=3, dp=2, tp=2), LayoutSwitch(step=6, dp=1, tp=4, zero=3), LayoutSwitch(step=9, dp=4, tp=1, zero=1)]


def test_switch_at_names_the_layout_only_at_its_step() -> None:
    assert [switch_at(SCHEDULE, s) for s in (1, 3, 4, 6, 9)] == [
        None, TrainLayout(2, 2, 3), None, TrainLayout(1, 4, 3), TrainLayout(4, 1, 1)]
    validate_schedule(SCHEDULE, world_size=4)


@pytest.mark.parametrize(("schedule", "message"), [
    ([LayoutSwitch(step=3, dp=2, tp=1)], "dp=2 x tp=1 x pp=1 != world size 4"),
    ([LayoutSwitch(step=3, dp=4, tp=1, zero=0)], "zero=0"),
    ([LayoutSwitch(step=5, dp=4, tp=1), LayoutSwitch(step=2, dp=2, tp=2)], "strictly increasing"),
])
def test_bad_schedules_are_refused_naming_the_wrong_number(schedule: list[LayoutSwitch], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_schedule(schedule, world_size=4)
