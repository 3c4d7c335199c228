"""Stop strings detected on bytes, and the token-id -> bytes table they need.

Byte-level BPE tokens are byte strings; one UTF-8 character may be split over several tokens.
Decoding token by token would turn a partial character into U+FFFD, which can hide a stop string
(its first bytes are in one token, the rest in the next) or fake one (a stop string that contains
U+FFFD). So the engine appends each generated token's *bytes* to a buffer and searches the stop
strings' UTF-8 encodings in it; the text ends exactly where the earliest stop string starts
(or after it, with ``include_stop_str``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional, Sequence


class StopMatcher:
    """Incremental search for byte patterns in an output byte stream (one per sequence)."""

    def __init__(self, stop_strings: Sequence[str], include_stop_str: bool = False):
        self.patterns = [(s, s.encode("utf-8")) for s in stop_strings]
        self.max_len = max((len(p) for _, p in self.patterns), default=0)
        self.include = include_stop_str
        self.buf = bytearray()
        self.cut: Optional[int] = None  # byte offset where the text ends, once a stop matched
        self.matched: Optional[str] = None

    def feed(self, piece: bytes) -> bool:
        """Append one token's bytes; return True when a stop string has just been completed."""
        if self.cut is not None:
            return True
        start = max(0, len(self.buf) - self.max_len + 1)
        self.buf += piece
        best: Optional[tuple[int, str, int]] = None
        for s, p in self.patterns:
            i = self.buf.find(p, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s, len(p))
        if best is None:
            return False
        i, s, n = best
        self.cut = i + n if self.include else i
        self.matched = s
        return True

    def text_bytes(self) -> bytes:
        return bytes(self.buf if self.cut is None else self.buf[: self.cut])

    def text(self) -> str:
        return self.text_bytes().decode("utf-8", errors="replace")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_byte_table(tokenizer: Any, vocab_size: int) -> list[bytes]:
    """A list ``table[id] -> bytes`` for a tokenizer.

    Accepts: an explicit sequence of bytes; an object with ``token_bytes(id) -> bytes`` (the
    c2jax tokenizer); or a ``tokenizers.Tokenizer`` / object with ``.backend`` / ``._tokenizer``
    holding one whose vocabulary uses the byte-level alphabet (special/added tokens map to their
    UTF-8 content). Ids the tokenizer does not know map to b"".
    """
    if isinstance(tokenizer, (list, tuple)):
        table = [bytes(b) for b in tokenizer]
        return table + [b""] * max(0, vocab_size - len(table))
    if hasattr(tokenizer, "token_bytes"):
        return [bytes(tokenizer.token_bytes(i)) for i in range(vocab_size)]
    hf = tokenizer
    for attr in ("_hf", "backend", "_tokenizer", "tokenizer"):
        if hasattr(hf, attr) and hasattr(getattr(hf, attr), "id_to_token"):
            hf = getattr(hf, attr)
            break
    if not hasattr(hf, "id_to_token"):
        raise TypeError(f"cannot build a token -> bytes table from {type(tokenizer).__name__}")
    u2b = _unicode_to_byte()
    special = set()
    if hasattr(hf, "get_added_tokens_decoder"):
        special = {int(i) for i in hf.get_added_tokens_decoder()}
    table = []
    for i in range(vocab_size):
        s = hf.id_to_token(i)
        if s is None:
            table.append(b"")
        elif i in special or any(ch not in u2b for ch in s):
            table.append(s.encode("utf-8"))
        else:
            table.append(bytes(u2b[ch] for ch in s))
    return table
