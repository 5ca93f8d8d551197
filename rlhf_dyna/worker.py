"""Body of one rank: `python -m rlhf_dyna.worker OUTPUT_DIR` (spawned) or called under torchrun."""
from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

from .config import RESOLVED_CONFIG, Config, load_config
from .launch import init_distributed, shutdown_distributed
from .orchestrator.loop import run_training


def shared_output_dir(out_dir: Path) -> Path:
    """Under torchrun every rank composed its own Hydra output dir (timestamps differ): use rank 0's."""
    holder = [str(out_dir)]
    dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def run_rank(cfg: Config, out_dir: Path) -> None:
    dist_info = init_distributed(device=cfg.parallel.device, tf32=cfg.trainer.tf32)
    out_dir = shared_output_dir(out_dir)
    try:
        run_training(cfg, out_dir, dist_info)
    finally:
        shutdown_distributed()


def main() -> None:
    out_dir = Path(sys.argv[1])
    run_rank(load_config(out_dir / RESOLVED_CONFIG), out_dir)


if __name__ == "__main__":
    main()
