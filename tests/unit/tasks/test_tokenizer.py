import json

import pytest

from rlhf_dyna.tasks.tokenizer import CHARACTERS, CharTokenizer


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer()


def test_special_ids_and_vocab_size(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 4 + len(CHARACTERS)


def test_one_token_per_character_round_trip(tok):
    text = "sort:3142= 12+34=46,7-8*9"
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text
    assert tok.encode("0")[0] != tok.encode("1")[0]


def test_bos_eos_and_eos_text(tok):
    ids = tok.encode("46", add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == 4
    assert tok.encode("46<eos>") == tok.encode("46", add_eos=True)
    assert tok.decode(ids) == "46"
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>46<eos>"


def test_unknown_character_maps_to_unk(tok):
    assert tok.encode("1?2") == [tok.encode("1")[0], tok.unk_id, tok.encode("2")[0]]


def test_save_loads_back_and_in_transformers(tok, tmp_path):
    from transformers import AutoTokenizer

    path = tok.save(tmp_path)
    assert path == tmp_path / "tokenizer.json" and path.exists()
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<eos>"
    text = "12+34="
    assert CharTokenizer.load(tmp_path).encode(text) == tok.encode(text)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (tok.pad_id, tok.bos_id, tok.eos_id)
    assert hf.decode(tok.encode("46", add_eos=True), skip_special_tokens=True) == "46"
