"""Checks of learned rewards before spawn: the reward model (`reward_model.*`, `rm` in task.reward, the critic from it)
and reward-model training (`algorithm.name=reward_model` with `task=preference`). One paragraph each."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import Config
from ..models.architectures import live_architectures
from ..tasks.preference import identical_notice, rows_to_pairs
from ..tasks.rewards import LEARNED, reward_names
from .data import check_files, load_checked
from ..errors import ConfigError
from .model_files import weight_files

KINDS = ("classifier",)  # reward_model.kind
CRITIC_INITS = ("policy", "reward_model")  # algorithm.critic_init


def _config_json(path: Path, key: str) -> dict[str, Any]:
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ConfigError(f"{key}={path} is not a local HF checkpoint directory (no config.json); give the directory "
                          "of a reward model that AutoModelForSequenceClassification opens (config.json, safetensors "
                          "weights, its tokenizer), e.g. one a run of algorithm=reward_model exported to "
                          "<run dir>/reward_model.")
    try:
        return json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise ConfigError(f"{key}={path}: config.json is not JSON ({err}); copy the checkpoint again.") from err


def check_reward_checkpoint(path_text: str, key: str = "reward_model.path") -> dict[str, Any]:
    """A one-label sequence classifier of a live architecture, with a padding id, weights and a tokenizer."""
    path = Path(path_text)
    config = _config_json(path, key)
    found = (config.get("architectures") or ["(none: config.json names no architectures)"])[0]
    labels = config.get("num_labels", len(config.get("id2label") or {}) or 2)  # transformers' default is 2 labels
    classifier = str(found).endswith("ForSequenceClassification")
    if not classifier or labels != 1:
        what = f"a {found} with {labels} labels (config.json num_labels)" if classifier else \
            f"a {found} (config.json architectures), not a sequence classifier"
        raise ConfigError(
            f"{key}={path_text} holds {what}; a reward model is a sequence classifier with one label (e.g. "
            "LlamaForSequenceClassification, num_labels=1), whose score at the last token is the reward. Train one "
            "with algorithm=reward_model task=preference (recipe=reward_tiny), or give such a checkpoint.")
    if config.get("model_type") not in live_architectures():
        raise ConfigError(f"{key}={path_text} is a {config.get('model_type')!r} model; reward models run live on "
                          f"the architectures {', '.join(live_architectures())}.")
    if config.get("pad_token_id") is None:
        raise ConfigError(f"{key}={path_text}: config.json has no pad_token_id, and transformers finds the last token "
                          "of each padded row by it; set pad_token_id in config.json (the tokenizer's pad token).")
    missing = [f.name for f in weight_files(path) if not f.is_file()]
    if missing:
        raise ConfigError(f"{key}={path_text} lacks its safetensors weights ({', '.join(missing)}); copy the whole "
                          "checkpoint directory.")
    if not (path / "tokenizer_config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise ConfigError(f"{key}={path_text} has no tokenizer (tokenizer.json, tokenizer_config.json): the reward model "
                          "reads the prompt and completion in its own tokens and chat format; save its tokenizer "
                          "next to config.json.")
    return config


def _tokenizer(path: str):
    from ..tasks.hf_tokenizer import HFTokenizer  # transformers: only when a reward model is configured

    return HFTokenizer(path)


def first_prompt(cfg: Config) -> Any:
    """The first training prompt of task=file (its type says whether prompts are chat messages)."""
    return load_checked("task.train_files", list(cfg.task.train_files))[0][cfg.task.prompt_key]


def check_learned_reward(cfg: Config) -> None:
    """`rm` in task.reward: a reward model to score with, a task whose rewards are task.reward, a placement that can
    hold it, and a chat template where the prompts are chat messages."""
    rm, task = cfg.reward_model, cfg.task
    if task.name != "file":
        raise ConfigError(f"task.reward names {LEARNED} (the reward model's score), but task={task.name} scores with its "
                          "own rule and reads no task.reward; use task=file with a prompt file (and model.path), "
                          f"or take {LEARNED} out of task.reward.")
    if rm.path is None:
        raise ConfigError(f"task.reward names {LEARNED}, the score of a reward model, but reward_model.path is not set; "
                          "give reward_model.path=DIR (a sequence classifier with one label, e.g. the "
                          "<run dir>/reward_model of an algorithm=reward_model run), or take rm out of task.reward.")
    if cfg.placement.rebalance:
        raise ConfigError("placement.rebalance=true with a reward model (rm in task.reward): re-balancing moves the "
                          "training roles between sets and does not move the reward model yet; use placement=split "
                          "without rebalance, placement=lend or placement=colocate.")
    heads = _config_json(Path(rm.path), "reward_model.path").get("num_attention_heads", 1)
    if heads % cfg.parallel.train.tp:
        raise ConfigError(f"parallel.train.tp={cfg.parallel.train.tp} does not divide the reward model's "
                          f"num_attention_heads={heads} ({rm.path}/config.json); it is sharded with the training "
                          "layout's tp: choose a tp that divides both models' heads.")
    prompt = first_prompt(cfg) if task.train_files else ""
    if not isinstance(prompt, str) and not _tokenizer(rm.path).has_chat_template:
        raise ConfigError(f"task.prompt_key holds chat messages but the reward model's tokenizer ({rm.path}) has no "
                          "chat template to put them and the completion into the text it scores; use a reward model "
                          "whose tokenizer_config.json has a `chat_template`, or a prompt column of plain strings.")


def check_critic_init(cfg: Config) -> None:
    alg, rm = cfg.algorithm, cfg.reward_model
    if alg.critic_init not in CRITIC_INITS:
        raise ConfigError(f"algorithm.critic_init={alg.critic_init!r} is not a valid choice; valid: "
                          f"{', '.join(CRITIC_INITS)}.")
    if alg.critic_init != "reward_model":
        return
    if alg.name != "ppo" or rm.path is None:
        missing = "algorithm=ppo (only PPO has a critic)" if alg.name != "ppo" else "reward_model.path=DIR"
        raise ConfigError(f"algorithm.critic_init=reward_model initialises PPO's critic from a reward model; it needs "
                          f"{missing}. Set it, or algorithm.critic_init=policy.")
    if cfg.placement.rebalance:
        raise ConfigError("algorithm.critic_init=reward_model with placement.rebalance=true: re-balancing rebuilds the "
                          "critic from the policy's architecture; use it without rebalance.")
    policy = _tokenizer(cfg.model.path).hf.get_vocab() if cfg.model.path else None
    if policy is None or policy != _tokenizer(rm.path).hf.get_vocab():
        policy_name = cfg.model.path or "the toy character tokenizer"
        raise ConfigError(f"algorithm.critic_init=reward_model: the critic reads the policy's token ids, but the reward "
                          f"model's tokenizer ({rm.path}) is not the policy's ({policy_name}); initialise the critic from a reward model trained from the policy's checkpoint "
                          "(algorithm=reward_model model.path=<the policy>), or use algorithm.critic_init=policy.")


def check_preference(cfg: Config) -> None:
    """algorithm=reward_model with task=preference: a base checkpoint, pair files with their columns, pairs that
    split into the layout, a chat template for chat messages; identical pairs counted and said."""
    t, alg = cfg.task, cfg.algorithm
    if (alg.name == "reward_model") != (t.name == "preference"):
        raise ConfigError(f"algorithm.name={alg.name} with task={t.name}: a reward model trains on preference pairs "
                          "and only on them; use algorithm=reward_model with task=preference, or neither.")
    if cfg.model.path is None:
        raise ConfigError("algorithm=reward_model trains a sequence classifier from a causal LM checkpoint: give "
                          "model.path=DIR (its backbone, tokenizer and chat template; e.g. python -m "
                          "rlhf_dyna.models.tiny_checkpoint /tmp/tiny_ckpt).")
    if cfg.parallel.train.pp > 1 or cfg.placement.policy != "colocate":
        raise ConfigError(f"algorithm=reward_model trains on every rank in a dp x tp layout (parallel.train.pp="
                          f"{cfg.parallel.train.pp}, placement={cfg.placement.policy}); use parallel.train.pp=1 and "
                          "placement=colocate.")
    layout = cfg.parallel.train_layout()
    if t.prompts_per_step % (layout.dp * alg.mini_batches):
        raise ConfigError(f"task.prompts_per_step={t.prompts_per_step} pairs per step do not split into "
                          f"algorithm.mini_batches={alg.mini_batches} x dp={layout.dp} equal shards (each pair's two "
                          f"rows stay together); use a multiple of {layout.dp * alg.mini_batches}.")
    check_files("task.train_files", list(t.train_files), required=True)
    check_files("task.eval_files", list(t.eval_files), required=False)
    chat = False
    for key, files in (("task.train_files", list(t.train_files)), ("task.eval_files", list(t.eval_files))):
        if files:
            chat |= check_pair_files(key, files, t)
    if chat and not _tokenizer(cfg.model.path).has_chat_template:
        raise ConfigError(f"the preference pairs hold chat messages but the tokenizer of model.path={cfg.model.path} "
                          "has no chat template to turn them into text; use a checkpoint whose tokenizer_config.json "
                          "has a `chat_template`, or plain string prompts and completions.")


def check_pair_files(key: str, files: list[str], t) -> bool:
    """The columns are there (else the columns present are named); identical pairs are counted and said (the task
    drops them), all-identical files refused. Returns whether any prompt or completion is chat messages."""
    ds = load_checked(key, files)
    columns = list(ds.column_names)
    for what, column in (("task.prompt_key", t.prompt_key), ("task.chosen_key", t.chosen_key),
                         ("task.rejected_key", t.rejected_key)):
        if (column or what != "task.prompt_key") and column not in columns:
            raise ConfigError(f"{what}={column!r} is not a column of {key} {files}; the columns there are: "
                              f"{', '.join(columns)}. Set {what} to one of them"
                              f"{' (task.prompt_key= for files whose completions hold the whole conversation)' if what == 'task.prompt_key' else ''}.")
    rows = ds.to_list()
    pairs, dropped = rows_to_pairs(rows, t.prompt_key, t.chosen_key, t.rejected_key)
    if not pairs:
        raise ConfigError(f"{key}: all {len(rows)} pairs have identical {t.chosen_key!r} and {t.rejected_key!r} "
                          "completions, so there is no preference to learn; give pairs whose chosen and rejected "
                          "differ.")
    if dropped:
        print(identical_notice(dropped, len(rows), key), flush=True)
    return any(not isinstance(x, str) for p in pairs[:1] for x in (p.prompt, p.chosen, p.rejected))


def check_reward_models(cfg: Config) -> None:
    """Every learned-reward check that applies to this run."""
    rm = cfg.reward_model
    if rm.kind not in KINDS:
        raise ConfigError(f"reward_model.kind={rm.kind!r} is not a valid choice; valid: {', '.join(KINDS)} (a "
                          "sequence classifier; generative judges are not built yet).")
    learned = LEARNED in reward_names(cfg.task.reward)
    if rm.path is not None:
        check_reward_checkpoint(rm.path)
        if not learned and cfg.algorithm.critic_init != "reward_model":
            raise ConfigError(f"reward_model.path={rm.path} is set but nothing uses it: add {LEARNED} to task.reward "
                              f"(e.g. task.reward=[{LEARNED}]) to score with it, and/or algorithm.critic_init="
                              "reward_model to start PPO's critic from it; or drop reward_model.path.")
    if learned:
        check_learned_reward(cfg)
    check_critic_init(cfg)
    if cfg.algorithm.name == "reward_model" or cfg.task.name == "preference":
        check_preference(cfg)
