"""The run's metrics sink: metrics.jsonl, wandb and the console, fed one dict per step.

Only rank 0 creates a Tracker (the orchestrator gathers metrics there first); constructing one
on another rank of an initialised process group raises, so metrics are never written twice.
Every Tracker of one output directory logs into one wandb run (its id kept in wandb/run_id): a
rank 0 that took over (the old one lost or left) and a trainer.resume in the same directory resume it.
"""
from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlhf_dyna.tracking.console import CONSOLE_KEYS, CONSOLE_MODES, ConsoleSink

WANDB_MODES: tuple[str, ...] = ("offline", "online", "disabled")
WANDB_KEYS: frozenset[str] = frozenset({"wandb_mode", "project", "run_name", "console", "transition_trace", "trace_syncs", "sample_log"})
METRICS_FILE = "metrics.jsonl"
WANDB_RUN_ID = "wandb/run_id"  # under the output directory


def _assert_rank_zero() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        raise RuntimeError(f"Tracker created on rank {dist.get_rank()}; only rank 0 may track metrics")


def _json_value(value: float) -> float | None:
    """Strict JSON has no NaN/Infinity: non-finite values are written as null."""
    return value if math.isfinite(value) else None


class Tracker:
    """Log one dict of float metrics per step to every sink.

    output_dir: the run's output directory; gets metrics.jsonl and wandb's run directory.
    wandb_cfg: mapping with the keys of the `tracking` config group: wandb_mode
      ("offline" default | "online" | "disabled"), project, run_name (None: wandb picks);
      "console" (that is the `console` argument) and the loop's trace keys are accepted and ignored. None = disabled.
    console: tracking.console, one of CONSOLE_MODES; all but "off" print a line per step (the launcher renders them).
    total_steps: the number of steps the run will make, for the step lines and their ETA.
    run_config: the resolved run config (plain dict), passed to wandb.init(config=...).
    after_step: the run was rolled back to the state after this step (a recovery whose lost rank 0 wrote the rows so
      far): metrics.jsonl's rows of later steps are dropped, and logging goes on from the next step.
    Steps must strictly increase across `log` calls: gather a step's metrics, then log once.
    """

    def __init__(
        self,
        output_dir: str | Path,
        wandb_cfg: Mapping[str, Any] | None,
        console: str,
        total_steps: int,
        run_config: Mapping[str, Any] | None = None,
        console_keys: Sequence[str] = CONSOLE_KEYS,
        after_step: int | None = None,
    ) -> None:
        _assert_rank_zero()
        if console not in CONSOLE_MODES:
            raise ValueError(f"console must be one of {CONSOLE_MODES}, got {console!r}")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if after_step is not None:
            drop_rows_after(self.output_dir / METRICS_FILE, after_step)
        # Append so a resumed run keeps its earlier steps.
        self._jsonl = (self.output_dir / METRICS_FILE).open("a", encoding="utf-8")
        self._last_step: int | None = after_step
        self._console = ConsoleSink(total_steps, console_keys) if console != "off" else None
        self._wandb_floor: int | None = None  # the last step wandb was sent before a rewind
        self._wandb_run = self._init_wandb(dict(wandb_cfg or {"wandb_mode": "disabled"}), run_config)

    def _init_wandb(self, cfg: dict[str, Any], run_config: Mapping[str, Any] | None) -> Any:
        unknown = set(cfg) - WANDB_KEYS
        if unknown:
            raise ValueError(f"unknown wandb_cfg keys {sorted(unknown)}; valid: {sorted(WANDB_KEYS)}")
        mode = cfg.get("wandb_mode", "offline")
        if mode not in WANDB_MODES:
            raise ValueError(f"wandb_mode must be one of {WANDB_MODES}, got {mode!r}")
        if mode == "disabled":
            return None
        import wandb  # slow import, only when wandb is used

        return wandb.init(
            id=wandb_run_id(self.output_dir),
            resume="allow",  # a later rank 0 of this run goes on in the same wandb run
            mode=mode,
            project=cfg.get("project", "rlhf_dyna"),
            name=cfg.get("run_name"),
            dir=str(self.output_dir),
            config=dict(run_config) if run_config is not None else None,
            reinit="create_new",
            # console="off": wandb must not wrap stdout, which carries the step lines.
            settings=wandb.Settings(console="off", silent=True),
        )

    @property
    def wandb_run_dir(self) -> Path | None:
        """The wandb run's local directory (offline: .../wandb/offline-run-*), None if disabled."""
        return Path(self._wandb_run.dir).parent if self._wandb_run is not None else None

    def rewind(self, step: int) -> None:
        """The run went back to the state after `step` (a recovery from a lost rank, orchestrator/recovery.py): the
        steps after it are logged again, and metrics.jsonl drops its rows of them, so that it holds each step once
        (a wandb run keeps what it was sent; it takes no step twice)."""
        if self._last_step is not None:
            floor = self._wandb_floor
            self._wandb_floor = self._last_step if floor is None else max(floor, self._last_step)
            self._last_step = min(self._last_step, step)
        self._jsonl.close()
        drop_rows_after(self.output_dir / METRICS_FILE, step)
        self._jsonl = (self.output_dir / METRICS_FILE).open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` (numbers, 0-dim tensors) for `step`; values are converted to float."""
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} logged after step {self._last_step}; steps must increase")
        self._last_step = step
        values = {key: float(value) for key, value in metrics.items()}
        if "step" in values:
            raise ValueError("'step' is reserved for the step number")
        record = {"step": step, **{key: _json_value(v) for key, v in values.items()}}
        self._jsonl.write(json.dumps(record, allow_nan=False) + "\n")
        self._jsonl.flush()
        if self._wandb_run is not None and (self._wandb_floor is None or step > self._wandb_floor):
            self._wandb_run.log(values, step=step)  # a redone step: wandb keeps the first values it was sent
        if self._console is not None:
            self._console.log(step, values)

    def close(self) -> None:
        """Flush and close every sink; safe to call twice. Shuts wandb's service process down, so
        that the run is complete on disk when this returns (one Tracker per process)."""
        if self._console is not None:
            self._console.close()
            self._console = None
        if self._wandb_run is not None:
            import wandb

            self._wandb_run.finish()
            # finish() can return before wandb-core flushes the offline run file (seen with wandb
            # 0.31: run-*.wandb held only its header); teardown waits for the service to exit.
            wandb.teardown()
            self._wandb_run = None
        if not self._jsonl.closed:
            self._jsonl.close()

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wandb_run_id(output_dir: Path) -> str:
    """The wandb run id of the run in `output_dir`: the one kept there, or a new one kept there from now on."""
    path = output_dir / WANDB_RUN_ID
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("x", encoding="utf-8") as f:  # x: two rank 0s never write two ids
            f.write(secrets.token_hex(4))  # wandb's own ids: 8 characters of [a-z0-9]
    except FileExistsError:
        pass
    return path.read_text(encoding="utf-8").strip()


def drop_rows_after(path: Path, step: int) -> int:
    """metrics.jsonl rewritten (atomically) without its rows of steps after `step`, and without a last line that a
    killed writer cut short; how many lines went. Lines that are no metrics row stay."""
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        if not line.endswith("\n"):  # only the last line can lack it: its writer died inside the write
            continue
        try:
            row_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            row_step = None
        if not isinstance(row_step, int) or row_step <= step:
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)
    return len(lines) - len(kept)
