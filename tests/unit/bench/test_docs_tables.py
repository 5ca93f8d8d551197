"""The tables of README.md and docs/bench/*.md are the committed JSON's: scripts/docs_tables.py regenerates each one
between its markers, and a page whose table differs from what its JSON gives now is reported."""
from __future__ import annotations

import shutil
from pathlib import Path

import docs_tables


def test_every_generated_table_equals_what_its_json_gives() -> None:
    assert docs_tables.stale() == [], "run python scripts/docs_tables.py and commit the pages"


def test_a_changed_figure_or_a_missing_table_is_reported(tmp_path: Path) -> None:
    for page in docs_tables.TABLES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(docs_tables.ROOT / page, tmp_path / page)
    moe = tmp_path / "docs" / "bench" / "moe.md"
    moe.write_text(moe.read_text().replace("13.3x", "31.3x", 1))  # a figure typed over by hand
    readme = tmp_path / "README.md"
    begin, end = docs_tables.markers("results")
    readme.write_text(readme.read_text().replace(begin, "").replace(end, ""))  # the table's markers gone
    assert docs_tables.stale(tmp_path) == ["README.md: results", "docs/bench/moe.md: bench_reshard_moe"]
