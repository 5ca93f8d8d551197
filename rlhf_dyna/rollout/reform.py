"""A running vLLM engine (external_launcher) carried across a change of world: its model, KV cache and
scheduler stay; only its process groups and its data-parallel place are rebuilt over the new world.

    release_groups()                        # every rank of the old world, instead of rollout.shutdown()
    ... the old default group is gone; the survivors join the new one ...
    reform(rollout, rank, world_size, build)  # each survivor: vLLM's groups over the new world, its DP rank and size

Under external_launcher vLLM builds its groups (world, TP, PP, DP, EP, ...) on the default torch group and reads its
DP rank and size from the parallel config; the replicas agree on when a generate call is done over the DP group. So a
new world needs vLLM's groups re-made on the new default group and the config's DP fields set, nothing else.

Where the change was known a step ahead, `build` (elastic.world_prebuild) made those groups (`vllm_groups`) and
counted the world's machines in the background during the step before: the re-form then builds no group and, at tp 1,
runs no collective (a TP group of several ranks still sets up vLLM's shared-memory broadcaster and checks its ranks
share one, over its new cpu group). Without it (NCCL, a SIGTERM leave, recovery) vLLM builds and counts them here.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..elastic.world_prebuild import WorldBuild, configured_backend, rollout_groups
from .vllm_engine import VLLMRollout


RETIRED_KEPT = 64  # old worlds' groups kept alive at most (each holds its sockets and worker threads)
_retired: list = []  # vLLM's groups of old worlds, deregistered but not yet freed


def release_groups() -> None:
    """Destroy vLLM's process groups and the default group under them (no collective), keeping the engine. The old
    groups leave torch's registry at once; their objects are freed only once RETIRED_KEPT are held, because freeing
    a used gloo group blocks for ~20 ms and vLLM holds a dozen (the change would wait for it)."""
    from vllm.distributed import parallel_state  # deferred, as in vllm_engine: importing vLLM costs seconds
    for ref in parallel_state._groups.values():
        coordinator = ref()
        if coordinator is not None:
            _retired.extend(g for g in (getattr(coordinator, "device_group", None),
                                        getattr(coordinator, "cpu_group", None)) if g is not None)
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    del _retired[:max(0, len(_retired) - RETIRED_KEPT)]


def vllm_groups(tp: int, world_size: int, moe: bool) -> tuple[tuple[int, ...], ...]:
    """The groups `reform` makes vLLM create over a world of `world_size` at rollout tp `tp`, in its order (vLLM's
    parallel_state: world, TP, DCP, PCP, PP, DP, then EP for an MoE model; pp, pcp and dcp 1), each twice (a device
    group and a cpu group): what a build in the background makes for it (elastic.world_prebuild.WorldPlan.rollout)."""
    dp = world_size // tp
    ranks = torch.arange(world_size).reshape(-1, dp, 1, 1, tp)  # vLLM's ExternalDP x DP x PP x PCP x TP
    dims = [ranks.reshape(1, -1), ranks.reshape(-1, tp), ranks.reshape(-1, 1), ranks.transpose(3, 4).reshape(-1, 1),
            ranks.transpose(2, 4).reshape(-1, 1), ranks.transpose(1, 4).reshape(-1, dp)]
    if moe:
        dims.append(ranks.transpose(1, 2).reshape(-1, dp * tp))
    return tuple(tuple(group) for dim in dims for group in dim.tolist() for _ in ("device", "cpu"))


def engine_is_moe(rollout: VLLMRollout) -> bool:
    """Whether vLLM builds expert-parallel groups for `rollout`'s model."""
    return bool(rollout.llm.llm_engine.vllm_config.model_config.is_moe)


@contextmanager
def machines_counted(build: WorldBuild | None):
    """Inside: vLLM takes the new world's machine count from `build`, where it counted them in the background."""
    from vllm.distributed import parallel_state

    if build is None or not build.used or build.machines is None:
        yield
        return
    # vLLM counts the machines of a world it makes with a collective over its world group (a shared memory segment
    # named by broadcast, then a barrier): the only collective left in a re-form over groups built in the background
    plain, parallel_state._node_count = parallel_state._node_count, lambda group: build.machines
    try:
        yield
    finally:
        parallel_state._node_count = plain


def reform(rollout: VLLMRollout, rank: int, world_size: int, build: WorldBuild | None = None) -> None:
    """`rollout` as replica rank // tp of world_size // tp, on groups over the new default group (collective), taken
    from `build` where it built them in the background (its plan's `rollout`: `vllm_groups`). Its tp and its place in
    its TP group stay (where a change would move them, elastic.membership.engines_kept says so and the runtime starts
    new engines instead)."""
    from vllm.config import set_current_vllm_config  # deferred, as in vllm_engine: importing vLLM costs seconds
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    engine = rollout.llm.llm_engine
    config = engine.vllm_config
    parallel = config.parallel_config
    parallel.data_parallel_size = world_size // rollout.tp
    parallel.data_parallel_rank = parallel.data_parallel_index = rank // rollout.tp
    with rollout_groups(build), machines_counted(build), set_current_vllm_config(config):
        init_worker_distributed_environment(config, rank, "env://", backend=configured_backend())
    # vLLM decides this once, at start: an engine started in a world of one (a joiner's) must agree with its replicas
    engine.external_launcher_dp = parallel.data_parallel_size > 1
    engine.dp_group = parallel_state.get_dp_group().cpu_group if engine.external_launcher_dp else None
    rollout.dp_size, rollout.dp_rank = parallel.data_parallel_size, parallel.data_parallel_rank
