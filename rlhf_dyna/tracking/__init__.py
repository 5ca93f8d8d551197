"""Metrics sinks (metrics.jsonl, wandb, console) and the metric names they share."""
from rlhf_dyna.tracking import names
from rlhf_dyna.tracking.console import CONSOLE_KEYS, CONSOLE_MODES, ConsoleSink, format_step_line, parse_step_line
from rlhf_dyna.tracking.tracker import METRICS_FILE, WANDB_MODES, Tracker

__all__ = ["CONSOLE_KEYS", "CONSOLE_MODES", "METRICS_FILE", "WANDB_MODES", "ConsoleSink", "Tracker", "format_step_line",
           "names", "parse_step_line"]
