"""vLLM on a rank set smaller than the world: the engine core runs in its own process, outside our process groups.

Under `external_launcher` vLLM builds its groups over the whole default world (every rank must take part), and an
in-process engine built on a subset hangs at worker init (ENVIRONMENT.md). With the engine core in a child process
(`VLLM_ENABLE_V1_MULTIPROCESSING=1`, tp=1, the `uni` executor: the model runs in that process), the engine
initialises a private one-process torch.distributed world of its own (file:// init), so a rank builds it alone and the
other ranks are free. vLLM's CPU platform would turn `uni` into `mp` (a grandchild worker, for OMP thread binding,
which a rank's engine leaves to the OS: VLLM_CPU_OMP_THREADS_BIND=nobind): a second fresh interpreter importing torch
and vLLM at every engine start and a second teardown at every stop; `keep_uni_executor` keeps the model in the engine
process (the same tokens and logprobs; docs/placements.md has its start and stop). `generate` is then a local call of that rank (no collective), like any other client of a vLLM server.

Weights cross the process boundary through shared memory on the CPU: `load_weights` packs the (HF name, tensor)
pairs into one file in /dev/shm named after the run (`<VLLM_DIST_IDENT>-weights-<rank>`, so the launcher's
clean-up removes it after a crash), and `collective_rpc` runs `ShmWeightInstall.install_from_shm` inside the engine process, which
maps the file and hands zero-copy views to vLLM's checkpoint-format loader (`reload_weights`), the same in-place
reload the in-rank engine uses (on a GPU the same place could take CUDA IPC handles, as vLLM's IPC backend does; for
now the rank copies its CUDA tensors into the same shm file).

On CUDA the engine process sees only this rank's GPU (CUDA_VISIBLE_DEVICES while it starts): vLLM's `uni` executor
puts its worker on device 0 of what it sees (local_rank 0, vllm/v1/executor/uniproc_executor.py), which would be
GPU 0 for every rank's engine otherwise.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import Tensor

from ..launch.devices import engine_visible_devices
from ..tracking.console import announce
from .gpu_defaults import memory_args
from .vllm_engine import VLLMRollout, platform_engine_args

SHM_DIR = Path("/dev/shm")


@contextmanager
def engine_environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ while the engine process starts (it inherits them), the previous values afterwards."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def keep_uni_executor() -> Iterator[None]:
    """While an engine starts here: vLLM's CPU platform checks the engine's config as usual but leaves its executor
    `uni` (the model in the engine process, not in a grandchild; the module docstring says why)."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    checked = platform.__dict__["check_and_update_config"]

    def check_keeping_executor(cls, vllm_config) -> None:
        backend = vllm_config.parallel_config.distributed_executor_backend
        checked.__func__(cls, vllm_config)
        vllm_config.parallel_config.distributed_executor_backend = backend

    platform.check_and_update_config = classmethod(check_keeping_executor)
    try:
        yield
    finally:
        platform.check_and_update_config = checked


class ShmWeightInstall:
    """vLLM worker extension (`worker_extension_cls`), mixed into the worker inside the engine process: a named method
    that `collective_rpc` can call by name (a pickled function would need VLLM_ALLOW_INSECURE_SERIALIZATION)."""

    def install_from_shm(self, path: str, nbytes: int, entries: list[tuple[str, str, list[int], int]]) -> int:
        """Map the run's shm file and reload weights from zero-copy views of it (checkpoint format)."""
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)

        def weights():
            for name, dtype, shape, offset in entries:
                dt = getattr(torch, dtype)
                count = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dt).element_size()
                yield name, flat[offset: offset + count].view(dt).view(shape)

        self.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(entries)


class SubsetVLLMRollout(VLLMRollout):
    """VLLMRollout's surface (generate, load_weights, reset_prefix_cache, shutdown) for one rank of a rollout set
    that is smaller than the world: one tp=1 replica per rank, engine core in a child process."""

    def __init__(self, model_dir: str | Path, seed: int = 0, max_model_len: int = 512, kv_cache_bytes: int = 64 << 20,
                 dtype: str = "float32", logprobs_mode: str = "processed_logprobs",
                 enable_prefix_caching: bool = True, block_size: int | None = None, rank: int = 0,
                 gpu_memory_utilization: float = 0.5, enforce_eager: bool = True) -> None:
        from vllm import LLM
        from vllm.platforms import current_platform

        self.tp, self.dp_size, self.dp_rank, self.expert_parallel = 1, 1, 0, False
        self.sleep_level, self.asleep = 0, set()  # the engine has its GPU to itself: it never sleeps
        self.rank = rank
        self.shm_path = SHM_DIR / f"{os.environ.get('VLLM_DIST_IDENT', 'rlhfdyna-local')}-weights-{rank}"
        on_cuda = not current_platform.is_cpu()  # this thread's current device is the rank's (rollout/device_threads)
        engine_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # engine core in its own process: outside our world
        if on_cuda:
            engine_env["CUDA_VISIBLE_DEVICES"] = engine_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                                        torch.cuda.current_device())
        # every engine sees itself as local rank 0 and would pin its OMP threads to core 0: let the OS place them
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        announce(f"starting vLLM on rank {rank} (max_model_len={max_model_len})...")
        with engine_environment(engine_env), (nullcontext() if on_cuda else keep_uni_executor()):
            self.llm = LLM(
                model=str(model_dir), tensor_parallel_size=1, distributed_executor_backend="uni",
                skip_tokenizer_init=True, enforce_eager=enforce_eager, seed=seed,
                **memory_args("cuda" if on_cuda else "cpu", kv_cache_bytes, gpu_memory_utilization),
                dtype=dtype, max_model_len=max_model_len, logprobs_mode=logprobs_mode,
                enable_prefix_caching=enable_prefix_caching, **({} if block_size is None else {"block_size": block_size}),
                worker_extension_cls=f"{__name__}.ShmWeightInstall", **platform_engine_args(max_model_len),
                **({} if on_cuda else {"worker_cls": "rlhf_dyna.rollout.cpu_worker.EagerSamplerCPUWorker"}),
            )

    def load_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Pack full tensors (HF names, checkpoint format) into the run's shm file; the engine process loads them."""
        tensors = [(name, t.detach().contiguous()) for name, t in named_tensors]
        entries, offset = [], 0
        for name, t in tensors:
            offset = -(-offset // 64) * 64  # aligned views for every dtype
            entries.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), offset))
            offset += t.numel() * t.element_size()
        nbytes = max(offset, 1)
        storage = torch.UntypedStorage.from_file(str(self.shm_path), shared=True, nbytes=nbytes)
        flat = torch.empty(0, dtype=torch.uint8).set_(storage)
        for (name, t), (_, _, _, start) in zip(tensors, entries):
            flat[start: start + t.numel() * t.element_size()].copy_(t.view(-1).view(torch.uint8))
        del flat, storage
        self.llm.collective_rpc("install_from_shm", args=(str(self.shm_path), nbytes, entries))
        self.reset_prefix_cache()

    def shutdown(self) -> None:
        """Local, not collective: stops the engine process and removes the shm file."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        self.shm_path.unlink(missing_ok=True)
