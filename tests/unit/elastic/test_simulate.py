"""The placement simulation: Amdahl fits, per-policy step formulas, cost-model transitions, the best choice."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlhf_dyna.parallel_layout import ParallelLayout
from rlhf_dyna.elastic.placement import ACTOR, CRITIC, ROLLOUT
from rlhf_dyna.elastic.policies import PolicyRequest
from rlhf_dyna.elastic.simulate import (ZERO, PhaseModel, Workload, colocate_step, fit_phase, lend_step,
                                        predict_policies, split_step, transition_seconds)
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps.cost import Cluster

CFG = SimpleNamespace(model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=1000)


def test_fit_recovers_serial_and_parallel_parts():
    m = fit_phase({1: 3.0 + 8.0, 2: 3.0 + 4.0, 4: 3.0 + 2.0})
    assert m.serial_s == pytest.approx(3.0) and m.parallel_s == pytest.approx(8.0)
    assert m.seconds(8) == pytest.approx(4.0)


def test_fit_clamps_to_non_negative_terms():
    slower = fit_phase({1: 1.0, 2: 1.2, 4: 1.5})  # ranks sharing two cores get slower
    assert slower.parallel_s == 0 and slower.serial_s == pytest.approx((1.0 + 1.2 + 1.5) / 3)
    superlinear = fit_phase({1: 8.0, 2: 3.0, 4: 1.0})
    assert superlinear.serial_s == 0 and superlinear.parallel_s > 0


W = Workload("ppo", generate=PhaseModel(4.0, 8.0), prepare=PhaseModel(0.0, 2.0), train_actor=PhaseModel(1.0, 8.0),
             train_critic=PhaseModel(1.0, 8.0))


def test_step_formulas():
    assert colocate_step(W, 8, 0.5).step_s == pytest.approx(5 + 0.25 + 2 + 2 + 0.5)
    s0, s1 = split_step(W, 8, 4, 0, 0.5), split_step(W, 8, 4, 1, 0.5)
    assert s0.step_s == pytest.approx(6 + (0.5 + 3 + 3) + 0.5)
    assert s1.step_s == pytest.approx(max(6, 6.5) + 0.5) and s1.staleness == 1
    assert lend_step(W, 8, 4, 0.5).step_s == pytest.approx(5 + 0.25 + 3 + 0.5)


def test_transition_seconds_from_the_cost_model():
    catalog, cluster = catalog_from_config(CFG), Cluster(1, 8, 360.0, 25.0)
    base = PolicyRequest("colocate", 8, (ACTOR, CRITIC, ROLLOUT))
    colocate = transition_seconds(base, catalog, cluster)
    lend = transition_seconds(PolicyRequest("lend", 8, (ACTOR, CRITIC, ROLLOUT)), catalog, cluster)
    assert 0 < colocate < lend  # lend adds four role moves to the weight sync


def test_predict_policies_picks_the_best_split_and_lend():
    base = PolicyRequest("colocate", 8, (ACTOR, CRITIC, ROLLOUT), ParallelLayout(tp=2), rollout_tp=2)
    seen = []

    def cost(req):
        seen.append((req.policy, req.rollout_ranks, req.train_ranks))
        return 0.1
    preds = {(p.policy, p.staleness): p for p in predict_policies(W, base, cost)}
    assert set(preds) == {("colocate", 0), ("split", 0), ("split", 1), ("lend", 0)}
    assert all(r % 2 == 0 for pol, r, _ in seen if pol == "split")  # rollout sets that rollout.tp=2 divides
    best_split = preds[("split", 1)]
    assert best_split.step_s == min(split_step(W, 8, r, 1, 0.1).step_s for r in (2, 4, 6))
    gen_heavy = Workload("gen", PhaseModel(0, 64.0), ZERO, PhaseModel(0, 1.0))
    split = {p.policy: p for p in predict_policies(gen_heavy, base, cost) if p.staleness == 1}["split"]
    assert split.sets["rollout"] == 6  # generation dominates: most devices generate
    assert "lend" not in {p.policy for p in predict_policies(gen_heavy, base, cost)}  # no critic
