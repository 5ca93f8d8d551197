"""Reward functions over a batch, TRL's convention: `fn(prompts, completions, **columns) -> list[float]`.

Built in: `math` (final answer compared by value, through math-verify) and `exact` (stripped string equality);
both read the ground truth from the column named by `task.answer_key`; `rm` is the reward model's score
(`reward_model.path`), computed by the loop's scoring phase and added to the sum there. Custom: `my_pkg.my_module:my_fn`,
imported with the working directory on sys.path. Several combine as a weighted sum; each is reported by name.
"""
from __future__ import annotations

import functools
import importlib
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlhf_dyna.errors import ConfigError

RewardFn = Callable[..., list[float]]

_GSM8K = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


class RewardError(ConfigError):
    """A reward that cannot be used as task.reward names it: one paragraph, then its own traceback if it raised."""


def final_answer(text: str) -> str | None:
    """The completion's final answer as text: GSM8K `#### N`, else the last `\\boxed{}`, else the last number."""
    gsm = _GSM8K.findall(text)
    if gsm:
        return gsm[-1].strip()
    if "\\boxed" in text:
        return text  # math-verify extracts the last \boxed{} itself
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _as_math(text: str) -> list:
    from math_verify import parse  # deferred: the toy tasks never need it

    if "\\boxed" in text or "$" in text:
        return parse(text)
    return parse(f"${text}$")  # a bare value ("0.5", "1/2", "42") read as LaTeX math


def math_equal(completion: str, truth: str) -> bool:
    """True when the completion's final answer equals the ground truth (a value, GSM8K answer or LaTeX) by value."""
    from math_verify import verify

    answer = final_answer(completion)
    if answer is None:
        return False
    gold_text = final_answer(truth) or truth
    gold, guess = _as_math(gold_text), _as_math(answer)
    return bool(gold) and bool(guess) and bool(verify(gold, guess))


def math_reward(prompts: Sequence, completions: Sequence[str], answer_key: str = "answer", **columns: Any) -> list[float]:
    return [float(math_equal(c, str(t))) for c, t in zip(completions, columns[answer_key])]


def exact_reward(prompts: Sequence, completions: Sequence[str], answer_key: str = "answer", **columns: Any) -> list[float]:
    return [float(c.strip() == str(t).strip()) for c, t in zip(completions, columns[answer_key])]


BUILT_IN: dict[str, RewardFn] = {"math": math_reward, "exact": exact_reward}
LEARNED = "rm"  # the reward model's score (reward_model.path): no function here, the loop's scoring phase fills it


def import_reward(path: str) -> RewardFn:
    """`module.path:function`, importable from the working directory."""
    module_name, sep, fn_name = path.partition(":")
    if not sep or not module_name or not fn_name:
        raise RewardError(
            f"task.reward={path!r} is neither a built-in reward ({', '.join(BUILT_IN)}) nor a 'module:function' path; "
            "write e.g. task.reward=my_rewards:format_reward for my_rewards.py in the working directory."
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # user reward modules live next to where the run starts
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise RewardError(
            f"task.reward={path!r}: module {module_name!r} does not import ({type(err).__name__}: {err}); it must be "
            f"importable from the working directory {os.getcwd()} or the Python path."
        ) from err
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise RewardError(
            f"task.reward={path!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function "
            f"{fn_name!r}; define `def {fn_name}(prompts, completions, **columns) -> list[float]` there."
        )
    return fn


def reward_names(reward: Any) -> list[str]:
    """task.reward as a list of names: one string, or a list of them."""
    if reward is None:
        return []
    return [reward] if isinstance(reward, str) else [str(r) for r in reward]


def short_name(name: str) -> str:
    """The name a reward is logged under: `math`, or the function name of `pkg.mod:fn`."""
    return name.rpartition(":")[2] or name


@dataclass
class RewardSet:
    """The weighted sum of several reward functions, each checked on every call."""

    names: list[str]
    fns: list[RewardFn | None]  # None for `rm`
    weights: list[float]

    def score(self, prompts: Sequence, completions: Sequence[str], columns: dict[str, list]) -> tuple[list[float], dict[str, list[float]]]:
        """Weighted total per completion, and each function's own values by short name (`rm` comes later)."""
        parts = {short_name(name): call_reward(name, fn, prompts, completions, columns)
                 for name, fn in zip(self.names, self.fns) if name != LEARNED}
        return [self.weighted({k: v[i] for k, v in parts.items()}) for i in range(len(completions))], parts

    def weighted(self, parts: dict[str, float]) -> float:
        """One completion's weighted sum of the parts it has, in task.reward's order."""
        return sum(w * parts[short_name(n)] for n, w in zip(self.names, self.weights) if short_name(n) in parts)

    @property
    def learned(self) -> bool:
        """task.reward names the reward model's score."""
        return LEARNED in self.names


def own_traceback(err: BaseException) -> str:
    """`err`'s traceback from the frame below the one that caught it: the reward's own frames, its exception last."""
    tb = err.__traceback__.tb_next if err.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(err), err, tb)).rstrip("\n")


def call_reward(name: str, fn: RewardFn, prompts: Sequence, completions: Sequence[str], columns: dict[str, list]) -> list[float]:
    """One reward function's values for `completions`, checked; its exception becomes a RewardError naming it."""
    try:
        values = fn(list(prompts), list(completions), **columns)
    except Exception as err:  # noqa: BLE001 -- whatever a user's function raises is reported with its name
        raise RewardError(
            f"reward {name!r} raised {type(err).__name__} while scoring {len(completions)} completions; fix the "
            f"function (its traceback follows) or take it out of task.reward.\n{own_traceback(err)}"
        ) from err
    return checked(name, values, len(completions))


def checked(name: str, values: Any, expected: int) -> list[float]:
    """The reward values as floats, or a clear error naming the reward and the sample that is wrong."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise RewardError(f"reward {name!r} must return a list of {expected} numbers, one per completion; got {values!r:.200}.")
    values = list(values)
    if len(values) != expected:
        raise RewardError(
            f"reward {name!r} returned {len(values)} values for {expected} completions; it must return one float per "
            "completion, in the order of `completions`."
        )
    for i, v in enumerate(values):
        if isinstance(v, (str, bytes)) or v is None:  # float("1.0") would pass: a reward must compute a number
            raise RewardError(
                f"reward {name!r} returned {v!r} ({type(v).__name__}) for sample index {i} of the batch; rewards must "
                "be numbers (int or float), one per completion: return e.g. float(score)."
            )
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError) as err:
        raise RewardError(f"reward {name!r} must return a list of {expected} numbers, one per completion; got {values!r:.200} ({err}).") from err
    for i, v in enumerate(values):
        if math.isnan(v) or math.isinf(v):
            raise RewardError(f"reward {name!r} returned {v} for sample index {i} of the batch; rewards must be finite numbers.")
    return values


def build_rewards(reward: Any, weights: Sequence[float] | None, answer_key: str) -> RewardSet:
    """task.reward (a name or a list) and task.reward_weights (empty = 1.0 each) as a RewardSet."""
    names = reward_names(reward)
    if not names:
        raise RewardError(f"task.reward is empty; use one of {', '.join(BUILT_IN)}, a 'module:function' path, or a list of them.")
    weights = list(weights or [1.0] * len(names))
    if len(weights) != len(names):
        raise RewardError(
            f"task.reward_weights has {len(weights)} values for {len(names)} rewards {names}; give one weight per reward "
            "(or none, for 1.0 each)."
        )
    shorts = [short_name(n) for n in names]
    if len(set(shorts)) != len(shorts):
        raise RewardError(f"task.reward names {names} repeat a name ({shorts}); each reward is logged by its name, so use distinct functions.")
    fns = [None if n == LEARNED else functools.partial(BUILT_IN[n], answer_key=answer_key) if n in BUILT_IN
           else import_reward(n) for n in names]
    return RewardSet(names, fns, [float(w) for w in weights])
