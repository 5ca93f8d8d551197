"""The checkpoint's tokenizer behind the loop's tokenizer surface: chat template, every stop id, pad fallback, save."""
from __future__ import annotations

import json

import pytest

from rlhf_dyna.models.tiny_checkpoint import make_tiny_checkpoint
from rlhf_dyna.tasks.hf_tokenizer import HFTokenizer, build_tokenizer
from rlhf_dyna.tasks.tokenizer import CharTokenizer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), num_hidden_layers=1)


def test_chat_prompts_go_through_the_template_and_stop_on_every_eos(ckpt):
    tok = build_tokenizer(str(ckpt))
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_ids == [5, 2] and tok.eos_id == 5 and tok.pad_id == 0  # <|im_end|>, </s> (generation_config)
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    ids = tok.encode_prompt(messages)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text == tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and ids[0] == 4
    assert tok.decode(tok.encode("12 apples")) == "12 apples"
    assert tok.encode_prompt("plain") == tok.hf("plain")["input_ids"]


def test_pad_falls_back_to_eos_and_save_round_trips(ckpt, tmp_path):
    tok = HFTokenizer(ckpt)
    assert tok.pad_id == 0
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    config.pop("pad_token", None)
    no_pad = tmp_path / "no_pad"
    tok.save(no_pad)
    (no_pad / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFTokenizer(no_pad).pad_id == HFTokenizer(no_pad).eos_id == 5  # no generation_config there: eos only
    assert HFTokenizer(no_pad).eos_ids == [5]


def test_toy_runs_keep_the_character_tokenizer():
    tok = build_tokenizer(None)
    assert isinstance(tok, CharTokenizer) and tok.eos_ids == [tok.eos_id]
    assert tok.encode_prompt("12+34=") == tok.encode("12+34=", add_bos=True)
    with pytest.raises(ValueError, match="chat messages need model.path"):
        tok.encode_prompt([{"role": "user", "content": "hi"}])


def test_a_checkpoint_without_tokenizer_files_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="has no tokenizer that transformers can load"):
        HFTokenizer(tmp_path)
