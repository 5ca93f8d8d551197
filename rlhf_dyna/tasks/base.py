"""The task interface: prompts, a held-out eval set, and a verifiable reward in [0, 1].

Every task is deterministic given its seed: the eval set is fixed and disjoint from anything
`train_prompts` can return, and training draws come from the caller's `random.Random`.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Union

from rlhf_dyna.tasks.tokenizer import EOS


@dataclass(frozen=True, slots=True)
class Example:
    prompt: Union[str, list[dict[str, Any]]]  # "12+34=", or chat messages [{role, content}, ...]
    answer: str  # e.g. "46": the reference response (toy tasks) or ground truth for the reward
    columns: dict[str, Any] = field(default_factory=dict)  # a data file's other columns, handed to rewards by name


@dataclass(frozen=True, slots=True)
class SFTExample:
    prompt: str
    completion: str  # answer followed by the literal "<eos>", which CharTokenizer encodes as one token


def response_answer(response_text: str) -> str:
    """The answer part of a decoded response: text before any <eos>, stripped of whitespace."""
    return response_text.split(EOS, 1)[0].strip()


def digit_range(min_digits: int, max_digits: int) -> tuple[int, int]:
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}..{max_digits}")
    return min_digits, max_digits


def positional_credit(answer: str, response: str) -> float:
    """Fraction of answer characters matched at the same position; 0 if the lengths differ."""
    if len(response) != len(answer) or not answer:
        return float(response == answer)
    return sum(a == b for a, b in zip(answer, response)) / len(answer)


class BaseTask(ABC):
    """What the loop asks of a task: training prompts, an eval set, batch rewards and a data position."""

    name: str = "task"

    @abstractmethod
    def train_prompts(self, step: int, batch_size: int, rng: random.Random) -> list[Example]:
        """`batch_size` training examples for `step` (identical on every rank)."""

    @abstractmethod
    def eval_set(self) -> list[Example]:
        """The fixed held-out set."""

    @abstractmethod
    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
        """Reward per response (examples[i] is the prompt of responses[i]), and each named reward part."""

    @abstractmethod
    def eval_accuracy(self, examples: Sequence[Example], responses: Sequence[str], rewards: Sequence[float]) -> float:
        """What eval/accuracy reports."""

    def sft_examples(self, n: int, rng: random.Random) -> list[SFTExample]:
        raise NotImplementedError(f"task {self.name!r} has no demonstrations for a supervised warm-up")

    def state_dict(self) -> dict[str, Any]:
        """The data position (for checkpoint resume); tasks drawing from the loop's rng have none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()`."""


class Task(BaseTask):
    """A verifiable task. Subclasses provide `_sample` (one training example from an rng) and
    `_make_eval_set`; the rest (disjointness, rewards, SFT data) is shared."""

    def __init__(self, seed: int, eval_size: int, partial_credit: bool) -> None:
        if eval_size < 1:
            raise ValueError(f"eval_size must be >= 1, got {eval_size}")
        if 2 * eval_size > self.num_distinct_prompts():
            raise ValueError(
                f"eval_size={eval_size} is too large for {self.num_distinct_prompts()} distinct "
                f"prompts of {self.name}; at most {self.num_distinct_prompts() // 2} leaves half for training"
            )
        self.seed = seed
        self.partial_credit = partial_credit
        self._eval = self._make_eval_set(random.Random(seed), eval_size)
        self._held_out = {self._identity(e) for e in self._eval}

    @abstractmethod
    def num_distinct_prompts(self) -> int:
        """How many different prompts the task can produce (under `_identity`)."""

    @abstractmethod
    def _sample(self, rng: random.Random) -> Example:
        """One example drawn from the training distribution (may hit the eval set)."""

    @abstractmethod
    def _identity(self, example: Example) -> Any:
        """Key under which two examples count as the same problem for train/eval disjointness."""

    @property
    @abstractmethod
    def max_answer_length(self) -> int:
        """Longest answer in characters; a response needs this many tokens plus one for <eos>."""

    def _make_eval_set(self, rng: random.Random, size: int) -> list[Example]:
        chosen: dict[Any, Example] = {}
        while len(chosen) < size:
            example = self._sample(rng)
            chosen.setdefault(self._identity(example), example)
        return list(chosen.values())

    def train_prompts(self, step: int, batch_size: int, rng: random.Random) -> list[Example]:
        """`batch_size` training examples, never from the eval set. `step` is for curricula;
        the built-in tasks ignore it."""
        out: list[Example] = []
        while len(out) < batch_size:
            example = self._sample(rng)
            if self._identity(example) not in self._held_out:
                out.append(example)
        return out

    def eval_set(self) -> list[Example]:
        """The fixed held-out set (same for the same seed)."""
        return list(self._eval)

    def is_correct(self, example: Example, response_text: str) -> bool:
        return response_answer(response_text) == example.answer

    def reward(self, example: Example, response_text: str) -> float:
        """1.0 for the exact answer; else 0.0, or the positional credit if partial_credit."""
        if self.is_correct(example, response_text):
            return 1.0
        if self.partial_credit:
            return positional_credit(example.answer, response_answer(response_text))
        return 0.0

    def score(self, examples: Sequence[Example], responses: Sequence[str]) -> tuple[list[float], dict[str, list[float]]]:
        return [self.reward(e, r) for e, r in zip(examples, responses)], {}

    def eval_accuracy(self, examples: Sequence[Example], responses: Sequence[str], rewards: Sequence[float]) -> float:
        return self.accuracy(examples, responses)

    def accuracy(self, examples: Sequence[Example], responses: Sequence[str]) -> float:
        """Exact-match fraction (what eval/accuracy reports)."""
        if len(examples) != len(responses):
            raise ValueError(f"{len(examples)} examples but {len(responses)} responses")
        if not examples:
            return 0.0
        return sum(self.is_correct(e, r) for e, r in zip(examples, responses)) / len(examples)

    def sft_examples(self, n: int, rng: random.Random) -> list[SFTExample]:
        """Demonstrations for a supervised warm-up: training prompts with answer + <eos>."""
        return [SFTExample(e.prompt, e.answer + EOS) for e in self.train_prompts(0, n, rng)]


TASK_REGISTRY: dict[str, Callable[..., BaseTask]] = {}


def register_task(name: str) -> Callable[[type[BaseTask]], type[BaseTask]]:
    def register(cls: type[BaseTask]) -> type[BaseTask]:
        cls.name = name
        TASK_REGISTRY[name] = cls
        return cls

    return register


def make_task(name: str, **cfg: Any) -> BaseTask:
    """Build a registered task by name; `cfg` are the task's constructor arguments."""
    if name not in TASK_REGISTRY:
        raise ValueError(f"unknown task {name!r}; registered: {sorted(TASK_REGISTRY)}")
    try:
        return TASK_REGISTRY[name](**cfg)
    except TypeError as err:
        raise TypeError(f"bad config for task {name!r}: {err}") from err
