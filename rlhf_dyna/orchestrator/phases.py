"""Generation (with scoring), evaluation and the supervised warm-up, on the ranks that serve them.

A rollout layout (parallel_layout.RolloutLayout) says which ranks generate and in which vLLM replica; every rank
calls `rollouts` (it ends in one all_gather), and only ranks of the layout generate."""
from __future__ import annotations

import random
import time


from ..config import Config
from ..parallel_layout import RolloutLayout
from ..tasks.base import BaseTask as Task
from ..tasks.base import Example
from ..tasks.hf_tokenizer import HFTokenizer
from ..tasks.tokenizer import CharTokenizer
from ..tracking.console import announce
from .batch import Sample, gather_samples, pack, shard_rows
from .objectives import sft_loss


def replica_slice(items: list, layout: RolloutLayout, rank: int) -> tuple[int, list]:
    """The contiguous share of `items` that this rank's rollout replica serves (TP ranks share it)."""
    per = len(items) // layout.replicas
    start = layout.replica(rank) * per
    return start, items[start : start + per]


Tokenizer = CharTokenizer | HFTokenizer


def prompt_ids(tokenizer: Tokenizer, example: Example) -> list[int]:
    return tokenizer.encode_prompt(example.prompt)


def reward_part_means(samples: list[Sample]) -> dict[str, float]:
    """reward/<name>/mean for each named reward function (task=file)."""
    names = samples[0].reward_parts if samples else {}
    return {f"reward/{n}/mean": sum(s.reward_parts[n] for s in samples) / len(samples) for n in names}


def generate(cfg: Config, rollout, task: Task, tokenizer: Tokenizer, prompts: list[Example], layout: RolloutLayout,
             rank: int, greedy: bool = False, seed: int | None = None) -> list[Sample]:
    """This replica's prompts, n samples each, scored by the task's reward."""
    r = cfg.rollout
    n = 1 if greedy else r.n
    start, mine = replica_slice(prompts, layout, rank)
    ids = [prompt_ids(tokenizer, e) for e in mine]
    outputs = rollout.generate(
        ids, n=n, temperature=0.0 if greedy else r.temperature, top_p=1.0 if greedy else r.top_p,
        top_k=-1 if greedy else r.top_k, max_tokens=r.max_new_tokens, stop_token_ids=tokenizer.eos_ids,
        seed=seed, first_index=start,  # global prompt indices: the same samples under any replica count
    )
    samples, examples, texts = [], [], []
    stops = set(tokenizer.eos_ids)
    for i, (example, p_ids, outs) in enumerate(zip(mine, ids, outputs)):
        for out in outs:
            response = list(out.token_ids)
            samples.append(Sample(prompt_index=start + i, prompt_ids=p_ids, response_ids=response,
                                  finished=bool(response) and response[-1] in stops, prompt=example.prompt))
            examples.append(example)
            texts.append(tokenizer.decode(response))
    score(task, samples, examples, texts)
    return samples


def score(task: Task, samples: list[Sample], examples: list[Example], texts: list[str]) -> None:
    """Each sample's reward (and each named reward's part), from one batch call: user reward fns get lists."""
    rewards, parts = task.score(examples, texts)
    for j, sample in enumerate(samples):
        sample.reward = rewards[j]
        sample.reward_parts = {name: values[j] for name, values in parts.items()}


def rollouts(cfg: Config, rollout, task: Task, tokenizer: Tokenizer, prompts: list[Example], layout: RolloutLayout,
             rank: int, greedy: bool = False, seed: int | None = None) -> tuple[list[Sample], float]:
    """Collective: the samples of `prompts` on every rank, in prompt order, and this rank's generate seconds (0 off
    the layout). Ranks of the layout generate and score their replica's share; one all_gather shares them."""
    t0 = time.perf_counter()
    local = generate(cfg, rollout, task, tokenizer, prompts, layout, rank, greedy, seed) if layout.holds(rank) else []
    seconds = time.perf_counter() - t0 if layout.holds(rank) else 0.0
    samples = sorted(gather_samples(local, layout.is_leader(rank)), key=lambda s: s.prompt_index)
    return samples, seconds


def evaluate(cfg: Config, rollout, task: Task, tokenizer: Tokenizer, layout: RolloutLayout, rank: int,
             prefix: str = "eval", rescore=None) -> dict[str, float]:
    """Greedy decoding on the held-out set: exact-match accuracy and mean task reward (`rescore(samples)`, collective,
    adds what the generating ranks do not score: the reward model's part)."""
    t0 = time.perf_counter()
    examples = task.eval_set()
    usable = len(examples) - len(examples) % layout.replicas
    announce(f"evaluating {usable} prompts ({prefix})...")
    samples, _ = rollouts(cfg, rollout, task, tokenizer, examples[:usable], layout, rank, greedy=True)
    if rescore is not None:
        rescore(samples)
    texts = [tokenizer.decode(s.response_ids) for s in samples]
    return {
        f"{prefix}/accuracy": task.eval_accuracy(examples[:usable], texts, [s.reward for s in samples]),
        f"{prefix}/reward": sum(s.reward for s in samples) / len(samples),
        f"timing_s/{prefix}": time.perf_counter() - t0,
    }


def supervised_warmup(cfg: Config, actor, task: Task, tokenizer: Tokenizer) -> dict[str, float]:
    """Optional short SFT on task demonstrations (loss on the answer tokens only), at trainer.sft_lr."""
    steps = cfg.trainer.sft_warmup_steps
    if steps <= 0:
        return {}
    t0 = time.perf_counter()
    announce(f"supervised warm-up, {steps} steps...")
    rng = random.Random(cfg.trainer.seed + 2)
    saved_lrs = [g["lr"] for g in actor.optimizer.param_groups]
    for group in actor.optimizer.param_groups:
        group["lr"] = cfg.trainer.sft_lr
    metrics: dict[str, float] = {}
    for _ in range(steps):
        examples = task.sft_examples(cfg.trainer.sft_batch_size, rng)  # identical on every rank
        samples = [Sample(i, prompt_ids(tokenizer, e), tokenizer.encode(e.completion)) for i, e in enumerate(examples)]
        batch = shard_rows(pack(samples, tokenizer.pad_id), actor.dp_rank, actor.dp_size)
        metrics = actor.step(batch, sft_loss())
    for group, lr in zip(actor.optimizer.param_groups, saved_lrs):
        group["lr"] = lr
    actor.optimizer.state.clear()  # RL starts with fresh Adam moments at its own learning rate
    return {"sft/loss": metrics["sft_loss"], "sft/steps": float(steps), "timing_s/sft": time.perf_counter() - t0}
