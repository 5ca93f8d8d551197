"""Weight sync from the training rank set to a rollout rank set whose engines live outside our process groups
(`rollout.subset_engine.SubsetVLLMRollout`, tp=1 per rank): the groundwork of placement=split.

The destination is a VPS layout of its own: every rollout rank holds one whole copy of each parameter
(ParallelSpec(TRAIN, dp=1, dp_replicate=<rollout ranks>), first_rank = the rollout set's first rank), which is what
vLLM's checkpoint-format loader takes. The plan sends each rollout rank exactly the shards it lacks, from the
training set's FSDP / TP shards, in rounds under the memory budget; the rank then hands the whole tensors to its
engine through shared memory. Ranks outside both sets take part with no buffers (the executor is collective).
Every rank moves its bytes over the world's transport: on NCCL the rollout ranks receive into buffers on their own
GPU (then copied into the engine's shm file), since CPU buffers would post gloo receives that no NCCL send matches.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from rlhf_dyna.models.catalog import catalog_from_config
from rlhf_dyna.train.engine import TrainEngine
from rlhf_dyna.transition.bind_train import bind_train_buffers
from rlhf_dyna.transition.executor import execute
from rlhf_dyna.transition.relayout import bind_train_state
from rlhf_dyna.transition.sync import SyncStats
from rlhf_dyna.transition.trace import TraceRecorder
from rlhf_dyna.transition.transport import release_cached_memory, wire_device, world_transport
from rlhf_dyna.transition.views import TORCH_DTYPES
from rlhf_dyna.transition.vps_plans import DEFAULT_BUDGET_BYTES, planned
from rlhf_dyna.vps.spec import ParallelSpec, Phase
from rlhf_dyna.vps.tensor import Kind


def replicated_spec(first_rank: int, ranks: int) -> ParallelSpec:
    """A whole copy of every parameter on each of `ranks` ranks from `first_rank`."""
    return ParallelSpec(Phase.TRAIN, dp=1, dp_replicate=ranks, zero=3, first_rank=first_rank)


class SubsetSync:
    """Collective over the world: train set (spec `train`) -> whole copies on the rollout set -> each engine."""

    name = "vps_subset"

    def __init__(self, hf_config: object, train: ParallelSpec, rollout_first: int, rollout_ranks: int,
                 dtype: str = "float32", budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.config, self.train, self.budget_bytes = hf_config, train, budget_bytes
        self.rollout = replicated_spec(rollout_first, rollout_ranks)
        self.catalog = catalog_from_config(hf_config, dtype, dtype)
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.transfer_seconds = 0.0  # of the last sync: the executor's part

    def sync(self, train_engine: TrainEngine | None, rollout, recorder: TraceRecorder | None = None,
             trace_name: str = "train_to_rollout") -> SyncStats:
        """`train_engine` on ranks of the training set, `rollout` (SubsetVLLMRollout) on ranks of the rollout set;
        with a recorder, each round is a trace event named `trace_name`."""
        start, rank = time.perf_counter(), dist.get_rank()
        t = planned(self.catalog, self.train, self.catalog, self.rollout, (Kind.PARAM,), self.budget_bytes, rank)
        src = {}
        if train_engine is not None:
            params = {k: v for k, v in bind_train_state(train_engine).items() if k[1] == Kind.PARAM.value}
            src = bind_train_buffers(params, t.src, rank, t.src_buffers)
        transport = world_transport()
        device = wire_device(transport)
        dst = {name: torch.empty(b.shape, dtype=TORCH_DTYPES[b.dtype], device=device) for name, b in t.dst_buffers.items()}
        moving = time.perf_counter()
        stats = execute(t.rank_plan, src, dst, trace=recorder, trace_name=trace_name, transport=transport)
        self.transfer_seconds = time.perf_counter() - moving  # without planning and the engine's install
        if rollout is not None:
            rollout.load_weights(self._named(dst))
        del dst
        release_cached_memory(device)  # the whole copies are in the engine now: the GPU's blocks go back
        return SyncStats(time.perf_counter() - start, t.bytes_between_ranks, stats.rounds, stats.peak_extra_bytes)

    def _named(self, whole: dict[str, torch.Tensor]):
        """(HF name, tensor) from the buffers "<name>:param"; a tied lm_head is yielded too (vLLM reloads every layer)."""
        for buffer, tensor in whole.items():
            name = buffer.rsplit(":", 1)[0]
            yield name, tensor
            if self.tied and name == "model.embed_tokens.weight":
                yield "lm_head.weight", tensor
