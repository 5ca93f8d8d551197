"""Verifiable reward tasks, their data (made in code) and the character tokenizer."""
from rlhf_dyna.tasks import arithmetic, file_task, sort_digits  # noqa: F401  (register the built-in tasks)
from rlhf_dyna.tasks.arithmetic import ArithmeticTask
from rlhf_dyna.tasks.base import (
    TASK_REGISTRY,
    Example,
    SFTExample,
    Task,
    make_task,
    positional_credit,
    response_answer,
)
from rlhf_dyna.tasks.sort_digits import SortDigitsTask
from rlhf_dyna.tasks.tokenizer import CharTokenizer, build_char_tokenizer

__all__ = [
    "TASK_REGISTRY", "ArithmeticTask", "CharTokenizer", "Example", "SFTExample", "SortDigitsTask",
    "Task", "build_char_tokenizer", "make_task", "positional_credit", "response_answer",
]
