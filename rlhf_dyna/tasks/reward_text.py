"""The text a reward model scores: the prompt and a completion in the reward model's own format, tokenized by its own
tokenizer (whatever the policy's is), the same way when it is trained on preference pairs and when it scores samples.

A string prompt is followed by the completion text, with the tokenizer's own special tokens (e.g. BOS); chat messages
get the completion as the assistant's turn and go through the reward model's chat template. A completion may itself be
chat messages (a preference file's chosen / rejected turns): they follow the prompt's messages.
"""
from __future__ import annotations

from typing import Any, Union

Messages = list[dict[str, Any]]
Text = Union[str, Messages]


def conversation(prompt: Text, completion: Text) -> Messages:
    """The prompt and completion as chat messages (a string prompt becomes the user's turn)."""
    head = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    tail = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion)
    return (head if prompt else []) + tail


def is_chat(prompt: Text, completion: Text) -> bool:
    return not isinstance(prompt, str) or not isinstance(completion, str)


def reward_text(tokenizer, prompt: Text, completion: Text) -> str:
    """What the reward model reads, as text (`tokenizer`: an HFTokenizer, the reward model's)."""
    if not is_chat(prompt, completion):
        return prompt + completion
    if not tokenizer.has_chat_template:
        raise ValueError(f"the reward model's tokenizer ({tokenizer.model_dir}) has no chat template, so chat messages "
                         "cannot be turned into the text it scores; use a reward model whose tokenizer_config.json has "
                         "a `chat_template`, or plain string prompts and completions.")
    return tokenizer.hf.apply_chat_template(conversation(prompt, completion), tokenize=False)


def reward_ids(tokenizer, prompt: Text, completion: Text) -> list[int]:
    """The token ids of `reward_text`: special tokens added for plain text, none for templated chat (its text already
    holds them)."""
    text = reward_text(tokenizer, prompt, completion)
    return tokenizer.hf(text, add_special_tokens=not is_chat(prompt, completion))["input_ids"]
