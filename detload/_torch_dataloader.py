"""What a torch ``DataLoader`` needs of detload's loaders, done without importing torch (seconds of import).

DataLoader iterates an object only if it is an ``IterableDataset`` (else it indexes it), so `Loader` is
registered as a virtual subclass: at once if ``torch.utils.data`` is loaded, else by a ``sys.meta_path``
finder that acts when it is imported and then removes itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["register", "register_iterable"]

# The classes to register; IterableDataset's metaclass is ABCMeta (through typing.Iterable).
_CLASSES: list[type] = []


def register_iterable(cls: type) -> None:
    """Make ``cls`` a virtual torch IterableDataset: now if torch.utils.data is loaded, else when it is."""
    if cls not in _CLASSES:
        _CLASSES.append(cls)
    if not register() and not any(isinstance(f, _TorchDataFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchDataFinder())


def register() -> bool:
    """Register the classes given to `register_iterable` if torch.utils.data is loaded; True once done.

    Cheap: a loader calls it when built, in case torch.utils.data was loaded past the finder.
    """
    data = sys.modules.get("torch.utils.data")
    iterable = getattr(data, "IterableDataset", None)
    if iterable is None:
        return False
    for cls in _CLASSES:
        if not issubclass(cls, iterable):
            iterable.register(cls)
    return True


class _RegisterAfterExec(importlib.abc.Loader):
    """Runs torch.utils.data's own loader, then registers; everything else is the real loader's."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        # Leave nothing of ours on the module: its loader is its own again.
        if module.__spec__ is not None and module.__spec__.loader is self:
            module.__spec__.loader = self._inner
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._inner
        if register():
            _TorchDataFinder.remove()

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, resource readers ...
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


class _TorchDataFinder(importlib.abc.MetaPathFinder):
    """A sys.meta_path entry that only acts on ``torch.utils.data``: it finds the module
    with the finders after it and wraps its loader in `_RegisterAfterExec`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch.utils.data":
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisterAfterExec(spec.loader)
                return spec
        return None

    @staticmethod
    def remove() -> None:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchDataFinder)]
