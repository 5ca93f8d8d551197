"""vLLM's TP-local parameters as the destination of a VPS transition (the ROLLOUT layout), and their installation.

Every rollout rank receives only its own shard: fused `qkv_proj` = [q_r; k_r; v_r] (KV heads replicated when
tp > num_kv_heads), `gate_up_proj` = [gate_r; up_r], vocab-parallel rows with padding, row-parallel columns.

GPU (kernel format == vLLM's model format for unquantized weights, checked per parameter by
transition/kernel_format.py: method, MoE backend, strides): the destination buffers are the parameters' own storage,
written in place; nothing to install. Any parameter that fails the check sends the whole sync through the staged path.
CPU: vLLM repacks linear weights after loading (its `qkv_proj.weight` becomes shape (0,), the data lives in a
oneDNN / SGL handle), so the executor writes into staging buffers shaped like vLLM's model-format TP-local
parameters (taken from a pool that keeps them between groups and syncs), one group of layers at a time, and `vllm_install.LayerwiseInstaller` hands each group to vLLM's own
layerwise reload (the repack) while the next group is on the wire.
"""
from __future__ import annotations

from math import prod

import torch
from torch import Tensor, nn

from rlhf_dyna.rollout.vllm_engine import VLLMRollout
from rlhf_dyna.transition.kernel_format import kernel_format_problems
from rlhf_dyna.transition.tensor_pool import TensorPool
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.vps.layout import Layout
from rlhf_dyna.vps import spec as vps_spec
from rlhf_dyna.vps.spec import ParallelSpec


def rollout_spec(rollout: VLLMRollout) -> ParallelSpec:
    """Our VLLMRollout runs one vLLM with data_parallel_size = world / tp: consecutive ranks form TP groups; with
    expert parallelism its MoE layers hold whole experts spread over all tp * dp ranks."""
    return vps_spec.rollout_spec(rollout.tp, rollout.dp_size, expert_parallel=rollout.expert_parallel)


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


STAGING_POOL = TensorPool()  # one per process: the CPU install's staging, kept between groups and syncs


class VllmDestination:
    """This rank's vLLM parameters as a VPS destination: in place where the kernel format is vLLM's model format
    (GPU, unquantized), else staging buffers per (sub-)layout that `vllm_install.LayerwiseInstaller` hands to vLLM.
    Everything is read from the live model here, before any layerwise reload puts its layers on the meta device."""

    def __init__(self, rollout: VLLMRollout, layout: Layout, rank: int, pool: TensorPool = STAGING_POOL) -> None:
        from vllm.platforms import current_platform

        self.rollout, self.rank, self.pool = rollout, rank, pool
        self.model = vllm_model(rollout)
        self.aliases = aliases(self.model)
        wanted = layout.buffers(rank)
        missing = sorted(set(wanted) - set(self.aliases))
        if missing:
            raise ValueError(f"rank {rank}: vLLM has no parameters {missing[:5]} of the VPS layout {layout.spec.describe()}")
        params = dict(self.model.named_parameters(remove_duplicate=False))
        self.devices = {n: params[n].device for n in self.aliases}
        self.kernel_problems = [] if current_platform.is_cpu() else kernel_format_problems(self.model, sorted(wanted))
        self.staged = current_platform.is_cpu() or bool(self.kernel_problems) or not all(
            tuple(params[n].shape) == b.shape and params[n].dtype == TORCH_DTYPES[b.dtype] for n, b in wanted.items())
        self.kernel = {} if self.staged else {n: params[n].data for n in wanted}
        self._specs: dict[Layout, list] = {}  # a Layout hashes by identity

    def buffers(self, layout: Layout) -> dict[str, Tensor]:
        """Where the executor writes `layout`'s pieces: the live parameters (in place), or staging buffers shaped like
        vLLM's model-format TP-local parameters, taken from the pool (give them back once installed)."""
        if not self.staged:
            return {n: self.kernel[n] for n in layout.buffers(self.rank)}
        out = {}
        for n, shape, dtype, padded in self._staging_specs(layout):
            buf = self.pool.take(shape, dtype, self.devices[n])
            if padded:  # vocabulary padding rows belong to no logical tensor: vLLM loads them as 0
                buf.zero_()
            out[n] = buf
        return out

    def _staging_specs(self, layout: Layout) -> list[tuple[str, tuple[int, ...], torch.dtype, bool]]:
        """(name, shape, dtype, has rows no piece fills) of each staging buffer, worked out once per layout."""
        if layout not in self._specs:
            wanted = layout.buffers(self.rank)
            covered = dict.fromkeys(wanted, 0)
            for piece in layout.pieces(self.rank):
                covered[piece.buffer] += piece.box.volume
            self._specs[layout] = [(n, b.shape, TORCH_DTYPES[b.dtype], covered[n] < prod(b.shape)) for n, b in wanted.items()]
        return self._specs[layout]
