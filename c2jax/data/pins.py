"""Pinned corpus sources: the exact Python and package versions a corpus config was recorded with.

A corpus that gathers Python source from "whatever is installed" hashes differently on every
machine (and the quickstart's held-out margin moves with it). A config with ``data.pins`` lists the
sources by exact version; `check_pins` compares them with this interpreter before anything is read
and raises `CorpusPinError` naming every difference and how to fix it:

    data.pins = {"python": "3.11.7", "packages": {"rich": "15.0.0", ...}}

``python`` pins the standard library (its files change between patch releases). ``packages`` are
PEP 503 names; the config's package sources must only read these (`pinned_packages`), so anything
else installed on the machine cannot enter the corpus. An empty/absent ``pins`` disables the check.
"""
from __future__ import annotations

import importlib.metadata as md
import platform
from typing import Any, Mapping

from c2jax.data.sources import normalize_package


class CorpusPinError(ValueError):
    """The installed sources differ from the versions the corpus config pins."""


def _plain(x: Any) -> dict:
    return dict(x.items()) if hasattr(x, "items") else dict(x or {})


def installed_version(name: str) -> str | None:
    """The installed distribution's version, or None if it is not installed."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def pin_differences(pins: Mapping[str, Any] | None) -> list[str]:
    """One line per difference between `pins` and this interpreter (empty: everything matches)."""
    pins = _plain(pins)
    problems = []
    want_py = pins.get("python")
    if want_py and platform.python_version() != str(want_py):
        problems.append(f"python {platform.python_version()} is running; the corpus pins the standard library "
                        f"of python {want_py}")
    for name, want in sorted(_plain(pins.get("packages")).items()):
        have = installed_version(name)
        if have is None:
            problems.append(f"{name} is not installed; pinned {want} (pip install '{name}=={want}')")
        elif have != str(want):
            problems.append(f"{name} {have} is installed; pinned {want} (pip install '{name}=={want}')")
    return problems


def check_pins(pins: Mapping[str, Any] | None) -> None:
    """Raise CorpusPinError (before any file is read) if the installed sources differ from `pins`."""
    problems = pin_differences(pins)
    if problems:
        raise CorpusPinError(
            "the corpus sources differ from the pinned versions, so the corpus (and its manifest hash and "
            "held-out figures) would differ from the recorded one:\n  - " + "\n  - ".join(problems)
            + "\nInstall the pinned versions, or set data.pins = {} to build from whatever is installed.")


def pinned_packages(pins: Mapping[str, Any] | None) -> list[str]:
    """The pinned package names (normalised), for a package source's ``packages`` list."""
    return sorted(normalize_package(n) for n in _plain(_plain(pins).get("packages")))
