"""Licence of an installed distribution, read from its metadata, as an SPDX-style expression.

Evidence, in order of trust: the PEP 639 ``License-Expression`` field, the trove classifiers
(``License :: OSI Approved :: MIT License``; several classifiers mean a choice, joined with OR), then
the free-text ``License`` field (an SPDX expression, a short name such as "Apache 2.0", or the first
line of a licence text). Anything else is ``UNKNOWN``, which is never permissive.

`is_permissive(expr, allowed)` evaluates AND / OR / WITH / parentheses: ``A AND B`` needs both
allowed, ``A OR B`` either, ``A WITH exception`` is judged by ``A``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

UNKNOWN = "UNKNOWN"
STDLIB_LICENCE = "PSF-2.0"

# Default allow-list: permissive licences only (no copyleft: GPL, LGPL, MPL, EPL, ...).
PERMISSIVE: tuple[str, ...] = (
    "MIT", "MIT-0", "MIT-CMU", "BSD", "BSD-2-Clause", "BSD-3-Clause", "0BSD", "Apache-2.0", "PSF-2.0",
    "Python-2.0", "CNRI-Python", "ISC", "Zlib", "BSL-1.0", "Unlicense", "CC0-1.0", "HPND",
)

_CLASSIFIERS = {
    "MIT License": "MIT",
    "MIT No Attribution License (MIT-0)": "MIT-0",
    "BSD License": "BSD",
    "Apache Software License": "Apache-2.0",
    "Python Software Foundation License": "PSF-2.0",
    "ISC License (ISCL)": "ISC",
    "zlib/libpng License": "Zlib",
    "The Unlicense (Unlicense)": "Unlicense",
    "Boost Software License 1.0 (BSL-1.0)": "BSL-1.0",
    "Historical Permission Notice and Disclaimer (HPND)": "HPND",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "GNU General Public License v2 (GPLv2)": "GPL-2.0",
    "GNU General Public License v3 (GPLv3)": "GPL-3.0",
    "GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0",
    "GNU Library or Lesser General Public License (LGPL)": "LGPL",
}

# Short free-text names -> SPDX id (matched case-insensitively against the whole field).
_SHORT = [
    (r"mit( license)?", "MIT"),
    (r"apache( software)?( license)?,? ?(v(ersion)? ?)?2(\.0)?( license)?", "Apache-2.0"),
    (r"apache( software license)?", "Apache-2.0"),
    (r"(new |modified |revised )?bsd( license)?", "BSD"),
    (r"(the )?(3|three)[- ]clause bsd( license)?|bsd[- ]3[- ]clause( license)?", "BSD-3-Clause"),
    (r"(2|two)[- ]clause bsd( license)?|bsd[- ]2[- ]clause( license)?", "BSD-2-Clause"),
    (r"psf( license)?|python software foundation( license)?", "PSF-2.0"),
    (r"isc( license)?", "ISC"),
]

# First lines of licence texts pasted into the License field.
_TEXT_HINTS = [
    (r"bsd 3-clause|redistribution and use in source and binary forms", "BSD"),
    (r"mit license|permission is hereby granted, free of charge", "MIT"),
    (r"apache license", "Apache-2.0"),
    (r"isc license", "ISC"),
]

_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclass(frozen=True)
class Licence:
    """A normalised expression, where it came from, and the raw text it was read from."""

    expression: str
    evidence: str
    raw: str = ""


def _spdx_like(text: str) -> bool:
    toks = _TOKEN.findall(text)
    return bool(toks) and all(re.fullmatch(r"[A-Za-z0-9.+\-]+|AND|OR|WITH|\(|\)", t) for t in toks) and (
        len(toks) == 1 or any(t in ("AND", "OR", "WITH") for t in toks))


def from_metadata(meta) -> Licence:
    """Licence of a distribution from its `importlib.metadata` metadata message."""
    expr = (meta.get("License-Expression") or "").strip()
    if expr:
        return Licence(expr, "License-Expression", expr)
    classifiers = [c.split("::")[-1].strip() for c in (meta.get_all("Classifier") or []) if c.startswith("License ::")]
    mapped = [_CLASSIFIERS[c] for c in classifiers if c in _CLASSIFIERS]
    if mapped:
        return Licence(" OR ".join(dict.fromkeys(mapped)), "classifier", "; ".join(classifiers))
    text = (meta.get("License") or "").strip()
    if text and text.upper() != "UNKNOWN":
        return from_text(text)
    return Licence(UNKNOWN, "none", "")


def from_text(text: str) -> Licence:
    """Licence from a free-text ``License`` field."""
    t = text.strip()
    first = t.splitlines()[0].strip() if t else ""
    for pat, spdx in _SHORT:
        if re.fullmatch(pat, first, flags=re.I):
            return Licence(spdx, "License", t[:200])
    if "\n" not in t and _spdx_like(t):
        return Licence(t, "License", t)
    low = t[:400].lower()
    for pat, spdx in _TEXT_HINTS:
        if re.search(pat, low):
            return Licence(spdx, "License text", t[:200])
    return Licence(UNKNOWN, "License", t[:200])


def is_permissive(expression: str, allowed: Iterable[str] = PERMISSIVE) -> bool:
    """Evaluate an SPDX-style expression against the allow-list (case-insensitive ids)."""
    ok = {a.lower() for a in allowed}
    toks = _TOKEN.findall(expression or "")
    if not toks:
        return False
    pos = 0

    def atom() -> bool:
        nonlocal pos
        if pos >= len(toks):
            raise ValueError("unexpected end")
        t = toks[pos]
        pos += 1
        if t == "(":
            v = disj()
            if pos >= len(toks) or toks[pos] != ")":
                raise ValueError("missing )")
            pos += 1
        else:
            v = t.lower().rstrip("+") in ok or t.lower() in ok
        if pos < len(toks) and toks[pos] == "WITH":  # exceptions only add permissions
            pos += 2
        return v

    def conj() -> bool:
        nonlocal pos
        v = atom()
        while pos < len(toks) and toks[pos] == "AND":
            pos += 1
            v = atom() and v
        return v

    def disj() -> bool:
        nonlocal pos
        v = conj()
        while pos < len(toks) and toks[pos] == "OR":
            pos += 1
            v = conj() or v
        return v

    try:
        v = disj()
    except ValueError:
        return False
    return v and pos == len(toks)
