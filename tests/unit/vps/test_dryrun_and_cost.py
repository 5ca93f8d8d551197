"""Dry-run rows and JSON, the cost model's arithmetic and plan caching (the planner imports no torch:
tests/app/vps/test_fresh_interpreter.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.vps import (Cluster, ParallelSpec, Phase, Transition, build_layout, build_plan, build_schedule,
                           cached_plan, predict_seconds, summarize, write_summary)
from rlhf_dyna.vps.validate import SpecError

CFG = SimpleNamespace(model_type="llama", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=1000)
FIELDS = {"transition", "src", "dst", "world_size", "bytes_total", "bytes_moved", "bytes_min", "bytes_local",
          "rounds", "peak_extra_bytes", "predicted_s", "planning_s"}


def test_summarize_rows_and_json(tmp_path):
    catalog = catalog_from_config(CFG)
    transitions = [Transition("train->rollout", ParallelSpec(dp=4), ParallelSpec(Phase.ROLLOUT, dp=2, tp=2)),
                   Transition("train 4->2", ParallelSpec(dp=4), ParallelSpec(dp=2), in_place=True)]
    rows = summarize(catalog, transitions, Cluster(2, 2, 100.0, 10.0))
    assert [r["transition"] for r in rows] == ["train->rollout", "train 4->2"]
    for r in rows:
        assert set(r) == FIELDS and r["bytes_moved"] == r["bytes_min"] > 0 and r["predicted_s"] > 0
    data = json.loads(write_summary(rows, tmp_path / "out" / "plan_summary.json").read_text())
    assert data["transitions"] == rows


def test_summarize_refuses_specs_larger_than_the_cluster():
    with pytest.raises(SpecError, match="dst spans ranks 0..7 but the cluster has 4 devices"):
        summarize(catalog_from_config(CFG), [Transition("x", ParallelSpec(dp=4), ParallelSpec(dp=8))],
                  Cluster(2, 2, 100.0, 10.0))


def test_cost_model_two_ranks_inter_node():
    """One stream of B bytes across nodes: B / inter bandwidth + one latency (no local copies)."""
    catalog = catalog_from_config(CFG)
    src = build_layout(catalog, ParallelSpec(dp=1))  # rank 0 holds everything
    dst = build_layout(catalog, ParallelSpec(dp=1, first_rank=1))  # rank 1 needs everything
    plan = build_plan(src, dst, ranks_per_node=1)
    schedule = build_schedule(plan, budget_bytes=1 << 40)
    cluster = Cluster(2, 1, intra_node_gbps=100.0, inter_node_gbps=10.0, inter_latency_s=1e-3)
    assert schedule.num_rounds == 1
    assert abs(predict_seconds(schedule, cluster) - (plan.moved_bytes / 10e9 + 1e-3)) < 1e-9


def test_plans_cached_per_spec_pair():
    catalog = catalog_from_config(CFG)
    a = cached_plan(catalog, ParallelSpec(dp=2), ParallelSpec(Phase.ROLLOUT, tp=2))
    assert a is cached_plan(catalog, ParallelSpec(dp=2), ParallelSpec(Phase.ROLLOUT, tp=2))
    assert a is not cached_plan(catalog, ParallelSpec(dp=2), ParallelSpec(Phase.ROLLOUT, tp=2, dp=2))
