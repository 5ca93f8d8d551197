"""The re-balancing decision: move devices toward the slower side only when the gain beats the move's cost."""
from __future__ import annotations

from rlhf_dyna.elastic.rebalance import decide_split
from rlhf_dyna.elastic.simulate import ZERO, PhaseModel, Workload

GEN_HEAVY = Workload("gen heavy", PhaseModel(0.0, 60.0), ZERO, PhaseModel(0.0, 20.0))


def test_moves_devices_to_generation_when_it_dominates():
    d = decide_split(GEN_HEAVY, 8, 4, staleness=1, steps_left=100, move_seconds=lambda a, b: 1.0)
    assert d.move and d.rollout_to == 6  # 60/6 = 10 = 20/2: balanced
    assert d.step_s_now == 15.0 and d.step_s_new == 10.0
    assert d.predicted_gain_s == 5.0 * 100 - 1.0
    assert d.as_metrics()["rebalance/rollout_ranks"] == 6.0


def test_stays_when_the_move_costs_more_than_it_gains():
    d = decide_split(GEN_HEAVY, 8, 4, staleness=1, steps_left=2, move_seconds=lambda a, b: 50.0)
    assert not d.move and d.predicted_gain_s == 0.0


def test_stays_when_already_balanced_or_gain_is_noise():
    balanced = Workload("even", PhaseModel(0.0, 40.0), ZERO, PhaseModel(0.0, 40.0))
    assert not decide_split(balanced, 8, 4, 1, 100, lambda a, b: 0.0).move
    tiny_gain = Workload("near", PhaseModel(0.0, 40.4), ZERO, PhaseModel(0.0, 39.6))
    assert not decide_split(tiny_gain, 8, 4, 1, 100, lambda a, b: 0.0).move


def test_respects_allowed_sizes():
    d = decide_split(GEN_HEAVY, 8, 4, 1, 100, lambda a, b: 0.0, sizes=[2, 4])
    assert d.rollout_to == 4 and not d.move
