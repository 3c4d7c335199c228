"""Search spaces: ``--grid 'KEY=[v1,v2]'`` and ``--random 'KEY=loguniform(a,b)'`` -> sweep points.

Values stay strings, exactly as they will be written on ``run.py``'s command line
(``--config.KEY=v``), so the in-process check and the subprocess parse the same text. A point is an
ordered ``{key: value_str}``; a cell is a point plus a seed.
"""
from __future__ import annotations

import ast
import itertools
import math
import random
import re
from dataclasses import dataclass, field

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_DIST = re.compile(r"^(uniform|loguniform|randint|choice)\((.*)\)$", re.S)


class SpaceError(ValueError):
    """A malformed grid / random spec (names the spec)."""


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes: ``'1,[2,3],"a,b"'`` -> ``['1', '[2,3]', '"a,b"']``."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if quote or depth:
        raise SpaceError(f"unbalanced brackets or quotes in {text!r}")
    last = "".join(cur).strip()
    if last or parts:
        parts.append(last)
    return parts


def _key_and_rhs(spec: str, kind: str) -> tuple[str, str]:
    key, eq, rhs = spec.partition("=")
    key = key.strip().removeprefix("--config.").removeprefix("config.")
    if not eq or not _KEY.match(key):
        raise SpaceError(f"{kind} spec must be KEY=..., got {spec!r}")
    if key == "seed":
        raise SpaceError(f"{spec!r}: seeds are set with --seeds, not swept as a key")
    return key, rhs.strip()


def parse_grid(spec: str) -> tuple[str, list[str]]:
    """``'rl.rewards.length.q=[0,0.5,1]'`` -> ``('rl.rewards.length.q', ['0', '0.5', '1'])``."""
    key, rhs = _key_and_rhs(spec, "grid")
    if not (rhs.startswith("[") and rhs.endswith("]")):
        raise SpaceError(f"grid spec {spec!r}: values must be a bracketed list, e.g. {key}=[1,2]")
    values = split_top_level(rhs[1:-1])
    if not values or any(v == "" for v in values):
        raise SpaceError(f"grid spec {spec!r}: empty value")
    if len(set(values)) != len(values):
        raise SpaceError(f"grid spec {spec!r}: repeated value")
    return key, [_unquote(v) for v in values]


def _unquote(v: str) -> str:
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


@dataclass(frozen=True)
class Distribution:
    """One random-search dimension: uniform(a,b), loguniform(a,b), randint(a,b) (inclusive) or choice([...])."""

    key: str
    kind: str
    args: tuple = field(default_factory=tuple)

    def draw(self, rng: random.Random) -> str:
        if self.kind == "uniform":
            return repr(rng.uniform(*self.args))
        if self.kind == "loguniform":
            lo, hi = self.args
            return repr(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        if self.kind == "randint":
            return str(rng.randint(*self.args))
        return rng.choice(self.args)


def parse_random(spec: str) -> Distribution:
    """``'smoke.learning_rate=loguniform(1e-4,1e-2)'`` -> a `Distribution`."""
    key, rhs = _key_and_rhs(spec, "random")
    m = _DIST.match(rhs)
    if not m:
        raise SpaceError(f"random spec {spec!r}: expected uniform(a,b), loguniform(a,b), randint(a,b) or choice([...])")
    kind, inner = m.group(1), m.group(2).strip()
    if kind == "choice":
        if not (inner.startswith("[") and inner.endswith("]")):
            raise SpaceError(f"random spec {spec!r}: choice takes a bracketed list")
        values = [_unquote(v) for v in split_top_level(inner[1:-1])]
        if not values:
            raise SpaceError(f"random spec {spec!r}: empty choice")
        return Distribution(key, kind, tuple(values))
    try:
        lo, hi = (ast.literal_eval(v) for v in split_top_level(inner))
    except (ValueError, SyntaxError) as e:
        raise SpaceError(f"random spec {spec!r}: {kind} takes two numbers") from e
    if kind == "randint" and not (isinstance(lo, int) and isinstance(hi, int)):
        raise SpaceError(f"random spec {spec!r}: randint takes two integers")
    if not lo < hi:
        raise SpaceError(f"random spec {spec!r}: need low < high")
    if kind == "loguniform" and lo <= 0:
        raise SpaceError(f"random spec {spec!r}: loguniform needs low > 0")
    return Distribution(key, kind, (lo, hi))


def points(grid: list[str], random_specs: list[str] = (), samples: int = 0, search_seed: int = 0) -> list[dict]:
    """Every sweep point: the grid's Cartesian product x ``samples`` random draws (seeded, reproducible).

    With no grid and no random spec there is one point (``{}``: just the seeds).
    """
    grid_dims = [parse_grid(g) for g in grid]
    dists = [parse_random(r) for r in random_specs]
    keys = [k for k, _ in grid_dims] + [d.key for d in dists]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise SpaceError(f"key swept twice: {', '.join(sorted(dup))}")
    if dists and samples < 1:
        raise SpaceError("--random needs --samples >= 1")
    if samples and not dists:
        raise SpaceError("--samples given without any --random spec")
    rng = random.Random(search_seed)
    draws = [{d.key: d.draw(rng) for d in dists} for _ in range(samples)] if dists else [{}]
    out = []
    for combo in itertools.product(*[[(k, v) for v in vs] for k, vs in grid_dims]):
        for draw in draws:
            out.append({**dict(combo), **draw})
    return out
