"""What a torch ``DataLoader`` needs of detload's loaders, done without importing torch (seconds of import).

DataLoader iterates an object only if it is an ``IterableDataset`` (else it indexes it), so `Loader` is
registered as a virtual subclass: at once if ``torch.utils.data`` is loaded, else by a ``sys.meta_path``
finder that acts when it is imported and then removes itself. And a DataLoader that batches (any
``batch_size`` but None) would batch detload's whole batches again: `refuse_auto_batching` sees it from
the frames that call ``iter()`` and refuses.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

from .errors import OptionError

__all__ = ["refuse_auto_batching", "register", "register_iterable"]

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


# How far above the loader's __iter__ the DataLoader's fetcher may be: its __init__ calls iter()
# directly (a builtin, no frame of its own), and a subclass's __iter__ may add a level or two.
_FETCHER_FRAMES = 4
# And how far above the fetcher the DataLoader's iterator is (create_fetcher lies between).
_ITERATOR_FRAMES = 3


def refuse_auto_batching(dataset: object, what: str) -> None:
    """OptionError when ``iter(dataset)`` is called by a torch DataLoader with automatic batching.

    Called at the start of ``dataset.__iter__``. torch's DataLoader iterator (in this process,
    and in each worker process) makes an ``_IterableDatasetFetcher(dataset, auto_collation, ...)``
    whose ``__init__`` calls ``iter(dataset)``; ``auto_collation`` is true unless
    ``batch_size=None`` (an IterableDataset takes no ``batch_sampler``). Only a fetcher of this
    very dataset counts: a user's dataset that iterates a loader and yields its rows may batch them.
    Nothing is looked at unless torch's DataLoader is loaded.
    """
    fetch = sys.modules.get("torch.utils.data._utils.fetch")
    fetcher_type = getattr(fetch, "_IterableDatasetFetcher", None)
    if fetcher_type is None:
        return
    try:
        frame: types.FrameType | None = sys._getframe(2)  # the caller of dataset.__iter__
    except ValueError:  # __iter__ called with no Python frame above it
        return
    try:
        for _ in range(_FETCHER_FRAMES):
            if frame is None:
                return
            fetcher = _self_of(frame)
            if isinstance(fetcher, fetcher_type) and getattr(fetcher, "dataset", None) is dataset:
                if getattr(fetcher, "auto_collation", False):
                    raise OptionError(_batched_twice(what, _batch_size(frame.f_back)))
                return
            frame = frame.f_back
    finally:
        del frame  # a frame held from a local would keep every frame above it alive


def _self_of(frame: types.FrameType) -> object:
    """The frame's ``self`` argument, if its function has one (f_locals only then: it copies)."""
    code = frame.f_code
    if not code.co_argcount or code.co_varnames[0] != "self":
        return None
    return frame.f_locals.get("self")


def _batch_size(frame: types.FrameType | None) -> int | None:
    """The DataLoader's batch_size, from its iterator's batch sampler a few frames up (None if not found)."""
    for _ in range(_ITERATOR_FRAMES):
        if frame is None:
            return None
        sampler = getattr(_self_of(frame), "_index_sampler", None)
        size = getattr(sampler, "batch_size", None)
        if isinstance(size, int):
            return size
        frame = frame.f_back
    return None


def _batched_twice(what: str, batch_size: int | None) -> str:
    given = f"batch_size={batch_size}" if batch_size is not None else "a batch_size other than None"
    return (f"a {what} already yields whole batches, and this torch DataLoader ({given}) would batch them "
            f"again: at batch_size=1, the DataLoader's default, every column gains a leading dimension of 1, "
            f"and at more, that many batches are stacked and a shorter last one fails. Pass batch_size=None to "
            f"the DataLoader: it then passes each batch on as the {what} made it (set the batch size with the "
            f"Loader's own batch_size=; a collate_fn= then receives each whole batch)")
