"""Rewards: math by value (math-verify), exact, custom by path, weighted sums, and the errors of a bad reward fn."""
from __future__ import annotations

import math
import sys

import pytest

from rlhf_dyna.tasks.rewards import RewardError, build_rewards, final_answer, import_reward, math_equal


@pytest.mark.parametrize("completion,truth,expected", [
    ("so the total is #### 42", "42", True),
    ("#### 42", "#### 42", True),
    ("\\boxed{1/2}", "0.5", True),
    ("the answer is $\\boxed{\\frac{1}{2}}$", "#### 0.5", True),
    ("first 3, then 7", "7", True),
    ("first 7, then 3", "7", False),
    ("#### 41", "42", False),
    ("1,234 apples", "1234", True),
    ("no number here", "3", False),
    ("", "3", False),
])
def test_math_compares_final_answers_by_value(completion, truth, expected):
    assert math_equal(completion, truth) is expected


def test_final_answer_prefers_gsm8k_marker_over_later_numbers():
    assert final_answer("#### 12\nstep 99") == "12"
    assert final_answer("a 5 b 6") == "6"
    assert final_answer("words") is None


def test_exact_is_stripped_string_equality():
    rs = build_rewards("exact", [], "answer")
    totals, parts = rs.score(["p", "p", "p"], [" yes\n", "Yes", "no"], {"answer": ["yes", "yes", "no "]})
    assert totals == [1.0, 0.0, 1.0] and parts == {"exact": totals}


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_fmt_rewards.py").write_text(
        "def fmt(prompts, completions, answer, kind, **kw):\n"
        "    return [0.5 if c.startswith('#') else 0.0 for c in completions]\n"
        "def short(prompts, completions, **kw):\n    return [1.0]\n"
        "def nan(prompts, completions, **kw):\n    return [1.0, float('nan'), 0.0]\n"
        "def text(prompts, completions, **kw):\n    return ['a'] * len(completions)\n"
        "def numeric_text(prompts, completions, **kw):\n    return ['1.0'] * len(completions)\n"
        "def raises(prompts, completions, **kw):\n    return helper(completions)\n"
        "def helper(completions):\n    raise KeyError('no such column: score')\n"
    )
    monkeypatch.chdir(tmp_path)  # custom rewards import from the working directory
    yield "my_fmt_rewards"
    sys.modules.pop("my_fmt_rewards", None)


def test_custom_reward_by_path_and_weighted_sum(reward_module):
    rs = build_rewards(["math", f"{reward_module}:fmt"], [1.0, 0.2], "answer")
    totals, parts = rs.score(["q"] * 3, ["#### 4", "4", "#### 5"], {"answer": ["4", "4", "4"], "kind": ["a", "b", "c"]})
    assert parts == {"math": [1.0, 1.0, 0.0], "fmt": [0.5, 0.0, 0.5]}
    assert totals == pytest.approx([1.1, 1.0, 0.1])


@pytest.mark.parametrize("fn,message", [
    ("short", "returned 1 values for 3 completions"),
    ("nan", "returned nan for sample index 1"),
    ("text", "returned 'a' \\(str\\) for sample index 0 of the batch; rewards must be numbers"),
    ("numeric_text", "returned '1.0' \\(str\\) for sample index 0"),  # float('1.0') would have passed it
])
def test_bad_reward_outputs_are_named(reward_module, fn, message):
    rs = build_rewards(f"{reward_module}:{fn}", [], "answer")
    with pytest.raises(RewardError, match=message):
        rs.score(["q"] * 3, ["a", "b", "c"], {"answer": ["1", "2", "3"]})


def test_a_raising_reward_is_named_with_its_own_traceback_last(reward_module):
    rs = build_rewards(["exact", f"{reward_module}:raises"], [], "answer")
    with pytest.raises(RewardError) as err:
        rs.score(["q"] * 2, ["a", "b"], {"answer": ["1", "2"]})
    message = str(err.value)
    assert message.startswith(f"reward '{reward_module}:raises' raised KeyError while scoring 2 completions")
    lines = message.splitlines()
    assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "KeyError: 'no such column: score'"
    assert "in raises" in message and "in helper" in message and "rlhf_dyna/tasks" not in message  # its frames only


def test_reward_paths_that_do_not_import(reward_module):
    with pytest.raises(RewardError, match="module 'no_such_mod' does not import"):
        import_reward("no_such_mod:fn")
    with pytest.raises(RewardError, match=f"module '{reward_module}' .* has no function 'missing'"):
        import_reward(f"{reward_module}:missing")
    with pytest.raises(RewardError, match="neither a built-in reward"):
        build_rewards("mathh", [], "answer")


def test_weights_must_match_rewards():
    with pytest.raises(RewardError, match="2 values for 1 rewards"):
        build_rewards(["math"], [1.0, 2.0], "answer")
    assert not math.isnan(build_rewards("math", [], "answer").weights[0])
