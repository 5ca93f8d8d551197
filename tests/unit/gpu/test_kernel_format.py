"""The GPU sync writes into vLLM's parameters in place only where they hold vLLM's model format
(transition/kernel_format.py). vLLM's methods are stood in for by classes of the same names: what is checked is the
decision from a module's method, MoE backend and strides."""
from __future__ import annotations

from enum import Enum

import torch
from torch import nn

from rlhf_dyna.transition.kernel_format import kernel_format_problem, kernel_format_problems


class UnquantizedLinearMethod:
    pass


class Fp8LinearMethod:
    pass


class Backend(Enum):
    TRITON = "TRITON"
    FLASHINFER_CUTLASS = "FlashInfer CUTLASS"


class UnquantizedFusedMoEMethod:
    def __init__(self, backend: Backend) -> None:
        self.unquantized_backend = backend


def layer(method=None, weight: torch.Tensor | None = None) -> nn.Module:
    module = nn.Module()
    module.weight = nn.Parameter(torch.zeros(4, 8) if weight is None else weight)
    if method is not None:
        module.quant_method = method
    return module


def test_unquantized_contiguous_weights_are_written_in_place() -> None:
    m = layer(UnquantizedLinearMethod())
    assert kernel_format_problem("qkv_proj.weight", m.weight, m) is None
    norm = layer()  # RMSNorm: no method at all
    assert kernel_format_problem("norm.weight", norm.weight, norm) is None


def test_a_same_shape_relayout_is_detected() -> None:
    fp8 = layer(Fp8LinearMethod())
    assert "Fp8LinearMethod keeps the weights in a kernel format" in kernel_format_problem("o_proj.weight", fp8.weight, fp8)
    moe = layer(UnquantizedFusedMoEMethod(Backend.FLASHINFER_CUTLASS))  # swaps w13's halves to [up; gate]
    assert "FLASHINFER_CUTLASS MoE backend re-lays out" in kernel_format_problem("w13_weight", moe.weight, moe)
    assert kernel_format_problem("w13_weight", moe.weight, layer(UnquantizedFusedMoEMethod(Backend.TRITON))) is None
    transposed = layer(UnquantizedLinearMethod(), torch.zeros(8, 4).t())  # XPU's weight.t().contiguous().t()
    assert "strides (1, 4)" in kernel_format_problem("down_proj.weight", transposed.weight, transposed)


def test_problems_of_a_model_by_parameter_name() -> None:
    model = nn.Module()
    model.attn = layer(UnquantizedLinearMethod())
    model.mlp = layer(Fp8LinearMethod())
    assert kernel_format_problems(model, ["attn.weight"]) == []
    assert kernel_format_problems(model, ["attn.weight", "mlp.weight"]) == [
        "mlp.weight: Fp8LinearMethod keeps the weights in a kernel format of its own"]
