"""Rank 0's console lines: one plain, greppable line per step (step, metrics, the last eval, ETA) and the status lines
that say what the run is doing. The launcher reads them back (tracking/console_view.py) and renders them for a person:
a live progress bar on a terminal, the lines themselves elsewhere."""
from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rlhf_dyna.tracking import names

CONSOLE_MODES: tuple[str, ...] = ("progress", "plain", "verbose", "off")  # tracking.console
OWN_PREFIX = "rlhf_dyna:"  # every line of ours starts with it, but the step lines (not "rlhf_dyna.x.Error", a traceback's)
WORKING_SUFFIX = "..."  # a status line that ends so says what is being done now (the bar's caption, not a record)
CONSOLE_KEYS: tuple[str, ...] = (
    names.REWARD_MEAN, names.ACTOR_PG_LOSS, names.ACTOR_KL,
    names.CRITIC_VF_LOSS, names.RESPONSE_LENGTH_MEAN, names.TIMING_STEP,
)
ETA_KEY = "eta"
_STEP_LINE = re.compile(r"^step (\d+)/(\d+)((?: \| [^|]+)*)$")


def announce(what: str) -> None:
    """A status line: `what` ends with WORKING_SUFFIX while it is being done ("evaluating 64 prompts...")."""
    print(f"{OWN_PREFIX} {what}", flush=True)


def _number(value: float) -> str:
    return str(value) if not math.isfinite(value) else f"{value:.4g}"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_step_line(step: int, total_steps: int, metrics: Mapping[str, float], keys: Sequence[str],
                     last_eval: tuple[int, float] | None = None, eta_s: float | None = None) -> str:
    """"step 3/20 | reward/mean 0.5 | eval/accuracy 0.25 (step 0) | eta 0:01:10": the `keys` present in `metrics`,
    the last eval accuracy with the step it was measured at, and the estimated time to the last step."""
    parts = [f"step {step}/{total_steps}"]
    parts += [f"{key} {_number(metrics[key])}" for key in keys if key in metrics]
    if last_eval is not None:
        parts.append(f"{names.EVAL_ACCURACY} {_number(last_eval[1])} (step {last_eval[0]})")
    if eta_s is not None:
        parts.append(f"{ETA_KEY} {format_duration(eta_s)}")
    return " | ".join(parts)


@dataclass(frozen=True)
class StepLine:
    step: int
    total_steps: int
    fields: dict[str, str]  # key -> value as printed

    @property
    def eval_step(self) -> int | None:
        """The step of the eval accuracy this line shows, if any."""
        match = re.search(r"\(step (\d+)\)$", self.fields.get(names.EVAL_ACCURACY, ""))
        return int(match.group(1)) if match else None


def parse_step_line(line: str) -> StepLine | None:
    """The inverse of format_step_line; None for any other line."""
    match = _STEP_LINE.match(line)
    if match is None:
        return None
    fields = dict(part.split(" ", 1) for part in match.group(3).split(" | ")[1:] if " " in part)
    return StepLine(int(match.group(1)), int(match.group(2)), fields)


def is_own_line(line: str) -> bool:
    return line.startswith(OWN_PREFIX) or parse_step_line(line) is not None


class ConsoleSink:
    """Prints a step line to stdout for each logged step; the ETA comes from the steps timed in this process."""

    def __init__(self, total_steps: int, keys: Sequence[str] = CONSOLE_KEYS) -> None:
        self.total_steps = total_steps
        self.keys = tuple(keys)
        self.last_eval: tuple[int, float] | None = None
        self._first: tuple[int, float] | None = None  # (step, time) of the first step logged here

    def _eta(self, step: int) -> float | None:
        now = time.monotonic()
        if self._first is None:
            self._first = (step, now)
            return None
        done = step - self._first[0]
        return (now - self._first[1]) / done * (self.total_steps - step) if done > 0 else None

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if names.EVAL_ACCURACY in metrics:
            self.last_eval = (step, metrics[names.EVAL_ACCURACY])
        line = format_step_line(step, self.total_steps, metrics, self.keys, self.last_eval, self._eta(step))
        print(line, file=sys.stdout, flush=True)

    def close(self) -> None:
        sys.stdout.flush()
