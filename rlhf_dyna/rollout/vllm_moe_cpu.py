"""vLLM 0.32's CPU MoE kernel prepacks (and pads) `w13` / `w2` once, when its kernel is first built; a weight update
through the layerwise reload (ours or vLLM's own `reload_weights`) leaves the new weights in model format in the
kernel tensors, and the CPU kernel then computes with unpacked bytes (wrong tokens, no error). Prepacking the
installed experts again with the kernel's own `process_weights_after_loading` makes them what a fresh load gives."""
from __future__ import annotations

from torch import nn


def cpu_moe_experts(layer: nn.Module):
    """The CPU fused-experts object of a vLLM RoutedExperts layer (the portable kernel or its x86 AMX / Arm / Power
    subclasses, which share its prepack), or None for any other layer."""
    kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    unquantized = any(c.__name__ == "CPUUnquantizedExperts" for c in type(experts).__mro__)
    return experts if unquantized else None


def repack_installed_experts(layer: nn.Module) -> None:
    experts = cpu_moe_experts(layer)
    if experts is not None:
        experts.process_weights_after_loading(layer)


def owns_w13(module: nn.Module) -> bool:
    """The module that holds an MoE layer's `w13_weight` itself (vLLM's RoutedExperts), not a wrapper above it."""
    return any(name == "w13_weight" for name, _ in module.named_parameters(recurse=False))


def repack_all_experts(model: nn.Module) -> None:
    """After vLLM's own `reload_weights`: prepack every expert layer once. Only the module that owns `w13_weight` is
    repacked (wrappers that forward `quant_method` would prepack the same bytes twice)."""
    for layer in model.modules():
        if cpu_moe_experts(layer) is not None and owns_w13(layer):
            repack_installed_experts(layer)
