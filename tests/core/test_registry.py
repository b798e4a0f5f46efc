"""Plugin registries (core/registry.py): one table per kind, names unique."""

from __future__ import annotations

import pytest

from sluicegate.core.registry import Registry


def test_two_plugins_with_one_name_are_refused() -> None:
    """A table that names two factories alike is an error when it is built, not a silent
    loss of one of them."""
    with pytest.raises(ValueError, match="two routers are called 'same'"):
        Registry("router", (("same", int), ("other", str), ("same", float)))


def test_unknown_name_lists_the_choices() -> None:
    """Asking for a missing name raises KeyError with every registered name, sorted."""
    registry = Registry("ordering", (("b", int), ("a", str)))
    with pytest.raises(KeyError, match=r"unknown ordering 'c'; choose one of \['a', 'b'\]"):
        registry.get("c")
    assert list(registry) == ["a", "b"]
    assert registry.get("a") is str
