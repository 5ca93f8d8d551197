"""What a person sees of a run, in the launcher: rank 0's own lines (tracking/console.py), rendered for the mode of
`tracking.console`; everything else a rank prints stays in its log file.

  progress  on a terminal, a live line (what the run is doing, a bar, step, reward, last eval, elapsed, ETA) with
            rlhf_dyna's notices and each evaluated step printed above it; elsewhere the same as plain
  plain     rlhf_dyna's lines as they come, one per step
  verbose   everything rank 0 prints, third-party warnings and progress bars included
  off       rlhf_dyna's notices only, no step lines
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from rlhf_dyna.tracking import names
from rlhf_dyna.tracking.console import (
    CONSOLE_MODES, ETA_KEY, WORKING_SUFFIX, StepLine, format_duration, is_own_line, parse_step_line,
)


def _terminal_copy() -> IO[str]:
    """A stream on a copy of this process's stdout descriptor: it stays the console while descriptor 1 is lent to a
    log file (launch/output.py quiets the launcher's own imports that way)."""
    sys.stdout.flush()
    return os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")


class ConsoleView:
    def __init__(self, mode: str, stream: IO[str] | None = None) -> None:
        if mode not in CONSOLE_MODES:
            raise ValueError(f"console mode must be one of {CONSOLE_MODES}, got {mode!r}")
        self.mode = mode
        self._own_stream = stream is None
        self.stream = _terminal_copy() if stream is None else stream
        self.console = Console(file=self.stream, highlight=False)
        self.progress: Progress | None = None
        self._started = time.monotonic()
        self._lock = threading.Lock()  # rank 0's output arrives on the launcher's reader thread
        if mode == "progress" and self.console.is_terminal:
            self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
                TextColumn("{task.fields[step]}"), TextColumn("{task.fields[reward]}"),
                TextColumn("{task.fields[eval]}"), TimeElapsedColumn(), TextColumn("{task.fields[eta]}"),
                console=self.console, transient=True,
            )
            self._task = self.progress.add_task("starting", total=None, step="", reward="", eval="", eta="")
        self._live = False

    def start(self) -> None:
        """Start the live display (a thread of its own: the launcher starts it after forking the ranks)."""
        if self.progress is not None:
            self.progress.start()
            self._live = True

    def status(self, what: str) -> None:
        """The launcher's own status, phrased as announce() phrases a rank's."""
        self.rank_line(f"rlhf_dyna: {what}")

    def rank_line(self, line: str) -> None:
        """One line of rank 0's output (without its newline)."""
        if self.mode == "verbose":
            self._print(line)
            return
        if not is_own_line(line):
            return
        step = parse_step_line(line)
        if step is not None:
            self._step(line, step)
        elif self._live and line.endswith(WORKING_SUFFIX):
            self.progress.update(self._task, description=line.removeprefix("rlhf_dyna: ").removesuffix(WORKING_SUFFIX))
        else:
            self._print(line)

    def _step(self, line: str, step: StepLine) -> None:
        if self.mode == "off":
            return
        if self.progress is None:
            self._print(line)
            return
        fields = step.fields
        self.progress.update(
            self._task, total=step.total_steps, completed=step.step, description="training",
            step=f"step {step.step}/{step.total_steps}",
            reward=f"reward {fields[names.REWARD_MEAN]}" if names.REWARD_MEAN in fields else "",
            eval=f"eval {fields[names.EVAL_ACCURACY]}" if names.EVAL_ACCURACY in fields else "",
            eta=f"eta {fields[ETA_KEY]}" if ETA_KEY in fields else "",
        )
        if step.eval_step == step.step:  # an evaluated step stays on screen above the live line
            self._print(line)

    def _print(self, line: str) -> None:
        if self.progress is not None:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            with self._lock:
                self.stream.write(line + "\n")
                self.stream.flush()

    def close(self) -> None:
        """Stop the live line (what it showed last was printed above it where it mattered)."""
        if self._live:
            self.progress.stop()
            self._live = False
        self.stream.flush()
        if self._own_stream:
            self.stream.close()

    @property
    def elapsed(self) -> str:
        return format_duration(time.monotonic() - self._started)
