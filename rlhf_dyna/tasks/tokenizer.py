"""Character-level tokenizer for the toy tasks: one token per character, built locally.

It is a real `tokenizers.Tokenizer` (WordLevel over single characters), so `save` can ship it
next to an HF model directory and vLLM / transformers load it like any other tokenizer.
"""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order
CHARACTERS: str = string.digits + "+-*=,: " + string.ascii_lowercase


def build_char_tokenizer(characters: str = CHARACTERS) -> Tokenizer:
    """A WordLevel tokenizer with the special tokens first, then one token per character."""
    if len(set(characters)) != len(characters):
        raise ValueError(f"characters contain duplicates: {characters!r}")
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *characters))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()  # join characters without the default spaces
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


class CharTokenizer:
    """Thin wrapper over the `tokenizers.Tokenizer` with the ids the trainer needs.

    `encode` adds no special tokens unless asked; special-token text such as "<eos>" inside the
    string is recognised as that one token. Unknown characters map to <unk>.
    """

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else build_char_tokenizer()
        self.pad_id = self._special_id(PAD)
        self.bos_id = self._special_id(BOS)
        self.eos_id = self._special_id(EOS)
        self.unk_id = self._special_id(UNK)

    def _special_id(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer has no {token} token")
        return token_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    @property
    def eos_ids(self) -> list[int]:
        """Every id that ends a generation (one here; HF checkpoints may have several)."""
        return [self.eos_id]

    def encode_prompt(self, prompt: str) -> list[int]:
        """A toy task's prompt: <bos> then one token per character (the ids the toy recipes always used)."""
        if not isinstance(prompt, str):
            raise ValueError("the character tokenizer takes string prompts only; chat messages need model.path")
        return self.encode(prompt, add_bos=True)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; by default special tokens (pad, bos, eos, unk) are dropped."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save(self, directory: str | Path) -> Path:
        """Write tokenizer.json plus tokenizer_config.json into `directory` (an HF model dir),
        so `transformers.AutoTokenizer.from_pretrained(directory)` and vLLM can load it."""
        from transformers import (
            PreTrainedTokenizerFast,  # heavy import, only when shipping
        )

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        hf = PreTrainedTokenizerFast(
            tokenizer_object=self.tokenizer, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
        )
        hf.save_pretrained(str(directory))
        return directory / "tokenizer.json"

    @classmethod
    def load(cls, path: str | Path) -> "CharTokenizer":
        """Load from a tokenizer.json file or a directory holding one."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        return cls(Tokenizer.from_file(str(path)))
