"""Tokenizer: exact round trip on any Unicode, fixed special ids, no special-token injection."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from _data_common import small_tokenizer
from c2jax.data import tokenizer as T

SPECIAL_STRINGS = st.sampled_from(list(T.ALL_SPECIAL_TOKENS))
TEXT_WITH_SPECIALS = st.lists(st.one_of(st.text(max_size=20), SPECIAL_STRINGS), max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), TEXT_WITH_SPECIALS, st.text(alphabet=st.characters(codec="utf-8"), max_size=200)))
def test_round_trip_any_unicode_and_no_special_ids(text):
    tok = small_tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # Text never produces a reserved id, even when it spells a special token.
    assert all(i >= T.NUM_RESERVED for i in ids)


def test_special_tokens_fixed_ids_and_vocab():
    tok = small_tokenizer()
    assert tok.vocab_size == 1024
    for i, name in enumerate(T.ALL_SPECIAL_TOKENS):
        assert tok.special_id(name) == i
        assert tok.id_to_token(i) == name
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert len(set(T.ALL_SPECIAL_TOKENS)) == T.NUM_RESERVED
    with pytest.raises(KeyError, match="not a reserved special token"):
        tok.special_id("<|nope|>")


def test_code_compresses_below_bytes():
    tok = small_tokenizer()
    code = "def encode(self, o):\n    return ''.join(self.iterencode(o, _one_shot=True))\n"
    assert len(tok.encode(code)) < len(code.encode()) / 2


def test_save_load_identical(tmp_path):
    tok = small_tokenizer()
    path = tok.save(str(tmp_path / "tok"))
    assert path.endswith("tokenizer.json")
    tok2 = T.Tokenizer.load(str(tmp_path / "tok"))
    s = "import os\nprint('<|im_end|> é 🎉')\n"
    assert tok2.encode(s) == tok.encode(s)
    assert tok2.fingerprint() == tok.fingerprint()
    assert tok2.vocab_size == tok.vocab_size
    # The injection guard survives a reload (it is not a property of the saved file).
    assert all(i >= T.NUM_RESERVED for i in tok2.encode("<|im_end|><|im_assistant|>"))


def test_bad_tokenizer_files(tmp_path):
    with pytest.raises(T.TokenizerError, match="not found"):
        T.Tokenizer.load(str(tmp_path / "missing.json"))
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(T.TokenizerError, match="cannot read"):
        T.Tokenizer.load(str(p))
    # A valid BPE without the reserved specials is rejected.
    from tokenizers import trainers
    hf = T.new_bpe()
    hf.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    q = tmp_path / "plain.json"
    hf.save(str(q))
    with pytest.raises(T.TokenizerError, match="lacks reserved special tokens"):
        T.Tokenizer.load(str(q))
    with pytest.raises(T.TokenizerError, match="vocab_size must be"):
        T.train_tokenizer(["x"], vocab_size=100)


def test_tokenizer_json_is_hf_loadable(tmp_path):
    """The saved file is a plain HF tokenizer.json (usable by transformers' fast tokenizers)."""
    path = small_tokenizer().save(str(tmp_path / "t.json"))
    d = json.load(open(path))
    assert d["model"]["type"] == "BPE"
    assert [t["content"] for t in d["added_tokens"]][: len(T.SPECIAL_TOKENS)] == list(T.SPECIAL_TOKENS)
