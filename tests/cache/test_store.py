"""The locked store: the recount counts each entry's bytes once."""

from __future__ import annotations

import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _sample import OBJ, RG, sample  # noqa: E402

from detload._cache import RowGroupCache, cache_info, open_cache  # noqa: E402
from detload._cache.store import _Store  # noqa: E402


def test_recount_counts_an_entry_once_while_its_temp_name_still_exists(tmp_path):
    """A writer links its temp file to the entry's name and then removes the temp name,
    without the lock: a loader starting in between recounts those bytes once, not twice."""
    cache = tmp_path / "cache"
    specs, fill, cols = sample()
    rgc = RowGroupCache(open_cache(cache, None, [OBJ]), specs, fill)
    rgc.put(OBJ, RG, cols, "sample")
    total = cache_info(cache)["bytes"]
    assert total == os.path.getsize(rgc._path(OBJ, RG))
    store = _Store(str(cache / "v1"))
    os.link(rgc._path(OBJ, RG), os.path.join(store.tmp, f"{socket.gethostname()}-{os.getpid()}-0000abcd.tmp"))
    with store.locked():
        assert store.rescan() == total
    assert cache_info(cache)["usage_counter"] == total
