"""The corpus's two record types: `Candidate` (a document not yet read) and `Document` (its text).

Sources yield them (`c2jax.data.sources`), the corpus build filters and deduplicates them
(`c2jax.data.corpus`), and the SFT synthesiser derives new ones (`c2jax.data.synth`); keeping them
here lets each of those import the types without importing the others.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Candidate:
    """A document not yet read: enough metadata to filter it, and `load()` to get its text.

    `load()` returns the text, or ``(text, sha256 of the file it was derived from)`` for derived
    text such as docstrings (so dedup can drop text derived from a held-out file), or None.
    """

    source: str
    package: str
    path: str
    licence: str
    size: int
    load: Callable[[], Any]
    kind: str = "text"
    vendored_in: str | None = None


@dataclass
class Document:
    """A corpus document; `sha256` of the text is its identity for exact-duplicate removal."""

    text: str
    source: str
    package: str
    path: str
    licence: str
    kind: str = "text"
    vendored_in: str | None = None
    split: str = "train"
    sha256: str = ""
    origin_sha256: str | None = None  # the file a derived document (docstrings, SFT) came from

    def __post_init__(self):
        if not self.sha256:
            self.sha256 = hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest()

    def record(self, with_text: bool = True) -> dict:
        d = {"source": self.source, "package": self.package, "path": self.path, "licence": self.licence,
             "kind": self.kind, "vendored_in": self.vendored_in, "split": self.split, "sha256": self.sha256,
             "origin_sha256": self.origin_sha256, "bytes": len(self.text.encode("utf-8", "surrogatepass"))}
        if with_text:
            d["text"] = self.text
        return d

    @classmethod
    def from_record(cls, d: dict) -> "Document":
        return cls(text=d["text"], source=d["source"], package=d["package"], path=d["path"], licence=d["licence"],
                   kind=d.get("kind", "text"), vendored_in=d.get("vendored_in"), split=d.get("split", "train"),
                   sha256=d.get("sha256", ""), origin_sha256=d.get("origin_sha256"))
