"""The entry format does not drift: an entry written by the code before the cache became a
subpackage (tests/cache/data, made by ``_sample.py`` at that commit) is read back, and the
same columns are written today to the same bytes."""

from __future__ import annotations

import os
import shutil
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _sample import OBJ, RG, sample  # noqa: E402

from detload._cache import CacheConfig, RowGroupCache, cache_info, open_cache  # noqa: E402
from detload._types import Ragged  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")
OLD = next(f for f in os.listdir(DATA) if f.endswith(".dlc"))


@pytest.fixture
def opened(tmp_path):
    """(config, cache, the sample's columns); the cache is closed after the test, which lets go
    of its kept mappings (they count towards a per-process cap other tests check)."""
    cfg = open_cache(tmp_path / "c", None, [OBJ])
    assert cfg is not None
    specs, fill, cols = sample()
    cache = RowGroupCache(cfg, specs, fill)
    yield cfg, cache, cols
    cache.close()


def _equal(a, b):
    if isinstance(a, Ragged):
        return isinstance(b, Ragged) and a.kind == b.kind and _equal(a.values, b.values) \
            and _equal(a.offsets, b.offsets)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_an_entry_written_by_the_old_layout_is_read(tmp_path, opened):
    cfg, cache, cols = opened
    assert os.path.basename(cache._path(OBJ, RG)) == OLD  # the columns still hash to its name
    os.makedirs(os.path.dirname(cache._path(OBJ, RG)))
    shutil.copy(os.path.join(DATA, OLD), cache._path(OBJ, RG))
    got = cache.get(OBJ, RG, "sample", rows=5)
    assert got is not None and cache.hits == 1
    assert set(got) == set(cols) and all(_equal(got[k], cols[k]) for k in cols)
    assert set(got.runs) == {"x", "y"}  # the two float32 columns still form one run
    assert cache_info(tmp_path / "c", verify=True)["corrupt"] == []


def test_the_same_columns_are_written_to_the_same_bytes(tmp_path, opened):
    cfg, cache, cols = opened
    cache.put(OBJ, RG, cols, "sample")
    with open(cache._path(OBJ, RG), "rb") as f, open(os.path.join(DATA, OLD), "rb") as g:
        assert f.read() == g.read()
    assert isinstance(cfg, CacheConfig) and cache_info(tmp_path / "c")["usage_counter"] == os.path.getsize(
        cache._path(OBJ, RG))


def test_an_entry_with_runs_is_checked_against_the_plans_row_count(opened):
    """The row-count check once read the count of the entry's last run of same-typed columns
    instead of the plan's, so an entry with such a run was never found short."""
    cfg, cache, cols = opened
    cache.put(OBJ, RG, cols, "sample")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get(OBJ, RG, "sample", rows=6) is None
    assert any("its column 'id' holds 5 rows, the row group 6" in str(w.message) for w in caught)
    assert not os.path.exists(cache._path(OBJ, RG))  # discarded, to be read from the source again
