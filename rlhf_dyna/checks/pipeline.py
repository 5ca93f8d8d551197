"""Checks of pipeline-parallel layouts (train.pipeline_engine's limits).

Every layout the run trains in (parallel.train and each parallel.schedule entry) with pp > 1 must: have no more
stages than decoder layers (uneven splits are fine: vps.validate.stage_layers), split every batch it
trains on into equal micro-batches of algorithm.micro_batch_size rows per dp rank, and give 1F1B at least pp of
them.
"""
from __future__ import annotations

from ..config import Config
from ..parallel_layout import LayoutError

def _micro_batches(rows: int, micro: int | None, pp: int, schedule: str, what: str, where: str) -> str | None:
    mbs = min(micro or rows, rows)
    if rows % mbs:
        return (f"{where}: {what} gives {rows} rows per dp rank, which do not split into equal micro-batches of "
                f"algorithm.micro_batch_size={mbs}; choose a micro_batch_size that divides {rows}")
    if schedule == "1F1B" and rows // mbs < pp:
        return (f"{where}: {what} gives {rows // mbs} micro-batch(es) of {mbs} rows per dp rank but 1F1B needs at "
                f"least pp={pp}; set algorithm.micro_batch_size <= {rows // pp} or parallel.train.pp_schedule=GPipe")
    return None


def pipeline_problems(cfg: Config) -> list[str]:
    try:
        layouts = [("parallel.train", cfg.parallel.train_layout())]
        layouts += [(f"parallel.schedule[{i}]", s.layout) for i, s in enumerate(cfg.parallel.layout_schedule())]
    except LayoutError as err:  # an unknown schedule name, or a layout that does not fill the world
        return [str(err).rstrip(".")]
    problems = []
    layers = cfg.model.num_hidden_layers
    rows = cfg.task.prompts_per_step * cfg.rollout.n // max(cfg.algorithm.mini_batches, 1)
    for where, layout in (entry for entry in layouts if entry[1].pp > 1):
        pp, dp = layout.pp, layout.dp
        if pp > layers:
            problems.append(f"{where}: pp={pp} exceeds model.num_hidden_layers={layers}; valid pp: 1..{layers} "
                            f"(uneven splits are fine)")
        if layout.cp > 1:
            problems.append(f"{where}: pp={pp} with cp={layout.cp}: context parallel is not live; use cp=1")
        micro = cfg.algorithm.micro_batch_size
        checks = [(rows // dp, "task.prompts_per_step * rollout.n / algorithm.mini_batches")]
        if cfg.trainer.sft_warmup_steps > 0 and where == "parallel.train":
            checks.append((cfg.trainer.sft_batch_size // dp, "trainer.sft_batch_size"))
        for per_rank, what in checks:
            problem = _micro_batches(per_rank, micro, pp, layout.pp_schedule, what, where)
            if problem:
                problems.append(problem)
    return problems
