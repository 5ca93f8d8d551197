"""Run checkpoints on disk: `<run dir>/checkpoints/step_<N>/`, complete only with its COMPLETE marker.

Pure file-system logic (no torch.distributed), so a bad `trainer.resume` fails before any rank spawns."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

CHECKPOINTS = "checkpoints"
MARKER = "COMPLETE"  # json: step, layout, files; written last, then the dir is renamed from step_<N>.tmp
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A `trainer.resume` that points at nothing usable."""


def step_dir(checkpoints: Path, step: int) -> Path:
    return checkpoints / f"step_{step}"


def missing_files(path: Path) -> list[str]:
    """What a complete checkpoint dir lacks: the marker, or a file the marker lists."""
    marker = path / MARKER
    if not marker.is_file():
        return [MARKER]
    try:
        listed = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError):
        return [f"{MARKER} (unreadable)"]
    return [name for name in listed if not (path / name).exists()]


def read_marker(path: Path) -> dict:
    return json.loads((path / MARKER).read_text())


def scan(checkpoints: Path) -> tuple[list[tuple[int, Path]], list[Path]]:
    """(complete (step, dir) sorted by step, incomplete dirs incl. leftover step_<N>.tmp) under `checkpoints`."""
    complete, incomplete = [], []
    if not checkpoints.is_dir():
        return complete, incomplete
    for path in sorted(checkpoints.iterdir()):
        match = STEP_DIR.match(path.name)
        if match and path.is_dir() and not missing_files(path):
            complete.append((int(match.group(1)), path))
        elif path.is_dir() and path.name.startswith("step_"):
            incomplete.append(path)
    return sorted(complete), incomplete


def _listing(checkpoints: Path) -> str:
    complete, _ = scan(checkpoints)
    return ", ".join(str(p) for _, p in complete) or "none"


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """The step dir to resume from: None (fresh run), `auto` (latest complete one under run_dir, None if there is
    none), or a path to a step_<N> dir, a checkpoints/ dir or a run dir holding one. Raises CheckpointError."""
    if resume is None or resume in ("", "none", "null"):
        return None
    if resume == "auto":
        complete, incomplete = scan(run_dir / CHECKPOINTS)
        for path in incomplete:
            print(f"rlhf_dyna: ignoring incomplete checkpoint {path} (missing {', '.join(missing_files(path))})")
        if not complete:
            print(f"rlhf_dyna: trainer.resume=auto: no complete checkpoint under {run_dir / CHECKPOINTS}; starting fresh")
            return None
        return complete[-1][1]
    path = Path(resume).expanduser().resolve()
    if not path.exists():
        raise CheckpointError(
            f"trainer.resume={resume}: {path} does not exist. Give a checkpoints/step_<N> dir, a checkpoints/ dir, or "
            f"a run dir that holds one, or trainer.resume=auto with hydra.run.dir=<the run's dir>.")
    if STEP_DIR.match(path.name):
        missing = missing_files(path)
        if missing:
            raise CheckpointError(
                f"trainer.resume={resume}: {path} is an incomplete checkpoint (missing {', '.join(missing)}); a run "
                f"killed while saving leaves one. Complete checkpoints in {path.parent}: {_listing(path.parent)}.")
        return path
    checkpoints = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    complete, _ = scan(checkpoints)
    if not complete:
        raise CheckpointError(
            f"trainer.resume={resume}: no complete checkpoint (step_<N>/ with a {MARKER} marker) under {checkpoints}; "
            f"found {sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else 'no such dir'}.")
    return complete[-1][1]


def prune(checkpoints: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints (keep <= 0: all); older and leftover .tmp dirs go."""
    complete, incomplete = scan(checkpoints)
    doomed = [p for _, p in complete[:-keep]] if keep > 0 else []
    for path in doomed + [p for p in incomplete if p.name.endswith(".tmp")]:
        shutil.rmtree(path, ignore_errors=True)


def resolve_trainer_resume(trainer, run_dir: Path) -> str | None:
    """Checks the checkpoint keys of `trainer` (TrainerConfig) and returns trainer.resume as a concrete step dir."""
    for key in ("save_every", "keep_checkpoints"):
        if getattr(trainer, key) < 0:
            raise CheckpointError(f"trainer.{key}={getattr(trainer, key)} is negative; use 0 (off / keep all) or a "
                                  f"positive number of steps / checkpoints")
    if trainer.export_max_shard_bytes <= 0:
        raise CheckpointError(f"trainer.export_max_shard_bytes={trainer.export_max_shard_bytes} must be positive "
                              f"(bytes of one exported safetensors file, e.g. 2147483648)")
    path = resolve_resume(trainer.resume, run_dir)
    if path is not None:
        step = read_marker(path)["step"]
        if step >= trainer.total_steps:
            raise CheckpointError(f"trainer.resume={trainer.resume}: {path} is at step {step}, and trainer.total_steps="
                                  f"{trainer.total_steps} leaves nothing to run; raise trainer.total_steps above {step}")
    return str(path) if path is not None else None
