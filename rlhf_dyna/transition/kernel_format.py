"""Whether one of vLLM's live parameters holds its weights in vLLM's model format, so that the GPU sync may write
model-format bytes straight into its storage (bind_vllm's in-place path).

Shape and dtype are not enough: a kernel may re-lay out a weight at the same shape after loading. vLLM 0.32's
FlashInfer CUTLASS MoE backend swaps the halves of `w13` to [up; gate] (`swap_w13_to_w31` in
fused_moe/oracle/unquantized.py), its TRT-LLM backend permutes blocks in place, XPU keeps a transposed copy behind
the same shape (`weight.t().contiguous().t()` in linear.py), and every quantized method packs its own format. A
parameter qualifies only if its module computes with an unquantized method whose post-load step keeps the model
format on CUDA (linear and embedding: a no-op there; MoE: only the Triton backends), and its storage has the model
format's contiguous strides; anything else goes through vLLM's own loader (the staged path).
"""
from __future__ import annotations

from torch import Tensor, nn

IN_PLACE_METHODS = frozenset({"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod"})
IN_PLACE_MOE_BACKENDS = frozenset({"TRITON", "BATCHED_TRITON"})


def kernel_format_problem(name: str, param: Tensor, owner: nn.Module) -> str | None:
    """Why writing model-format bytes into `param` (of module `owner`) would not give vLLM these weights; None when
    it would."""
    method = getattr(owner, "quant_method", None)
    if method is not None and type(method).__name__ not in IN_PLACE_METHODS:
        return f"{name}: {type(method).__name__} keeps the weights in a kernel format of its own"
    backend = getattr(method, "unquantized_backend", None)
    if backend is not None and getattr(backend, "name", str(backend)) not in IN_PLACE_MOE_BACKENDS:
        return f"{name}: the {getattr(backend, 'name', backend)} MoE backend re-lays out the experts after loading"
    if not param.is_contiguous():
        return f"{name}: stored with strides {tuple(param.stride())}, not the model format's contiguous layout"
    return None


def kernel_format_problems(model: nn.Module, names: list[str]) -> list[str]:
    """`kernel_format_problem` of each named parameter of vLLM's `model` that has one."""
    params = dict(model.named_parameters(remove_duplicate=False))
    out = []
    for name in names:
        owner = model.get_submodule(name.rpartition(".")[0])
        problem = kernel_format_problem(name, params[name], owner)
        if problem is not None:
            out.append(problem)
    return out
