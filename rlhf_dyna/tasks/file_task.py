"""`task=file`: prompts and ground truths from local jsonl / json / parquet files (HF `datasets`), scored by rewards.

Training walks the rows in a fresh permutation per epoch, drawn from the seed (so a run's order is reproducible
and resumable from `state_dict()`); epochs continue when the data runs out. Eval is greedy on `eval_files`;
eval/accuracy is the fraction of completions whose weighted reward is > 0.5, eval/reward the mean reward.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlhf_dyna.tasks.base import BaseTask, Example, register_task
from rlhf_dyna.tasks.epoch_order import EpochOrder
from rlhf_dyna.tasks.rewards import RewardSet, build_rewards

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
CORRECT_ABOVE = 0.5  # eval/accuracy counts a completion correct when its weighted reward is above this


def data_format(files: Sequence[str]) -> str:
    """The `datasets` builder for these files (all must share one), from their extensions."""
    formats = {FORMATS.get(Path(f).suffix.lower()) for f in files}
    if None in formats or len(formats) != 1:
        raise ValueError(f"data files {list(files)} must all be one of {', '.join(FORMATS)} (by extension).")
    return formats.pop()


def load_rows(files: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of the files, in file order, as plain dicts."""
    from datasets import load_dataset  # deferred: heavy, and only task=file needs it

    return load_dataset(data_format(files), data_files=[str(f) for f in files], split="train").to_list()


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


@register_task("file")
class FileTask(BaseTask):
    def __init__(self, train_files: Sequence[str], eval_files: Sequence[str] = (), prompt_key: str = "prompt",
                 answer_key: str = "answer", max_prompt_tokens: int = 0, reward: Any = "math",
                 reward_weights: Sequence[float] = (), seed: int = 0, eval_size: int = 128, tokenizer=None) -> None:
        self.prompt_key, self.answer_key = prompt_key, answer_key
        self.rewards: RewardSet = build_rewards(reward, reward_weights, answer_key)
        self.train = self._examples(train_files, tokenizer, max_prompt_tokens, "train")
        if not self.train:
            raise ValueError(f"task.train_files {list(train_files)} hold no usable prompts (after task.max_prompt_tokens).")
        # without eval files, eval scores the first training rows (not held out)
        evals = self._examples(eval_files, tokenizer, max_prompt_tokens, "eval") if eval_files else self.train
        self.eval = evals[:eval_size]
        self.order = EpochOrder(len(self.train), seed, "file", "rows")

    def _examples(self, files: Sequence[str], tokenizer, max_tokens: int, split: str) -> list[Example]:
        rows = load_rows(files)
        examples = [
            Example(prompt=row[self.prompt_key], answer=str(row[self.answer_key]),
                    columns={k: v for k, v in row.items() if k != self.prompt_key})
            for row in rows
        ]
        if max_tokens > 0 and tokenizer is not None:
            kept = [e for e in examples if len(tokenizer.encode_prompt(e.prompt)) <= max_tokens]
            if len(kept) < len(examples) and _is_rank0():
                print(f"rlhf_dyna: task=file dropped {len(examples) - len(kept)} of {len(examples)} {split} prompts "
                      f"longer than task.max_prompt_tokens={max_tokens}", flush=True)
            examples = kept
        return examples

    def train_prompts(self, step: int, batch_size: int, rng: random.Random) -> list[Example]:
        """The next `batch_size` rows of this epoch's order, into the next epoch when it runs out (rng unused)."""
        return [self.train[i] for i in self.order.take(batch_size)]

    def eval_set(self) -> list[Example]:
        return list(self.eval)

    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
        columns: dict[str, list] = {k: [e.columns.get(k) for e in examples] for k in (examples[0].columns if examples else {})}
        return self.rewards.score([e.prompt for e in examples], responses, columns)

    def eval_accuracy(self, examples: Sequence[Example], responses: Sequence[str], rewards: Sequence[float]) -> float:
        return sum(r > CORRECT_ABOVE for r in rewards) / len(rewards) if rewards else 0.0

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state)


def make_file_task(task_cfg, seed: int, tokenizer) -> FileTask:
    t = task_cfg
    return FileTask(list(t.train_files), list(t.eval_files), t.prompt_key, t.answer_key, t.max_prompt_tokens,
                    t.reward, list(t.reward_weights or []), seed, t.eval_size, tokenizer)
