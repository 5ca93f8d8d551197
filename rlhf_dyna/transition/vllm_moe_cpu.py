"""vLLM 0.32's CPU MoE kernel prepacks (and pads) `w13` / `w2` once, when its kernel is first built; a weight update
through the layerwise reload (ours or vLLM's own `reload_weights`) leaves the new weights in model format in the
kernel tensors, and the CPU kernel then computes with unpacked bytes (wrong tokens, no error). Prepacking the
installed experts again with the kernel's own `process_weights_after_loading` makes them what a fresh load gives."""
from __future__ import annotations

from torch import nn


def cpu_moe_experts(layer: nn.Module):
    """The CPU fused-experts object of a vLLM RoutedExperts layer, or None for any other layer."""
    kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    return experts if type(experts).__name__ == "CPUUnquantizedExperts" else None


def repack_installed_experts(layer: nn.Module) -> None:
    experts = cpu_moe_experts(layer)
    if experts is not None:
        experts.process_weights_after_loading(layer)
