"""Dry run: plan every transition of a recipe without devices; a table and plan_summary.json.

    rows = summarize(catalog, transitions, cluster, budget_bytes=4 << 30)
    print(format_table(rows)); write_summary(rows, hydra_output_dir / "plan_summary.json")

`catalog`: a ModelCatalog (rlhf_dyna.models.catalog.catalog_from_config(hf_config)); `transitions`:
Transition(name, src ParallelSpec, dst ParallelSpec, in_place) in the order the recipe runs them;
`cluster`: Cluster (nodes, devices per node, bandwidths, latencies).  Each row has: transition, src,
dst, world_size, bytes_total, bytes_moved, bytes_min, bytes_local, rounds, peak_extra_bytes (max over
ranks), predicted_s, planning_s (cold: layouts + plan + schedule).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from .cost import Cluster, predict_seconds
from .layout import build_layout
from .memory import peak_extra_bytes
from .model import ModelCatalog
from .plan import build_plan
from .schedule import build_schedule
from .spec import ParallelSpec
from .validate import SpecError


@dataclass(frozen=True)
class Transition:
    name: str
    src: ParallelSpec
    dst: ParallelSpec
    in_place: bool = False  # source storage released as soon as its reads are done


def summarize(catalog: ModelCatalog, transitions: list[Transition], cluster: Cluster,
              budget_bytes: int = 4 << 30) -> list[dict]:
    rows = []
    for t in transitions:
        for side, spec in (("src", t.src), ("dst", t.dst)):
            if spec.rank_bound > cluster.world_size:
                raise SpecError(f"{t.name}: {side} spans ranks {min(spec.ranks)}..{spec.rank_bound - 1} but the "
                                f"cluster has {cluster.world_size} devices; valid world_size + first_rank <= "
                                f"{cluster.world_size}")
        start = time.perf_counter()
        plan = build_plan(build_layout(catalog, t.src), build_layout(catalog, t.dst), cluster.devices_per_node)
        schedule = build_schedule(plan, budget_bytes)
        planning_s = time.perf_counter() - start
        rows.append(dict(
            transition=t.name, src=t.src.describe(), dst=t.dst.describe(), world_size=plan.world_size,
            bytes_total=plan.state_bytes, bytes_moved=plan.moved_bytes, bytes_min=plan.min_bytes,
            bytes_local=plan.local_bytes, rounds=schedule.num_rounds,
            peak_extra_bytes=int(peak_extra_bytes(schedule, t.in_place).max(initial=0)),
            predicted_s=float(f"{predict_seconds(schedule, cluster):.6g}"), planning_s=float(f"{planning_s:.4g}"),
        ))
    return rows


def write_summary(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"transitions": rows}, indent=2))
    return path


def format_table(rows: list[dict]) -> str:
    gb = 1e9
    head = f"{'transition':<28}{'total GB':>10}{'moved GB':>11}{'min GB':>10}{'rounds':>8}{'peak+ GB':>10}" \
           f"{'pred s':>9}{'plan s':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['transition']:<28}{r['bytes_total'] / gb:>10.2f}{r['bytes_moved'] / gb:>11.2f}"
                     f"{r['bytes_min'] / gb:>10.2f}{r['rounds']:>8}{r['peak_extra_bytes'] / gb:>10.2f}"
                     f"{r['predicted_s']:>9.3f}{r['planning_s']:>8.3f}")
    return "\n".join(lines)
