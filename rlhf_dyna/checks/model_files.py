"""A checkpoint's weight files before spawn: every safetensors file the checkpoint names exists and is whole.

`safe_open` reads only the header and checks that the tensors it lists cover the file exactly, so a file cut short
by an interrupted copy or download is found in milliseconds, not by every rank after vLLM and torch have started."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ..errors import ConfigError

INDEX = "model.safetensors.index.json"


def weight_files(path: Path) -> list[Path]:
    """The files the checkpoint's weights live in: the shards its index names, or model.safetensors."""
    index = path / INDEX
    if not index.is_file():
        return [path / "model.safetensors"]
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"model.path={path}: {INDEX} is not a safetensors index ({type(err).__name__}: {err}); it must be JSON "
            "with a `weight_map` from tensor names to shard files. Copy the checkpoint again."
        ) from err
    return [path / name for name in sorted(set(weight_map.values()))]


def check_weight_files(model_path: str | None) -> None:
    """Nothing without a checkpoint, or without weights (check_resources names what is missing then)."""
    if model_path is None or not any((Path(model_path) / n).is_file() for n in ("model.safetensors", INDEX)):
        return
    path = Path(model_path)
    files = weight_files(path)
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError(
            f"model.path={model_path}: {len(missing)} weight file(s) named by {INDEX} are missing: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. Copy the whole checkpoint directory."
        )
    for file in files:
        try:
            with safe_open(str(file), framework="numpy"):
                pass
        except SafetensorError as err:
            raise ConfigError(
                f"model.path={model_path}: {file} is not a whole safetensors file ({err}; it has "
                f"{file.stat().st_size} bytes). It was probably cut short by an interrupted copy or download: copy "
                "or download it again."
            ) from err
