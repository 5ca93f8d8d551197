"""The checkpoint's own tokenizer (HF `AutoTokenizer`) behind the surface the loop uses, and the choice of tokenizer.

Surface shared with `CharTokenizer`: `encode`, `encode_prompt`, `decode`, `eos_id`, `eos_ids`, `pad_id`, `bos_id`,
`vocab_size`, `save`. A prompt is a plain string or a list of `{role, content}` chat messages.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from rlhf_dyna.tasks.tokenizer import CharTokenizer

Messages = list[dict[str, Any]]
Prompt = Union[str, Messages]


def generation_eos_ids(model_dir: str | Path) -> list[int]:
    """Every `eos_token_id` of the checkpoint's generation_config.json (an int or a list), [] without one."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


class HFTokenizer:
    """A checkpoint directory's tokenizer and chat template (transformers.AutoTokenizer)."""

    def __init__(self, model_dir: str | Path) -> None:
        from transformers import (
            AutoTokenizer,  # heavy import, only for real checkpoints
        )

        self.model_dir = str(model_dir)
        try:
            self.hf = AutoTokenizer.from_pretrained(self.model_dir)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(
                f"model.path={self.model_dir} has no tokenizer that transformers can load ({type(err).__name__}: "
                f"{str(err)[:300]}); a checkpoint directory needs its tokenizer files (tokenizer.json and "
                "tokenizer_config.json, as save_pretrained writes them) next to config.json."
            ) from err
        eos = self.hf.eos_token_id
        stops = ([eos] if eos is not None else []) + generation_eos_ids(model_dir)
        if not stops:
            raise ValueError(
                f"the tokenizer of {self.model_dir} has no eos token and generation_config.json names no "
                "eos_token_id, so generation could never stop; set eos_token in tokenizer_config.json."
            )
        self.eos_ids: list[int] = list(dict.fromkeys(stops))  # ordered, without repeats
        self.eos_id: int = self.eos_ids[0]
        self.bos_id: int | None = self.hf.bos_token_id
        self.pad_id: int = self.hf.pad_token_id if self.hf.pad_token_id is not None else self.eos_id  # pad, else eos

    @property
    def vocab_size(self) -> int:
        return len(self.hf)  # base vocabulary plus added tokens

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.hf(text, add_special_tokens=False)["input_ids"]
        bos = [self.bos_id] if add_bos and self.bos_id is not None else []
        return bos + ids + [self.eos_id] * add_eos

    def chat_text(self, messages: Messages) -> str:
        """The chat-templated text of `messages`, ending with the assistant's turn opened."""
        if not self.has_chat_template:
            raise ValueError(
                f"the prompt is a list of chat messages but the tokenizer of {self.model_dir} has no chat template; "
                "use a checkpoint with one (tokenizer_config.json `chat_template`) or plain string prompts."
            )
        return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """A string with the tokenizer's own special-token convention; messages through the chat template
        (whose text already holds any BOS, so no special tokens are added again)."""
        if isinstance(prompt, str):
            return self.hf(prompt, add_special_tokens=True)["input_ids"]
        return self.hf(self.chat_text(prompt), add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save(self, directory: str | Path) -> Path:
        """save_pretrained into `directory` (tokenizer files and chat template)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.hf.save_pretrained(str(directory))
        return directory


def build_tokenizer(model_path: str | None) -> CharTokenizer | HFTokenizer:
    """model.path set -> that checkpoint's tokenizer; random-init toy models -> the character tokenizer."""
    return HFTokenizer(model_path) if model_path is not None else CharTokenizer()
