"""Installing staged model-format TP-local weights into a CPU vLLM engine, group by group, behind the wire.

vLLM's layerwise reload (vllm/model_executor/model_loader/reload/layerwise.py) is driven directly, without any
re-sharding: `initialize_layerwise_reload` puts every layer back into model format on the meta device (the live
kernel tensors are kept), then for each staged layer its parameters adopt the staged tensors and
`_layerwise_process` runs `process_weights_after_loading` (the CPU repack) and copies the result into the kernel
tensors, as vLLM's own `reload_weights` does after its weight loaders ran; `finalize_layerwise_reload` gives the
layers nobody touched their old tensors back.

With `overlap`, a group is installed on a worker thread while the caller receives the next one (torch and gloo
release the GIL): at most two groups of staging are alive, the one being installed and the one being received.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import torch
from torch import Tensor, nn

from rlhf_dyna.rollout.vllm_moe_cpu import repack_installed_experts


class LayerwiseInstaller:
    """`with LayerwiseInstaller(model, vllm_config, aliases) as install: install.submit(staged)` per group."""

    def __init__(self, model: nn.Module, vllm_config: object, aliases: Mapping[str, Iterable[str]],
                 overlap: bool = True, installed: Callable[[Iterable[Tensor]], None] | None = None) -> None:
        self.model, self.vllm_config, self.aliases = model, vllm_config, aliases
        self.overlap = overlap
        self.installed = installed  # gets each group's staged tensors once vLLM holds its own copy (a pool's give)
        self.pending: Future | None = None
        self.install_seconds = 0.0  # time spent installing, on whichever thread did it

    def __enter__(self) -> LayerwiseInstaller:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import initialize_layerwise_reload

        self._config = set_current_vllm_config(self.vllm_config)  # a module global: the worker thread sees it too
        self._config.__enter__()
        initialize_layerwise_reload(self.model)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="vllm-install") if self.overlap else None
        return self

    def submit(self, staged: dict[str, Tensor]) -> None:
        """Install one group (vLLM parameter name -> model-format tensor, every parameter of its layers); with
        overlap this returns once the previous group is installed, so at most two groups are alive."""
        if self.pool is None:
            return self._install(staged)
        self.wait()
        self.pending = self.pool.submit(self._install, staged)

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()  # re-raises the worker's error here

    @torch.no_grad()
    def _install(self, staged: dict[str, Tensor]) -> None:
        import time

        from vllm.model_executor.model_loader.reload.layerwise import _layerwise_process, get_layerwise_info
        from vllm.model_executor.model_loader.reload.meta import materialize_layer

        start = time.perf_counter()
        per_layer: dict[str, dict[str, Tensor]] = {}
        first_name: dict[int, str] = {}  # module id -> one of its names: MoE's FusedMoE also reaches the router as .gate
        for name, tensor in staged.items():
            for alias in self.aliases[name]:  # a tied lm_head is processed (repacked) from the same tensor
                layer_name, _, attr = alias.rpartition(".")
                layer_name = first_name.setdefault(id(self.model.get_submodule(layer_name)), layer_name)
                per_layer.setdefault(layer_name, {})[attr] = tensor
        held: set[int] = set()  # storage a processed layer kept as its own (e.g. a tied embedding): not reusable staging
        for layer_name, tensors in per_layer.items():
            layer = self.model.get_submodule(layer_name)
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
            held.update(t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers()))
        if self.installed is not None:
            self.installed([t for t in staged.values() if t.untyped_storage().data_ptr() not in held])
        self.install_seconds += time.perf_counter() - start

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

        try:
            if self.pool is not None:
                try:
                    self.wait()
                finally:
                    self.pool.shutdown(wait=True)
            finalize_layerwise_reload(self.model, self.vllm_config.model_config)  # untouched layers get theirs back
        finally:
            self._config.__exit__(kind, error, tb)
