"""The re-balancing decision as a pure function, with hand-made phase times."""
from __future__ import annotations

import itertools

import pytest

from rlhf_dyna.elastic.rebalance import (RebalanceRule, Rebalancer, SplitShape, StepTimes, describe_invalid,
                                         move_seconds, split_candidates)

FREE = lambda target: 0.0  # noqa: E731  a move that costs nothing


def manager(start=3, rule=RebalanceRule(margin=0.1, every=1), staleness=0, candidates=(1, 2, 3)):
    return Rebalancer(4, list(candidates), start, staleness, rule)


def step(r, gen, train, sync=0.05):
    return StepTimes(r, gen, train, sync, gen + train + sync)


def test_candidates_are_the_splits_the_config_can_run_and_the_others_say_why():
    valid, invalid = split_candidates(SplitShape(world_size=4, prompts_per_step=12, rows=24, mini_batches=2))
    assert valid == [1, 2, 3] and invalid == {}
    valid, invalid = split_candidates(SplitShape(world_size=4, prompts_per_step=8, rows=32, mini_batches=2))
    assert valid == [2]
    assert "32 rows do not split into algorithm.mini_batches=2 x dp=3" in invalid[1]
    assert "task.prompts_per_step=8 does not divide over 3 rollout replicas" in invalid[3]
    valid, invalid = split_candidates(SplitShape(8, 12, 48, 1, rollout_tp=2, train_inner=2))
    assert valid == [2, 4, 6] and "rollout.tp=2 does not divide 3 rollout ranks" in invalid[3]
    assert describe_invalid({3: "why"}, 4) == "3+1: why"
    # at cluster scale the sizes that rollout.tp does not divide are counted, the others listed
    assert describe_invalid({1: "tp", 2: "tp", 8: "rows", 3: "tp"}, 16, rollout_tp=8) == \
        "the 3 rollout set sizes that are not a multiple of rollout.tp=8; 8+8: rows"


def test_training_bound_split_moves_ranks_to_training_with_the_predicted_gain():
    m = manager()
    m.observe(step(3, gen=0.3, train=2.0))
    d = m.decide(remaining=5, move_cost=lambda target: 0.2)
    # one size measured: all parallel. 2+2: 0.45 + 1.0; 1+3: 0.9 + 0.667; now 2.3 (+ sync 0.05 each)
    assert d.moves and d.target == 2
    assert d.predicted_gain_s == pytest.approx(2.35 - 1.5)
    assert d.predicted_step_s[1] == pytest.approx(0.9 + 2.0 / 3 + 0.05)
    assert d.predicted_cost_s == 0.2 and d.predicted_total_gain_s == pytest.approx(0.85 * 5)
    assert "3+1 -> 2+2" in d.describe(4)


def test_generation_bound_split_moves_ranks_to_generation():
    m = manager(start=1)
    m.observe(step(1, gen=3.0, train=0.2))
    assert m.decide(5, FREE).target == 3  # 3+1: gen 1.0 + train 0.6 vs 2+2: 1.5 + 0.3 vs now 3.2


def test_no_decision_before_every_steps_are_measured_on_the_split():
    m = manager(rule=RebalanceRule(margin=0.1, every=2))
    m.observe(step(3, 0.3, 2.0))
    assert not m.decide(5, FREE).moves
    m.observe(step(3, 0.3, 2.0))
    assert m.decide(5, FREE).moves


def test_a_move_that_the_remaining_steps_do_not_pay_for_is_not_taken():
    m = manager()
    m.observe(step(3, 0.3, 2.0))
    # gain 0.85 s/step, less the 10% margin (0.235): 0.615 s/step net
    assert not m.decide(remaining=2, move_cost=lambda t: 1.3).moves  # 1.23 < 1.3
    assert m.decide(remaining=3, move_cost=lambda t: 1.3).moves  # 1.845 > 1.3
    assert not m.decide(remaining=0, move_cost=FREE).moves


def test_a_gain_inside_the_margin_is_noise_and_kept():
    times = step(2, gen=0.5, train=2.0)  # now 2.55; 1+3: 1.0 + 1.333 + 0.05 = 2.383, a gain of 0.167 s (6.5%)
    m = manager(start=2, rule=RebalanceRule(margin=0.2, every=1))
    m.observe(times)
    d = m.decide(100, FREE)
    assert not d.moves and "20%" in d.reason
    m = manager(start=2, rule=RebalanceRule(margin=0.05, every=1))
    m.observe(times)
    assert m.decide(100, FREE).target == 1


def test_staleness_1_overlaps_generation_and_training():
    m = manager(staleness=1)
    m.observe(step(3, gen=0.3, train=2.0))
    predicted = m.predictions()
    assert predicted[3] == pytest.approx(2.0 + 0.05) and predicted[1] == pytest.approx(0.9 + 0.05)
    assert m.decide(5, FREE).target == 1


def test_two_measured_sizes_are_fitted_and_measured_sizes_predict_their_measurement():
    m = manager()
    m.observe(step(3, gen=0.3, train=2.0))
    m.apply(m.decide(5, FREE))
    assert m.current == 2
    m.observe(step(2, gen=0.4, train=1.2))
    predicted = m.predictions()
    assert predicted[2] == pytest.approx(1.65) and predicted[3] == pytest.approx(2.35)
    # gen fit through (3, 0.3), (2, 0.4): 0.1 + 0.6 / n -> 0.7 at 1; train fit through (1, 2.0), (2, 1.2): 0.4 + 1.6 / t
    assert predicted[1] == pytest.approx(0.7 + 0.4 + 1.6 / 3 + 0.05)


def test_a_split_that_was_left_is_entered_again_only_once_then_the_manager_settles():
    m = manager()
    m.observe(step(3, gen=0.3, train=2.0))
    m.apply(m.decide(10, FREE))  # 3 -> 2, predicted 1.5
    m.observe(step(2, gen=1.5, train=2.0))  # measured far worse than predicted (e.g. the cores are shared)
    back = m.decide(10, FREE)
    assert back.target == 3 and back.reason == "return to the split just left"
    m.apply(back)
    assert m.settled
    m.observe(step(3, gen=0.3, train=9.0))  # whatever it measures now, it stays
    assert not m.decide(10, FREE).moves
    assert m.measured_gain() == pytest.approx((1.5 + 2.0 + 0.05) - (2.35 + 9.35) / 2)  # left 2, now 3 (two stints)


def test_noisy_times_never_make_it_oscillate():
    """Phase times that flip between favouring generation and training every step: the manager moves a bounded
    number of times and never goes A -> B -> A -> B."""
    m = manager()
    flips = itertools.cycle([(0.2, 3.0), (3.0, 0.2)])
    sizes = [m.current]
    for remaining in range(40, 0, -1):
        gen, train = next(flips)
        m.observe(step(m.current, gen, train))
        m.apply(m.decide(remaining, FREE))
        sizes.append(m.current)
    changes = [b for a, b in zip(sizes, sizes[1:]) if a != b]
    assert len(changes) <= 3  # each split is entered at most twice overall, and one return settles it
    path = [sizes[0], *changes]
    for i in range(len(path) - 3):
        assert not (path[i] == path[i + 2] and path[i + 1] == path[i + 3]), path
    # these times: 3 -> 1 (generation looked cheap), 1 -> 2 (a split not left yet), then it stays on 2
    assert changes == [1, 2] and m.left == [3, 1] and m.current == 2 and not m.settled


def test_after_one_return_the_manager_stays_whatever_it_measures():
    """A -> B -> A, then times that make A far slower than B was: no move after the return (without the settling
    these times take it 3 -> 2 -> 3 -> 2 -> 3), so never A -> B -> A -> B."""
    m = manager()
    sizes = [m.current]
    times = [(0.3, 2.0), (1.5, 2.0)] + [(0.2, 9.0)] * 8  # 3 looks training-bound; 2 measured worse; then 3 far worse
    for remaining, (gen, train) in zip(range(10, 0, -1), times):
        m.observe(step(m.current, gen, train))
        m.apply(m.decide(remaining, FREE))
        sizes.append(m.current)
    changes = [b for a, b in zip(sizes, sizes[1:]) if a != b]
    assert changes == [2, 3] and m.left == [3, 2] and m.settled
    assert sizes == [3, 2] + [3] * 9


def test_measured_gain_is_step_before_minus_step_after():
    m = manager()
    m.observe(step(3, gen=0.3, train=2.0))
    assert m.measured_gain() is None
    m.apply(m.decide(5, FREE))
    m.observe(step(2, gen=0.5, train=1.0))
    assert m.measured_gain() == pytest.approx(2.35 - 1.55)


def test_the_starting_split_must_be_valid():
    with pytest.raises(ValueError, match=r"3\+1 is not among the valid rollout sizes \[2\]"):
        Rebalancer(4, [2], start=3)


def test_a_move_costs_its_bytes_at_the_bandwidth_plus_a_joining_engine_start_and_sync():
    assert move_seconds(3_000_000, 1e7, joins=False, engine_start_s=5.0, sync_s=0.1) == pytest.approx(0.3)
    assert move_seconds(3_000_000, 1e7, joins=True, engine_start_s=5.0, sync_s=0.1) == pytest.approx(5.4)
    assert move_seconds(10, 0.0, joins=False, engine_start_s=0.0, sync_s=0.0) == 10.0  # no bandwidth yet: 1 B/s


def test_a_change_of_world_re_plans_the_manager_and_keeps_what_was_measured_by_set_size():
    """4 ranks, 3+1 left for 2+2; rank 3 leaves: over 3 ranks the manager starts on 2+1 with nothing left, waits
    `every` steps there, and predicts from the old world's phase times by set size."""
    m = manager()
    m.observe(step(3, gen=0.3, train=2.0))
    m.apply(m.decide(10, FREE))  # 3+1 -> 2+2
    m.observe(step(2, gen=0.4, train=1.2))
    assert not m.decide(10, FREE).moves and m.left == [3]
    new = m.over(3, [1, 2], start=2)
    assert (new.world_size, new.candidates, new.current, new.left, new.settled) == (3, [1, 2], 2, [], False)
    assert not new.decide(10, FREE).moves  # nothing measured in this world yet
    new.observe(step(2, gen=0.4, train=2.0))  # 2 rollout ranks generate as in the old world; 1 trains as 3+1's did
    predicted = new.predictions()
    # generate at 1 rank: the fit through (3, 0.3), (2, 0.4) -> 0.7; train at 2 ranks: measured 1.2 (the old 2+2)
    assert predicted[1] == pytest.approx(0.7 + 1.2 + 0.05)
    assert predicted[2] == pytest.approx(0.4 + 2.0 + 0.05)  # its measurements, both worlds' (gen 0.4, 0.4)
    assert new.decide(10, FREE).target == 1
    with pytest.raises(ValueError, match=r"3\+0 is not among"):
        m.over(3, [1, 2], start=3)
