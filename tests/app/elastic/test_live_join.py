"""End to end: a rank leaves a live run and a new one joins later (placement=colocate, 4 -> 3 -> 4 gloo ranks,
`elastic.events=[leave:3@3,join@6]`).

The launcher starts the joining process beside the four ranks; it prepares (task, skeletons, a vLLM engine in a private
world of one) while they train, builds the new world's groups with them during step 6 (rank 0 posts it the plan), and
enters at the boundary after step 6. For GRPO and for PPO (whose critic moves
too) the run ends with exit code 0, leaves no process behind, logs the world size 4, 3, then 4 again and the join's
metrics, and logs the same per-step losses, grad norms, rewards and eval as a run whose world never changed (relative
1e-5): steps 7 and 8 train from the state spread over the joiner (parameters and AdamW moments) and generate with its
vLLM engine, and the joiner's loop state (prompt sampler, KL controller) came from rank 0. The bytes the join moved
equal an independent count: element by element, what each rank of the new world needs and did not hold
(tests/unit/elastic/test_membership_bytes.py's count, on the run's own model). With dp2 x tp2 training, two ranks leave
and two joiners enter at one boundary (`join:2@6`), and the metrics match those of the dp2 x tp2 run without events;
with pp2 x dp2 training and rollout.tp=2 the survivors train dp3 (pp 1) and every rank starts a vLLM engine of tp 1
at the leave, and the join returns to pp2 x dp2 with engines of tp 2, matching the run without events.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from rlhf_dyna.config import RESOLVED_CONFIG, load_config
from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.models.value_catalog import value_catalog
from rlhf_dyna.orchestrator.membership import membership_worlds
from tests.app.marked_processes import marked_processes
from tests.app.runtimes.placed_runs import GRPO4, assert_same_metrics, kill_marked, run
from tests.unit.elastic.test_membership_bytes import brute_force_bytes

STEPS = 8
ARGS = [a for a in GRPO4 if not a.startswith("trainer.total_steps=")] + [f"trainer.total_steps={STEPS}"]
EVENTS = "elastic.events=[leave:3@3,join@6]"  # 48 rows split over dp 4 and 3, 12 prompts over 4 and 3 replicas


@pytest.fixture
def fixed(grpo4_colocate) -> list[dict]:
    """The GRPO run whose world stays 4 ranks (dp4) throughout: the session's run of ARGS (tests/app/conftest.py)."""
    assert len(grpo4_colocate) == STEPS + 1
    return grpo4_colocate


def counted_join_bytes(run_dir: Path) -> int:
    """The join's bytes counted element by element from the run's config and model (no planner involved)."""
    cfg = load_config(run_dir / RESOLVED_CONFIG)
    event, world = membership_worlds(cfg)[1]
    assert event.joining == 4 - world.change.world_size
    catalog = catalog_from_config(AutoConfig.from_pretrained(run_dir / "model_init" / "node0"), param_dtype="float32")
    catalogs = {"actor": catalog, "reference": catalog, "critic": value_catalog(catalog)}
    return sum(brute_force_bytes(catalogs[m.role], m, world.change) for m in world.moves)


def joined(run_dir: Path, *args: str, events: str = EVENTS, between: float = 3.0) -> list[dict]:
    """The run with `events` (4 ranks, `between` of them from step 4 to 6, 4 again from step 7), checked."""
    try:
        rows = run(run_dir, *args, events)
    finally:
        kill_marked(run_dir)
    assert not marked_processes(str(run_dir))
    assert [r.get("elastic/world_size") for r in rows[1:]] == [4.0] * 3 + [between] * 3 + [4.0] * 2
    change = rows[7]
    assert change["elastic/join/bytes_moved"] == counted_join_bytes(run_dir) > 0
    assert change["elastic/join/rounds"] >= 1 and change["elastic/join/seconds"] > 0
    assert change["elastic/join/prepare_seconds"] > 0
    assert change["elastic/join/ready_wait_seconds"] < 1.0, "the joiner prepared during steps 1-6: none is waited"
    assert change["elastic/join/background"] == 1.0, "the join was known a step ahead: its world built during step 6"
    assert change["elastic/join/wait_seconds"] <= 0.1 * change["elastic/join/build_seconds"], "the build not hidden"
    assert not any(k.startswith("elastic/join/") for r in rows if r["step"] != 7 for k in r)
    log = (run_dir / "logs" / "rank4.log").read_text()  # joiner 0: launched as process 4
    assert "joiner0 (pid" in log and "prepared in" in log and f"joiner0 joins after step 6 as rank {int(between)}" in log
    joining = int(4 - between)
    assert f"elastic/join/+{joining}@6: {joining} rank{'s' if joining > 1 else ''} join" in \
        (run_dir / "logs" / "rank0.log").read_text()
    return rows


@pytest.mark.timeout(1200)
def test_grpo_a_rank_leaves_and_one_joins_and_nothing_changes_but_the_world(fixed, tmp_path: Path) -> None:
    rows = joined(tmp_path / "joined", *ARGS)
    assert any(abs(r["actor/pg_loss"]) > 1e-3 for r in fixed[7:]), "no learning signal after the join"
    assert_same_metrics(fixed, rows)
    trace = json.loads((tmp_path / "joined" / "transition_trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any("elastic/join/+1@6" in str(e.get("name", "")) for e in events), "the join is not on the run's trace"
    assert {"elastic/join/+1@6/build", "elastic/join/+1@6/world"} <= {e.get("name") for e in events}
    assert rows[7]["elastic/join/rollout_groups"] == 12  # vLLM's 6 groups over 4, device and cpu each (rank 0's)


@pytest.mark.timeout(900)
def test_tensor_parallel_training_two_ranks_join_at_once(tmp_path: Path) -> None:
    """dp2 x tp2 training loses ranks 2-3 (dp1 x tp2 over ranks 0-1), then two joiners arrive at one boundary (dp2 x
    tp2 again over 0-3, join:2@6): the same metrics as the dp2 x tp2 run without events (against the dp4 run, tp's
    summation order alone drifts to 3e-5 by step 8; against dp2 x tp2 the worst seen was 2.7e-6)."""
    run_dir, tp2 = tmp_path / "tp2", [*ARGS, "parallel.train.tp=2"]
    try:
        fixed_tp2 = run(tmp_path / "fixed", *tp2)
    finally:
        kill_marked(tmp_path / "fixed")
    rows = joined(run_dir, *tp2, events="elastic.events=[leave:2-3@3,join:2@6]", between=2.0)
    assert_same_metrics(fixed_tp2, rows)
    assert "training layout dp2xtp2-zero3" in (run_dir / "logs" / "rank0.log").read_text()
    assert "joiner1 joins after step 6 as rank 3 of 4" in (run_dir / "logs" / "rank5.log").read_text()


@pytest.mark.timeout(1200)
def test_ppo_the_critic_spreads_over_the_joiner_too(tmp_path: Path) -> None:
    # micro-batches of 4 rows: with one micro-batch a mini-batch, the critic's grad norm drifted to 1.9e-5 by step 7
    ppo = ["recipe=ppo_tiny" if a == "recipe=grpo_tiny" else a.replace("micro_batch_size=16", "micro_batch_size=4")
           for a in ARGS]
    try:
        fixed = run(tmp_path / "fixed", *ppo)
    finally:
        kill_marked(tmp_path / "fixed")
    rows = joined(tmp_path / "joined", *ppo)
    assert {"critic/vf_loss", "critic/grad_norm"} <= rows[7].keys()
    assert rows[4]["elastic/leave/rounds"] >= 3 and rows[7]["elastic/join/rounds"] >= 3  # actor, critic, reference
    assert_same_metrics(fixed, rows)


@pytest.mark.timeout(1200)
def test_pipeline_training_and_rollout_tp_2_drop_at_a_leave_and_return_at_a_join(tmp_path: Path) -> None:
    """pp2 x dp2 training with rollout.tp=2: 3 ranks take no pp but 1 (dp3) and generate with tp 1, so every rank
    starts a new vLLM engine at the leave (three replicas) and again at the join (tp 2; the joiner's engine of its own
    replaced), and the joiner builds its pipeline stage from the broadcast settings; the same metrics as the pp2 x
    dp2, rollout tp 2 run without events (against the dp4 run, the pipeline's 4-row micro-batches alone drift to
    2.5e-5 by step 8)."""
    # 1F1B needs a micro-batch per stage: 4 rows (the sft batch gives 8 per dp rank)
    pp2 = [*[a.replace("micro_batch_size=16", "micro_batch_size=4") for a in ARGS], "parallel.train.pp=2",
           "rollout.tp=2"]
    try:
        fixed_pp2 = run(tmp_path / "fixed", *pp2)
    finally:
        kill_marked(tmp_path / "fixed")
    run_dir = tmp_path / "pp2"
    rows = joined(run_dir, *pp2)
    assert_same_metrics(fixed_pp2, rows)
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "(4 -> 3 ranks); moved" in log and "training layout dp3xtp1-zero3" in log
    assert "training layout pp2xdp2xtp1-zero3" in log
    starts = [line.split("(")[1].split(",")[0] for line in log.splitlines() if "starting vLLM" in line]
    assert starts == ["tp=2", "tp=1", "tp=2"], starts
    assert rows[4]["elastic/leave/rollout_groups"] == rows[7]["elastic/join/rollout_groups"] == 0  # new engines
    assert "starting vLLM (tp=2" in (run_dir / "logs" / "rank4.log").read_text()  # the joiner, in the new world
