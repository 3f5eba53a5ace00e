"""Derived entries: small per-row-group results keyed by a file version and the identity of
what derived them, under the same counter, limit, eviction and atomic writes as row groups."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pyarrow.fs as pafs
import pytest

from detload._cache import CacheWarning, DerivedStore, cache_info, clear_cache, object_key, open_cache
from detload._types import Ragged

KEY = "0123456789abcdef/fedcba9876543210"
SEL = "filter: x > 3"  # a filter's canonical text, say


def _open(tmp_path, limit=None, objects=(KEY,), **kw):
    cfg = open_cache(tmp_path / "c", limit, list(objects), **kw)
    assert cfg is not None
    return DerivedStore(cfg)


def _arrays(n=100):
    return {"mask": np.arange(n) % 3 == 0, "rows": np.arange(0, n, 3, dtype=np.int64),
            "grid": np.arange(2 * n, dtype=np.float32).reshape(n, 2),
            "groups": Ragged(np.arange(10, dtype=np.int32), np.array([0, 4, 4, 10]), "list")}


def _same(a, b):
    assert set(a) == set(b)
    for k in a:
        if isinstance(a[k], Ragged):
            assert isinstance(b[k], Ragged) and a[k].kind == b[k].kind
            assert np.array_equal(a[k].values, b[k].values) and np.array_equal(a[k].offsets, b[k].offsets)
        else:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])


def _usage(tmp_path):
    info = cache_info(tmp_path / "c")
    return info["usage_counter"], info["bytes"], info["entries"]


def test_hit_after_put(tmp_path):
    d = _open(tmp_path)
    assert d.get(KEY, 4, SEL) is None
    d.put(KEY, 4, SEL, _arrays())
    got = _open(tmp_path).get(KEY, 4, SEL)  # another handle: it is on disk
    assert got is not None
    _same(got, _arrays())
    assert not got["mask"].flags.writeable
    d.put_bytes(KEY, 4, b"\x00index v1", b"some bytes")
    assert d.get_bytes(KEY, 4, b"\x00index v1") == b"some bytes"
    d.put_bytes(KEY, 5, "empty", b"")
    assert d.get_bytes(KEY, 5, "empty") == b""
    assert (d.hits, d.misses) == (2, 1)
    used, on_disk, n = _usage(tmp_path)
    assert used == on_disk > 0 and n == 3


def test_miss_on_another_identity_or_row_group(tmp_path):
    d = _open(tmp_path)
    d.put(KEY, 4, SEL, _arrays())
    assert d.get(KEY, 4, "filter: x > 4") is None
    assert d.get(KEY, 5, SEL) is None
    assert d.get(KEY, 4, SEL.encode()) is not None  # text is its UTF-8 bytes
    assert cache_info(tmp_path / "c")["entries"] == 1


def test_miss_after_the_file_changes(tmp_path):
    src = tmp_path / "f.parquet"
    src.write_bytes(b"one version")
    fs = pafs.LocalFileSystem()

    def key():
        st = os.stat(src)
        return object_key(fs, str(src), st.st_size, st.st_mtime_ns, None)

    old = key()
    _open(tmp_path, objects=[old]).put(old, 0, SEL, _arrays())
    src.write_bytes(b"another, longer version")
    new = key()
    assert new != old and new.split("/")[0] == old.split("/")[0]
    d = _open(tmp_path, objects=[new])  # a loader over the new version evicts the old one's entries
    assert d.get(new, 0, SEL) is None
    assert cache_info(tmp_path / "c")["entries"] == 0 and _usage(tmp_path)[0] == 0


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


@pytest.mark.parametrize("damage", ["payload", "header", "magic", "truncated", "short", "grown"])
def test_a_damaged_entry_is_a_miss_and_is_removed(tmp_path, damage):
    d = _open(tmp_path)
    d.put(KEY, 4, SEL, _arrays())
    d.put(KEY, 5, SEL, _arrays())  # undamaged: stays
    path = d.path(KEY, 4, SEL)
    size = os.path.getsize(path)
    if damage == "payload":
        _flip(path, size - 70)
    elif damage == "header":
        _flip(path, 40)
    elif damage == "magic":
        _flip(path, 0)
    elif damage in ("truncated", "short"):
        os.truncate(path, size // 2 if damage == "truncated" else 10)
    else:
        with open(path, "ab") as f:
            f.write(b"\0" * 64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert d.get(KEY, 4, SEL) is None
        assert d.get(KEY, 4, SEL) is None  # gone: a plain miss, no second warning
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and f"derived cache entry {path} (row group 4) is damaged" in ours[0]
    assert not os.path.exists(path) and (d.hits, d.misses) == (0, 2)
    used, on_disk, n = _usage(tmp_path)
    assert n == 1 and on_disk == os.path.getsize(d.path(KEY, 5, SEL))
    # Uncounted as the size it was found at (like a damaged row-group entry); a resized one
    # leaves the counter off by the difference until the next loader recounts.
    assert used == on_disk or damage in ("truncated", "short", "grown")
    d = _open(tmp_path)
    assert _usage(tmp_path)[0] == on_disk
    d.put(KEY, 4, SEL, _arrays())  # derived again
    _same(d.get(KEY, 4, SEL), _arrays())


def test_colliding_identity_hashes_are_misses_not_wrong_data(tmp_path, monkeypatch):
    from detload._cache import derived

    monkeypatch.setattr(derived, "_derived_name", lambda rg, ident: f"rg{rg:06d}-dcollide.dlc")
    d = _open(tmp_path)
    d.put_bytes(KEY, 0, "a", b"what a derived")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert d.get_bytes(KEY, 0, "b") is None
    assert d.get_bytes(KEY, 0, "a") is None  # the colliding entry was dropped; never returned for "b"


def test_counted_against_the_limit_like_row_groups(tmp_path):
    d = _open(tmp_path, limit=10_000)
    payload = bytes(2000)
    for rg in range(10):
        d.put_bytes(KEY, rg, SEL, payload)
    used, on_disk, n = _usage(tmp_path)
    assert 0 < n < 10 and used == on_disk <= 10_000  # the first ones stay, the rest are not written
    kept = [rg for rg in range(10) if d.get_bytes(KEY, rg, SEL) is not None]
    assert kept == list(range(n))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d.put_bytes(KEY, 99, SEL, bytes(20_000))
        d.put_bytes(KEY, 98, SEL, bytes(20_000))
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "Cache.limit (10,000 bytes) is smaller than a derived cache entry" in ours[0]
    assert clear_cache(tmp_path / "c") == on_disk
    assert _usage(tmp_path) == (0, 0, 0)


def test_a_failed_write_stops_writing_and_warns_once(tmp_path):
    d = _open(tmp_path, fail_after_bytes=3000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rg in range(5):
            d.put_bytes(KEY, rg, SEL, bytes(1000))
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "is full" in ours[0] and not d.writes_on
    assert 0 < cache_info(tmp_path / "c")["entries"] < 5


def test_concurrent_threads_writing_one_entry_leave_one_valid_entry(tmp_path):
    d = [_open(tmp_path) for _ in range(8)]
    start = threading.Barrier(len(d))

    def write(h):
        start.wait()
        h.put(KEY, 1, SEL, _arrays(5000))

    threads = [threading.Thread(target=write, args=(h,)) for h in d]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    used, on_disk, n = _usage(tmp_path)
    assert n == 1 and used == on_disk == os.path.getsize(d[0].path(KEY, 1, SEL))
    assert os.listdir(tmp_path / "c" / "v1" / "tmp") == []
    _same(d[0].get(KEY, 1, SEL), _arrays(5000))


_WRITER = """
import sys, time
import numpy as np
from detload._cache import DerivedStore, open_cache
cfg = open_cache(sys.argv[1], None, [sys.argv[2]])
d = DerivedStore(cfg)
payload = np.arange(200_000, dtype=np.int64).tobytes()
while time.time() < float(sys.argv[3]):
    pass
for rg in range(20):
    d.put_bytes(sys.argv[2], rg, "same", payload)
"""


def test_concurrent_processes_writing_the_same_entries_leave_valid_ones(tmp_path):
    import time

    cache = str(tmp_path / "c")
    go = str(time.time() + 2.0)  # both start writing together
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, cache, KEY, go], env=env) for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    d = _open(tmp_path)
    want = np.arange(200_000, dtype=np.int64).tobytes()
    assert all(d.get_bytes(KEY, rg, "same") == want for rg in range(20))
    used, on_disk, n = _usage(tmp_path)
    assert n == 20 and used == on_disk
    assert os.listdir(tmp_path / "c" / "v1" / "tmp") == []


def test_what_a_derived_entry_holds_is_checked(tmp_path):
    d = _open(tmp_path)
    with pytest.raises(TypeError, match="a derived entry's identity must be str or bytes, got int"):
        d.get(KEY, 0, 7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a derived entry holds NumPy arrays without objects; 'x' is ndarray of objects"):
        d.put(KEY, 0, SEL, {"x": np.array(["a", None], dtype=object)})
    with pytest.raises(TypeError, match="'y' is list"):
        d.put(KEY, 0, SEL, {"y": [1, 2]})  # type: ignore[dict-item]
    assert cache_info(tmp_path / "c")["entries"] == 0


def test_derived_and_row_group_entries_share_a_folder(tmp_path):
    """A derived entry sits beside its row group's entry, and neither is read as the other."""
    sys.path.insert(0, os.path.dirname(__file__))
    from _sample import RG, sample

    from detload._cache import RowGroupCache

    d = _open(tmp_path)
    specs, fill, cols = sample()
    rgc = RowGroupCache(d.cfg, specs, fill)
    d.put(KEY, RG, SEL, _arrays())
    assert rgc.get(KEY, RG, "sample") is None
    rgc.put(KEY, RG, cols, "sample")
    assert rgc.get(KEY, RG, "sample") is not None
    rgc.close()  # its kept mapping counts towards the process's cap
    _same(d.get(KEY, RG, SEL), _arrays())
    assert os.path.dirname(rgc._path(KEY, RG)) == os.path.dirname(d.path(KEY, RG, SEL))
    assert cache_info(tmp_path / "c", verify=True)["corrupt"] == []
