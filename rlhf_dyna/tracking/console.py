"""Per-step console output: a rich progress bar with a compact line per step on a terminal,
one plain line per step elsewhere (CI logs, files), so logs stay greppable."""
from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

from rlhf_dyna.tracking import names

CONSOLE_KEYS: tuple[str, ...] = (
    names.REWARD_MEAN, names.EVAL_ACCURACY, names.ACTOR_PG_LOSS, names.ACTOR_KL,
    names.CRITIC_VF_LOSS, names.RESPONSE_LENGTH_MEAN, names.TIMING_STEP,
)


def format_step_line(step: int, total_steps: int, metrics: Mapping[str, float], keys: Sequence[str]) -> str:
    """"step 3/20 | reward/mean 0.5 | actor/pg_loss -0.0123": only `keys` present in `metrics`."""
    parts = [f"step {step}/{total_steps}"]
    parts += [f"{key} {_number(metrics[key])}" for key in keys if key in metrics]
    return " | ".join(parts)


def _number(value: float) -> str:
    return str(value) if not math.isfinite(value) else f"{value:.4g}"


class ConsoleSink:
    def __init__(self, total_steps: int, keys: Sequence[str] = CONSOLE_KEYS, console: Console | None = None) -> None:
        self.total_steps = total_steps
        self.keys = tuple(keys)
        self.console = console if console is not None else Console()
        self.progress: Progress | None = None
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]rlhf_dyna"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TimeRemainingColumn(), console=self.console,
            )
            self.task_id = self.progress.add_task("steps", total=total_steps)
            self.progress.start()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        line = format_step_line(step, self.total_steps, metrics, self.keys)
        if self.progress is None:
            print(line, file=sys.stdout, flush=True)
            return
        self.progress.console.print(line, highlight=False, markup=False)
        self.progress.update(self.task_id, completed=min(step, self.total_steps))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
