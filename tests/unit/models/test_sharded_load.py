"""Loading from a checkpoint without ranks: vLLM opens model.path itself, and a checkpoint without safetensors
weights is refused before spawn (the sharded loads on gloo ranks: tests/ranks/models/test_sharded_load.py)."""
from __future__ import annotations

import pytest

from rlhf_dyna.checks import ConfigError
from rlhf_dyna.checks.resources import check_resources
from rlhf_dyna.config import Config
from rlhf_dyna.orchestrator.build import write_initial_checkpoint


def test_vllm_opens_model_path_itself(tmp_path):
    """With a checkpoint, the directory vLLM opens is model.path: no gather (no actor needed), nothing written."""
    model_dir = write_initial_checkpoint(str(tmp_path / "ckpt"), None, None, tmp_path / "out", 0, 0)
    assert model_dir == tmp_path / "ckpt" and not (tmp_path / "out").exists()


def test_checkpoint_without_safetensors_is_refused_before_spawn(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    cfg = Config()
    cfg.model.path = str(tmp_path)
    with pytest.raises(ConfigError, match="has no safetensors weights"):
        check_resources(cfg, under_torchrun=False)
