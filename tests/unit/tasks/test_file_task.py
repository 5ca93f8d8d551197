"""task=file: jsonl / json / parquet through HF datasets, reproducible per-epoch shuffling, position state, prompt drops."""
from __future__ import annotations

import json
import random

import pytest

from rlhf_dyna.tasks.file_task import FileTask
from rlhf_dyna.tasks.tokenizer import CharTokenizer


def rows(n: int) -> list[dict]:
    return [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "level": i % 3} for i in range(n)]


def write(path, data, fmt):
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    elif fmt == "json":
        path.write_text(json.dumps(data))
    else:
        import datasets

        datasets.Dataset.from_list(data).to_parquet(str(path))
    return str(path)


def make(tmp_path, n=10, fmt="jsonl", **kw) -> FileTask:
    train = write(tmp_path / f"train.{fmt}", rows(n), fmt)
    return FileTask([train], reward="exact", seed=kw.pop("seed", 0), **kw)


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_formats_load_every_row_and_column(tmp_path, fmt):
    task = make(tmp_path, 6, fmt)
    assert sorted(e.prompt for e in task.train) == sorted(r["prompt"] for r in rows(6))
    assert task.train[0].columns == {"answer": "0", "level": 0}
    totals, parts = task.score(task.train[:2], [task.train[0].answer, "wrong"])
    assert totals == [1.0, 0.0] and parts == {"exact": [1.0, 0.0]}


def test_epochs_are_permutations_reproducible_from_the_seed(tmp_path):
    a, b, other = make(tmp_path), make(tmp_path), make(tmp_path, seed=1)
    rng = random.Random(0)
    first = [e.prompt for e in a.train_prompts(1, 10, rng)]
    assert sorted(first) == sorted(r["prompt"] for r in rows(10))  # one epoch: every row once
    assert first == [e.prompt for e in b.train_prompts(1, 10, rng)]
    assert first != [e.prompt for e in other.train_prompts(1, 10, rng)]
    second = [e.prompt for e in a.train_prompts(2, 10, rng)]
    assert sorted(second) == sorted(first) and second != first  # a fresh order per epoch
    assert a.state_dict() == {"epoch": 1, "index": 10, "seed": 0, "num_rows": 10}


def test_position_round_trip_continues_the_same_stream(tmp_path):
    a = make(tmp_path)
    a.train_prompts(1, 7, random.Random())
    state = a.state_dict()
    expected = [e.prompt for e in a.train_prompts(2, 8, random.Random())]  # crosses into epoch 1
    b = make(tmp_path)
    b.load_state_dict(json.loads(json.dumps(state)))
    assert [e.prompt for e in b.train_prompts(2, 8, random.Random())] == expected
    with pytest.raises(ValueError, match="resume with the same data"):
        make(tmp_path, seed=3).load_state_dict(state)


def test_long_prompts_are_dropped_and_counted(tmp_path, capsys):
    data = rows(4) + [{"prompt": "9" * 40 + "=", "answer": "x", "level": 0}]
    train = write(tmp_path / "t.jsonl", data, "jsonl")
    task = FileTask([train], reward="exact", max_prompt_tokens=10, tokenizer=CharTokenizer())
    assert len(task.train) == 4
    assert "dropped 1 of 5 train prompts longer than task.max_prompt_tokens=10" in capsys.readouterr().out


def test_eval_accuracy_counts_rewards_above_half(tmp_path):
    task = make(tmp_path, 4)
    assert task.eval_accuracy(task.eval_set(), ["a"] * 4, [1.0, 0.5, 0.6, 0.0]) == 0.5
