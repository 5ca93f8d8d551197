"""Write every table that README.md and the pages under docs/ show from committed JSON, between its markers.

    python scripts/docs_tables.py           # regenerate them all in place (after committing a new benchmark JSON)
    python scripts/docs_tables.py --check   # change nothing; exit 1 naming each table that differs from its JSON

A table sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in its page; the text around it is prose.
tests/unit/bench/test_docs_tables.py runs the check, so a page cannot drift from the data it cites.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from bench import doc_tables, elastic_tables, speed_tables
from bench_report import markdown as reshard_markdown
from bench_report import replace_table

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "bench"


def _json(name: str) -> dict:
    return json.loads((BENCH / name).read_text())


# page (relative to the repository root) -> table name -> what writes it
TABLES: dict[str, dict[str, Callable[[], str]]] = {
    "README.md": {"results": lambda: doc_tables.results(BENCH)},
    "docs/bench/reshard.md": {
        "bench_reshard": lambda: reshard_markdown(_json("bench_reshard.json")),
        "reshard_history": lambda: doc_tables.reshard_history(BENCH),
        "sync_ab": lambda: doc_tables.sync_ab(BENCH),
    },
    "docs/bench/moe.md": {"bench_reshard_moe": lambda: doc_tables.moe_table(_json("bench_reshard_moe.json"))},
    "docs/bench/pipeline.md": {
        "reshard_pp": lambda: doc_tables.reshard_pp(BENCH),
        "pp_step": lambda: doc_tables.pp_step(BENCH),
    },
    "docs/bench/loading.md": {"bench_load": lambda: doc_tables.load(BENCH)},
    "docs/bench/launch.md": {"launch_fork": lambda: doc_tables.launch(BENCH)},
    "docs/bench/placement.md": {
        "bench_placement": lambda: doc_tables.placement_table(_json("bench_placement.json")),
        "placements_live": lambda: doc_tables.placements_live(BENCH),
        "rebalance_moves": lambda: doc_tables.rebalance_moves(BENCH),
    },
    "docs/bench/tuning.md": {
        "lift": lambda: doc_tables.lift(BENCH),
        "compare_algos": lambda: doc_tables.compare_algos(BENCH),
    },
    "docs/bench/speed.md": {
        "peer": lambda: speed_tables.peer(BENCH),
        "train_phase": lambda: speed_tables.train_phase(BENCH),
    },
    "docs/reward_models.md": {"rm_pipeline": lambda: doc_tables.rm_pipeline(_json("rm_pipeline.json"))},
    "docs/elastic/dry_runs.md": {
        "dry_run_grpo_70b": lambda: elastic_tables.elastic_dry_run(BENCH, "grpo_70b"),
        "dry_run_ppo_235b_moe": lambda: elastic_tables.elastic_dry_run(BENCH, "ppo_235b_moe"),
        "membership_planning": lambda: elastic_tables.membership_planning(BENCH),
    },
    "docs/elastic/torchft.md": {"torchft_probe": lambda: elastic_tables.torchft_probe(BENCH)},
    "docs/elastic/benchmarks.md": {
        "bench_elastic": lambda: elastic_tables.bench_elastic(BENCH),
        "recovery_paths": lambda: elastic_tables.recovery_paths(BENCH),
        "snapshot_cost": lambda: elastic_tables.snapshot_cost(BENCH),
    },
    "docs/bench/planning.md": {
        "bench_plan": lambda: doc_tables.planning(BENCH),
        "dry_run": lambda: doc_tables.dry_run(BENCH),
    },
}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def current(page: Path, name: str) -> str | None:
    """The text between the table's markers in `page` (None when the page lacks them)."""
    begin, end = markers(name)
    found = re.search(f"{re.escape(begin)}\n(.*?)\n{re.escape(end)}", page.read_text(), flags=re.S)
    return found.group(1) if found else None


def stale(root: Path = ROOT) -> list[str]:
    """`page: table` for every generated table whose page text differs from what its JSON gives now."""
    return [f"{page}: {name}" for page, tables in TABLES.items() for name, make in tables.items()
            if current(root / page, name) != make()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report the tables that differ from their JSON")
    args = parser.parse_args()
    if args.check:
        differ = stale()
        for entry in differ:
            print(f"stale: {entry} (run python scripts/docs_tables.py)")
        sys.exit(1 if differ else 0)
    for page, tables in TABLES.items():
        for name, make in tables.items():
            replace_table(ROOT / page, *markers(name), make())
        print(f"{page}: {', '.join(tables)} regenerated")


if __name__ == "__main__":
    main()
