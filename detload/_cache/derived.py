"""Derived entries: small per-row-group results (filter selections, group indexes, group-check
verdicts) kept beside a file version's row-group entries, keyed by what derived them.
(A cached transform's outputs are not derived entries: they are row-group entries of the
output schema, memory-mapped like any row group; see `detload._xform`.)

They are entry files of the same format, in the same folder, under the same counter, limit,
eviction and atomic write as row-group entries. A derived entry is read whole into memory
(it is small) and its checksum verified before anything is returned; a damaged or truncated
one is discarded and reported as a miss, never returned.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from .._types import Column, Ragged
from .config import CacheConfig, _warn_once
from .format import _PREFIX, _Corrupt, _parse, _prefix, _serialize, _verify
from .keys import _derived_name
from .store import _Store
from .write import _Writer

#: The name of the one array `put_bytes` stores.
_BYTES = "bytes"


def _identity(identity: str | bytes) -> bytes:
    if isinstance(identity, str):
        return identity.encode("utf-8")
    if isinstance(identity, (bytes, bytearray, memoryview)):
        return bytes(identity)
    raise TypeError(f"a derived entry's identity must be str or bytes, got {type(identity).__name__}")


class DerivedStore:
    """One worker's handle on the derived entries of a cache.

    ``file_key`` is the file version's `object_key` (a replaced file gets another, and
    its old entries go when a loader opens the cache); ``identity`` says what derived
    the result (a filter's canonical text, a group index spec, a transform's identity).
    Its full bytes are stored in the entry and compared on read, so two identities whose
    hashes collide are two misses, not a wrong hit. Arrays returned by `get` are
    read-only views of a private copy of the entry: they own their memory and hold no
    file or mapping.
    """

    def __init__(self, cfg: CacheConfig) -> None:
        self.cfg = cfg
        self.store = _Store(cfg.root)
        self._writer = _Writer(cfg, self.store, tag="derived")
        self.hits = 0
        self.misses = 0

    @property
    def writes_on(self) -> bool:
        """False once a write failed (disk full, read-only): this handle writes no more."""
        return self._writer.writes_on

    def path(self, file_key: str, rg: int, identity: str | bytes) -> str:
        """Where the entry lives (tests and tools)."""
        return os.path.join(self.store.objects, file_key, _derived_name(rg, _identity(identity)))

    def get(self, file_key: str, rg: int, identity: str | bytes) -> dict[str, Column] | None:
        """The arrays put for (file version, row group, identity), or None (a miss)."""
        ident = _identity(identity)
        name = _derived_name(rg, ident)
        path = os.path.join(self.store.objects, file_key, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError:
            self.misses += 1
            return None  # unreadable (EIO, permissions): derive it again
        try:
            out = _decode(data, f"{file_key}/{name}", ident)
        except _Corrupt as exc:
            self.store.discard(path)
            _warn_once(self.cfg, "corrupt-derived",
                       f"derived cache entry {path} (row group {rg}) is damaged ({exc}); it was discarded "
                       "and the result derived again. Further damaged derived entries are handled the same "
                       "way without another warning.")
            self.misses += 1
            return None
        self.hits += 1
        return out

    def put(self, file_key: str, rg: int, identity: str | bytes, arrays: Mapping[str, Column]) -> None:
        """Store ``arrays`` (NumPy arrays or `Ragged`, no objects) unless the entry exists; like
        a row group's, it is not written when it would pass ``Cache.limit``."""
        ident = _identity(identity)
        cols = list(arrays.items())
        for k, a in cols:
            for part in _arrays(a):
                if not isinstance(part, np.ndarray) or part.dtype.hasobject:
                    raise TypeError(f"a derived entry holds NumPy arrays without objects; {k!r} is "
                                    f"{type(part).__name__}{' of objects' if isinstance(part, np.ndarray) else ''}")
        name = _derived_name(rg, ident)
        self._writer.put(os.path.join(self.store.objects, file_key, name),
                         lambda: _serialize(f"{file_key}/{name}", cols, {"derived": ident.hex()}))

    def get_bytes(self, file_key: str, rg: int, identity: str | bytes) -> bytes | None:
        """The bytes `put_bytes` stored, or None."""
        got = self.get(file_key, rg, identity)
        a = None if got is None else got.get(_BYTES)
        return None if not isinstance(a, np.ndarray) else a.tobytes()

    def put_bytes(self, file_key: str, rg: int, identity: str | bytes, payload: bytes) -> None:
        self.put(file_key, rg, identity, {_BYTES: np.frombuffer(bytes(payload), dtype=np.uint8)})


def _arrays(col: Column | object) -> list[object]:
    """A column's arrays: a Ragged's offsets and values (its strings' for a list of strings)."""
    if isinstance(col, Ragged):
        return [col.offsets, *_arrays(col.values)]
    return [col]


def _decode(data: bytes, key: str, ident: bytes) -> dict[str, Column]:
    """The arrays of a derived entry file's bytes, checksum verified; _Corrupt if damaged."""
    if len(data) < _PREFIX.size:
        raise _Corrupt(f"{len(data)} bytes, shorter than the entry prefix")
    buf = np.frombuffer(data, dtype=np.uint8)
    hlen, digest = _prefix(buf)
    _verify(buf, digest)
    header, cols, _ = _parse(buf, hlen, key)
    if header.get("derived") != ident.hex():
        raise _Corrupt("entry holds another identity")  # the 64-bit name hash collided
    return dict(cols)
