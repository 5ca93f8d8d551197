"""Body of one rank: `python -m rlhf_dyna.worker OUTPUT_DIR` (spawned) or called under torchrun."""
from __future__ import annotations

import sys
from pathlib import Path

from .config import Config


def run_rank(cfg: Config, out_dir: Path) -> None:
    from .launch import init_distributed, shutdown_distributed
    from .orchestrator.loop import run_training

    dist_info = init_distributed()
    try:
        run_training(cfg, out_dir, dist_info)
    finally:
        shutdown_distributed()


def main() -> None:
    from .job import RESOLVED_CONFIG, load_config

    out_dir = Path(sys.argv[1])
    run_rank(load_config(out_dir / RESOLVED_CONFIG), out_dir)


if __name__ == "__main__":
    main()
