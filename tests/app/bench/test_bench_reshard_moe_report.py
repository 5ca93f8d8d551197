"""The committed MoE train -> rollout benchmark (docs/bench/bench_reshard_moe.json) regenerates its table, and
what it recorded holds: greedy tokens checked, each rank's planned expert bytes equal to what the live vLLM engine
held, expert parallelism moving no expert bytes over the wire (FSDP2's expert chunks are vLLM's placement)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.doc_tables import moe_table

ROOT = Path(__file__).resolve().parents[3]
REPORT = ROOT / "docs" / "bench" / "bench_reshard_moe.json"


def test_committed_moe_bench_regenerates_its_table(tmp_path: Path) -> None:
    report = json.loads(REPORT.read_text())
    rows = {(r["transition"], r["method"]): r for r in report["rows"]}
    assert all(r["correct"] for r in rows.values()), [k for k, r in rows.items() if not r["correct"]]
    assert min(report["params"].values()) >= 100e6
    for target in ("train_to_vllm_moe", "train_to_vllm_moe_ep"):
        floor = rows[(target, "floor")]
        assert floor["share_matches_live"] and floor["tokens_changed"]
        assert max(floor["vps_received_by_rank"]) < floor["naive_received_per_rank"] / 4
    ep = rows[("train_to_vllm_moe_ep", "floor")]
    assert ep["planned_expert_wire_by_rank"] == [0] * report["world"]
    assert sorted(e for experts in ep["experts_by_rank"] for e in experts) == list(range(report["specs"]["moe100m"]["num_experts"]))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- bench_reshard_moe:begin -->\nstale\n<!-- bench_reshard_moe:end -->\nb\n")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_reshard_moe.py"), "--report", str(REPORT), "--readme",
                    str(readme)], check=True, capture_output=True)
    text = readme.read_text()
    assert "stale" not in text and "expert parallel" in text and report["date"] in text
    assert text.startswith("a\n") and text.endswith("b\n")
    assert moe_table(report) in (ROOT / "docs" / "bench" / "moe.md").read_text()  # the page's table is this JSON's
