"""Dry run of the paper's setting: 16 nodes x 8 GPUs (NVLink in a node, 8 x 200 Gb/s NICs per node).

For Llama-3-70B and Qwen3-235B-A22B: (a) training layout -> vLLM rollout layout (weights), and
(b) a change of the training layout with all optimizer state, 128 -> 64 GPUs.  Predictions only.

    python scripts/dryrun_paper.py [--out plan_summary_paper.json]
"""
from __future__ import annotations

import argparse

from rlhf_dyna.models.catalog_presets import preset_catalog
from rlhf_dyna.vps.cost import Cluster
from rlhf_dyna.vps.dryrun import Transition, format_table, summarize, write_summary
from rlhf_dyna.vps.spec import ParallelSpec, Phase

SETTINGS = {
    "llama3_70b": [
        Transition("70b train->rollout", ParallelSpec(dp=16, tp=8, master_weights=True),
                   ParallelSpec(Phase.ROLLOUT, dp=16, tp=8)),
        Transition("70b train 128->64 +optim", ParallelSpec(dp=16, tp=8, master_weights=True),
                   ParallelSpec(dp=8, tp=8, master_weights=True), in_place=True),
    ],
    "qwen3_235b_a22b": [
        Transition("235b train->rollout", ParallelSpec(dp=32, tp=4, ep=8, master_weights=True),
                   ParallelSpec(Phase.ROLLOUT, dp=8, vllm_dp=2, tp=8, ep=16)),
        Transition("235b train->rollout tp8", ParallelSpec(dp=32, tp=4, ep=8, master_weights=True),
                   ParallelSpec(Phase.ROLLOUT, dp=16, tp=8)),
        Transition("235b train 128->64 +optim", ParallelSpec(dp=32, tp=4, ep=8, master_weights=True),
                   ParallelSpec(dp=16, tp=4, ep=8, master_weights=True), in_place=True),
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="plan_summary_paper.json")
    args = parser.parse_args()
    cluster = Cluster.h100_nodes(16)
    rows = []
    for model, transitions in SETTINGS.items():
        rows += summarize(preset_catalog(model), transitions, cluster)
    print(format_table(rows))
    print(f"wrote {write_summary(rows, args.out)}")


if __name__ == "__main__":
    main()
