"""Markdown tables of docs/elastic/dry_runs.md, torchft.md and benchmarks.md from their committed JSON
(scripts/docs_tables.py writes them between markers): membership planning time, the dry run's membership changes,
the torchft probe, a live leave and join against checkpoint-and-restart (scripts/bench_elastic.py), and a lost rank's
recovery against kill-and-relaunch with the snapshots' cost and memory (`bench_elastic.py --part recovery`)."""
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
    return "\n".join(lines) + (f"\n\nData: `docs/bench/bench_membership_plan.json` ({report['date']}, "
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
    return "\n".join(lines) + (f"\n\nData: `docs/bench/dryrun_elastic_{recipe}.json` ({report['date']}; predictions of the "
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
    return "\n".join(lines) + (f"\n\nData: `docs/bench/probe_torchft.json` ({report['date']}, {report['machine']}, "
                               f"torch {report['torch']}, torchft {report['torchft']}).")


def bench_elastic(bench: Path) -> str:
    report = read(bench, "bench_elastic.json")
    leave, join = report["leave"], report["join"]
    mib = 2**20

    def hidden(c: dict) -> str:
        where = "" if c["background"] else ", built at the boundary"
        return f"{1e3 * c['wait_seconds']:.2f} ms ({100 * c['wait_seconds'] / c['build_seconds']:.1f}% of the build{where})"

    rows = [
        ("the new world's groups built (`build_seconds`: every rendezvous and connect, on a thread during step 2)",
         f"{leave['build_seconds']:.3f}", f"{join['build_seconds']:.3f}"),
        ("... what the boundary waited for that build (`wait_seconds`; target: at most 10% of the build)",
         hidden(leave), hidden(join)),
        ("... the boundary's time on the world's groups and meshes in all (`world_seconds`: the wait, then torch "
         "taking the groups into the default group and the meshes)", f"{leave['world_seconds']:.3f}",
         f"{join['world_seconds']:.3f}"),
        ("the joiner's preparation (`prepare_seconds`: from its launch, off the path) / the wait for it", "",
         f"{join['prepare_seconds']:.1f} / {join['ready_wait_seconds']:.3f}"),
        ("the state moved (leave: over the old world into the new layout's shards; join: from the old engines over the new world)",
         f"{leave['move_seconds']:.3f} ({leave['bytes_moved'] / mib:.1f} MiB, {leave['rounds']:.0f} rounds)",
         f"{join['move_seconds']:.3f} ({join['bytes_moved'] / mib:.1f} MiB, {join['rounds']:.0f} rounds)"),
        ("leave: the engines built once on the new world's mesh and filled; join: rank 0's handover",
         f"{leave['copy_seconds']:.3f}", f"{join['handover_seconds']:.3f}"),
        ("vLLM's groups released and re-formed over the new world, weights synced", f"{leave['rollout_seconds']:.3f}",
         f"{join['rollout_seconds']:.3f}"),
        ("the whole change (`elastic/leave/seconds`, `elastic/join/seconds`)", f"{leave['seconds']:.2f}",
         f"{join['seconds']:.2f}"),
        ("from the boundary to step 3 done", f"**{leave['boundary_to_first_step_seconds']:.2f}**",
         f"**{join['boundary_to_first_step_seconds']:.2f}**"),
        ("checkpoint and restart: the save and the stop (from step 2's metrics row to the launcher's exit)",
         f"{report['restart']['save_and_stop_seconds']:.2f}", f"{report['join_restart']['save_and_stop_seconds']:.2f}"),
        ("... then the relaunch with `trainer.resume` to step 3 done (imports, vLLM start-up, the load, step 3)",
         f"{report['restart']['launch_to_first_step_seconds']:.2f}",
         f"{report['join_restart']['launch_to_first_step_seconds']:.2f}"),
        ("checkpoint and restart: the whole path", f"**{report['restart']['path_seconds']:.2f}**",
         f"**{report['join_restart']['path_seconds']:.2f}**"),
        ("step 3 (the first in the new world) / step 4", f"{leave['first_step_seconds']:.2f} / {leave['next_step_seconds']:.2f}",
         f"{join['first_step_seconds']:.2f} / {join['next_step_seconds']:.2f}"),
        ("ratio (target: 0.10)", f"{report['leave_over_restart']:.3f}", f"{report['join_over_restart']:.3f}"),
        (f"... in each of the {len(report['repeats'])} repeats (this table shows the median one)",
         ", ".join(f"{r['leave_over_restart']:.3f}" for r in report["repeats"]),
         ", ".join(f"{r['join_over_restart']:.3f}" for r in report["repeats"])),
    ]
    lines = [f"| seconds (grpo_tiny, gloo) | leave: {report['change']} | join: {report['join_change']} |",
             "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]
    load = ", ".join(f"{x:.1f}" for x in report["load_average_at_start"])
    note = f"; {report['note']}" if report.get("note") else ""
    return "\n".join(lines) + (f"\n\nData: `docs/bench/bench_elastic.json` ({report['date']}, {report['machine']}, load average "
                               f"{load} at the start{note}): `python scripts/bench_elastic.py --out "
                               f"docs/bench/bench_elastic.json`.")


def recovery_paths(bench: Path) -> str:
    """The recovery from a killed rank against kill-and-relaunch (`docs/bench/bench_recovery.json`)."""
    report = read(bench, "bench_recovery.json")
    rec, restart = report["recovery"], report["kill_and_relaunch"]
    rows = [
        ("recovery: kill -9 of rank 2 during step 6 -> the survivors' error and the announcement (`detect_seconds`)",
         rec["detect_seconds"]),
        ("recovery: old world released, new default group over 3 ranks (`world_seconds`)", rec["world_seconds"]),
        (f"recovery: the state rebuilt from own shards (mapped from node-local slot files) and rank 3's replica, "
         f"{rec['bytes_moved'] / 2**20:.1f} MiB moved (`move_seconds`)", rec["move_seconds"]),
        ("recovery: vLLM re-formed, weights synced, loop rolled back to step 5 (`rollout_seconds`)",
         rec["rollout_seconds"]),
        ("recovery: the new ring's replicas (`snapshot_seconds`)", rec["snapshot_seconds"]),
        ("recovery: step 6 redone on 3 ranks (`timing_s/step`)", rec["first_step_seconds"]),
        ("**recovery: from the kill to step 6 done**", rec["kill_to_first_step_seconds"]),
        (f"kill and relaunch without replicas: the run stops (exit {restart['killed_exit_code']})",
         restart["stop_seconds"]),
        ("kill and relaunch: relaunch on 3 ranks with `trainer.resume` of step 5, to step 6 done",
         restart["relaunch_to_first_step_seconds"]),
        ("**kill and relaunch: from the kill to step 6 done**", restart["kill_to_first_step_seconds"]),
        ("ratio (target: below 0.25)", report["recovery_over_relaunch"]),
    ]
    lines = ["| path | seconds |", "|---|---|"]
    lines += [f"| {what} | {f'**{value:.2f}**' if what.startswith('**') else f'{value:.2f}'} |" for what, value in rows]
    return "\n".join(lines)


def snapshot_cost(bench: Path) -> str:
    """The snapshots' cost on the step and their memory per rank, K=1, with replicas against without."""
    report, mib = read(bench, "bench_recovery.json"), 2**20
    costs = report["snapshot_cost"]
    rows = [
        ("mean iteration without / with replicas (`timing_s/iteration`, steps 3 on; the A/B pair with the median change)",
         lambda c: f"{c['replicas0_step_seconds']:.3f} / {c['replicas1_step_seconds']:.3f} s "
         f"({100 * c['step_time_change']:+.1f}%)"),
        ("the change in every A/B pair (run back to back, the order alternating), and their mean",
         lambda c: ", ".join(f"{100 * p['step_time_change']:+.1f}%" for p in c["pairs"])
         + f" (mean {100 * sum(p['step_time_change'] for p in c['pairs']) / len(c['pairs']):+.1f}%)"),
        ("on the loop's path (in the iteration): the copy into the own slot files and the wait for the previous send",
         lambda c: f"{c['on_path_seconds']:.4f} s ({100 * c['on_path_over_step']:.1f}% of a step)"),
        ("beside the next step: the replicas and the commit (`elastic/snapshot/seconds`)",
         lambda c: f"{c['snapshot_seconds']:.3f} s ({c['snapshot_bytes'] / mib:.1f} MiB over the world)"),
        ("CPU seconds of a snapshot on the rank's Python threads, the copy and the send (`cpu_seconds`)",
         lambda c: f"{c['cpu_seconds']:.4f} s ({100 * c['cpu_over_step']:.1f}% of a step)"),
        ("host memory per rank between snapshots (`host_bytes`: the predecessor's replica)",
         lambda c: f"{c['host_bytes_per_rank'] / mib:.2f} MiB (replica {c['replica_bytes_per_rank'] / mib:.2f} MiB)"),
        ("host memory per rank while a snapshot is sent (`peak_host_bytes`)",
         lambda c: f"{c['peak_host_bytes_per_rank'] / mib:.2f} MiB"),
        ("node-local disk per rank (`disk_bytes`: its own shards, two slots)", lambda c: f"{c['disk_bytes_per_rank'] / mib:.2f} MiB"),
    ]
    lines = [f"| rank 0, K=1, 4 ranks | {' | '.join(costs)} |", "|---|" + "---|" * len(costs)]
    lines += [f"| {what} | {' | '.join(cell(c) for c in costs.values())} |" for what, cell in rows]
    load = ", ".join(f"{x:.1f}" for x in report["load_average_at_start"])
    note = f"; {report['note']}" if report.get("note") else ""
    return "\n".join(lines) + (f"\n\nData: `docs/bench/bench_recovery.json` ({report['date']}, {report['machine']}, load "
                               f"average {load} at the start{note}): `python scripts/bench_elastic.py --part recovery "
                               f"--repeats {len(next(iter(costs.values()))['pairs'])} --out docs/bench/bench_recovery.json`.")


def short(result: str) -> str:
    """An error without source paths, peer ports and object addresses (they change from run to run)."""
    result = re.sub(r"\[/[^\]]*\] |\[[\d.]+\]:\d+\.? ?", "", result)
    result = re.sub(r"<[^>]* at 0x[0-9a-f]+>", "...", result)
    return result.split(" This is typically")[0].split(", please create")[0].replace("|", "/").strip()
