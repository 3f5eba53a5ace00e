"""A row-group entry read back as columns: its mapping checked and parsed into views (`_Entry`),
and the checksum verified at once or as a block copies the columns (`PendingCheck`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import xxhash

from .._types import UnitColumns
from .format import _PREFIX, _parse, _prefix, _verify
from .mapping import _map, _Mapping


class PendingCheck:
    """An entry's checksum, verified in file order as the block reads its columns.

    Reading a warm entry's 3 MB twice from memory (once to hash it, once to copy
    it into the block) cost a sixth of a warm block's time. With a pending check
    the block hashes each group of columns just before it copies them, so the copy
    reads them from the CPU cache, and `finish` must pass before the block is handed over;
    if it fails the block is rebuilt from the source (see _worker._produce).
    """

    def __init__(self, buf: np.ndarray, digest: bytes, size: int, ends: dict[str, int], path: str) -> None:
        self._buf = buf
        self._digest = digest
        self._size = size
        self._pos = _PREFIX.size
        self._h = xxhash.xxh3_128()
        self.ends = ends  # column name -> where its bytes end in the entry
        self.path = path

    def upto(self, end: int) -> None:
        """Hash the entry's bytes up to ``end`` (no-op for what was hashed already)."""
        if end > self._pos:
            self._h.update(self._buf[self._pos : end].data)
            self._pos = end

    def finish(self) -> bool:
        self.upto(self._size)
        return self._h.digest() == self._digest


class _Entry(NamedTuple):
    """A mapped entry with its parsed header and column views (what KeptMappings keeps)."""

    mapping: _Mapping
    hlen: int
    digest: bytes
    cols: UnitColumns
    ends: dict[str, int]


def _entry(mapping: _Mapping, expect: str | None, defer: bool, kept: _Entry | None = None,
           rows: int | None = None, verify: bool = True) -> _Entry:
    """Check the prefix (re-read on every use: the checksum does not cover it) and, unless
    ``defer``, the checksum; then parse the header, or reuse ``kept`` (an earlier parse of
    this mapping, whose row count was checked then) if the prefix is still the one it was
    parsed from."""
    hlen, digest = _prefix(mapping.buf)
    if not defer and verify:  # (verify: False only for a scratch cache written without checksums)
        _verify(mapping.buf, digest)
    if kept is not None and hlen == kept.hlen and digest == kept.digest:
        return kept
    # First mapped, or another entry written into the same file: parse it.
    _, cols, ends = _parse(mapping.buf, hlen, expect, rows)
    return _Entry(mapping, hlen, digest, cols, ends)


def _checked(entry: _Entry, path: str, defer: bool) -> UnitColumns:
    """The entry's columns for one read: verified already, or (``defer``) carrying a `PendingCheck`."""
    cols = entry.cols
    out = UnitColumns(cols)
    out.runs = cols.runs
    if defer:
        m = entry.mapping
        out.check = PendingCheck(m.buf, entry.digest, m.size, entry.ends, path)
    return out


def _load(path: str, expect: str | None, *, defer: bool = False, verify: bool = True) -> UnitColumns | None:
    """The columns of an entry, memory-mapped; None if missing; raises _Corrupt if damaged.

    With ``defer`` the checksum is not computed here: the result carries a
    `PendingCheck` as ``.check``, which the caller must finish before using
    anything built from the columns. ``verify`` False: an entry written without a
    checksum (a spilled window's columns beside its file, _engine/spill.py).
    """
    mapping = _map(path)
    if mapping is None:
        return None
    return _checked(_entry(mapping, expect, defer, verify=verify), path, defer)
