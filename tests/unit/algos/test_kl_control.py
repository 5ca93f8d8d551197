import pytest

from rlhf_dyna.algos.kl_control import AdaptiveKLController, FixedKLController, make_kl_controller


def test_fixed_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(10.0, 1000)
    assert ctl.value == 0.05


def test_adaptive_by_hand_and_clipped_error():
    ctl = AdaptiveKLController(0.1, target=0.1, horizon=1000)
    ctl.update(0.15, 100)  # error 0.5 -> clipped 0.2: 0.1 * (1 + 0.2 * 0.1)
    assert ctl.value == pytest.approx(0.1 * 1.02)
    ctl = AdaptiveKLController(0.1, target=0.1, horizon=1000)
    ctl.update(0.09, 100)  # error -0.1: 0.1 * (1 - 0.01)
    assert ctl.value == pytest.approx(0.099)


def test_adaptive_converges_towards_target_direction():
    ctl = make_kl_controller("adaptive", 0.1, 0.05, 100)
    for _ in range(50):
        ctl.update(0.5, 64)  # KL far above target: the coefficient keeps rising
    assert ctl.value > 1.0
    with pytest.raises(ValueError, match="adaptive"):
        make_kl_controller("pid", 0.1, 0.05, 100)
