"""Body of one rank: `python -m rlhf_dyna.worker OUTPUT_DIR` (spawned) or called under torchrun."""
from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from .config import RESOLVED_CONFIG, Config, load_config
from .launch import init_distributed, record_failure, route_rank_output, shutdown_distributed
from .launch.fork import exit_now


def shared_output_dir(out_dir: Path) -> Path:
    """Under torchrun every rank composed its own Hydra output dir (timestamps differ): use rank 0's."""
    holder = [str(out_dir)]
    dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def run_rank(cfg: Config, out_dir: Path) -> None:
    dist_info = init_distributed(device=cfg.parallel.device, tf32=cfg.trainer.tf32)
    out_dir = shared_output_dir(out_dir)
    route_rank_output(out_dir, dist_info.rank, cfg.tracking.console)  # torchrun: output to logs/, as spawn_ranks does
    from .orchestrator.loop import run_training  # after the routing: vLLM's import notices go to the rank's log

    try:
        run_training(cfg, out_dir, dist_info)
    except Exception as err:
        record_failure(err, dist_info.rank)  # before the peers fail of it, so the launcher shows this one
        raise
    finally:
        shutdown_distributed()


def main() -> None:
    out_dir = Path(sys.argv[1])
    run_rank(load_config(out_dir / RESOLVED_CONFIG), out_dir)
    exit_now(0)  # the engines go with the process (VLLMRollout.close_for_exit): no teardown that would stop them


if __name__ == "__main__":
    main()
