"""Generation with real vLLM inside our own ranks (external_launcher: one in-process engine per rank).

Layout: vLLM puts `tp` consecutive ranks in one TP group and numbers the groups (its DP replicas)
`dp_rank = rank // tp`. Ranks of one TP group must pass identical prompts and sampling arguments;
each replica gets its own prompt shard. `generate` is collective over the world (the replicas
agree on when all are done, an idle replica runs dummy batches), so every rank calls it.

Log-probs (vllm 0.32 `logprobs_mode`, see vllm/v1/sample/sampler.py): the default "raw_logprobs" is
log_softmax of the model's logits *before* temperature / top-k / top-p. We default to
"processed_logprobs": log_softmax after temperature and top-k/top-p masking, i.e. the distribution
the token was actually sampled from. With temperature=1 and no top-k/top-p both modes agree and
equal the train engine's `logprobs(temperature=1)`; with temperature T they equal
`logprobs(temperature=T)` as long as top-k/top-p are off (otherwise vLLM renormalises over the kept
tokens). Greedy requests (temperature=0) report raw log-probs in both modes.

GPU memory (rollout/gpu_defaults.py): on CUDA vLLM takes `gpu_memory_utilization` of the card; with `sleep_level` > 0
(colocate) it runs in vLLM's sleep mode (its CuMemAllocator keeps every allocation at a fixed virtual address), so
`sleep()` after generation hands the KV cache (and at level 1 the weights, kept in host memory; at level 2 dropped,
since the sync rewrites every one) back to training, and `wake_up(("weights",))` before the sync and `wake_up()`
before generation map it back at the same addresses: tensors bound for an in-place sync stay valid. Both are no-ops
on the CPU and with sleep_level 0.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from rlhf_dyna.models.moe_weights import to_checkpoint_names
from rlhf_dyna.rollout.gpu_defaults import memory_args
from rlhf_dyna.rollout.vllm_moe_cpu import repack_all_experts
from rlhf_dyna.tracking.console import announce


CPU_STEP_TOKENS = 4096  # vLLM's own CPU default of max_num_batched_tokens (prompt tokens one engine step takes)


def platform_engine_args(max_model_len: int) -> dict:
    """vLLM settings the platform needs. On the CPU, no chunked prefill: vLLM 0.32 crashes ("CPU Generator does not
    use offset") when a seeded request's prompt is cut across two steps, which happens as soon as one call's prompts
    exceed the step's token budget; unchunked, such prompts wait for the next step instead."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(CPU_STEP_TOKENS, max_model_len)}


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]  # generated tokens (prompt excluded), stop token included if one was hit
    logprobs: list[float]  # log-prob of each generated token (see module doc for which distribution)


class VLLMRollout:
    def __init__(
        self,
        model_dir: str | Path,
        tp: int = 1,
        seed: int = 0,
        max_model_len: int = 512,
        kv_cache_bytes: int = 64 << 20,
        dtype: str = "float32",
        logprobs_mode: str = "processed_logprobs",
        enable_prefix_caching: bool = True,
        block_size: int | None = None,
        load_format: str = "auto",  # "dummy": random weights, config.json only (benchmarks that sync real weights in)
        expert_parallel: bool = False,  # MoE: each rank holds whole experts (vLLM's linear placement), not a TP slice
        gpu_memory_utilization: float = 0.5,  # CUDA: share of the GPU vLLM may take
        enforce_eager: bool = True,  # False: CUDA graphs and compile (gpu_defaults.enforce_eager)
        sleep_level: int = 0,  # CUDA: vLLM's sleep mode between generations (see module doc); 0 = off
    ) -> None:
        from vllm import LLM  # deferred: importing vllm costs seconds and the trainer-only paths don't need it
        from vllm.platforms import current_platform

        world = dist.get_world_size() if dist.is_initialized() else 1
        if world % tp:
            raise ValueError(f"tp={tp} does not divide the world size {world}")
        self.tp = tp
        self.expert_parallel = expert_parallel
        self.dp_size = world // tp
        self.dp_rank = (dist.get_rank() if dist.is_initialized() else 0) // tp
        device_type = "cpu" if current_platform.is_cpu() else "cuda"
        self.sleep_level = sleep_level if device_type == "cuda" else 0
        self.asleep: set[str] = set()  # what vLLM has released: "weights", "kv_cache"
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in this process
        announce(f"starting vLLM (tp={tp}, max_model_len={max_model_len})...")
        if expert_parallel and current_platform.is_cpu():
            from .vllm_cpu_ep import install

            install()  # vLLM's CPU MoE kernel ignores the expert map (rollout/vllm_cpu_ep.py)
        self.llm = LLM(
            model=str(model_dir),
            tensor_parallel_size=tp,
            data_parallel_size=self.dp_size,
            distributed_executor_backend="external_launcher" if dist.is_initialized() else None,
            skip_tokenizer_init=True,
            enforce_eager=enforce_eager,
            **memory_args(device_type, kv_cache_bytes, gpu_memory_utilization),
            enable_sleep_mode=self.sleep_level > 0,
            seed=seed,  # identical on every rank: TP peers each sample and must draw the same tokens
            dtype=dtype,
            max_model_len=max_model_len,
            logprobs_mode=logprobs_mode,
            enable_prefix_caching=enable_prefix_caching,
            load_format=load_format,
            enable_expert_parallel=expert_parallel,
            **({} if block_size is None else {"block_size": block_size}),  # only whole blocks are prefix-cached
            worker_cls="rlhf_dyna.rollout.cpu_worker.ShmIdentCPUWorker" if current_platform.is_cpu() else "auto",
            **platform_engine_args(max_model_len),
        )

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_tokens: int = 16,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        first_index: int = 0,
    ) -> list[list[Sample]]:
        """n samples per prompt, in prompt order. `seed` makes sample j of prompt i use seed + (first_index + i)*n + j,
        where `first_index` is the global index of this call's first prompt (its replica's slice start), so any
        placement or replica count draws the same samples; pass a different seed every step, or the same tokens
        come back for the same prompts."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake_up()

        def params(i: int) -> SamplingParams:
            return SamplingParams(
                n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                stop_token_ids=stop_token_ids or [], seed=None if seed is None else seed + (first_index + i) * n,
                logprobs=0, detokenize=False,  # logprobs=0: only the sampled token's log-prob
            )

        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_ids]
        outputs = self.llm.generate(prompts, [params(i) for i in range(len(prompts))], use_tqdm=False)
        return [
            [Sample(list(c.token_ids), [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]) for c in out.outputs]
            for out in outputs
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load full tensors by HF name (checkpoint format, MoE experts by their per-expert names; vLLM shards, fuses
        and repacks them itself, but for its CPU expert kernels, prepacked here), then drop the prefix cache, whose KV
        was computed with the old weights."""
        self.wake_up(("weights",))
        self.llm.collective_rpc(
            "reload_weights", kwargs=dict(weights_iterator=to_checkpoint_names(named_tensors), is_checkpoint_format=True)
        )
        self.llm.apply_model(repack_all_experts)
        self.reset_prefix_cache()

    def sleep(self) -> None:
        """After generation (colocate, CUDA): release vLLM's KV cache and weights (level 1: to host memory) and the
        caching allocator's free blocks, so training gets the GPU. No-op on the CPU, with sleep_level 0, or asleep."""
        if not self.sleep_level or self.asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self.asleep = {"weights", "kv_cache"}
        torch.cuda.empty_cache()

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        """Map back what `tags` name (`("weights",)` before a sync, everything before generation), after returning
        training's cached blocks to the driver. No-op for what is awake."""
        wanted = [t for t in tags if t in self.asleep]
        if not wanted:
            return
        torch.cuda.empty_cache()
        self.llm.wake_up(tags=wanted)
        self.asleep -= set(wanted)

    def drop_requests(self) -> None:
        """Abort what a generate interrupted by an error (a lost peer's, inside vLLM's DP sync) left in the engine, so
        it is idle again: its requests (by their internal ids, children of n > 1 included) and a pending dummy batch."""
        engine = self.llm.llm_engine
        unfinished = list(engine.output_processor.request_states)
        if unfinished:
            engine.abort_request(unfinished, internal=True)
        engine.should_execute_dummy_batch = False

    def reset_prefix_cache(self) -> None:
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache (requests still running?)")

    def close_for_exit(self) -> None:
        """The end of the rank (collective): the peers agree that generation is over, and the engine goes with the
        process. vLLM's own shutdown unfreezes and collects the whole heap, seconds that an exiting rank need not
        spend (it runs when the engine is collected, from a finalizer, which is detached here); its /dev/shm segments
        are removed by the rank's exit hook (launch/rank.py)."""
        dist.barrier()
        self.discard()

    def discard(self) -> None:
        """Let the engine go without vLLM's shutdown, which would destroy the default process group (a new world's,
        after a change of world) and collect the whole heap: its finalizer detached, its memory freed with it."""
        finalizer = getattr(self.llm.llm_engine.engine_core, "_finalizer", None)  # vLLM's in-process client
        if finalizer is not None:
            finalizer.detach()

    def shutdown(self) -> None:
        """The last collective act of a rank: vLLM's EngineCore.shutdown() (also run when the LLM is garbage
        collected) calls cleanup_dist_env_and_memory(), which destroys the *default* process group too."""
        dist.barrier()
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
