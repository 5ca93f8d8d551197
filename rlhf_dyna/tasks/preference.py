"""`task=preference`: pairs of completions of one prompt, one preferred, from local jsonl / json / parquet files (HF
`datasets`), for training a reward model (algorithm.name=reward_model).

Columns: `task.prompt_key` (a string or chat messages; "" for files without one, whose completions are then whole
conversations), `task.chosen_key` and `task.rejected_key` (strings, or chat messages that follow the prompt's). A pair
whose chosen and rejected are the same teaches nothing: it is dropped, and the count is said. Training walks the pairs
in a fresh permutation per epoch drawn from the seed (resumable from `state_dict()`); the held-out pairs are
`task.eval_files`, or without them the last `task.eval_size` pairs of the training files, which training then never
sees.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .epoch_order import EpochOrder
from .file_task import load_rows
from .reward_text import Text


@dataclass(frozen=True)
class Pair:
    prompt: Text
    chosen: Text
    rejected: Text


def _is_rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def rows_to_pairs(rows: Sequence[dict[str, Any]], prompt_key: str, chosen_key: str, rejected_key: str,
                  ) -> tuple[list[Pair], int]:
    """The rows as pairs, without those whose chosen equals their rejected; also how many were dropped."""
    pairs = [Pair(row[prompt_key] if prompt_key else "", row[chosen_key], row[rejected_key]) for row in rows]
    kept = [p for p in pairs if p.chosen != p.rejected]
    return kept, len(pairs) - len(kept)


def identical_notice(dropped: int, total: int, where: str) -> str:
    return (f"rlhf_dyna: task=preference dropped {dropped} of {total} pairs of {where} whose chosen and rejected "
            "completions are identical (no preference to learn from them)")


class PreferenceTask:
    name = "preference"

    def __init__(self, train_files: Sequence[str], eval_files: Sequence[str] = (), prompt_key: str = "prompt",
                 chosen_key: str = "chosen", rejected_key: str = "rejected", seed: int = 0, eval_size: int = 128) -> None:
        keys = (prompt_key, chosen_key, rejected_key)
        train = self._pairs(train_files, keys, "task.train_files")
        if eval_files:
            self.eval = self._pairs(eval_files, keys, "task.eval_files")[:eval_size]
        else:  # held out from the training files: the last eval_size pairs, never trained on
            held = min(eval_size, len(train) // 2)
            train, self.eval = train[: len(train) - held], train[len(train) - held:]
        if not train or not self.eval:
            raise ValueError(f"task=preference has {len(train)} training and {len(self.eval)} held-out pairs after "
                             "dropping identical ones; give files with more distinct pairs.")
        self.train = train
        self.order = EpochOrder(len(train), seed, "preference", "pairs")

    @staticmethod
    def _pairs(files: Sequence[str], keys: tuple[str, str, str], where: str) -> list[Pair]:
        rows = load_rows(files)
        pairs, dropped = rows_to_pairs(rows, *keys)
        if dropped and _is_rank0():
            print(identical_notice(dropped, len(rows), where), flush=True)
        return pairs

    def train_pairs(self, batch_size: int) -> list[Pair]:
        """The next `batch_size` pairs of this epoch's order, into the next epoch when it runs out."""
        return [self.train[i] for i in self.order.take(batch_size)]

    def eval_pairs(self) -> list[Pair]:
        return list(self.eval)

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state)


def make_preference_task(task_cfg, seed: int) -> PreferenceTask:
    t = task_cfg
    return PreferenceTask(list(t.train_files), list(t.eval_files), t.prompt_key, t.chosen_key, t.rejected_key, seed,
                          t.eval_size)
