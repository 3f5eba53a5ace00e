"""`Transform`: a user's function run in the workers on each row group's converted rows, and the
`TransformContext` it is called with (the row group's identity and, for a random transform, its
own random streams). See docs/transforms.md; the engine side is in _xform.py.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ._mainmod import main_source
from ._streams import _stable_argsort_u64, row_group_entropy
from .errors import OptionError

__all__ = ["Transform", "TransformContext"]

RowsMode = Literal["same", "changes"]


def _qualified_name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{name}"


class Transform:
    """``fn(columns, ctx) -> dict`` run in the workers on one whole row group at a time.

    ``columns`` is a dict of the row group's converted columns (``ndarray`` or `Ragged`,
    read-only views: copy one before changing it) after the filter's selection;
    ``ctx`` a `TransformContext`. ``fn`` returns a dict of ``ndarray | Ragged``, all of
    one length: the delivered columns.

    - ``name``: what the manifest, the state and the cache know it by (default: the
      function's qualified name). With ``version`` it is the transform's identity.
    - ``version``: a string; change it whenever ``fn`` changes what it returns. Only a
      versioned deterministic transform's output is cached (``None``: never cached).
    - ``random``: ``fn`` draws from ``ctx.rng`` (or ``ctx.uniform``/``integers``/
      ``permutation``), seeded per (seed, epoch, file, row group). A transform that is
      not declared random must give the same output for the same input.
    - ``rows``: ``"same"`` (each row group keeps its row count) or ``"changes"`` (it
      may filter or explode rows; deterministic transforms only: planning runs it
      over every row group to count its rows).
    - ``cache``: keep the output of a versioned deterministic transform in the
      loader's cache (default True; ``False`` runs it every epoch).

    Name, version, ``random`` and ``rows`` are order options: they enter ``order``,
    the manifest header, the state and the plan fingerprint. ``cache`` never
    changes a byte of any batch.
    """

    __slots__ = ("bare", "cache", "fn", "name", "random", "rows", "version")

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, version: str | None = None,
                 random: bool = False, rows: RowsMode = "same", cache: bool = True) -> None:
        if not callable(fn):
            raise OptionError(f"Transform needs a callable fn(columns, ctx) -> dict, got {type(fn).__name__} {fn!r}")
        if name is None:
            name = _qualified_name(fn)
        if not isinstance(name, str) or not name.strip():
            raise OptionError(f"Transform.name must be a non-empty str, got {name!r}")
        if version is not None and not isinstance(version, str):
            raise OptionError(f"Transform.version must be a str or None, got {type(version).__name__} {version!r}")
        for field, value in (("random", random), ("cache", cache)):
            if not isinstance(value, bool):
                raise OptionError(f"Transform.{field} must be True or False, got {type(value).__name__} {value!r}")
        if rows not in ("same", "changes"):
            raise OptionError(f"Transform.rows must be 'same' or 'changes', got {rows!r}")
        if random and rows == "changes":
            raise OptionError(
                f"transform {name!r} is random and changes row counts (random=True, rows='changes'): the plan "
                "counts every row group's rows before the epoch starts, and a random count would differ "
                "from epoch to epoch. Keep rows='same' (mark dropped rows in a column instead), or make the "
                "row-count change deterministic and draw only the values at random")
        self.fn = fn
        self.name = name
        self.version = version
        self.random = random
        self.rows: RowsMode = rows
        self.cache = cache
        self.bare = False  # a plain callable given as transform=: never cached

    @classmethod
    def of(cls, value: Any) -> Transform | None:
        """``transform=``: None, a `Transform`, or a plain callable (named by its qualified name, never cached)."""
        if value is None or isinstance(value, Transform):
            return value
        if callable(value):
            t = cls(value, cache=False)
            t.bare = True
            return t
        raise OptionError(f"transform must be a detload.Transform or a callable fn(columns, ctx) -> dict, "
                          f"got {type(value).__name__} {value!r}")

    @property
    def identity(self) -> dict[str, Any]:
        """What the order options record: name, version, random, rows."""
        return {"name": self.name, "version": self.version, "random": self.random, "rows": self.rows}

    @property
    def cached(self) -> bool:
        """Whether its output may be cached: deterministic, versioned, cache=True, not a bare callable."""
        return self.cache and not self.random and not self.bare and self.version is not None

    def __repr__(self) -> str:
        return (f"Transform({_qualified_name(self.fn)}, name={self.name!r}, version={self.version!r}, "
                f"random={self.random}, rows={self.rows!r}, cache={self.cache})")

    def __reduce__(self) -> Any:
        state = (self.name, self.version, self.random, self.rows, self.cache, self.bare)
        by_value = _by_value(self.fn)
        if by_value is not None:
            return (_rebuild_by_value, (by_value, state))
        return (_rebuild, (self.fn, state))


def _by_value(fn: Any) -> bytes | None:
    """``fn`` pickled by value (cloudpickle) when it lives in a main module that a worker process
    cannot import (a stdin script, ``python -c``, a notebook) and cloudpickle is installed."""
    if getattr(fn, "__module__", None) != "__main__":
        return None
    if main_source() is not None:
        return None  # the worker imports the script, as for any other name defined there
    try:
        import cloudpickle  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        return None
    return bytes(cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL))


def _rebuild(fn: Any, state: tuple[Any, ...]) -> Transform:
    t = Transform.__new__(Transform)
    t.fn = fn
    t.name, t.version, t.random, t.rows, t.cache, t.bare = state
    return t


def _rebuild_by_value(data: bytes, state: tuple[Any, ...]) -> Transform:
    return _rebuild(pickle.loads(data), state)  # cloudpickle's output is read by plain pickle


class TransformContext:
    """What a transform is told about the row group it is called on.

    - ``file``: the file's path relative to the dataset root; ``file_index`` its index
      in canonical order; ``row_group`` the row group's index in the file.
    - ``rows``: the rows it is given (after the filter's selection); ``selected``: the
      indices of those rows among the row group's stored rows, or None (all of them).
    - ``rng``: a ``numpy.random.Generator`` (PCG64) seeded from the fixed-length entropy
      ``row_group_entropy(seed, epoch, file_index, row_group)``, for transforms
      declared ``random=True``. Its methods give the same numbers for the same row
      group, epoch and seed at every worker count, pool, cache state and resume point,
      within one NumPy version: NumPy may change a method's algorithm between releases.
    - ``uniform(n)``, ``integers(n, high)``, ``permutation(n)``: built on a bit
      generator's raw output alone (``PCG64.random_raw``), which NumPy keeps stable
      across versions. They draw from a second stream of the same entropy, so using
      ``rng`` does not move them; each call continues where the last one ended.
    """

    __slots__ = ("_entropy", "_raw", "_rng", "file", "file_index", "random", "row_group", "rows", "selected")

    def __init__(self, *, file: str, file_index: int, row_group: int, rows: int, selected: np.ndarray | None,
                 seed: int, epoch: int, random: bool) -> None:
        self.file = file
        self.file_index = file_index
        self.row_group = row_group
        self.rows = rows
        self.selected = selected
        self.random = random
        self._entropy = row_group_entropy(seed, epoch, file_index, row_group) if random else None
        self._rng: np.random.Generator | None = None
        self._raw: np.random.PCG64 | None = None

    def _stream(self, child: int) -> np.random.SeedSequence:
        if self._entropy is None:
            raise OptionError(
                "this transform draws random numbers but was not declared random: pass random=True to "
                "detload.Transform, so that its draws are seeded per (seed, epoch, file, row group) and its "
                "output is never cached")
        # The two children of spawn(2), written out: SeedSequence's spawn keys are part of its stable API.
        return np.random.SeedSequence(self._entropy, spawn_key=(child,))

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.Generator(np.random.PCG64(self._stream(0)))
        return self._rng

    def _bits(self, n: int) -> np.ndarray:
        if self._raw is None:
            self._raw = np.random.PCG64(self._stream(1))
        n = _count(n)
        return np.asarray(self._raw.random_raw(n), dtype=np.uint64).reshape(n)

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 in [0, 1): the top 53 bits of each raw word, times 2**-53."""
        return (self._bits(n) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def integers(self, n: int, high: int) -> np.ndarray:
        """``n`` int64 in [0, high), each a raw word modulo ``high`` (bias below high / 2**64)."""
        if isinstance(high, bool) or not isinstance(high, (int, np.integer)) or not 1 <= high < 2**63:
            raise OptionError(f"integers(n, high) needs an int high in [1, 2**63), got {high!r}")
        return (self._bits(n) % np.uint64(high)).astype(np.int64)

    def permutation(self, n: int) -> np.ndarray:
        """A permutation of range(n): the stable argsort of ``n`` raw words (int64)."""
        return _stable_argsort_u64(self._bits(n))

    def __repr__(self) -> str:
        return (f"TransformContext(file={self.file!r}, row_group={self.row_group}, rows={self.rows}, "
                f"random={self.random})")


def _count(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise OptionError(f"a count of draws must be an int >= 0, got {n!r}")
    return int(n)

