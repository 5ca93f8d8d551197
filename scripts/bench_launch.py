"""Start of local ranks, side by side: ranks that each import torch, transformers and vLLM themselves (exec) against
ranks forked from a launcher that imported them once (fork, what `python -m rlhf_dyna` does). The same resolved
config runs both ways, one after the other in one process; the script prints the wall time of each from spawn to
exit, their ratio, and whether the two runs logged the same metrics (timings aside).

    python scripts/bench_launch.py --out docs/bench/launch_fork.json -- recipe=grpo_tiny parallel.world_size=4 \
        trainer.total_steps=3 task.prompts_per_step=12 rollout.n=4 algorithm.micro_batch_size=4

The exec run goes first, so that the fork run's wall time includes the launcher's own import of the modules.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from rlhf_dyna.config import register_configs
from rlhf_dyna.job import QUIET_ENV, RANK_PRELOAD, RESOLVED_CONFIG, to_config
from rlhf_dyna.launch import spawn_ranks
from rlhf_dyna.checks import check_config
from rlhf_dyna.models.checkpoint_fields import resolve_model

QUIET = ["tracking.wandb_mode=disabled", "trainer.save_last=false", "trainer.export_policy=false"]


def resolved_config(overrides: list[str], out_dir: Path) -> int:
    """Write the config the app would hand its ranks into out_dir; returns the world size."""
    register_configs()
    with initialize_config_module("rlhf_dyna.conf", version_base="1.3"):
        cfg = to_config(compose("config", overrides=[*overrides, *QUIET]))
    recipes = [o.split("=", 1)[1] for o in overrides if o.startswith("recipe=")]
    cfg.recipe = recipes[-1] if recipes else cfg.recipe
    resolve_model(cfg)
    check_config(cfg)
    out_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.structured(cfg), out_dir / RESOLVED_CONFIG)
    return cfg.parallel.world_size


def without_timings(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/")) and not k.endswith("seconds")}
            for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="JSON to write")
    parser.add_argument("overrides", nargs="*", help="app overrides, after --")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method, preload in (("exec", ()), ("fork", RANK_PRELOAD)):
            run_dir = Path(tmp) / method
            world_size = resolved_config(args.overrides, run_dir)
            start = time.perf_counter()
            code = spawn_ranks(world_size, "rlhf_dyna.worker", [str(run_dir)], run_dir=run_dir, env=QUIET_ENV,
                               preload=preload)
            wall = time.perf_counter() - start
            if code:
                raise SystemExit(f"the {method} run failed with exit code {code}; see its log above")
            results[method] = {"wall_s": wall, "metrics": without_timings(run_dir / "metrics.jsonl")}
            print(f"{method}: {wall:.1f} s from spawn to exit", flush=True)
    same = results["exec"]["metrics"] == results["fork"]["metrics"]
    ratio = results["exec"]["wall_s"] / results["fork"]["wall_s"]
    print(f"exec / fork: {ratio:.2f}x; same metrics: {same}")
    if args.out:
        args.out.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {os.cpu_count()} cpus", "overrides": args.overrides,
            "exec_wall_s": results["exec"]["wall_s"], "fork_wall_s": results["fork"]["wall_s"],
            "exec_over_fork": ratio, "same_metrics": same,
            "load_average_after": os.getloadavg(),
        }, indent=1) + "\n")
    if not same:
        sys.exit("the exec and fork runs logged different metrics")


if __name__ == "__main__":
    main()
