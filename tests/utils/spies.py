"""A pass-through spy: which tests need to know whether (and how often) a kernel helper ran, without changing it."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["count_calls"]


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[None]:
    """Replace `owner.name` (a module's function, as its callers look it up) by a wrapper that appends to the returned
    list at each call and then runs the original."""
    original = getattr(owner, name)
    calls: list[None] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
