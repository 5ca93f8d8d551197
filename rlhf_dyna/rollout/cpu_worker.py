"""vLLM CPU workers: their shared-memory segments named per run, and their sampler without a first-call compile.

vLLM's CPUWorker names the TP communicator's /dev/shm segments after the last ':' field of
distributed_init_method, overwriting VLLM_DIST_IDENT. Under external_launcher that method is the constant
"env://", so every run on a host uses "//-tp:0-[0-1]-cpushm" and a second run (or any run after a crash)
fails with `create shm in SHMManager failed. errno: 17`. Our ranks already have torch.distributed
initialised, so the init method is not used to connect; we only give it a per-run last field.

vLLM's sampler ranks each sampled token among the logits with `batched_count_greater_than`, a function under
`torch.compile(backend="inductor")` (vllm/v1/sample/ops/logprobs.py): its first call traces and compiles C++ for
seconds in every engine process, which every run paid at its first generation. The eager expression is the same
integer count.

vLLM's CPU platform swaps core Triton kernels for C++ fallbacks at every worker start, and finds every reference to
them by scanning the namespace of every loaded module: a large share of each engine's start. The launcher does it
once before it forks the ranks (rlhf_dyna.job.RANK_PRELOAD), which inherit the swapped kernels.
"""
from __future__ import annotations


from vllm.v1.sample import sampler
from vllm.v1.worker.cpu_worker import CPUWorker

from rlhf_dyna.launch.shm import run_ident


def eager_logprob_ranks() -> None:
    """Idempotent, per process: vLLM's sampler counts token ranks with the uncompiled function."""
    compiled = sampler.batched_count_greater_than
    sampler.batched_count_greater_than = getattr(compiled, "_torchdynamo_orig_callable", compiled)


def _already_overridden(cls) -> None:
    """The platform's kernel overrides, once they are in place in this process."""


def kernel_overrides_once() -> None:
    """Idempotent, per process and the processes it forks: vLLM's CPU platform swaps its Triton kernels now; its own
    later calls (one per engine start) do nothing."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    if platform.register_triton_kernel_overrides.__func__ is _already_overridden:
        return
    platform.register_triton_kernel_overrides()
    platform.register_triton_kernel_overrides = classmethod(_already_overridden)


class EagerSamplerCPUWorker(CPUWorker):
    def init_device(self) -> None:
        eager_logprob_ranks()
        super().init_device()


class ShmIdentCPUWorker(EagerSamplerCPUWorker):
    def init_device(self) -> None:
        self.distributed_init_method = f"env://:{run_ident()}"
        super().init_device()
