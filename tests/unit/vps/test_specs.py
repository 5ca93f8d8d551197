"""Invalid specs are refused with the wrong number and the valid choices; split rules match torch."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.models.catalog_presets import preset_catalog
from rlhf_dyna.vps.layout import build_layout
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from rlhf_dyna.vps.split import chunk, linear
from rlhf_dyna.vps.validate import SpecError


@pytest.fixture(scope="module")
def llama():
    return preset_catalog("llama3_70b")


@pytest.mark.parametrize("spec,message", [
    (ParallelSpec(tp=3), "tp=3 does not divide num_attention_heads=64; valid tp: 1, 2, 4, 8, 16, 32, 64"),
    (ParallelSpec(tp=16), "tp=16 does not divide num_key_value_heads=8; valid tp: 1, 2, 4, 8"),
    (ParallelSpec(pp=81), "pp=81 exceeds num_hidden_layers=80; valid pp: 1..80"),
    (ParallelSpec(pp=2, pp_layers=(40, 39)), "pp_layers=[40, 39] sums to 79"),
    (ParallelSpec(zero=4), "zero=4 is not a ZeRO stage; valid zero: 0, 1, 2, 3"),
    (ParallelSpec(ep=2), "ep=2, etp=1 on a dense model; valid: ep=1, etp=1"),
    (ParallelSpec(Phase.ROLLOUT, tp=6), "tp=6 does not divide num_attention_heads=64"),
])
def test_invalid_specs_name_the_number_and_valid_choices(llama, spec, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        build_layout(llama, spec)


def test_rollout_kv_replication_needs_kv_heads_dividing_tp():
    cfg = SimpleNamespace(model_type="llama", num_hidden_layers=2, hidden_size=48, num_attention_heads=12,
                          num_key_value_heads=4, head_dim=4, intermediate_size=24, vocab_size=100)
    with pytest.raises(SpecError, match="tp=6 neither divides nor is a multiple of num_key_value_heads=4 .*; valid tp: 1, 2, 4, 12"):
        build_layout(catalog_from_config(cfg), ParallelSpec(Phase.ROLLOUT, tp=6))


def test_moe_spec_errors():
    moe = preset_catalog("qwen3_235b_a22b")
    with pytest.raises(SpecError, match="ep=4: vLLM's expert parallel spans vllm_dp\\*tp ranks; valid ep: 1, 8"):
        build_layout(moe, ParallelSpec(Phase.ROLLOUT, tp=8, ep=4))
    with pytest.raises(SpecError, match="ep\\*etp=3 does not divide dp\\*cp\\*tp=8"):
        build_layout(moe, ParallelSpec(dp=8, ep=3))


@pytest.mark.parametrize("n", [0, 1, 5, 7, 10, 37])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8])
def test_chunk_is_torch_chunk_with_empty_tail(n, parts):
    pieces = torch.arange(n).chunk(parts)
    sizes = [len(p) for p in pieces] + [0] * (parts - len(pieces))
    assert [hi - lo for lo, hi in chunk(n, parts)] == sizes


def test_linear_is_vllm_expert_placement():
    assert linear(5, 2) == [(0, 3), (3, 5)]
    assert linear(128, 16)[15] == (120, 128)
