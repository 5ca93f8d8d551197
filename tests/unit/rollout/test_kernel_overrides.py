"""rollout/cpu_worker.kernel_overrides_once: vLLM's CPU platform swaps its Triton kernels for C++ fallbacks once per
process (the launcher, before it forks the ranks); the platform's own call at every engine start then keeps them."""
from __future__ import annotations

from vllm.platforms import current_platform
from vllm.triton_utils.dispatcher import KernelOverride
from vllm.v1.worker.block_table import ComputeSlotMappingKernel

from rlhf_dyna.rollout.cpu_worker import kernel_overrides_once


def test_the_kernels_are_swapped_once_and_an_engine_start_keeps_them() -> None:
    kernel_overrides_once()
    swapped = ComputeSlotMappingKernel.kernel
    assert isinstance(swapped, KernelOverride)
    current_platform.register_triton_kernel_overrides()  # what vLLM's worker calls at every engine start
    kernel_overrides_once()
    assert ComputeSlotMappingKernel.kernel is swapped
