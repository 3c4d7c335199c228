"""Byte-level BPE tokenizer (Hugging Face `tokenizers`) with Kimi-K2-style reserved special tokens.

Why byte-level: every valid Unicode string maps to bytes and back, so `decode(encode(s)) == s` for
any `s` (no unknown token, no normalisation); tests check this with hypothesis.

Special tokens (chat roles, tool calls, think, padding, eos) occupy the FIRST ids of the vocabulary,
in the fixed order of `SPECIAL_TOKENS`, padded with `<|reserved_i|>` tokens up to `NUM_RESERVED`, so
the ids of the chat template never move when the tokenizer is retrained on another corpus.

Injection safety: `encode(text)` ALWAYS treats special-token strings inside `text` as plain text
(the HF flag `encode_special_tokens=True`), so a source file or a tool output that contains the
string ``<|im_end|>`` is split into ordinary byte tokens and can never open a role or a tool call.
Special ids enter a sequence only through `special_id(name)` (used by `chat_format.py`).

    tok = train_tokenizer(texts, vocab_size=4096)
    tok.save("out/tokenizer.json"); tok = Tokenizer.load("out/tokenizer.json")
    ids = tok.encode("def f(): ...")          # list[int], specials never matched
    text = tok.decode(ids)                     # exact inverse
"""
from __future__ import annotations

import hashlib
import os
from typing import Iterable, Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from c2jax.atomic import atomic_path

# Kimi-K2 names; order fixes the ids (0, 1, 2, ...). Never reorder, only append before reserved.
PAD = "[PAD]"
BOS = "[BOS]"
EOS = "[EOS]"
IM_SYSTEM = "<|im_system|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_MIDDLE = "<|im_middle|>"
IM_END = "<|im_end|>"
TOOL_CALLS_BEGIN = "<|tool_calls_section_begin|>"
TOOL_CALLS_END = "<|tool_calls_section_end|>"
TOOL_CALL_BEGIN = "<|tool_call_begin|>"
TOOL_CALL_ARG_BEGIN = "<|tool_call_argument_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"
THINK_BEGIN = "<think>"
THINK_END = "</think>"

SPECIAL_TOKENS: tuple[str, ...] = (
    PAD, BOS, EOS, IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END,
    TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_ARG_BEGIN, TOOL_CALL_END,
    THINK_BEGIN, THINK_END,
)
NUM_RESERVED = 32  # specials + reserved slots: ids [0, NUM_RESERVED) are never produced by text
ALL_SPECIAL_TOKENS: tuple[str, ...] = SPECIAL_TOKENS + tuple(
    f"<|reserved_{i}|>" for i in range(NUM_RESERVED - len(SPECIAL_TOKENS))
)
MIN_VOCAB = NUM_RESERVED + 256  # specials + the 256 byte symbols


class TokenizerError(ValueError):
    """A tokenizer file is missing, malformed, or lacks the reserved special tokens."""


class Tokenizer:
    """Thin wrapper over an HF byte-level BPE `tokenizers.Tokenizer` with safe text encoding."""

    def __init__(self, hf: HFTokenizer, path: str | None = None):
        self._hf = hf
        self._hf.encode_special_tokens = True  # text never produces special ids (injection safety)
        self.path = path
        vocab = hf.get_vocab(with_added_tokens=True)
        missing = [t for t in ALL_SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise TokenizerError(f"tokenizer {path or ''} lacks reserved special tokens {missing[:4]}...")
        bad = [t for i, t in enumerate(ALL_SPECIAL_TOKENS) if vocab[t] != i]
        if bad:
            raise TokenizerError(f"tokenizer {path or ''}: special tokens not at ids 0..{NUM_RESERVED - 1}: {bad[:4]}")
        self._special = {t: i for i, t in enumerate(ALL_SPECIAL_TOKENS)}

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        """Load `tokenizer.json` (or a directory holding it); raise TokenizerError if unusable."""
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise TokenizerError(f"tokenizer file not found: {path}")
        try:
            hf = HFTokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise TokenizerError(f"cannot read tokenizer {path}: {e}") from e
        return cls(hf, path)

    def save(self, path: str) -> str:
        """Write `tokenizer.json` atomically (path may be a directory); returns the file path."""
        if os.path.isdir(path) or not path.endswith(".json"):
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, "tokenizer.json")
        with atomic_path(path) as tmp:
            self._hf.save(tmp)
        self.path = path
        return path

    # ---- properties -----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids including specials; the model's `vocab_size` must be >= this."""
        return self._hf.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._special[PAD]

    @property
    def eos_id(self) -> int:
        return self._special[EOS]

    @property
    def bos_id(self) -> int:
        return self._special[BOS]

    def special_id(self, token: str) -> int:
        """Id of a reserved special token such as ``<|im_end|>`` (KeyError if not reserved)."""
        try:
            return self._special[token]
        except KeyError:
            raise KeyError(f"{token!r} is not a reserved special token; known: {list(SPECIAL_TOKENS)}") from None

    def is_special(self, token_id: int) -> bool:
        return 0 <= int(token_id) < NUM_RESERVED

    def fingerprint(self) -> str:
        """sha256 of the serialised tokenizer (vocab + merges + specials): keys shard caches."""
        return hashlib.sha256(self._hf.to_str().encode()).hexdigest()

    # ---- encode / decode ------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings inside `text` stay plain text."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` for many texts at once (parallel in Rust)."""
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Exact inverse of `encode`; special ids are rendered as their token strings."""
        ids = [int(i) for i in ids]
        return self._hf.decode(ids, skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> str | None:
        return self._hf.id_to_token(int(token_id))



def new_bpe() -> HFTokenizer:
    """An untrained byte-level BPE pipeline (no normaliser: exact round trip)."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    return hf


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2,
                    show_progress: bool = False) -> Tokenizer:
    """Train a byte-level BPE on `texts`; specials get ids [0, NUM_RESERVED), bytes the next 256.

    The result may have fewer than `vocab_size` ids when the corpus is too small to supply that
    many merges; `Tokenizer.vocab_size` reports the real size.
    """
    if vocab_size < MIN_VOCAB:
        raise TokenizerError(f"vocab_size must be >= {MIN_VOCAB} (specials + 256 bytes), got {vocab_size}")
    hf = new_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(ALL_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    hf.train_from_iterator(_nonempty(texts), trainer=trainer)
    return Tokenizer(hf)


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    for t in texts:
        if t:
            yield t


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype holding every id (uint16 up to 65536 ids, else uint32)."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def describe(tok: Tokenizer) -> dict:
    """Small JSON-able summary recorded in manifests and summaries."""
    return {"vocab_size": tok.vocab_size, "num_reserved": NUM_RESERVED, "fingerprint": tok.fingerprint(),
            "specials": list(SPECIAL_TOKENS)}
