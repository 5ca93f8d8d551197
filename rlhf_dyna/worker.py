"""Body of one rank: `python -m rlhf_dyna.worker OUTPUT_DIR` (spawned) or called under torchrun."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed as dist

from .config import RESOLVED_CONFIG, Config, load_config
from .launch import init_distributed, record_failure, route_rank_output, shutdown_distributed
from .elastic.join_world import NotAdmitted
from .launch.fork import exit_now, imports_without_gc
from .launch.output import ROUTED_ENV, stacks_on_signal
from .launch.shm import vllm_tp_over_gloo
from .launch.spawn import JOINER_ENV
from .elastic.replicas import recovers_from_checkpoint
from .launch.torchrun_join import announce_job, end_job
from .train.shm_collectives import use_shm_collectives


def shared_output_dir(out_dir: Path) -> Path:
    """Under torchrun every rank composed its own Hydra output dir (timestamps differ): use rank 0's."""
    holder = [str(out_dir)]
    dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])


def use_collectives(cfg: Config) -> None:
    """This process's CPU collectives: FSDP's through /dev/shm (parallel.shm_collectives); vLLM's TP through gloo
    where a lost rank is survived (a dead peer breaks gloo's sockets, never vLLM's shm ring: launch/shm.py)."""
    use_shm_collectives(cfg.parallel.shm_collectives)
    e = cfg.elastic
    vllm_tp_over_gloo(cfg.rollout.tp > 1 and bool(e.replicas or recovers_from_checkpoint(e.replicas,
                                                                                          e.recover_from_checkpoint)))


def run_rank(cfg: Config, out_dir: Path, announce_joins: bool = False) -> None:
    """`announce_joins`: under torchrun, with elastic.accept_joins, rank 0 writes RUN_DIR/join.json (no launcher of
    ours does) and rank 0 of the last world marks it finished (launch/torchrun_join.py)."""
    dist_info = init_distributed(device=cfg.parallel.device, tf32=cfg.trainer.tf32)
    out_dir = shared_output_dir(out_dir)
    route_rank_output(out_dir, dist_info.rank, cfg.tracking.console)  # torchrun: output to logs/, as spawn_ranks does
    if announce_joins and dist_info.rank == 0:
        announce_job(out_dir, out_dir / RESOLVED_CONFIG, dist_info.run_ident)
    with imports_without_gc():
        from .orchestrator.loop import run_training  # after the routing: vLLM's import notices go to the rank's log
    use_collectives(cfg)

    try:
        run_training(cfg, out_dir, dist_info)
        if announce_joins and dist.is_initialized() and dist.get_rank() == 0:  # a rank that left has no world
            end_job(out_dir)
    except Exception as err:
        record_failure(err, dist_info.rank)  # before the peers fail of it, so the launcher shows this one
        raise
    finally:
        shutdown_distributed()


def run_joiner_process(cfg: Config, out_dir: Path, index: int) -> None:
    """Joiner process `index` (elastic.events join@S): it enters the world at its boundary (orchestrator/joiner.py)."""
    with imports_without_gc():
        from .orchestrator.joiner import run_joiner  # as in run_rank: vLLM's import notices go to the process's log
    use_collectives(cfg)

    try:
        run_joiner(cfg, out_dir, index)
    except Exception as err:
        record_failure(err, cfg.parallel.world_size + index)
        raise
    finally:
        shutdown_distributed()


def run_requested_join(cfg: Config, run_dir: Path) -> int:
    """elastic.join=RUN_DIR, in the process the command started: join the job running in run_dir with its config;
    the exit code (1 with one paragraph when the job refused this process or ended before admitting it)."""
    with imports_without_gc():
        from .orchestrator.joiner import run_joiner  # as in run_rank: torch, vLLM and the loop on first use
    use_collectives(cfg)

    try:
        run_joiner(cfg, run_dir, None)
    except NotAdmitted as err:
        print(f"rlhf_dyna: error: elastic.join={run_dir}: not admitted: {err}", file=sys.stderr)
        return 1
    except dist.DistError as err:  # the job's store, which the private world uses too, went away while preparing
        print(f"rlhf_dyna: error: elastic.join={run_dir}: not admitted: the job's store stopped answering while this "
              f"process prepared ({str(err).splitlines()[0]}): the job has ended. Join a job that is still running.",
              file=sys.stderr)
        return 1
    finally:
        shutdown_distributed()
    print(f"rlhf_dyna: the job in {run_dir} finished; this process trained with it to the end", flush=True)
    return 0


def main() -> None:
    out_dir = Path(sys.argv[1])
    cfg = load_config(out_dir / RESOLVED_CONFIG)
    joiner = os.environ.get(JOINER_ENV)
    if os.environ.get(ROUTED_ENV):  # our launcher's process (RANK: its launch index); torchrun may send SIGUSR1 itself
        stacks_on_signal(out_dir, f"rank{os.environ['RANK']}")
    if joiner is not None:
        run_joiner_process(cfg, out_dir, int(joiner))
    else:
        run_rank(cfg, out_dir)
    exit_now(0)  # the engines go with the process (VLLMRollout.close_for_exit): no teardown that would stop them


if __name__ == "__main__":
    main()
