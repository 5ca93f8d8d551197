"""RUN_DIR/join.json under torchrun (docs/elastic/join_requests.md): no launcher of ours runs, so rank 0 writes it when the ranks
start and rank 0 of the last world marks it finished when the run ends (launch/join_file.py).

The address is the one every rank reached the job's store at: MASTER_ADDR:MASTER_PORT, torchrun's agent store where
TORCHELASTIC_USE_AGENT_STORE=True (the agent serves it as long as it runs, whatever its workers do), else the store of
rank 0's own process. The launcher named is the agent: rank 0's parent process."""
from __future__ import annotations

import os
from pathlib import Path

from .join_file import RunningJob, mark_finished, this_node, write_join_file


def announce_job(run_dir: Path, config: Path, run_ident: str) -> None:
    """Rank 0, once the world is up: elastic.join=RUN_DIR processes may ask from now on."""
    write_join_file(run_dir, RunningJob(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), run_ident,
                                        os.getppid(), int(os.environ["WORLD_SIZE"]), str(config), node=this_node()))


def end_job(run_dir: Path) -> None:
    """Rank 0 of the last world, its run done: a late joiner is refused at once, not when the agent ends."""
    mark_finished(run_dir)
