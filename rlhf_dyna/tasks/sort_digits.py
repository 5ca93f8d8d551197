"""Sorting a digit string ascending: "sort:3142=" -> "1234"."""
from __future__ import annotations

import random

from rlhf_dyna.tasks.base import Example, Task, digit_range, register_task

PREFIX = "sort:"


@register_task("sort_digits")
class SortDigitsTask(Task):
    """Strings of min_digits..max_digits digits (length uniform, digits uniform, repeats allowed).
    Each distinct input string is one problem."""

    def __init__(
        self,
        seed: int = 0,
        min_digits: int = 3,
        max_digits: int = 5,
        eval_size: int = 128,
        partial_credit: bool = False,
    ) -> None:
        self.min_digits, self.max_digits = digit_range(min_digits, max_digits)
        super().__init__(seed, eval_size, partial_credit)

    def num_distinct_prompts(self) -> int:
        return sum(10**length for length in range(self.min_digits, self.max_digits + 1))

    def _sample(self, rng: random.Random) -> Example:
        length = rng.randint(self.min_digits, self.max_digits)
        digits = "".join(rng.choice("0123456789") for _ in range(length))
        return Example(prompt=f"{PREFIX}{digits}=", answer="".join(sorted(digits)))

    def _identity(self, example: Example) -> str:
        return example.prompt

    @property
    def max_answer_length(self) -> int:
        return self.max_digits
