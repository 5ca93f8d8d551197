"""Tables of the step-speed benchmarks: rlhf_dyna against TRL (bench_peer.json) and the train phase before and after
the engine work (profile_train_step.json)."""
from __future__ import annotations

from pathlib import Path

from .doc_tables import read


def peer(bench: Path) -> str:
    """One row per shape and precision: medians of the steady steps, phases, the ratio (median over pairs)."""
    report = read(bench, "bench_peer.json")
    rows = ["| shape | precision | pairs | rlhf_dyna s/step | generate / prepare / train / sync s | TRL s/step (fastest mode) "
            "| TRL generate / train s | **rlhf_dyna / TRL** |", "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        last = r["runs"][-1]
        dyna, trl = last["rlhf_dyna"], last["trl"]
        rows.append(f"| {r['shape']} ({r['prompts']} prompts x {r['n']} x {r['max_new_tokens']} tokens) | {r['precision']} "
                    f"| {len(r['runs'])} | {r['rlhf_dyna_step_s_median']:.2f} | {dyna['generate_s']:.2f} / "
                    f"{dyna['prepare_s']:.2f} / {dyna['train_s']:.2f} / {dyna['weight_sync_s']:.2f} "
                    f"| {r['trl_step_s_median']:.2f} ({trl['mode']}) | {trl['generate_s']:.2f} / {trl['train_s']:.2f} "
                    f"| **{r['ratio_median']:.2f}x** |")
    return "\n".join(rows)


def train_phase(bench: Path) -> str:
    """The real shape's prepare and train phases per rank, before (19690cd) and after the engine work."""
    report = read(bench, "profile_train_step.json")
    rows = ["| checkout | precision | prepare s wall (CPU) | train s wall (CPU) | train peak RSS per rank MiB | load average |",
            "|---|---|---|---|---|---|"]
    for run in report["runs"]:
        ranks = run["ranks"]
        phase = lambda name: (f"{max(r[name]['wall_s'] for r in ranks):.2f} "
                              f"({max(r[name]['cpu_s'] for r in ranks):.2f})")
        rows.append(f"| {run['checkout']} | {run['args']['precision']} | {phase('prepare')} | {phase('train')} "
                    f"| {max(r['train_peak_rss_mib'] for r in ranks):.0f} | {run['load_average'][0]} |")
    return "\n".join(rows)
