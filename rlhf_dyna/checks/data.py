"""Checks of `model.path` + `task=file`: files, columns, reward imports, tokenizer vs embedding, chat template.

Each failure is one paragraph saying what is wrong and what would be right (raised as the caller's error type).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import Config
from ..tasks.file_task import FORMATS, data_format
from ..tasks.rewards import RewardError, build_rewards
from .errors import ConfigError


def _first_row_and_columns(files: list[str]) -> tuple[dict[str, Any], list[str]]:
    from datasets import load_dataset

    ds = load_dataset(data_format(files), data_files=files, split="train")
    if len(ds) == 0:
        raise ValueError(f"data files {files} hold no rows; give files with at least one prompt.")
    return ds[0], list(ds.column_names)


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
    row, columns = _first_row_and_columns(files)
    for what, column in (("task.prompt_key", task.prompt_key), ("task.answer_key", task.answer_key)):
        if column not in columns:
            raise ValueError(f"{what}={column!r} is not a column of {key} {files}; the columns there are: "
                             f"{', '.join(columns)}. Set {what} to one of them.")
    return row


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
    try:
        build_rewards(t.reward, list(t.reward_weights or []), t.answer_key)  # imports custom rewards here, before spawn
    except RewardError as err:
        raise ValueError(str(err)) from err
    check_tokenizer(cfg.model.path, row[t.prompt_key])


def check_data(cfg) -> None:
    """The data checks that apply to this run (task=file; any model.path's tokenizer)."""
    if cfg.task.name == "file":
        check_file_task(cfg)
    elif cfg.model.path is not None and (Path(cfg.model.path) / "config.json").is_file():
        check_tokenizer(cfg.model.path, "")


def check_lengths(cfg: Config) -> None:
    """Prompt + completion must fit vLLM's max_model_len (model.max_position_embeddings)."""
    r = cfg.rollout
    t, limit = cfg.task, cfg.model.max_position_embeddings
    if t.name == "file" and t.max_prompt_tokens > 0 and t.max_prompt_tokens + r.max_new_tokens > limit:
        raise ConfigError(
            f"task.max_prompt_tokens + rollout.max_new_tokens = {t.max_prompt_tokens} + {r.max_new_tokens} exceeds "
            f"model.max_position_embeddings={limit} (vLLM's max_model_len); raise model.max_position_embeddings to at "
            f"least {t.max_prompt_tokens + r.max_new_tokens} (within the checkpoint's) or lower the other two."
        )
