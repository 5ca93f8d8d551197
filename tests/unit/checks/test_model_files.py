"""A checkpoint's weight files are whole before spawn: one safetensors file or the shards of an index."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from rlhf_dyna.errors import ConfigError
from rlhf_dyna.checks.model_files import check_weight_files


def shards(path, names: list[str]) -> None:
    path.mkdir()
    weight_map = {}
    for i, name in enumerate(names):
        save_file({f"w{i}": torch.ones(64, 64)}, str(path / name))
        weight_map[f"w{i}"] = name
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_whole_files_pass_and_nothing_to_check_passes(tmp_path):
    save_file({"w": torch.ones(8)}, str(tmp_path / "model.safetensors"))
    check_weight_files(str(tmp_path))
    shards(tmp_path / "sharded", ["a.safetensors", "b.safetensors"])
    check_weight_files(str(tmp_path / "sharded"))
    check_weight_files(None)
    check_weight_files(str(tmp_path / "no_weights_here"))  # check_resources says that one


def test_a_truncated_file_is_named_with_its_size(tmp_path):
    shards(tmp_path / "ckpt", ["a.safetensors", "b.safetensors"])
    cut = tmp_path / "ckpt" / "b.safetensors"
    os.truncate(cut, cut.stat().st_size - 100)
    with pytest.raises(ConfigError, match=rf"{cut} is not a whole safetensors file \(.*; it has \d+ bytes\)"):
        check_weight_files(str(tmp_path / "ckpt"))


def test_a_missing_shard_is_named(tmp_path):
    shards(tmp_path / "ckpt", ["a.safetensors", "b.safetensors"])
    (tmp_path / "ckpt" / "a.safetensors").unlink()
    with pytest.raises(ConfigError, match="1 weight file.* are missing: a.safetensors"):
        check_weight_files(str(tmp_path / "ckpt"))
