"""A tiny name -> object registry used for every "pick by name" choice in c2jax.

Configs name components (MoE implementation, loss terms, advantage estimator, sandbox backend,
...) as strings; the module that implements a component registers it under that name, and the
code that composes an experiment looks it up here. An unknown name fails with the list of known
names, so a typo in a config is caught before any compute.

    MOE_IMPLS = Registry("moe_impl")

    @MOE_IMPLS.register("dropless")
    def dropless_moe(...): ...

    fn = MOE_IMPLS.get(config.model.moe.impl)
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar, overload

T = TypeVar("T")

_ALL: dict[str, "Registry"] = {}


class UnknownNameError(KeyError):
    """Raised when a name is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to objects (functions, classes, factories) of one kind."""

    def __init__(self, kind: str):
        if kind in _ALL:
            raise ValueError(f"a registry of kind {kind!r} already exists")
        self.kind = kind
        self._items: dict[str, T] = {}
        _ALL[kind] = self

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, obj: T) -> T: ...

    def register(self, name: str, obj: T | None = None):
        """Register `obj` under `name`; usable as a decorator when `obj` is omitted."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a registered name must be a non-empty string, got {name!r}")

        def add(o: T) -> T:
            if name in self._items and self._items[name] is not o:
                raise ValueError(f"{self.kind}: {name!r} is already registered")
            self._items[name] = o
            return o

        return add if obj is None else add(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items)) or '(none)'}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """Names in registration order (for choices whose order matters, e.g. build order)."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def registry(kind: str) -> Registry:
    """Return the registry of `kind` (for introspection and error messages)."""
    return _ALL[kind]
