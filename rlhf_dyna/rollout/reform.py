"""A running vLLM engine (external_launcher) carried across a change of world: its model, KV cache and
scheduler stay; only its process groups and its data-parallel place are rebuilt over the new world.

    release_groups()                        # every rank of the old world, instead of rollout.shutdown()
    ... the old default group is gone; the survivors join the new one ...
    reform(rollout, rank, world_size)       # each survivor: vLLM's groups over the new world, its DP rank and size

Under external_launcher vLLM builds its groups (world, TP, PP, DP, EP, ...) on the default torch group and reads its
DP rank and size from the parallel config; the replicas agree on when a generate call is done over the DP group. So a
new world needs vLLM's groups re-made on the new default group and the config's DP fields set, nothing else.
"""
from __future__ import annotations

from ..elastic.world_prebuild import configured_backend
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


def reform(rollout: VLLMRollout, rank: int, world_size: int) -> None:
    """`rollout` as replica rank // tp of world_size // tp, on groups over the new default group (collective). Its tp
    and its place in its TP group stay (where a change would move them, elastic.membership.engines_kept says so and the
    runtime starts new engines instead)."""
    from vllm.config import set_current_vllm_config  # deferred, as in vllm_engine: importing vLLM costs seconds
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    engine = rollout.llm.llm_engine
    config = engine.vllm_config
    parallel = config.parallel_config
    parallel.data_parallel_size = world_size // rollout.tp
    parallel.data_parallel_rank = parallel.data_parallel_index = rank // rollout.tp
    with set_current_vllm_config(config):
        init_worker_distributed_environment(config, rank, "env://", backend=configured_backend())
    # vLLM decides this once, at start: an engine started in a world of one (a joiner's) must agree with its replicas
    engine.external_launcher_dp = parallel.data_parallel_size > 1
    engine.dp_group = parallel_state.get_dp_group().cpu_group if engine.external_launcher_dp else None
    rollout.dp_size, rollout.dp_rank = parallel.data_parallel_size, parallel.data_parallel_rank
