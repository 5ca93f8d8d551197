"""vLLM's TP-local parameters as the destination of a VPS transition (the ROLLOUT layout), and their installation.

Every rollout rank receives only its own shard: fused `qkv_proj` = [q_r; k_r; v_r] (KV heads replicated when
tp > num_kv_heads), `gate_up_proj` = [gate_r; up_r], vocab-parallel rows with padding, row-parallel columns.

GPU (kernel format == vLLM's model format for unquantized weights): the destination buffers are the parameters'
own storage, written in place; nothing to install.
CPU: vLLM repacks linear weights after loading (its `qkv_proj.weight` becomes shape (0,), the data lives in a
oneDNN / SGL handle), so the executor writes into staging buffers shaped like vLLM's model-format TP-local
parameters, and `install` hands them to vLLM's own layerwise reload machinery without any re-sharding: each
layer is restored to model format (`initialize_layerwise_reload`), its parameters adopt the staged tensors,
then vLLM's `_layerwise_process` runs `process_weights_after_loading` (the repack) and copies the result into
the live kernel tensors, exactly as vLLM's `reload_weights` does after its weight loaders ran.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.transition.vllm_moe_cpu import repack_installed_experts
from rlhf_dyna.vps.layout import Layout
from rlhf_dyna.vps import spec as vps_spec
from rlhf_dyna.vps.spec import ParallelSpec


def rollout_spec(rollout: VLLMRollout) -> ParallelSpec:
    """Our VLLMRollout runs one vLLM with data_parallel_size = world / tp: consecutive ranks form TP groups."""
    return vps_spec.rollout_spec(rollout.tp, rollout.dp_size)


def rollout_dtype(rollout: VLLMRollout) -> str:
    dtype = rollout.llm.llm_engine.model_config.dtype
    return next(name for name, d in TORCH_DTYPES.items() if d == dtype)


def vllm_model(rollout: VLLMRollout) -> nn.Module:
    """The in-process worker's model (external_launcher, one worker per rank)."""
    (model,) = rollout.llm.apply_model(lambda m: m)
    return model


def aliases(model: nn.Module) -> dict[str, list[str]]:
    """Parameter name -> every name of the same tensor (a tied lm_head is embed_tokens' parameter)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {name: names for names in by_id.values() for name in names}


class VllmDestination:
    """This rank's destination buffers (layout buffer name -> tensor) and how they get into vLLM."""

    def __init__(self, rollout: VLLMRollout, layout: Layout, rank: int) -> None:
        from vllm.platforms import current_platform

        self.rollout, self.layout = rollout, layout
        self.model = vllm_model(rollout)
        self.aliases = aliases(self.model)
        wanted = layout.buffers(rank)
        missing = sorted(set(wanted) - set(self.aliases))
        if missing:
            raise ValueError(f"rank {rank}: vLLM has no parameters {missing[:5]} of the VPS layout {layout.spec.describe()}")
        params = dict(self.model.named_parameters(remove_duplicate=False))
        kernel_is_model_format = not current_platform.is_cpu() and all(
            tuple(params[n].shape) == b.shape and params[n].dtype == TORCH_DTYPES[b.dtype] for n, b in wanted.items())
        self.staged = not kernel_is_model_format
        if self.staged:
            covered = dict.fromkeys(wanted, 0)
            for piece in layout.pieces(rank):
                covered[piece.buffer] += piece.box.volume
            self.buffers = {}
            for n, b in wanted.items():
                buf = torch.empty(b.shape, dtype=TORCH_DTYPES[b.dtype], device=params[n].device)
                if covered[n] < buf.numel():  # vocabulary padding rows belong to no logical tensor: vLLM loads them as 0
                    buf.zero_()
                self.buffers[n] = buf
        else:
            self.buffers = {n: params[n].data for n in wanted}

    @property
    def staged_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values()) if self.staged else 0

    def install(self) -> None:
        """Make vLLM compute with the received weights; staging buffers are released."""
        if self.staged:
            vllm_config = self.rollout.llm.llm_engine.vllm_config
            groups = {name: self.aliases[name] for name in self.buffers}
            staged, self.buffers = self.buffers, {}
            self.rollout.llm.apply_model(lambda model: install_staged(model, vllm_config, staged, groups))
        self.rollout.reset_prefix_cache()  # its KV was computed with the old weights


@torch.no_grad()
def install_staged(model: nn.Module, vllm_config, staged: dict[str, Tensor], groups: dict[str, Iterable[str]]) -> None:
    """Put model-format TP-local tensors into vLLM through its layerwise reload (see module docstring)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload.layerwise import (_layerwise_process, finalize_layerwise_reload,
                                                                   get_layerwise_info, initialize_layerwise_reload)
    from vllm.model_executor.model_loader.reload.meta import materialize_layer

    per_layer: dict[str, dict[str, Tensor]] = {}
    first_name: dict[int, str] = {}  # module id -> one of its names: MoE's FusedMoE also reaches the router as .gate
    for name, tensor in staged.items():
        for alias in groups[name]:  # a tied lm_head is processed (repacked) from the same tensor
            layer_name, _, attr = alias.rpartition(".")
            layer_name = first_name.setdefault(id(model.get_submodule(layer_name)), layer_name)
            per_layer.setdefault(layer_name, {})[attr] = tensor
    with set_current_vllm_config(vllm_config):
        initialize_layerwise_reload(model)  # every layer back to model format, on meta; kernel tensors kept
        for layer_name, tensors in per_layer.items():
            layer = model.get_submodule(layer_name)
            info = get_layerwise_info(layer)
            expected = set(info.restore_metadata[0])
            if expected - tensors.keys():
                raise ValueError(f"{layer_name}: vLLM expects {sorted(expected)}, the VPS layout fills {sorted(tensors)}")
            materialize_layer(layer, info)
            for attr, tensor in tensors.items():
                param = getattr(layer, attr)
                if tuple(param.shape) != tuple(tensor.shape) or param.dtype != tensor.dtype:
                    raise ValueError(f"{layer_name}.{attr}: vLLM's model format is {tuple(param.shape)} {param.dtype}, "
                                     f"staged {tuple(tensor.shape)} {tensor.dtype}")
                param.data = tensor  # adopt the staged storage: no copy before the repack
            _layerwise_process(layer, info)  # process_weights_after_loading, copy into the kernel tensors
            repack_installed_experts(layer)  # CPU MoE: vLLM skips its expert prepack on updates
        finalize_layerwise_reload(model, vllm_config.model_config)  # layers we did not touch get their tensors back
