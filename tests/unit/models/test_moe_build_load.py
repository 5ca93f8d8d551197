"""A tiny Qwen3-MoE builds from a spec and saves per-expert checkpoint names (its load per shard on real gloo ranks:
tests/ranks/models/test_moe_build_load.py)."""
from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rlhf_dyna.models.build import ModelSpec, build_policy, make_hf_config, save_hf_dir

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def test_spec_builds_moe_and_save_matches_transformers_names(tmp_path):
    spec = ModelSpec(arch="qwen3_moe", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, **MOE)
    model = build_policy(spec, seed=3)
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.num_experts == 4
    ours = save_hf_dir(model, make_hf_config(spec), tmp_path / "ours")
    model.save_pretrained(tmp_path / "hf")  # transformers' own conversion back to checkpoint names
    with safe_open(str(ours / "model.safetensors"), "pt") as a, safe_open(str(tmp_path / "hf/model.safetensors"), "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        assert "model.layers.1.mlp.experts.3.up_proj.weight" in a.keys()
        for name in b.keys():
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    loaded = AutoModelForCausalLM.from_pretrained(ours)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_moe_spec_errors_are_clear():
    with pytest.raises(ValueError, match="num_experts_per_tok <= num_experts"):
        make_hf_config(ModelSpec(arch="qwen3_moe", vocab_size=64, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_experts=2,
                                 num_experts_per_tok=3, moe_intermediate_size=32))
