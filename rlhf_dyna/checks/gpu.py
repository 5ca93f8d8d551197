"""Pre-spawn checks of a run's devices and of vLLM's GPU memory, one paragraph each.

GPUs are counted through NVML (launch/host.visible_gpu_count), so these checks never initialise CUDA in the launcher.
The KV cache is sized as vLLM 0.32 sizes it: K and V of every layer, the KV heads a rank holds, whole blocks of
`gpu_defaults.KV_BLOCK_TOKENS` tokens; vLLM refuses to start unless one `max_model_len` sequence fits.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from ..config import Config
from ..launch.devices import gpu_memory_bytes, run_device
from ..launch.host import visible_gpu_count
from ..models.catalog import catalog_from_config
from ..rollout.context_length import max_model_len
from ..rollout.gpu_defaults import DTYPE_BYTES, KV_BLOCK_TOKENS, KvShape, rollout_dtype, sequence_kv_bytes
from ..rollout.gpu_defaults import kv_shape as model_kv_shape
from ..errors import ConfigError

GIB = 2**30


def model_fields(cfg: Config) -> SimpleNamespace:
    """The model's HF config fields: the checkpoint's config.json where model.path has one, else the model group's."""
    path = Path(cfg.model.path) / "config.json" if cfg.model.path else None
    if path is not None and path.is_file():
        return SimpleNamespace(**json.loads(path.read_text()))
    m = cfg.model
    return SimpleNamespace(model_type=m.arch, num_hidden_layers=m.num_hidden_layers, hidden_size=m.hidden_size,
                           num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                           head_dim=m.head_dim, intermediate_size=m.intermediate_size, vocab_size=m.vocab_size,
                           tie_word_embeddings=m.tie_word_embeddings, num_experts=m.num_experts,
                           num_experts_per_tok=m.num_experts_per_tok, moe_intermediate_size=m.moe_intermediate_size,
                           decoder_sparse_step=1, mlp_only_layers=[])


def kv_shape(cfg: Config, device_type: str) -> KvShape:
    return model_kv_shape(model_fields(cfg), cfg.rollout.tp, rollout_dtype(device_type, cfg.trainer.precision,
                                                                          cfg.model.dtype))


def check_gpu_memory_utilization(cfg: Config) -> None:
    value = cfg.rollout.gpu_memory_utilization
    if not 0 < value <= 1:
        raise ConfigError(
            f"rollout.gpu_memory_utilization={value} is outside (0, 1]: it is the share of each GPU that vLLM may "
            f"take for its weights and KV cache. Use e.g. 0.5 in colocate (the training engines need the rest) or "
            f"0.85 where vLLM has its GPU to itself (placement=split).")


def check_cuda_present(cfg: Config, gpus: int) -> None:
    if cfg.parallel.device == "cuda" and gpus == 0:
        build = "a CPU build of torch" if torch.version.cuda is None else f"torch {torch.__version__} with CUDA"
        raise ConfigError(
            f"parallel.device=cuda: the run needs {cfg.parallel.world_size} CUDA devices but this machine shows none "
            f"({build}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Run it on a GPU node, "
            f"set parallel.device=cpu (or auto) to run on the CPU, or plan it without devices with dry_run=true.")


def check_gpus_per_node(cfg: Config, gpus: int, under_torchrun: bool) -> None:
    """One GPU per rank on each node: without torchrun the launcher starts world_size / nodes ranks here; under
    torchrun each node starts LOCAL_WORLD_SIZE (a node whose scheduler shows each rank one GPU also works)."""
    if run_device(cfg.parallel.device, gpus) != "cuda":
        return
    world, nodes = cfg.parallel.world_size, max(cfg.parallel.nodes, 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world // nodes)) if under_torchrun else world // nodes
    if local > gpus and not (under_torchrun and gpus == 1):
        how = ("start at most that many ranks per node (torchrun --nproc-per-node)" if under_torchrun else
               "lower parallel.world_size, or start the run under torchrun on several nodes (parallel.nodes)")
        raise ConfigError(
            f"parallel.device={cfg.parallel.device}: {local} ranks on this node need one GPU each but {gpus} GPU(s) "
            f"are visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); {how}, or set "
            f"parallel.device=cpu to run on the CPU.")


def check_kv_cache(cfg: Config, device_type: str, gpu_bytes: int | None) -> None:
    """vLLM's KV budget holds one max_model_len sequence: the exact one (rollout.kv_cache_bytes) anywhere, or on a
    GPU of known size the share gpu_memory_utilization leaves after vLLM's weights."""
    shape, r = kv_shape(cfg, device_type), cfg.rollout
    max_len = max_model_len(cfg)
    need = sequence_kv_bytes(shape, max_len, device_type)
    what = (f"one sequence of rollout.max_model_len={max_len} tokens needs {need:,} bytes of KV cache on each rollout rank "
            f"({shape.layers} layers x K and V x {max(1, shape.kv_heads // shape.tp)} KV head(s) x head_dim "
            f"{shape.head_dim} x {DTYPE_BYTES[shape.dtype]} bytes, in whole blocks of {KV_BLOCK_TOKENS[device_type]} "
            f"tokens plus the block vLLM keeps back)")
    if r.kv_cache_bytes > 0:
        if r.kv_cache_bytes < need:
            raise ConfigError(
                f"rollout.kv_cache_bytes={r.kv_cache_bytes:,} cannot hold one sequence: {what}. Set "
                f"rollout.kv_cache_bytes to at least {need} (more for several sequences at once)"
                + (", or 0 to let vLLM size it from rollout.gpu_memory_utilization." if device_type == "cuda" else
                   ", or 0 to size it for every sequence a rollout replica runs at once."))
        return
    if device_type != "cuda" or gpu_bytes is None:
        return
    weights = catalog_from_config(model_fields(cfg)).numel() * DTYPE_BYTES[shape.dtype] // r.tp
    budget = int(r.gpu_memory_utilization * gpu_bytes) - weights
    if budget < need:
        least = (weights + need) / gpu_bytes
        raise ConfigError(
            f"rollout.gpu_memory_utilization={r.gpu_memory_utilization} of a {gpu_bytes / GIB:.1f} GiB GPU leaves vLLM "
            f"{max(budget, 0) / GIB:.2f} GiB after its {weights / GIB:.2f} GiB of weights per rank, and {what}. Raise "
            f"rollout.gpu_memory_utilization above {least:.3f} (activations need more), raise rollout.tp, or lower "
            f"model.max_position_embeddings.")


def check_gpu(cfg: Config, under_torchrun: bool, gpus: int | None = None, gpu_bytes: int | None = None) -> None:
    """Every check of this module, in order; `gpus` / `gpu_bytes`: this machine's (counted through NVML) unless given."""
    check_gpu_memory_utilization(cfg)
    gpus = visible_gpu_count() if gpus is None else gpus
    check_cuda_present(cfg, gpus)
    check_gpus_per_node(cfg, gpus, under_torchrun)
    device_type = run_device(cfg.parallel.device, gpus)
    if gpu_bytes is None and device_type == "cuda":
        gpu_bytes = gpu_memory_bytes()
    check_kv_cache(cfg, device_type, gpu_bytes)
