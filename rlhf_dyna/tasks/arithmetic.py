"""Addition of two non-negative integers: "12+34=" -> "46"."""
from __future__ import annotations

import random

from rlhf_dyna.tasks.base import Example, Task, digit_range, register_task


def _count_with_digits(digits: int) -> int:
    """How many non-negative integers have exactly `digits` digits (0 counts as 1-digit)."""
    return 10 if digits == 1 else 9 * 10 ** (digits - 1)


@register_task("arithmetic")
class ArithmeticTask(Task):
    """Each operand's digit count is uniform in [min_digits, max_digits], then the operand is
    uniform among numbers with that many digits. a+b and b+a are the same problem, so the eval set
    holds out both orders."""

    def __init__(
        self,
        seed: int = 0,
        min_digits: int = 1,
        max_digits: int = 2,
        eval_size: int = 128,
        partial_credit: bool = False,
    ) -> None:
        self.min_digits, self.max_digits = digit_range(min_digits, max_digits)
        super().__init__(seed, eval_size, partial_credit)

    def num_distinct_prompts(self) -> int:
        operands = sum(_count_with_digits(d) for d in range(self.min_digits, self.max_digits + 1))
        return operands * (operands + 1) // 2  # unordered pairs

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.min_digits, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(low, 10**digits - 1)

    def _sample(self, rng: random.Random) -> Example:
        a, b = self._operand(rng), self._operand(rng)
        return Example(prompt=f"{a}+{b}=", answer=str(a + b))

    def _identity(self, example: Example) -> frozenset[str]:
        return frozenset(example.prompt[:-1].split("+"))

    @property
    def max_answer_length(self) -> int:
        return len(str(2 * (10**self.max_digits - 1)))
