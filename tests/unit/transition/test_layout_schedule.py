"""The layout schedule a recipe lists: which layout applies at which step, and refusal of bad schedules."""
from __future__ import annotations

import pytest

from rlhf_dyna.checks import ConfigError
from rlhf_dyna.checks.layouts import check_layouts
from rlhf_dyna.config import Config, LayoutSwitchConfig
from rlhf_dyna.parallel_layout import LayoutSwitch, ParallelLayout, switch_at

SCHEDULE = [LayoutSwitch(3, ParallelLayout(dp=2, tp=2)), LayoutSwitch(6, ParallelLayout(dp=1, tp=4, zero=3)),
            LayoutSwitch(9, ParallelLayout(dp=4, tp=1, zero=1))]


def test_switch_at_names_the_layout_only_at_its_step() -> None:
    assert [switch_at(SCHEDULE, s) for s in (1, 3, 4, 6, 9)] == [
        None, ParallelLayout(2, 2, 3), None, ParallelLayout(1, 4, 3), ParallelLayout(4, 1, 1)]


@pytest.mark.parametrize(("schedule", "message"), [
    ([LayoutSwitchConfig(step=3, dp=2, tp=1)], r"dp\*tp\*pp\*cp = 2\*1\*1\*1 = 2 but parallel.world_size=4"),
    ([LayoutSwitchConfig(step=3, dp=4, tp=1, zero=0)], "zero=0; valid: 1, 2, 3"),
    ([LayoutSwitchConfig(step=5, dp=4, tp=1), LayoutSwitchConfig(step=2, dp=2, tp=2)], "strictly increasing"),
    ([LayoutSwitchConfig(step=0, dp=4, tp=1)], ">= 1"),
])
def test_bad_schedules_are_refused_naming_the_wrong_number(schedule: list[LayoutSwitchConfig], message: str) -> None:
    cfg = Config()
    cfg.parallel.world_size = 4
    cfg.parallel.schedule = [LayoutSwitchConfig(step=2, dp=2, tp=2)]
    check_layouts(cfg)  # a good one passes
    cfg.parallel.schedule = schedule
    with pytest.raises(ConfigError, match=message):
        check_layouts(cfg)
