"""The layout schedule a recipe lists: which layout applies at which step, and refusal of bad schedules."""
from __future__ import annotations

import pytest

from rlhf_dyna.config import Config, LayoutSwitchConfig
from rlhf_dyna.transition.relayout import LayoutSwitch, TrainLayout, switch_at
from rlhf_dyna.validate import ConfigError, check_layout_schedule

SCHEDULE = [LayoutSwitch(step=3, dp=2, tp=2), LayoutSwitch(step=6, dp=1, tp=4, zero=3), LayoutSwitch(step=9, dp=4, tp=1, zero=1)]


def test_switch_at_names_the_layout_only_at_its_step() -> None:
    assert [switch_at(SCHEDULE, s) for s in (1, 3, 4, 6, 9)] == [
        None, TrainLayout(2, 2, 3), None, TrainLayout(1, 4, 3), TrainLayout(4, 1, 1)]


@pytest.mark.parametrize(("schedule", "message"), [
    ([LayoutSwitchConfig(step=3, dp=2, tp=1)], r"dp\*tp\*pp = 2\*1\*1 = 2 but parallel.world_size=4"),
    ([LayoutSwitchConfig(step=3, dp=4, tp=1, zero=0)], "zero=0; valid: 1, 2, 3"),
    ([LayoutSwitchConfig(step=5, dp=4, tp=1), LayoutSwitchConfig(step=2, dp=2, tp=2)], "strictly increasing"),
    ([LayoutSwitchConfig(step=0, dp=4, tp=1)], ">= 1"),
])
def test_bad_schedules_are_refused_naming_the_wrong_number(schedule: list[LayoutSwitchConfig], message: str) -> None:
    cfg = Config()
    cfg.parallel.world_size = 4
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, dp=2, tp=2)]
    check_layout_schedule(cfg)  # a good one passes
    cfg.parallel.schedule = schedule
    with pytest.raises(ConfigError, match=message):
        check_layout_schedule(cfg)
