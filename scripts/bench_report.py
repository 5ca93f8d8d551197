"""Reporting of scripts/bench_reshard.py: per-rank records -> rows (floors, medians, ratios), table, JSON, chart."""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

LABELS = {  # transition -> what it is, for the table in docs/bench/reshard.md
    "train_to_vllm": "FSDP dp4 -> **real vLLM** tp2 x dp2 (install included)",
    "train_to_vllm_like": "FSDP dp4 -> vLLM-like buffers tp2 x dp2 (no engine)",
    "dp4_to_dp2tp2": "dp4 -> dp2 x tp2, AdamW",
    "dp4_to_dp2tp2_searched": "same, rank order searched (TP outer)",
}
BEGIN, END = "<!-- bench_reshard:begin -->", "<!-- bench_reshard:end -->"


def machine() -> str:
    with open("/proc/meminfo") as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:")) / 2**20
    return f"{os.cpu_count()} CPU cores, {total:.0f} GiB"


def run_stamp(when: str) -> dict:
    """When a run starts or ends, and how loaded the (shared) machine was: `{when}_utc`, `load_average_{when}`
    (os.getloadavg: 1, 5, 15 minutes). New keys of the reports; older JSON without them still reads."""
    return {f"{when}_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), f"load_average_{when}": os.getloadavg()}


def same_fingerprint(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(x == y or abs(x - y) <= 1e-9 * max(abs(x), abs(y)) for x, y in zip(a, b))


def summarize(size: str, per_rank: list[dict], restart: tuple[float, list[list[float]]] | None) -> list[dict]:
    """One row per (transition, method): slowest rank's seconds, bytes over all ranks, largest rank's peak; a
    `floor` row per transition: the paired probes of the plan's own pair matrix (median), plus vLLM's repack of
    the rank's shard from local memory where a real engine is the target."""
    rows = []
    for transition, info in per_rank[0]["floor"].items():
        received = info["received_by_rank"]  # from the plan: identical on every rank
        vps = next(x for x in per_rank[0]["records"] if x["transition"] == transition and x["floors"])
        repacks = vps.get("repacks") or [0.0] * len(vps["floors"])  # max-reduced by the probes: same on every rank
        totals = [w + r for w, r in zip(vps["floors"], repacks)]
        wire, repack = statistics.median(vps["floors"]), statistics.median(repacks)
        floor = dict(size=size, transition=transition, method="floor", seconds=statistics.median(totals), wire_seconds=wire,
                     repack_seconds=repack, wire_runs=vps["floors"], repack_runs=repacks, bytes_moved=sum(received),
                     max_rank_bytes=max(received), peak_extra_bytes=None, correct=True)
        for key in ("budget_bytes", "largest_piece_bytes", "tokens_changed", "install_overlapped", "relayed", "staging_kept_bytes",
                    "phases", "repack_samples", "cast_runs"):
            if key in info:
                floor[key] = info[key]
        casts = info.get("cast_runs")  # real vLLM rows: the cast of the rank's shard alone, beside the floor
        if casts:
            floor["cast_seconds"] = statistics.median(casts)
        rows.append(floor)
        methods = [rec["method"] for rec in per_rank[0]["records"] if rec["transition"] == transition]
        for method in methods:
            recs = [next(x for x in r["records"] if x["transition"] == transition and x["method"] == method) for r in per_rank]
            got = [x["bytes_received"] for x in recs]
            total = got[0] if recs[0].get("bytes_total") else (sum(got) if min(got) >= 0 else None)
            runs = [max(run) for run in zip(*(x["seconds"] for x in recs))]  # each run: its slowest rank
            floors, reps = recs[0]["floors"], recs[0].get("repacks") or repacks
            ratios = [t / (f + r) for t, f, r in zip(runs, floors, reps)]
            overlapped = [t / max(f, r) for t, f, r in zip(runs, floors, reps)]
            with_cast = {} if not casts or len(runs) != len(casts) else dict(
                paired_floor_with_cast_ratios=[t / (f + r + c) for t, f, r, c in zip(runs, floors, reps, casts)])
            rows.append(dict(size=size, transition=transition, method=method, seconds=statistics.median(runs), seconds_runs=runs,
                             paired_floor_ratios=ratios, paired_overlap_floor_ratios=overlapped, **with_cast, bytes_moved=total,
                             max_rank_bytes=None if recs[0].get("bytes_total") or min(got) < 0 else max(got),
                             peak_extra_bytes=max(x["peak_extra_bytes"] for x in recs), correct=all(x["correct"] for x in recs)))
            if method == "checkpoint" and restart is not None:
                restart_seconds, restart_prints = restart
                save = max(r["save_seconds"] for r in per_rank)
                correct = all(same_fingerprint(p, r["reference"]) for p, r in zip(restart_prints, per_rank))
                rows.append({**rows[-1], "method": "checkpoint_restart", "seconds": save + restart_seconds,
                             "peak_extra_bytes": None, "correct": correct})
        naive_row = next(r for r in rows if r["transition"] == transition and r["method"] == "naive")
        naive = naive_row["seconds"]
        vps_row = next((r for r in rows if r["transition"] == transition and r["method"] == "vps"), None)
        if vps_row is not None and len(naive_row["seconds_runs"]) == len(vps_row["seconds_runs"]) > 1:  # run in pairs
            vps_row["paired_naive_ratios"] = [n / v for n, v in zip(naive_row["seconds_runs"], vps_row["seconds_runs"])]
            vps_row["naive_over_vps"] = statistics.median(vps_row["paired_naive_ratios"])
        for row in rows:
            if row["transition"] == transition:
                row["x_floor"], row["x_naive"] = row["seconds"] / floor["seconds"], row["seconds"] / naive
                if row.get("paired_floor_ratios"):
                    row["x_floor"] = statistics.median(row["paired_floor_ratios"])
                if row.get("paired_floor_with_cast_ratios"):
                    row["x_floor_with_cast"] = statistics.median(row["paired_floor_with_cast_ratios"])
    return rows


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def print_table(rows: list[dict], params: dict[str, int]) -> None:
    header = (f"{'size':>6} {'transition':<22} {'method':<19} {'seconds':>9} {'x floor':>8} {'x naive':>8} "
              f"{'MiB moved':>10} {'max rank MiB':>12} {'peak extra MiB':>14} ok")
    print(header)
    print("-" * len(header))
    for r in rows:
        size = f"{params[r['size']] / 1e6:.0f}M" if params[r["size"]] >= 1e6 else f"{params[r['size']] / 1e3:.0f}K"
        print(f"{size:>6} {r['transition']:<22} {r['method']:<19} {r['seconds']:>9.3f} {r['x_floor']:>8.2f} {r['x_naive']:>8.2f} "
              f"{_mb(r['bytes_moved']):>10} {_mb(r['max_rank_bytes']):>12} {_mb(r['peak_extra_bytes']):>14} {'yes' if r['correct'] else 'NO'}")


def plot(rows: list[dict], params: dict[str, int], path: Path, order: tuple[str, ...], world: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    transitions = [t for t in order if any(r["transition"] == t for r in rows)]
    colors = {m: f"C{i}" for i, m in enumerate(dict.fromkeys(r["method"] for r in rows))}  # one color per method
    fig, axes = plt.subplots(1, len(transitions), figsize=(7 * len(transitions), 5), squeeze=False)
    for ax, transition in zip(axes[0], transitions):
        mine = [r for r in rows if r["transition"] == transition]
        sizes = list(dict.fromkeys(r["size"] for r in mine))
        methods = list(dict.fromkeys(r["method"] for r in mine))
        width = 0.8 / len(methods)
        for i, method in enumerate(methods):
            seconds = [next((r["seconds"] for r in mine if r["size"] == s and r["method"] == method), 0.0) for s in sizes]
            ax.bar([x + i * width for x in range(len(sizes))], seconds, width, label=method, color=colors[method])
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], [f"{params[s] / 1e6:.0f}M params" for s in sizes])
        ax.set_yscale("log")
        ax.set_ylabel("seconds (slowest rank)")
        ax.set_title(f"{transition} ({world} gloo ranks)")
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.1))  # below: bars stay visible
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(out: Path, rows: list[dict], params: dict[str, int], transitions: list[str], setup: dict,
                 order: tuple[str, ...], date: str | None = None, stamps: dict | None = None) -> None:
    """Prints the table, writes bench_reshard.json (`setup`: world, layouts; `stamps`: run_stamp's of the run) and
    bench_reshard.png."""
    out.mkdir(parents=True, exist_ok=True)
    print_table(rows, params)
    report = dict(**setup, params=params, date=date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine=machine(),
                  floor="per vps run: the plan's pair matrix replayed right before it (one contiguous message per pair, "
                        "same backend, same run) + vLLM's repack of the rank's shard from local memory (real vLLM rows)",
                  transitions=transitions, **(stamps or {}), rows=rows)
    (out / "bench_reshard.json").write_text(json.dumps(report, indent=1))
    plot(rows, params, out / "bench_reshard.png", order, setup["world"])
    print(f"wrote {out / 'bench_reshard.json'} and {out / 'bench_reshard.png'}")


def _times(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.0f}x"  # two decimals where a target (5x) is near: 4.99x is not 5.0x


def _s(row: dict | None) -> str:
    return "–" if row is None else f"{row['seconds']:.3f}"


def markdown(report: dict) -> str:
    """docs/bench/reshard.md's table of a bench_reshard.json: seconds of the slowest rank, medians of paired runs."""
    rows, params = report["rows"], report["params"]
    lines = ["| size | transition | floor: wire + repack | **vps** (x floor) | naive | naive / vps | DTensor redistribute "
             "| DCP save+load | DCP + restart | MiB moved: vps / naive | vps peak extra MiB |", "|" + "---|" * 11]
    for size in params:
        for transition in report["transitions"]:
            got = {r["method"]: r for r in rows if r["size"] == size and r["transition"] == transition}
            if "vps" not in got:
                continue
            floor, vps, naive = got["floor"], got["vps"], got["naive"]
            wire = f"{floor['wire_seconds']:.3f}" + (f" + {floor['repack_seconds']:.3f}" if floor["repack_seconds"] else "")
            moved = f"{_mb(vps['bytes_moved'])} / {_mb(naive['bytes_moved'])}"
            ok = "" if all(r["correct"] for r in got.values()) else " **(mismatch)**"
            cast = f"; {vps['x_floor_with_cast']:.2f}x of floor + cast" if "x_floor_with_cast" in vps else ""
            lines.append(f"| {params[size] / 1e6:.0f}M | {LABELS.get(transition, transition)}{ok} | {wire} | **{vps['seconds']:.3f}** "
                         f"({vps['x_floor']:.2f}x{cast}) | {naive['seconds']:.3f} | {_times(vps.get('naive_over_vps', naive['seconds'] / vps['seconds']))} | "
                         f"{_s(got.get('redistribute'))} | {_s(got.get('checkpoint'))} | {_s(got.get('checkpoint_restart'))} | "
                         f"{moved} | {_mb(vps['peak_extra_bytes'])} |")
    stamp = f"{report.get('date', 'undated')}, {report.get('machine', 'machine unrecorded')}, {report['world']} gloo ranks"
    return "\n".join(lines) + f"\n\nData: `docs/bench/bench_reshard.json` ({stamp}); table: `python scripts/docs_tables.py`."


def replace_table(readme: Path, begin: str, end: str, table: str) -> None:
    """Replace the text between the markers `begin` and `end` in `readme` by `table`."""
    text = readme.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{readme} has no {begin} ... {end} markers: add them where the table goes")
    readme.write_text(re.sub(f"{re.escape(begin)}.*?{re.escape(end)}", lambda _: f"{begin}\n{table}\n{end}", text,
                             flags=re.S))


def main() -> None:
    parser = argparse.ArgumentParser(description="bench_reshard.json -> markdown table (stdout, or into a page)")
    parser.add_argument("json", type=Path)
    parser.add_argument("--readme", type=Path, help=f"replace the text between {BEGIN} and {END} in this file")
    args = parser.parse_args()
    table = markdown(json.loads(args.json.read_text()))
    if args.readme is None:
        return print(table)
    replace_table(args.readme, BEGIN, END, table)
    print(f"{args.readme}: table regenerated from {args.json}")


if __name__ == "__main__":
    main()
