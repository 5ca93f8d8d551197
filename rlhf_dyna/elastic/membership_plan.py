"""The plan of a membership change (pure): each training role's state from the old world into the new one by VPS plan,
in the change's rank space, and the dry run's row of a change.

    plans = move_plans(new_world, {"actor": catalog, "reference": catalog, "critic": value_catalog}, ranks_per_node=8)
    row = summarize_change("elastic/leave/3@5", new_world, catalogs, cluster)   # bytes, rounds, predicted seconds

Roles move one after another (as role moves between rank sets do), so a change's rounds and predicted seconds are the
sums over its roles; its bytes are the sums, each role's plan moving the minimum its two layouts allow.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from ..vps.cost import Cluster, predict_seconds
from ..vps.layout import build_layout
from ..vps.memory import peak_extra_bytes
from ..vps.model import ModelCatalog
from ..vps.plan import Plan, build_plan
from ..vps.schedule import build_schedule
from .membership import NewWorld, RoleMove


def move_plan(move: RoleMove, catalog: ModelCatalog, ranks_per_node: int) -> Plan:
    return build_plan(build_layout(catalog, move.src, move.kinds), build_layout(catalog, move.dst, move.kinds),
                      ranks_per_node)


def move_plans(new: NewWorld, catalogs: Mapping[str, ModelCatalog], ranks_per_node: int = 8) -> dict[str, Plan]:
    """role -> the plan of its state across the change (catalogs: the model each training role holds)."""
    return {m.role: move_plan(m, catalogs[m.role], ranks_per_node) for m in new.moves}


def cluster_over(cluster: Cluster, ranks: int) -> Cluster:
    """`cluster` with nodes enough for `ranks` (joining ranks come on new nodes)."""
    nodes = -(-ranks // cluster.devices_per_node)
    return replace(cluster, nodes=max(cluster.nodes, nodes))


def summarize_change(name: str, new: NewWorld, catalogs: Mapping[str, ModelCatalog], cluster: Cluster,
                     budget_bytes: int = 4 << 30) -> dict:
    """One dry-run row (the columns of vps.dryrun.summarize) for every role's move of a change, plus per role."""
    cluster = cluster_over(cluster, new.change.rank_space)
    roles, first = {}, new.moves[0] if new.moves else None
    for move in new.moves:
        start = time.perf_counter()
        plan = move_plan(move, catalogs[move.role], cluster.devices_per_node)
        schedule = build_schedule(plan, budget_bytes)
        roles[move.role] = dict(
            src=move.src.describe(), dst=move.dst.describe(), bytes_total=plan.state_bytes,
            bytes_moved=plan.moved_bytes, bytes_min=plan.min_bytes, bytes_local=plan.local_bytes,
            rounds=schedule.num_rounds, peak_extra_bytes=int(peak_extra_bytes(schedule, False).max(initial=0)),
            predicted_s=predict_seconds(schedule, cluster), planning_s=time.perf_counter() - start)
    total = {key: sum(r[key] for r in roles.values()) for key in
             ("bytes_total", "bytes_moved", "bytes_min", "bytes_local", "rounds", "predicted_s", "planning_s")}
    return dict(
        transition=name, src=first.src.describe() if first else "-", dst=first.dst.describe() if first else "-",
        world_size=new.change.rank_space, **{k: total[k] for k in ("bytes_total", "bytes_moved", "bytes_min",
                                                                    "bytes_local", "rounds")},
        peak_extra_bytes=max((r["peak_extra_bytes"] for r in roles.values()), default=0),
        predicted_s=float(f"{total['predicted_s']:.6g}"), planning_s=float(f"{total['planning_s']:.4g}"),
        change=new.change.describe(), rollout_tp=new.rollout_tp, roles=roles)
