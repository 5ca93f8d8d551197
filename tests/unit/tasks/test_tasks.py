import random

import pytest

from rlhf_dyna.tasks import ArithmeticTask, CharTokenizer, Example, SortDigitsTask, make_task
from rlhf_dyna.tasks.base import positional_credit, response_answer

ADD = Example("12+34=", "46")


def _operands(example: Example) -> tuple[int, int]:
    a, b = example.prompt.rstrip("=").split("+")
    return int(a), int(b)


def test_arithmetic_examples_are_correct_sums_within_digit_range():
    task = ArithmeticTask(seed=0, min_digits=2, max_digits=3, eval_size=64)
    for ex in task.eval_set() + task.train_prompts(0, 200, random.Random(1)):
        a, b = _operands(ex)
        assert ex.answer == str(a + b)
        assert all(2 <= len(str(x)) <= 3 for x in (a, b))
        assert len(ex.answer) <= task.max_answer_length == 4


def test_eval_set_fixed_by_seed_and_sized():
    a = ArithmeticTask(seed=3, eval_size=50).eval_set()
    assert a == ArithmeticTask(seed=3, eval_size=50).eval_set()
    assert a != ArithmeticTask(seed=4, eval_size=50).eval_set()
    assert len(a) == 50 and len({e.prompt for e in a}) == 50


def test_training_never_draws_an_eval_problem_in_either_order():
    # 1-digit: only 55 unordered pairs, 20 held out, so collisions would surely show up.
    task = ArithmeticTask(seed=0, min_digits=1, max_digits=1, eval_size=20)
    held_out = {frozenset(_operands(e)) for e in task.eval_set()}
    train = task.train_prompts(0, 3000, random.Random(0))
    assert not held_out & {frozenset(_operands(e)) for e in train}
    assert len({frozenset(_operands(e)) for e in train}) == 55 - 20


def test_train_prompts_deterministic_given_rng():
    task = ArithmeticTask(seed=0)
    assert task.train_prompts(5, 8, random.Random(7)) == task.train_prompts(5, 8, random.Random(7))
    assert len(task.train_prompts(0, 8, random.Random(7))) == 8


def test_eval_size_too_large_names_the_limit():
    with pytest.raises(ValueError, match="at most 27"):
        ArithmeticTask(min_digits=1, max_digits=1, eval_size=28)


def test_reward_exact_match_and_eos_handling():
    task = ArithmeticTask(seed=0)
    assert task.reward(ADD, "46") == 1.0
    assert task.reward(ADD, "46<eos>") == 1.0
    assert task.reward(ADD, " 46 ") == 1.0
    assert task.reward(ADD, "47") == 0.0
    assert task.reward(ADD, "460") == 0.0
    assert task.reward(ADD, "") == 0.0


def test_partial_credit_per_position_zero_when_length_differs():
    task = ArithmeticTask(seed=0, partial_credit=True)
    assert task.reward(ADD, "47") == 0.5
    assert task.reward(ADD, "96") == 0.5
    assert task.reward(ADD, "64") == 0.0
    assert task.reward(ADD, "460") == 0.0
    assert task.reward(ADD, "46") == 1.0
    assert positional_credit("1234", "1204") == 0.75


def test_response_answer_cuts_at_eos():
    assert response_answer("46<eos>99") == "46"
    assert response_answer("46") == "46"


def test_accuracy_is_exact_match_fraction():
    task = ArithmeticTask(seed=0, partial_credit=True)
    examples = [ADD, Example("1+1=", "2"), Example("5+5=", "10"), Example("0+0=", "0")]
    assert task.accuracy(examples, ["46", "2<eos>", "11", ""]) == 0.5
    with pytest.raises(ValueError):
        task.accuracy(examples, ["46"])


def test_sort_digits_task():
    task = SortDigitsTask(seed=0, min_digits=3, max_digits=5, eval_size=32)
    for ex in task.eval_set() + task.train_prompts(0, 100, random.Random(0)):
        digits = ex.prompt.removeprefix("sort:").removesuffix("=")
        assert 3 <= len(digits) <= 5 and digits.isdigit()
        assert ex.answer == "".join(sorted(digits))
    held_out = {e.prompt for e in task.eval_set()}
    assert not held_out & {e.prompt for e in task.train_prompts(0, 500, random.Random(1))}
    assert task.reward(Example("sort:3142=", "1234"), "1234<eos>") == 1.0
    assert task.max_answer_length == 5


@pytest.mark.parametrize("name", ["arithmetic", "sort_digits"])
def test_sft_examples_tokenize_to_prompt_answer_eos(name):
    task = make_task(name, seed=0, min_digits=2, max_digits=3, eval_size=16)
    tok = CharTokenizer()
    for sft in task.sft_examples(20, random.Random(0)):
        ids = tok.encode(sft.prompt + sft.completion)
        assert tok.unk_id not in ids and ids[-1] == tok.eos_id
        assert task.reward(Example(sft.prompt, sft.completion[:-5]), sft.completion) == 1.0
        assert Example(sft.prompt, sft.completion[:-5]) not in task.eval_set()


def test_make_task_registry_errors():
    assert isinstance(make_task("arithmetic"), ArithmeticTask)
    with pytest.raises(ValueError, match="sort_digits"):
        make_task("multiplication")
    with pytest.raises(TypeError, match="arithmetic"):
        make_task("arithmetic", prompts_per_step=4)
