"""Name → implementation registries for pluggable policies, routers and limits."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named set of implementations; registering a name twice is an error at import."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator that registers the implementation under ``name``."""

        def decorate(item: T) -> T:
            if name in self._items:
                raise ValueError(f"duplicate {self._kind} name {name!r}")
            self._items[name] = item
            return item

        return decorate

    def get(self, name: str) -> T:
        """The implementation called ``name``; ``KeyError`` naming the choices if unknown."""
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(
                f"unknown {self._kind} {name!r}; choose one of {sorted(self._items)}"
            ) from None

    def names(self) -> frozenset[str]:
        """All registered names."""
        return frozenset(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
