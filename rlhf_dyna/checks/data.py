"""Checks of `model.path` + `task=file`: files (readable, not empty), columns, rewards (imported and tried once),
tokenizer vs embedding, chat template.

Each failure is one paragraph saying what is wrong and what would be right (raised as the caller's error type).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..tasks.file_task import FORMATS, data_format
from ..tasks.rewards import BUILT_IN, LEARNED, RewardError, RewardSet, build_rewards, call_reward


def _bad_json_line(file: Path) -> str | None:
    """Where a JSON / JSON-lines file stops parsing, as a sentence; None when every line parses (or the whole file)."""
    text = file.read_text(encoding="utf-8", errors="replace")
    try:
        json.loads(text)
        return None
    except ValueError:
        pass  # not one JSON document: read it as JSON lines, as `datasets` does
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            return f"line {number} is not valid JSON ({getattr(err, 'msg', err)} at column {getattr(err, 'colno', '?')}): {line[:120]!r}"
        if not isinstance(row, dict):
            return f"line {number} is a JSON {type(row).__name__}, not an object: {line[:120]!r}"
    return None


def _unreadable(key: str, files: list[str], err: Exception) -> str:
    """One paragraph naming the file (and line) `datasets` could not read, from the files themselves."""
    for name in files:
        file = Path(name)
        if file.stat().st_size == 0 or not file.read_bytes().strip():
            return f"{key}: {name} is empty (no rows); fill it with one JSON object per line, or leave it out of {key}."
        if FORMATS.get(file.suffix.lower()) == "json":
            where = _bad_json_line(file)
            if where is not None:
                return (f"{key}: {name} {where}. Each line of a JSON-lines file must be one JSON object with the prompt "
                        f"and answer columns, e.g. {{\"prompt\": \"What is 2 + 3?\", \"answer\": \"5\"}}.")
    return (f"{key}: {', '.join(files)} could not be read as {data_format(files)} data ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); check that each file is valid {data_format(files)}.")


def load_checked(key: str, files: list[str]):
    """The files as one `datasets` table, or a ValueError naming the file, line or emptiness at fault."""
    import datasets  # deferred: heavy, and only task=file needs it

    datasets.disable_progress_bars()  # a check of a few files needs no progress bar on the console
    try:
        ds = datasets.load_dataset(data_format(files), data_files=files, split="train")
    except Exception as err:  # noqa: BLE001 -- pyarrow and datasets raise many kinds; the files say which line
        raise ValueError(_unreadable(key, files, err)) from err
    if len(ds) == 0:
        raise ValueError(f"{key}: {', '.join(files)} hold no rows; give files with at least one prompt.")
    return ds


def check_files(key: str, files: list[str], required: bool) -> None:
    if required and not files:
        raise ValueError(f"{key} is empty; task=file needs at least one local .jsonl, .json or .parquet file, "
                         f"e.g. {key}=[examples/data/arith_chat_train.jsonl].")
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise ValueError(f"{key}: {len(missing)} file(s) do not exist: {', '.join(missing)} (relative paths are "
                         f"read from the working directory {Path.cwd()}); give existing {', '.join(FORMATS)} files.")
    if not files:
        return
    try:
        data_format(files)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from err


def check_columns(key: str, files: list[str], task) -> dict[str, Any]:
    ds = load_checked(key, files)
    row, columns = ds[0], list(ds.column_names)
    for what, column in (("task.prompt_key", task.prompt_key), ("task.answer_key", task.answer_key)):
        if column not in columns:
            raise ValueError(f"{what}={column!r} is not a column of {key} {files}; the columns there are: "
                             f"{', '.join(columns)}. Set {what} to one of them.")
    return row


def probe_rewards(rewards: RewardSet, row: dict[str, Any], prompt_key: str, answer_key: str) -> None:
    """Each custom reward called once, here, on two completions of the first training row (its answer and the empty
    completion a model may well produce): one that raises, miscounts or returns non-numbers is refused before spawn,
    not at step 1 in every rank. The built-in rewards are tested with the project."""
    prompts, completions = [row[prompt_key]] * 2, [str(row[answer_key]), ""]
    columns = {key: [value, value] for key, value in row.items() if key != prompt_key}
    for name, fn in zip(rewards.names, rewards.fns):
        if name in BUILT_IN or name == LEARNED:  # tested with the project; `rm` is the reward model's
            continue
        try:
            call_reward(name, fn, prompts, completions, columns)
        except RewardError as err:
            raise RewardError(f"task.reward, tried before the run on the first row of task.train_files with the "
                              f"completions {completions!r:.120}: {err}") from err


def check_tokenizer(model_path: str, prompt: Any) -> None:
    """The tokenizer fits the embedding of config.json, and chat prompts have a chat template to go through."""
    from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer

    tokenizer = HFTokenizer(model_path)
    vocab = json.loads((Path(model_path) / "config.json").read_text()).get("vocab_size")
    if vocab is not None and tokenizer.vocab_size > vocab:
        raise ValueError(f"the tokenizer of model.path={model_path} has {tokenizer.vocab_size} tokens but the model's "
                         f"embedding (config.json vocab_size) has {vocab} rows, so some token ids have no embedding; "
                         "use the tokenizer that was trained with this checkpoint, or resize the embedding.")
    if not isinstance(prompt, str) and not tokenizer.has_chat_template:
        raise ValueError(f"task.prompt_key holds chat messages but the tokenizer of model.path={model_path} has no chat "
                         "template to turn them into text; use a checkpoint whose tokenizer_config.json has a "
                         "`chat_template`, or a prompt column of plain strings.")


def check_file_task(cfg) -> None:
    """Everything about task=file that is knowable before the ranks start."""
    t = cfg.task
    if cfg.model.path is None:
        raise ValueError("task=file needs model.path=DIR (a local HF checkpoint): its tokenizer and chat template encode "
                         "the prompts; the built-in character tokenizer serves only the toy tasks.")
    if cfg.trainer.sft_warmup_steps > 0:
        raise ValueError(f"trainer.sft_warmup_steps={cfg.trainer.sft_warmup_steps} but task=file has no demonstrations "
                         "for a supervised warm-up; set trainer.sft_warmup_steps=0.")
    check_files("task.train_files", list(t.train_files), required=True)
    check_files("task.eval_files", list(t.eval_files), required=False)
    row = check_columns("task.train_files", list(t.train_files), t)
    if t.eval_files:
        check_columns("task.eval_files", list(t.eval_files), t)
    rewards = build_rewards(t.reward, list(t.reward_weights or []), t.answer_key)  # imports custom rewards, before spawn
    probe_rewards(rewards, row, t.prompt_key, t.answer_key)
    check_tokenizer(cfg.model.path, row[t.prompt_key])


def check_data(cfg) -> None:
    """The data checks that apply to this run (task=file; any model.path's tokenizer)."""
    if cfg.task.name == "file":
        check_file_task(cfg)
    elif cfg.model.path is not None and (Path(cfg.model.path) / "config.json").is_file():
        check_tokenizer(cfg.model.path, "")
