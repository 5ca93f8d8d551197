"""`cfg.model`'s architecture fields as a checkpoint's config.json has them, so that the checks before spawn and the
resolved config (`config_resolved.yaml`) see the model that runs, not the tiny default's sizes."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config, ModelConfig
from ..errors import ConfigError
from ..rollout.context_length import max_model_len
from .architectures import ARCHITECTURES, live_architectures

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # model.dtype's choices


def _rope_theta(config: PretrainedConfig, default: float) -> float:
    """transformers 5 keeps it in rope_parameters; older configs have a top-level rope_theta."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", default)))


def read_checkpoint_config(path: str, key: str = "model.path") -> PretrainedConfig:
    """The config.json of the checkpoint directory that config key `key` names, as transformers reads it."""
    from transformers import AutoConfig  # deferred: its import costs seconds, which a run without a checkpoint skips

    try:
        return AutoConfig.from_pretrained(Path(path))
    except Exception as err:  # noqa: BLE001 -- any failure here is a bad config.json, said in one paragraph
        raise ConfigError(
            f"{key}={path}: {Path(path) / 'config.json'} does not load as a Hugging Face config "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); give a checkpoint directory "
            "whose config.json transformers reads (AutoConfig.from_pretrained)."
        ) from err


def fill_model_fields(model: ModelConfig, live: bool = True) -> None:
    """Overwrite `model`'s architecture fields with those of `model.path`'s config.json (nothing without a path, or
    without a config.json: check_resources says that one). The checkpoint, not the config group, decides them."""
    if model.path is None or not (Path(model.path) / "config.json").is_file():
        return
    config = read_checkpoint_config(model.path)
    known = live_architectures() if live else list(ARCHITECTURES)
    if config.model_type not in known:
        raise ConfigError(
            f"model.path={model.path} holds a {config.model_type!r} model (config.json model_type); "
            f"{'live runs support' if live else 'the dry run plans'} {', '.join(known)} "
            f"(rlhf_dyna/models/architectures.py). Use a checkpoint of one of those architectures"
            + (", plan it with dry_run=true," if live and config.model_type in ARCHITECTURES else "")
            + " or add an entry to the architecture table (docs/extending.md)."
        )
    model.arch = config.model_type
    model.vocab_size = config.vocab_size
    model.hidden_size = config.hidden_size
    model.num_hidden_layers = config.num_hidden_layers
    model.num_attention_heads = config.num_attention_heads
    model.num_key_value_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    model.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    model.intermediate_size = config.intermediate_size
    model.max_position_embeddings = config.max_position_embeddings
    model.tie_word_embeddings = bool(config.tie_word_embeddings)
    model.rope_theta = _rope_theta(config, model.rope_theta)
    model.num_experts = getattr(config, "num_experts", 0) or 0
    model.num_experts_per_tok = getattr(config, "num_experts_per_tok", 0) or 0
    model.moe_intermediate_size = getattr(config, "moe_intermediate_size", 0) or 0
    dtype = str(config.dtype).removeprefix("torch.") if config.dtype is not None else None
    if dtype in DTYPE_NAMES:
        model.dtype = dtype


def resolve_model(cfg: Config) -> None:
    """Before the checks and before the config is written for the ranks: the checkpoint's architecture in cfg.model
    and the context length vLLM will be given in rollout.max_model_len (as they are used)."""
    fill_model_fields(cfg.model, live=not cfg.dry_run)
    cfg.rollout.max_model_len = max_model_len(cfg)
