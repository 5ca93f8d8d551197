"""Reporting of scripts/bench_reshard.py: per-rank records -> rows (floors, medians, ratios), table, JSON, chart."""
from __future__ import annotations

import json
import statistics
from pathlib import Path


def same_fingerprint(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(x == y or abs(x - y) <= 1e-9 * max(abs(x), abs(y)) for x, y in zip(a, b))


def summarize(size: str, per_rank: list[dict], restart: tuple[float, list[list[float]]] | None) -> list[dict]:
    """One row per (transition, method): slowest rank's seconds, bytes over all ranks, largest rank's peak."""
    copy_rate = per_rank[0]["bandwidth"]["copy"]
    rows = []
    for transition in per_rank[0]["must_receive"]:
        must = [r["must_receive"][transition][0] for r in per_rank]
        local = [r["must_receive"][transition][1] for r in per_rank]
        vps = next((x for x in per_rank[0]["records"] if x["transition"] == transition and x["bandwidths"]), None)
        paired = vps["bandwidths"] if vps else []  # identical on every rank (the probe all-reduces its time)
        bandwidth = statistics.median(paired) if paired else per_rank[0]["bandwidth"]["concurrent"]
        # with_copies: also the rank-local copy of what a rank keeps, fully overlapped (max, not sum): still a floor
        with_copies = max(max(m / bandwidth, c / copy_rate) for m, c in zip(must, local))
        floor = dict(size=size, transition=transition, method="floor", seconds=max(must) / bandwidth, bytes_moved=sum(must),
                     max_rank_bytes=max(must), peak_extra_bytes=None, correct=True, bandwidth_bytes_per_s=bandwidth,
                     local_bytes=local, copy_bytes_per_s=copy_rate, with_copies_seconds=with_copies)
        rows.append(floor)
        methods = [rec["method"] for rec in per_rank[0]["records"] if rec["transition"] == transition]
        for method in methods:
            recs = [next(x for x in r["records"] if x["transition"] == transition and x["method"] == method) for r in per_rank]
            received = [x["bytes_received"] for x in recs]
            runs = [max(run) for run in zip(*(x["seconds"] for x in recs))]  # each run: its slowest rank
            ratios = [t * bw / max(must) for t, bw in zip(runs, recs[0]["bandwidths"])]  # run / its paired floor
            rows.append(dict(size=size, transition=transition, method=method, seconds=statistics.median(runs), seconds_runs=runs,
                             paired_floor_ratios=ratios,
                             bytes_moved=sum(received) if min(received) >= 0 else None,
                             max_rank_bytes=max(received) if min(received) >= 0 else None,
                             peak_extra_bytes=max(x["peak_extra_bytes"] for x in recs), correct=all(x["correct"] for x in recs)))
            if method == "checkpoint" and restart is not None:
                restart_seconds, restart_prints = restart
                save = max(r["save_seconds"] for r in per_rank)
                correct = all(same_fingerprint(p, r["reference"]) for p, r in zip(restart_prints, per_rank))
                rows.append({**rows[-1], "method": "checkpoint_restart", "seconds": save + restart_seconds,
                             "peak_extra_bytes": None, "correct": correct})
        naive = next(r["seconds"] for r in rows if r["transition"] == transition and r["method"] == "naive")
        for row in rows:
            if row["transition"] == transition:
                row["x_floor"], row["x_naive"] = row["seconds"] / floor["seconds"], row["seconds"] / naive
                if row.get("paired_floor_ratios"):
                    row["x_floor"] = statistics.median(row["paired_floor_ratios"])
                row["x_floor_with_copies"] = row["seconds"] / with_copies
    return rows


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def print_table(rows: list[dict], params: dict[str, int]) -> None:
    header = (f"{'size':>6} {'transition':<22} {'method':<19} {'seconds':>9} {'x floor':>8} {'x floor+copy':>12} {'x naive':>8} "
              f"{'MiB moved':>10} {'max rank MiB':>12} {'peak extra MiB':>14} ok")
    print(header)
    print("-" * len(header))
    for r in rows:
        size = f"{params[r['size']] / 1e6:.0f}M" if params[r["size"]] >= 1e6 else f"{params[r['size']] / 1e3:.0f}K"
        print(f"{size:>6} {r['transition']:<22} {r['method']:<19} {r['seconds']:>9.3f} {r['x_floor']:>8.2f} {r.get('x_floor_with_copies', float('nan')):>12.2f} {r['x_naive']:>8.2f} "
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
                 order: tuple[str, ...]) -> None:
    """Prints the table, writes bench_reshard.json (`setup`: world, layouts) and bench_reshard.png."""
    out.mkdir(parents=True, exist_ok=True)
    print_table(rows, params)
    report = dict(**setup, params=params,
                  floor_bandwidth="p2p bytes/s per rank, all ranks exchanging at once (same backend, same run)",
                  transitions=transitions, rows=rows)
    (out / "bench_reshard.json").write_text(json.dumps(report, indent=1))
    plot(rows, params, out / "bench_reshard.png", order, setup["world"])
    print(f"wrote {out / 'bench_reshard.json'} and {out / 'bench_reshard.png'}")
