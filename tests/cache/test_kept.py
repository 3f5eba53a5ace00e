"""Mapped entries: read-only views, and a closed KeptMappings table keeps nothing."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _sample import OBJ, RG, sample  # noqa: E402

from detload._cache import KeptMappings, RowGroupCache, open_cache  # noqa: E402
from detload._cache.entry import _entry, _load  # noqa: E402
from detload._cache.mapping import _map  # noqa: E402


@pytest.fixture
def entry_path(tmp_path):
    specs, fill, cols = sample()
    rgc = RowGroupCache(open_cache(tmp_path / "cache", None, [OBJ]), specs, fill)
    rgc.put(OBJ, RG, cols, "sample")
    return rgc._path(OBJ, RG)


def test_kept_entries_are_read_only(entry_path):
    cols = _load(entry_path, None)
    assert any(hasattr(c, "offsets") for c in cols.values()) and cols.runs
    for c in cols.values():
        for a in (c.values, c.offsets) if hasattr(c, "offsets") else (c,):
            assert not a.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                a[:1] = 0
            with pytest.raises(ValueError):  # and cannot be made writable (a write would crash)
                a.flags.writeable = True
            with pytest.raises(ValueError):
                a.base.flags.writeable = True


def test_a_closed_table_keeps_nothing(entry_path):
    """A thread worker may outlive the pool's close() by a moment: what it offers then is not kept."""
    m = _map(entry_path)
    kept = _entry(m, None, defer=False)
    table = KeptMappings(10**9)
    table.offer(entry_path, kept)
    assert len(table) == 1 and table.nbytes == m.size
    table.close()
    table.offer(entry_path, kept)
    assert len(table) == 0 and table.nbytes == 0
