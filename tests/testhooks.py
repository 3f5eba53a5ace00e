"""Build a Loader or TorchLoader with test hooks (fault injection, a failing cache, the unordered
merge, the adapter's per-column path): they are detload's private hooks object, never keywords."""

from __future__ import annotations

from typing import Any, TypeVar

from detload._engine.config import DebugHooks
from detload._hooks import Hooks, installed

__all__ = ["hooked"]

T = TypeVar("T")


def hooked(factory: Any, *args: Any, debug: DebugHooks | None = None, cache_fail_after_bytes: int | None = None,
           unordered: bool = False, torch_per_column: bool = False, **kwargs: Any) -> Any:
    """``factory(*args, **kwargs)`` (Loader, TorchLoader, or a test's helper that builds one) with these hooks."""
    with installed(Hooks(debug=debug, cache_fail_after_bytes=cache_fail_after_bytes, unordered=unordered,
                         torch_per_column=torch_per_column)):
        return factory(*args, **kwargs)
