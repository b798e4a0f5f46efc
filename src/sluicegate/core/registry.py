"""Name → factory registries: how a config's plugin names become objects.

Every pluggable part (queue orderings and fairness, routers, adaptive limits)
has one ``Registry``, built in its package's ``__init__.py`` from an explicit
table of ``name: factory``. Nothing registers itself as a side effect of being
imported, so the table is the whole list, and ``core/spec.py`` validates the
names a config gives against ``names()`` when the config is parsed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F")


class Registry(Generic[F]):
    """The factories of one kind of plugin, keyed by the name a config uses.

    Args:
        kind: What the plugins are, for messages ("router", "ordering", …).
        entries: ``(name, factory)`` pairs; a factory is usually the plugin's class.

    Raises:
        ValueError: two entries share a name (one would silently hide the other).
    """

    def __init__(self, kind: str, entries: Iterable[tuple[str, F]]) -> None:
        self.kind = kind
        self._factories: dict[str, F] = {}
        for name, factory in entries:
            if name in self._factories:
                raise ValueError(f"two {kind}s are called {name!r}")
            self._factories[name] = factory

    def get(self, name: str) -> F:
        """The factory called ``name``; ``KeyError`` naming the choices if unknown."""
        try:
            return self._factories[name]
        except KeyError:
            raise KeyError(self.unknown(name)) from None

    def names(self) -> frozenset[str]:
        """Every registered name."""
        return frozenset(self._factories)

    def unknown(self, name: str) -> str:
        """The message for a name that is not registered: it lists the choices."""
        return f"unknown {self.kind} {name!r}; choose one of {sorted(self._factories)}"

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._factories))
