"""Entry point: `python -m rlhf_dyna [recipe=NAME] [key=value ...]` (Hydra app, multirun with -m)."""
from __future__ import annotations

import gc
import sys

gc.disable()  # until main(): Hydra and torch import without collections (launch/fork.imports_without_gc)

import hydra
from omegaconf import DictConfig

from .checks import ConfigError
from .checks.overrides import check_overrides
from .config import register_configs
from .job import run_job
from .launch.fork import exit_now, exit_status, imports_done

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://rlhf_dyna.conf", config_name="config")
def app(dcfg: DictConfig) -> None:
    code = run_job(dcfg)
    if code:
        raise SystemExit(code)


def main() -> None:
    imports_done()
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        print(f"rlhf_dyna: error: {err}", file=sys.stderr)
        exit_now(2)
    try:
        app()
    except SystemExit as err:
        exit_now(exit_status(err))
    exit_now(0)


if __name__ == "__main__":
    main()
