"""Markdown tables of the committed benchmark JSON under docs/bench/, for the pages that show them.

Each function reads the JSON it names and returns one table (plus a line naming its data); nothing is typed in by
hand, so a page cannot drift from its data: scripts/docs_tables.py writes these between markers and its --check
(tests/unit/bench/test_docs_tables.py) fails when a page and its JSON disagree.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from compare_algos import table as algos_table

MIB = 2**20
QUIET_OVERRIDES = ("tracking.", "trainer.save_last", "trainer.export_policy")  # a run's outputs, not its training
# what each variant of an A/B run of scripts/profile_vllm_sync.py was (its --flags); "pooled" is the code of the day
SYNC_VARIANTS = {
    "pooled": "the code of that day",
    "fresh_staging": "vLLM staging allocated fresh for every layer group (before the staging pool)",
    "interleaved": "each message sent as soon as it is packed, not after the round's packing",
    "rss_sampled": "inside the memory probe that samples RSS from a thread every 2 ms",
    "rss_high_water": "inside the memory probe that reads the kernel's high-water mark",
    "row_dim1": "FSDP2 shards row-parallel weights on dim 1 (`pooled` is dim 0 in this run)",
    "late": "strided receives unpacked after the whole window arrived",
    "direct": "each vLLM replica receives from the training ranks directly (no relay)",
}


MOE_LABELS = {"train_to_vllm_moe": "FSDP dp4 -> real vLLM tp4, experts TP-sliced",
              "train_to_vllm_moe_ep": "FSDP dp4 -> real vLLM tp4, **expert parallel**"}


def read(bench: Path, name: str) -> dict:
    return json.loads((bench / name).read_text())


def day(stamp: str) -> str:
    return stamp[:10]  # the JSON's dates come as "2026-12-04 03:26 UTC", "2026-12-05T13:08:28+00:00" or "2026-12-04"


def _rows(report: dict, transition: str, size: str | None = None) -> dict[str, dict]:
    return {r["method"]: r for r in report["rows"] if r["transition"] == transition and (size is None or r["size"] == size)}


def _naive_over_vps(got: dict[str, dict]) -> float:
    return got["vps"].get("naive_over_vps", got["naive"]["seconds"] / got["vps"]["seconds"])


def _mib(value: float) -> str:
    return f"{value / MIB:,.1f}"


def _override(overrides: list[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}="))


def _split(rollout_ranks: float, world: int) -> str:
    return f"{rollout_ranks:.0f}+{world - rollout_ranks:.0f}"  # rollout set + train set


def results(bench: Path, prefix: str = "docs/bench/") -> str:
    """README's summary: one row per benchmark with its headline figure, its JSON and the JSON's date."""
    rows = []

    def row(what: str, measured: str, name: str, date: str) -> None:
        rows.append(f"| {what} | {measured} | [`{name}`]({prefix}{name}), {day(date)} |")

    lift = read(bench, "grpo_tiny_lift.json")
    run = lift["runs"][0]
    row("`python -m rlhf_dyna` (GRPO, tiny Llama, 2-digit addition)",
        f"greedy eval accuracy {run['pre_warmup_accuracy']:.3f} at random init, {run['accuracy_after_warmup']:.3f} after "
        f"the supervised warm-up, **{run['final_accuracy']:.3f}** after {run['final_step']} GRPO steps",
        "grpo_tiny_lift.json", lift["date"])

    reshard = read(bench, "bench_reshard.json")
    big = max(reshard["params"], key=reshard["params"].get)
    size, world, tp = f"{reshard['params'][big] / 1e6:.0f}M", reshard["world"], reshard["rollout_tp"]
    sync, relayout = _rows(reshard, "train_to_vllm", big), _rows(reshard, "dp4_to_dp2tp2", big)
    row(f"weight sync FSDP dp{world} -> real vLLM tp{tp} x dp{world // tp}, {size} parameters",
        f"vps {sync['vps']['seconds']:.2f} s ({sync['vps']['x_floor']:.2f}x its floor); gather-everything baseline "
        f"{sync['naive']['seconds']:.2f} s: vps **{_naive_over_vps(sync):.2f}x** faster", "bench_reshard.json", reshard["date"])
    restart = relayout["checkpoint_restart"]["seconds"]
    row(f"training layout dp{world} -> dp2 x tp2 with AdamW state, {size}",
        f"vps {relayout['vps']['seconds']:.2f} s; DCP save + restart {restart:.1f} s: "
        f"**{restart / relayout['vps']['seconds']:.0f}x**", "bench_reshard.json", reshard["date"])

    moe = read(bench, "bench_reshard_moe.json")
    moe_size = next(iter(moe["params"]))
    ep = _rows(moe, "train_to_vllm_moe_ep", moe_size)
    row(f"MoE weight sync into vLLM with expert parallelism, {moe['params'][moe_size] / 1e6:.0f}M",
        f"vps {ep['vps']['seconds']:.2f} s, naive {ep['naive']['seconds']:.2f} s: "
        f"**{ep['naive']['seconds'] / ep['vps']['seconds']:.1f}x**; {_mib(max(ep['floor']['vps_received_by_rank']))} MiB "
        f"received per rank instead of {_mib(ep['floor']['naive_received_per_rank'])} MiB", "bench_reshard_moe.json",
        moe["date"])

    pp_report = read(bench, "bench_reshard_pp.json")
    pp = next(r for r in pp_report["rows"] if r["transition"] == "dp4_to_pp2dp2" and r["params"] > 1e7)
    row(f"dp4 -> pp2 x dp2 with AdamW state, {pp['params'] / 1e6:.0f}M",
        f"vps {pp['vps_seconds']:.2f} s; DCP save + restart {pp['dcp_with_restart_seconds']:.0f} s: **{pp['speedup']:.0f}x**",
        "bench_reshard_pp.json", pp_report["machine"]["date"])

    load = read(bench, "bench_load.json")
    dp_only = next(layout for layout in load["layouts"] if layout["tp"] == 1)["ranks"]
    row(f"loading a {load['model']['parameters'] / 1e6:.0f}M bf16 checkpoint on {load['world']} ranks (dp)",
        f"peak memory growth per rank **{max(r['per_shard_peak_mib'] for r in dp_only):.0f} MiB** reading only its "
        f"shard, {max(r['full_model_peak_mib'] for r in dp_only):.0f} MiB loading the whole model", "bench_load.json",
        load["date"])

    launch = read(bench, "launch_fork.json")
    row(f"start of {_override(launch['overrides'], 'parallel.world_size')} local ranks, a "
        f"{_override(launch['overrides'], 'trainer.total_steps')}-step run",
        f"{launch['fork_wall_s']:.1f} s forked from one import, {launch['exec_wall_s']:.1f} s each rank importing: "
        f"**{launch['exec_over_fork']:.2f}x**", "launch_fork.json", launch["date"])

    rebalance = read(bench, "placement_rebalance.json")
    move = next(p for p in rebalance["placements"].values() if p.get("moves"))["moves"][0]
    ranks = int(_override(rebalance["overrides"], "parallel.world_size"))
    row(f"automatic re-balancing of a split run ({_split(move['from_rollout_ranks'], ranks)} -> "
        f"{_split(move['to_rollout_ranks'], ranks)} ranks)",
        f"the move cost the step it served {move['lost_s']:.3f} s, **{100 * move['share_of_its_step']:.1f}%**",
        "placement_rebalance.json", rebalance["date"])

    pipeline = read(bench, "rm_pipeline.json")
    summary = pipeline["summary"]
    row("the classic RLHF pipeline (pairs -> reward model -> PPO), tiny Llama",
        f"reward model held-out pair accuracy {summary['rm_heldout_accuracy_end']:.2f}; PPO with it: sevens per "
        f"completion (the rule the pairs encode) {summary['ppo_sevens_per_completion_first5']:.2f} -> "
        f"**{summary['ppo_sevens_per_completion_last5']:.2f}** in {pipeline['ppo_steps']} steps", "rm_pipeline.json",
        pipeline["date"])
    peer = read(bench, "bench_peer.json")
    modes = (f"TRL's fastest of {len(peer['trl_modes'])} launch modes" if len(peer["trl_modes"]) > 1
             else f"TRL launched as {peer['trl_modes'][0]}, processes x threads")
    for shape, model in (("real", "135M-shaped checkpoint"), ("tiny", "tiny checkpoint (hidden 256 x 4 layers)")):
        runs = [r for r in peer["results"] if r["shape"] == shape]
        if not runs:
            continue
        row(f"a GRPO step against TRL's `GRPOTrainer`, {model}, {runs[0]['prompts']} prompts x {runs[0]['n']} x "
            f"{runs[0]['max_new_tokens']} tokens, each side at the same precision",
            "; ".join(f"{r['precision']}: rlhf_dyna {r['rlhf_dyna_step_s_median']:.2f} s, TRL "
                      f"{r['trl_step_s_median']:.2f} s, **{r['ratio_median']:.2f}x**" for r in runs)
            + f" TRL's time ({modes})", "bench_peer.json", peer["date"])
    elastic = read(bench, "bench_elastic.json")
    leave, join = elastic["leave"], elastic["join"]
    row("a rank leaving a live 4-rank grpo_tiny run after step 2, and one joining a 3-rank run",
        f"from the boundary to step 3 done: leave {leave['boundary_to_first_step_seconds']:.2f} s, "
        f"**{100 * elastic['leave_over_restart']:.1f}%** of save, stop and restart; join "
        f"{join['boundary_to_first_step_seconds']:.2f} s, **{100 * elastic['join_over_restart']:.1f}%**",
        "bench_elastic.json", elastic["date"])
    recovery = read(bench, "bench_recovery.json")
    kept, relaunched = recovery["recovery"], recovery["kill_and_relaunch"]
    row("a rank killed (kill -9) during step 6 of a 4-rank grpo_tiny run, `elastic.replicas=1`",
        f"from the kill to step 6 done on 3 ranks: {kept['kill_to_first_step_seconds']:.2f} s from in-memory replicas; "
        f"{relaunched['kill_to_first_step_seconds']:.2f} s stopping and relaunching with `trainer.resume`: "
        f"**{recovery['recovery_over_relaunch']:.2f}x**", "bench_recovery.json", recovery["date"])
    return "\n".join(["| what | measured | data |", "|---|---|---|", *rows])


def rm_pipeline(result: dict) -> str:
    """docs/reward_models.md: the pipeline's two stages, first and last values, from rm_pipeline.json."""
    s = result["summary"]
    lines = ["| stage | measured | start | end |", "|---|---|---|---|",
             f"| reward model ({result['rm_steps']} steps, recipe=reward_tiny) | held-out pair accuracy | "
             f"{s['rm_heldout_accuracy_start']:.3f} | {s['rm_heldout_accuracy_end']:.3f} |",
             f"| PPO ({result['ppo_steps']} steps, recipe=ppo_rm_tiny) | reward/rm/mean (mean of first / last 5 steps) | "
             f"{s['ppo_rm_mean_first5']:.2f} | {s['ppo_rm_mean_last5']:.2f} |",
             f"| PPO | sevens per completion, by the rule (first / last 5 steps) | "
             f"{s['ppo_sevens_per_completion_first5']:.2f} | {s['ppo_sevens_per_completion_last5']:.2f} |"]
    return "\n".join(lines) + (f"\n\nData: [`rm_pipeline.json`](bench/rm_pipeline.json) ({result['date']}, "
                                f"{result['machine']}); {s['rm_seconds']:.0f} s and {s['ppo_seconds']:.0f} s of wall time.")


def reshard_history(bench: Path) -> str:
    """Every committed run of scripts/bench_reshard.py into real vLLM, by date: vps seconds, x floor, naive / vps."""
    runs = sorted([*(bench / "runs").glob("bench_reshard_*.json"), bench / "bench_reshard.json"],
                  key=lambda p: read(p.parent, p.name)["date"])
    sizes = {"60m": "58M", "300m": "314M", "500m": "512M"}
    lines = ["| date (UTC) | JSON | " + " | ".join(f"{label}: vps s (x floor), naive / vps" for label in sizes.values()) + " |",
             "|" + "---|" * (2 + len(sizes))]
    for path in runs:
        report = read(path.parent, path.name)
        cells = []
        for size in sizes:
            got = _rows(report, "train_to_vllm", size)
            cells.append(f"{got['vps']['seconds']:.2f} ({got['vps']['x_floor']:.2f}x), {_naive_over_vps(got):.1f}x"
                         if "vps" in got else "–")
        if any(c != "–" for c in cells):
            where = path.relative_to(bench).as_posix()
            lines.append(f"| {report['date'][:16]} | [`{path.name}`]({where}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sync_ab(bench: Path) -> str:
    """The A/B runs of scripts/profile_vllm_sync.py: variants alternated in one run, medians side by side."""
    lines = ["| JSON (date, size) | variant | runs | median s | median x floor |", "|---|---|---|---|---|"]
    for path in sorted((bench / "runs").glob("profile_vllm_sync_*.json")):
        report = read(path.parent, path.name)
        variants: dict[str, list[dict]] = {}
        for run in report["runs"]:
            variants.setdefault(run["variant"], []).append(run)
        if len(variants) < 2:
            continue
        where = f"[`{path.name}`]({path.relative_to(bench).as_posix()}) ({report['date'][:16]}, {report['size']})"
        for name, runs in variants.items():
            lines.append(f"| {where} | `{name}`: {SYNC_VARIANTS[name]} | {len(runs)} | "
                         f"{statistics.median(r['seconds'] for r in runs):.3f} | "
                         f"{statistics.median(r['ratio'] for r in runs):.2f}x |")
            where = ""
    return "\n".join(lines)


def reshard_pp(bench: Path) -> str:
    report = read(bench, "bench_reshard_pp.json")
    lines = ["| model | transition | vps warm s | vps cold s (planning included) | MiB moved = independent count | "
             "DCP save + restart s | vps faster |", "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        check = "=" if r["vps_bytes_moved"] == r["independent_bytes"] else "**!=**"
        lines.append(f"| {r['size']} ({r['params'] / 1e6:.2f}M) | {r['transition']} | {r['vps_seconds']:.2f} | "
                     f"{r['vps_cold_seconds']:.2f} | {r['vps_bytes_moved'] / MIB:.1f} {check} {r['independent_bytes'] / MIB:.1f} | "
                     f"{r['dcp_save_seconds']:.1f} + {r['dcp_restart_seconds']:.1f} | {r['speedup']:.0f}x |")
    m = report["machine"]
    return "\n".join(lines) + f"\n\nData: `bench_reshard_pp.json` ({m['date']}, {m['cpus']} CPUs, {m['world']} {m['backend']} ranks)."


def pp_step(bench: Path) -> str:
    report = read(bench, "bench_pp_step.json")
    keys = ("timing_s/step", "timing_s/gen", "timing_s/prepare", "timing_s/train_actor", "timing_s/weight_sync")
    lines = ["| layout | " + " | ".join(k.split("/")[1] + " s" for k in keys) + " | predicted bubble |",
             "|" + "---|" * (len(keys) + 2)]
    for layout, t in report["layouts"].items():
        lines.append(f"| {layout} | " + " | ".join(f"{t[k]:.3f}" for k in keys) + f" | {t['pp/bubble_fraction']:.3f} |")
    return "\n".join(lines) + (f"\n\nData: `bench_pp_step.json` ({report['date']}, {report['cpus']} CPUs, load average "
                               f"{report['load_average_after']} after the run; medians of the steps after the first).")


def load(bench: Path) -> str:
    report = read(bench, "bench_load.json")
    lines = ["| layout | shard MiB | largest tensor MiB | bound MiB | per-shard peak MiB | read from disk MiB | "
             "full-model peak MiB |", "|---|---|---|---|---|---|---|"]
    for layout in report["layouts"]:
        worst = max(layout["ranks"], key=lambda r: r["per_shard_peak_mib"])
        full = max(r["full_model_peak_mib"] for r in layout["ranks"])
        lines.append(f"| dp={layout['dp']} x tp={layout['tp']} | {worst['shard_mib']:.1f} | {worst['largest_tensor_mib']:.1f} | "
                     f"{worst['bound_mib']:.1f} | {worst['per_shard_peak_mib']:.1f} "
                     f"({worst['per_shard_peak_mib'] / worst['bound_mib']:.2f} x bound) | {worst['bytes_read_mib']:.1f} | "
                     f"{full:.1f} ({full / worst['bound_mib']:.2f} x bound) |")
    return "\n".join(lines) + f"\n\nData: `bench_load.json` ({report['date']}, {report['machine']}; worst rank of each layout)."


def placements_live(bench: Path) -> str:
    """Every committed scripts/placement_live.py run: per placement the mean step and what its changes cost."""
    lines = ["| JSON (date) | placement (and its overrides) | mean step s | changes: mean share of the step | worst single "
             "change | groups built s | switch waited s |", "|---|---|---|---|---|---|---|"]
    for name in ("placement_live.json", "placement_split.json", "placement_rebalance.json",
                 "runs/placement_rebalance_before_background_prep.json"):
        report = read(bench, name)
        where = f"[`{Path(name).name}`]({name}) ({report['date']})"
        for placement, s in report["placements"].items():
            changes = (f"{100 * s['mean_change_share']:.1f}% | {100 * s['worst_single_change_share']:.1f}% | "
                       f"{s['build_s']:.3f} | {s['max_wait_s']:.4f}") if "changes" in s else "– | – | – | –"
            lines.append(f"| {where} | `{placement}` | {s['mean_step_s']:.2f} | {changes} |")
            where = ""
    return "\n".join(lines)


def rebalance_moves(bench: Path) -> str:
    lines = ["| JSON (date) | after step | rollout + train ranks | predicted gain s/step | predicted cost s | move took s | "
             "share of the step it served | that step lost s | measured gain s |", "|---|---|---|---|---|---|---|---|---|"]
    for name in ("placement_rebalance.json", "runs/placement_rebalance_before_background_prep.json"):
        report = read(bench, name)
        world = int(_override(report["overrides"], "parallel.world_size"))
        for s in report["placements"].values():
            for m in s.get("moves", []):
                lost = f"{m['lost_s']:.3f}" if "lost_s" in m else "not logged then"
                lines.append(f"| [`{Path(name).name}`]({name}) ({report['date']}) | {m['after_step']} | "
                             f"{_split(m['from_rollout_ranks'], world)} -> {_split(m['to_rollout_ranks'], world)} | "
                             f"{m['predicted_gain_s_per_step']:.3f} | {m['predicted_cost_s']:.4f} | {m['transition_s']:.3f} | "
                             f"{100 * m['share_of_its_step']:.1f}% | {lost} | {s['measured_gain_s']:.2f} |")
    return "\n".join(lines)


def launch(bench: Path) -> str:
    report = read(bench, "launch_fork.json")
    table = ("| ranks import for themselves (exec) | forked from one import | exec / fork | same metrics |\n|---|---|---|---|\n"
             f"| {report['exec_wall_s']:.1f} s | {report['fork_wall_s']:.1f} s | {report['exec_over_fork']:.2f}x | "
             f"{'yes' if report['same_metrics'] else 'NO'} |")
    return table + (f"\n\nData: `launch_fork.json` ({report['date']}, {report['machine']}, load average "
                     f"{report['load_average_after'][0]:.1f} after the runs); overrides: `{' '.join(report['overrides'])}`.")


def lift(bench: Path) -> str:
    """grpo_tiny's RL lift (the default run) and the tuning runs behind its settings."""
    lines = ["| JSON (date) | run | overrides | last step | accuracy after warm-up | final | RL lift | best | wall s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in ("grpo_tiny_lift.json", "grpo_tiny_tuning.json"):
        report = read(bench, name)
        low, high = report["load_average_start_end"]
        where = f"[`{name}`]({name}) ({report['date']}, load {low}-{high})"
        for run in report["runs"]:
            own = " ".join(o for o in run["overrides"] if not o.startswith(QUIET_OVERRIDES)) or "(the recipe of that day)"
            lines.append(f"| {where} | {run['run_dir']} | `{own}` | {run['final_step']} | "
                         f"{run['accuracy_after_warmup']:.3f} | {run['final_accuracy']:.3f} | {run['rl_lift']:+.3f} | "
                         f"{run['best_accuracy']:.3f} | {run['wall_s']:.0f} |")
            where = ""
    return "\n".join(lines)


def compare_algos(bench: Path) -> str:
    report = read(bench, "compare_algos.json")
    return algos_table(report["results"]) + (f"\n\nData: `compare_algos.json` ({report['date']}, {report['machine']}); "
                                             f"command: `{report['command']}`.")


def planning(bench: Path) -> str:
    report = read(bench, "bench_plan.json")
    lines = ["| setting | source -> destination | classes | rounds | cold planning, best CPU s (runs) | target |",
             "|---|---|---|---|---|---|"]
    for name, c in report["cases"].items():
        runs = ", ".join(f"{t:.2f}" for t in c["cpu_s_runs"])
        lines.append(f"| {name} | {c['src']} -> {c['dst']} | {c['classes']} | {c['rounds']} | **{c['best_cpu_s']:.2f}** "
                     f"({runs}) | < {c['target_s']} s |")
    load = ", ".join(f"{x:.1f}" for x in report["load_average_start"])
    return "\n".join(lines) + f"\n\nData: `bench_plan.json` ({report['date']}, {report['machine']}, load average {load} at the start)."


def dry_run(bench: Path) -> str:
    report = read(bench, "dryrun_paper.json")
    lines = ["| transition | source -> destination | state GB | moved GB (= minimum) | rounds | peak extra GB per rank | "
             "**predicted s** |", "|---|---|---|---|---|---|---|"]
    for r in report["transitions"]:
        check = "=" if r["bytes_moved"] == r["bytes_min"] else "**>**"
        lines.append(f"| {r['transition']} | {r['src']} -> {r['dst']} | {r['bytes_total'] / 1e9:.0f} | "
                     f"{r['bytes_moved'] / 1e9:.0f} {check} {r['bytes_min'] / 1e9:.0f} | {r['rounds']} | "
                     f"{r['peak_extra_bytes'] / 1e9:.1f} | **{r['predicted_s']:.2f}** |")
    return "\n".join(lines) + "\n\nData: `dryrun_paper.json` (predictions of the cost model, not measurements)."


def moe_table(report: dict) -> str:
    """A bench_reshard_moe.json: seconds of the slowest rank, medians of paired runs."""
    lines = ["| size | target | floor: wire + repack | **vps** (x floor) | naive | naive / vps | MiB each rollout rank "
             "receives: vps (max) / naive | experts per rank | expert MiB per rank (= live vLLM) | vps peak extra MiB |",
             "|" + "---|" * 10]
    for size, params in report["params"].items():
        for target in report["targets"]:
            got = _rows(report, target, size)
            if "vps" not in got:
                continue
            floor, vps, naive = got["floor"], got["vps"], got["naive"]
            ok = "" if all(r["correct"] for r in got.values()) else " **(mismatch)**"
            experts = "/".join(str(len(e)) for e in floor["experts_by_rank"])
            width = "" if floor["expert_parallel"] else f" (width {floor['expert_width_by_rank'][0]} each)"
            lines.append(f"| {params / 1e6:.0f}M | {MOE_LABELS[target]}{ok} | {floor['wire_seconds']:.3f} + "
                         f"{floor['repack_seconds']:.3f} | **{vps['seconds']:.3f}** ({vps['x_floor']:.2f}x) | "
                         f"{naive['seconds']:.3f} | {naive['seconds'] / vps['seconds']:.1f}x | "
                         f"{_mib(max(floor['vps_received_by_rank']))} / {_mib(floor['naive_received_per_rank'])} | "
                         f"{experts}{width} | {_mib(max(floor['planned_expert_bytes_by_rank']))} | "
                         f"{_mib(vps['peak_extra_bytes'])} |")
    stamp = f"{report['date']}, {report['machine']}, {report['world']} gloo ranks"
    return "\n".join(lines) + f"\n\nData: `docs/bench/bench_reshard_moe.json` ({stamp}); table: `python scripts/docs_tables.py`."


def placement_table(result: dict) -> str:
    """A bench_placement.json: measured phase seconds per rank count, then each simulated workload's policies."""
    lines = ["| ranks | generate s | prepare s | train actor s | train critic s | weight sync s | step s |",
             "|---|---|---|---|---|---|---|"]
    for n, t in sorted(result["measured"]["ppo"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {n} | {t['generate']:.2f} | {t['prepare']:.2f} | {t['train_actor']:.2f} | "
                     f"{t['train_critic']:.2f} | {t['weight_sync']:.2f} | {t['step']:.2f} |")
    for key in ("ppo_tiny_8gpu", "grpo_70b_128gpu"):
        lines += ["", f"{key}:", "", "| policy | sets | step s | transitions s |", "|---|---|---|---|"]
        for r in result["simulation"][key]:
            sets = ", ".join(f"{k} {v}" for k, v in r["sets"].items())
            lines.append(f"| {r['policy']} | {sets} | {r['step_s']:.3f} | {r['transition_s']:.4f} |")
    if "reward_model" in result:
        lines += ["", *reward_model_placements(result["reward_model"])]
    return "\n".join(lines) + f"\n\nData: `bench_placement.json` ({result['date']}, {result['machine']})."


def reward_model_placements(rm: dict) -> list[str]:
    """PPO with a reward model, live on the same ranks under each placement: its scoring phase and moves."""
    m = rm["model"]
    lines = [f"reward model beside PPO, live on {rm['world_size']} ranks ({rm['date']}; policy, critic and reward model "
             f"hidden {m['hidden_size']} x {m['num_hidden_layers']} layers; {rm['prompts_per_step']} prompts x 4 samples, "
             f"median of steps 2-{rm['steps']}):", "",
             "| placement | step s | timing_s/reward_model | share of step | reward model moves s | moved MiB |",
             "|---|---|---|---|---|---|"]
    for name, r in rm["placements"].items():
        lines.append(f"| {name} | {r['step_s']:.2f} | {r['reward_model_s']:.3f} | {r['reward_model_s'] / r['step_s']:.1%} "
                     f"| {r['moves_s']:.3f} | {r['moved_bytes'] / 2**20:.1f} |")
    return lines
