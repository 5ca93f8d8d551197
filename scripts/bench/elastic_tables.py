"""Markdown tables of docs/elastic.md from its committed JSON (scripts/docs_tables.py writes them between markers):
membership planning time, the dry run's membership changes, and the torchft probe."""
from __future__ import annotations

import json
import re
from pathlib import Path

GB = 1e9


def read(bench: Path, name: str) -> dict:
    return json.loads((bench / name).read_text())


def membership_planning(bench: Path) -> str:
    report = read(bench, "bench_membership_plan.json")
    lines = ["| change | source -> destination (actor) | moved GB (= minimum) | rounds | "
             "cold planning, best CPU s (runs) | target |", "|---|---|---|---|---|---|"]
    for name, c in report["cases"].items():
        runs = ", ".join(f"{t:.3f}" for t in c["cpu_s_runs"])
        check = "=" if c["moved_GB"] == c["min_GB"] else "**>**"
        lines.append(f"| {name} | {c['src']} -> {c['dst']} | {c['moved_GB']:.0f} {check} {c['min_GB']:.0f} | "
                     f"{c['rounds']} | **{c['best_cpu_s']:.3f}** ({runs}) | < {c['target_s']} s |")
    load = ", ".join(f"{x:.1f}" for x in report["load_average_start"])
    return "\n".join(lines) + (f"\n\nData: `bench/bench_membership_plan.json` ({report['date']}, "
                               f"{report['machine']}, load average {load} at the start).")


def elastic_dry_run(bench: Path, recipe: str) -> str:
    report = read(bench, f"dryrun_elastic_{recipe}.json")
    lines = ["| row | change | roles | state GB | moved GB (= minimum) | rounds | peak extra GB per rank | "
             "**predicted s** |", "|---|---|---|---|---|---|---|---|"]
    for r in report["transitions"]:
        if not r["transition"].startswith("elastic/"):
            continue
        check = "=" if r["bytes_moved"] == r["bytes_min"] else "**>**"
        lines.append(f"| {r['transition']} | {r['change']} | {', '.join(r['roles'])} | {r['bytes_total'] / GB:.0f} | "
                     f"{r['bytes_moved'] / GB:.0f} {check} {r['bytes_min'] / GB:.0f} | {r['rounds']} | "
                     f"{r['peak_extra_bytes'] / GB:.1f} | **{r['predicted_s']:.2f}** |")
    return "\n".join(lines) + (f"\n\nData: `bench/dryrun_elastic_{recipe}.json` ({report['date']}; predictions of the "
                               f"cost model, not measurements): `{report['command']}`.")


def torchft_probe(bench: Path) -> str:
    report = read(bench, "probe_torchft.json")
    lines = ["| probe | process | step | result | value | seconds |", "|---|---|---|---|---|---|"]
    for probe in ("process_group", "quorum", "shrink_group"):
        for r in report[probe]:
            result = short(r["result"])
            value = ", ".join(r["value"]) if isinstance(r["value"], list) and r["value"] and isinstance(
                r["value"][0], str) else r["value"]
            lines.append(f"| {probe} | {r['who']} | {r['what']} | {result} | {'' if value is None else value} | "
                         f"{r['seconds']:.3f} |")
    return "\n".join(lines) + (f"\n\nData: `bench/probe_torchft.json` ({report['date']}, {report['machine']}, "
                               f"torch {report['torch']}, torchft {report['torchft']}).")


def short(result: str) -> str:
    """An error without source paths, peer ports and object addresses (they change from run to run)."""
    result = re.sub(r"\[/[^\]]*\] |\[[\d.]+\]:\d+\.? ?", "", result)
    result = re.sub(r"<[^>]* at 0x[0-9a-f]+>", "...", result)
    return result.split(" This is typically")[0].split(", please create")[0].replace("|", "/").strip()
