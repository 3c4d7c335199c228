"""`c2jax.train.sed_probe`: the teacher-forced span of a demonstration's `sed -i` edit."""
from c2jax.train.sed_probe import _edit_span


class CharTokenizer:
    """One token per character (ids are code points): decode is exact, so spans are checkable."""

    def encode(self, s: str) -> list[int]:
        return [ord(c) for c in s]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)


def test_edit_span_is_the_number_and_substitution_inside_the_quotes():
    tok = CharTokenizer()
    comp = tok.encode('<call>{"command": "sed -i \'12s/+/*/\' */[!_]*.py"}</call>')
    s, e = _edit_span(tok, comp)
    assert tok.decode(comp[s:e]) == "12s/+/*/"
    assert tok.decode(comp[s:s + 1]) == "1"  # the line number's first token


def test_edit_span_is_none_without_an_in_place_sed():
    tok = CharTokenizer()
    assert _edit_span(tok, tok.encode('{"command": "sed -n \'5p\' */[!_]*.py"}')) is None
    assert _edit_span(tok, tok.encode('{"command": "grep -nF \' + \' */[!_]*.py"}')) is None
