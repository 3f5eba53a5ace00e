"""The row-group cache on local sources: determinism across cache states, integrity, limits, disk full.

Every run is compared with an uncached reference through `detload.verify.verify`,
so "the same bytes" means the same manifest, step by step.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _s3server import write_sample_dataset  # noqa: E402
from testhooks import hooked  # noqa: E402

import detload
from detload import CacheWarning, Loader, OptionError  # noqa: E402
from detload._cache import cache_info  # noqa: E402
from detload.cli import main as cli_main  # noqa: E402
from detload.verify import verify  # noqa: E402

FILES = {"a.parquet": [300, 200, 157], "b.parquet": [250, 250], "sub/c.parquet": [211]}
OPTS = dict(batch_size=128, seed=7, order="windowed", shuffle_window=2)


@pytest.fixture
def data(tmp_path):
    return write_sample_dataset(tmp_path / "data", FILES)


def run(source, manifest, *, epochs=2, **kw):
    """Iterate ``epochs`` epochs, writing a manifest; returns the loader's cache config."""
    opts = {**OPTS, **kw}
    with Loader(source, manifest=str(manifest), **opts) as loader:
        for e in range(epochs):
            loader.set_epoch(e)
            for _ in loader:
                pass
        return loader.cache


def same(a, b):
    res = verify(str(a), str(b))
    assert res.identical, res.message


def entries(cache_dir):
    out = {}
    for dirpath, _, names in os.walk(os.path.join(cache_dir, "v1", "objects")):
        for n in names:
            p = os.path.join(dirpath, n)
            st = os.stat(p)
            out[os.path.relpath(p, cache_dir)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


@pytest.mark.parametrize("pool,workers", [("thread", 1), ("thread", 3), ("process", 2)])
def test_cold_warm_and_uncached_runs_yield_identical_manifests(data, tmp_path, pool, workers):
    ref = tmp_path / "ref.jsonl"
    run(data, ref)
    cache = tmp_path / "cache"
    run(data, tmp_path / "cold.jsonl", cache=cache, pool=pool, workers=workers)
    info = cache_info(cache, verify=True)
    assert info["entries"] == 6 and info["corrupt"] == []
    assert info["usage_counter"] == info["bytes"]
    before = entries(cache)
    run(data, tmp_path / "warm.jsonl", cache=cache, pool=pool, workers=workers % 3 + 1)
    same(ref, tmp_path / "cold.jsonl")
    same(ref, tmp_path / "warm.jsonl")
    assert entries(cache) == before  # a warm run rewrites nothing


class CountingFS:
    """A local filesystem (fsspec, wrapped for pyarrow) that counts files opened for reading."""

    def __init__(self):
        import fsspec

        counter = self.opened = []

        class Local(type(fsspec.filesystem("file"))):
            def _open(self, path, mode="rb", **kw):
                counter.append(path)
                return super()._open(path, mode=mode, **kw)

        self.fs = Local(skip_instance_cache=True)


def test_warm_epochs_read_nothing_from_the_source(data, tmp_path):
    counting = CountingFS()
    cache = tmp_path / "cache"
    with Loader(data, storage=counting.fs, cache=cache, **OPTS) as loader:
        for _ in loader:  # epoch 0: cold
            pass
        counting.opened.clear()
        for e in (1, 2):
            loader.set_epoch(e)
            for _ in loader:
                pass
    assert counting.opened == []


def test_partly_evicted_cache_gives_the_same_manifest(data, tmp_path):
    ref = tmp_path / "ref.jsonl"
    run(data, ref)
    cache = tmp_path / "cache"
    run(data, tmp_path / "cold.jsonl", cache=cache, workers=2)
    for i, path in enumerate(sorted(entries(cache))):
        if i % 2:
            os.unlink(os.path.join(cache, path))
    run(data, tmp_path / "partial.jsonl", cache=cache, workers=2, pool="process")
    same(ref, tmp_path / "partial.jsonl")
    assert cache_info(cache)["entries"] == 6


def _flip(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_entries_are_detected_refetched_and_warned_once(data, tmp_path, pool, capsys):
    """With process workers too the warning is a Python warning in the consumer's process,
    where filters and ``pytest.warns`` see it, not text on a worker's stderr."""
    ref = tmp_path / "ref.jsonl"
    run(data, ref)
    cache = tmp_path / "cache"
    run(data, tmp_path / "cold.jsonl", cache=cache)
    paths = sorted(entries(cache))
    for p in paths[:2]:  # two damaged entries, one warning
        full = os.path.join(cache, p)
        _flip(full, os.path.getsize(full) // 2)
    with open(os.path.join(cache, paths[2]), "r+b") as f:  # and one torn (truncated) entry
        f.truncate(100)
    assert len(cache_info(cache, verify=True)["corrupt"]) == 3
    if pool == "thread":
        assert cli_main(["cache", "info", str(cache), "--verify"]) == 1  # damage found: exit 1
        assert "checksums: 3 damaged" in capsys.readouterr().out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(data, tmp_path / "fixed.jsonl", cache=cache, workers=3, pool=pool)
    ours = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    msg = str(ours[0].message)
    assert "damaged" in msg and "row group" in msg and "read again" in msg
    same(ref, tmp_path / "fixed.jsonl")
    info = cache_info(cache, verify=True)
    assert info["corrupt"] == [] and info["entries"] == 6
    assert info["usage_counter"] == info["bytes"]
    if pool == "thread":
        assert cli_main(["cache", "info", str(cache), "--verify"]) == 0
        assert "checksums: all good" in capsys.readouterr().out


def test_cache_limit_keeps_what_was_cached_first(data, tmp_path):
    ref = tmp_path / "ref.jsonl"
    run(data, ref, epochs=3)
    cache = tmp_path / "probe"
    run(data, tmp_path / "probe.jsonl", cache=cache, epochs=1)
    sizes = sorted(s for _, _, s in entries(cache).values())
    limit = sum(sizes[:3]) + 10  # room for about half of the six entries
    cache = tmp_path / "cache"
    with Loader(data, cache=detload.Cache(cache, limit=limit), manifest=str(tmp_path / "limited.jsonl"), **OPTS) as loader:
        for _ in loader:
            pass
        first = entries(cache)
        assert 0 < len(first) < 6 and sum(s for _, _, s in first.values()) <= limit
        for e in (1, 2):
            loader.set_epoch(e)
            for _ in loader:
                pass
    assert entries(cache) == first  # nothing evicted, nothing rewritten: no thrash
    same(ref, tmp_path / "limited.jsonl")
    assert cache_info(cache)["usage_counter"] <= limit


def test_replaced_local_file_is_not_served_stale_and_its_entries_go(tmp_path):
    data = write_sample_dataset(tmp_path / "data", FILES, compression="none")
    cache = tmp_path / "cache"
    run(data, tmp_path / "v1.jsonl", cache=cache)
    old = set(entries(cache))
    target = os.path.join(data, "a.parquet")
    size, mtime = os.path.getsize(target), os.stat(target).st_mtime_ns
    write_sample_dataset(tmp_path / "other", {"a.parquet": FILES["a.parquet"]}, seed=99, compression="none")
    shutil.copyfile(tmp_path / "other" / "a.parquet", target)
    assert os.path.getsize(target) == size  # same size: only the mtime tells the versions apart
    os.utime(target, ns=(mtime + 1, mtime + 1))
    run(data, tmp_path / "ref2.jsonl")
    run(data, tmp_path / "v2.jsonl", cache=cache)
    same(tmp_path / "ref2.jsonl", tmp_path / "v2.jsonl")
    assert not verify(str(tmp_path / "v1.jsonl"), str(tmp_path / "v2.jsonl")).identical
    now = set(entries(cache))
    assert len(now) == 6 and len(old - now) == 3  # a.parquet's three old entries were evicted


def test_entries_depend_on_columns_and_null_fill(data, tmp_path):
    cache = tmp_path / "cache"
    for i, kw in enumerate([dict(columns=["id", "x"]), dict(columns=["x", "s"]), dict(columns=["x"], null_fill={"x": 0.5})]):
        run(data, tmp_path / f"ref{i}.jsonl", epochs=1, **kw)
        run(data, tmp_path / f"c{i}.jsonl", epochs=1, cache=cache, **kw)
        same(tmp_path / f"ref{i}.jsonl", tmp_path / f"c{i}.jsonl")
    assert cache_info(cache)["entries"] == 18


def test_hive_partition_columns_with_the_cache(tmp_path):
    data = write_sample_dataset(tmp_path / "data", {"day=1/a.parquet": [100, 80], "day=2/b.parquet": [90]})
    run(data, tmp_path / "ref.jsonl")
    run(data, tmp_path / "cold.jsonl", cache=tmp_path / "cache")
    run(data, tmp_path / "warm.jsonl", cache=tmp_path / "cache", columns=["x", "day"])
    run(data, tmp_path / "ref2.jsonl", columns=["x", "day"])
    same(tmp_path / "ref.jsonl", tmp_path / "cold.jsonl")
    same(tmp_path / "ref2.jsonl", tmp_path / "warm.jsonl")
    run(data, tmp_path / "only.jsonl", cache=tmp_path / "cache", columns=["day"])


def test_disk_full_goes_on_uncached_with_one_warning(data, tmp_path):
    run(data, tmp_path / "ref.jsonl")
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Test hook: every worker acts as if the disk filled up after its first entry.
        hooked(run, data, tmp_path / "full.jsonl", cache=cache, workers=3, cache_fail_after_bytes=1)
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "is full" in ours[0] and "without writing" in ours[0], ours
    same(tmp_path / "ref.jsonl", tmp_path / "full.jsonl")
    assert cache_info(cache)["entries"] == 0


_TINY_FS_SCRIPT = """
import sys, warnings
sys.path.insert(0, {tests!r})
from detload import Loader
from detload._cache import CacheWarning
def main():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Loader({data!r}, cache={cache!r}, manifest={manifest!r}, workers=2, pool="process",
                    **{opts!r}) as loader:
            for e in range(2):
                loader.set_epoch(e)
                for _ in loader:
                    pass
    print("WARNINGS", sum(issubclass(w.category, CacheWarning) for w in caught))
    for w in caught:
        print("W", w.message)
if __name__ == "__main__":
    main()
"""


def test_tiny_filesystem_goes_on_uncached(data, tmp_path):
    """A real full disk: a 64 KiB tmpfs mounted in a private mount namespace (needs root).

    Process workers hand their warnings to the consumer's process; across the parent and both
    workers the warning must appear exactly once, and as a Python warning there.
    """
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare to mount a tiny tmpfs")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mnt}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
    run(data, tmp_path / "ref.jsonl")
    script = tmp_path / "tiny.py"
    script.write_text(_TINY_FS_SCRIPT.format(tests=os.path.dirname(__file__), data=data, cache=str(mnt / "cache"),
                                             manifest=str(tmp_path / "tiny.jsonl"), opts=OPTS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(["unshare", "-m", "sh", "-c",
                          f"mount -t tmpfs -o size=64k tmpfs {mnt} && exec {sys.executable} {script}"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    shown = res.stdout.count("is full") + res.stderr.count("is full")
    assert shown == 1, res.stdout + res.stderr[-2000:]
    assert "WARNINGS 1" in res.stdout, res.stdout + res.stderr[-2000:]  # caught in the parent
    same(tmp_path / "ref.jsonl", tmp_path / "tiny.jsonl")


def test_unusable_cache_dir_warns_and_loads_uncached(data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    run(data, tmp_path / "ref.jsonl", epochs=1)
    with pytest.warns(CacheWarning, match=r"^Cache.dir '.*' cannot be used \(.*\); loading without a cache$"):
        run(data, tmp_path / "x.jsonl", epochs=1, cache=blocker / "cache")
    same(tmp_path / "ref.jsonl", tmp_path / "x.jsonl")


def test_two_loaders_sharing_a_cache_dir(data, tmp_path):
    run(data, tmp_path / "ref.jsonl")
    cache = tmp_path / "cache"
    errors = []

    def one(i):
        try:
            run(data, tmp_path / f"shared{i}.jsonl", cache=cache, workers=2, pool="process" if i else "thread")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(2):
        same(tmp_path / "ref.jsonl", tmp_path / f"shared{i}.jsonl")
    info = cache_info(cache, verify=True)
    assert info["entries"] == 6 and info["corrupt"] == [] and info["temp_files"] == 0
    assert info["usage_counter"] == info["bytes"]


def test_entry_format_is_self_describing(data, tmp_path):
    """An entry can be read with json, numpy and xxhash alone, as docs/remote.md describes."""
    cache = tmp_path / "cache"
    run(data, tmp_path / "c.jsonl", cache=cache, epochs=1, columns=["id", "s", "emb"], shuffle=False)
    found = []
    for rel in sorted(entries(cache)):
        with open(os.path.join(cache, rel), "rb") as f:
            raw = f.read()
        assert raw[:8] == b"DLCACHE1"
        hlen = int.from_bytes(raw[8:16], "little")
        assert xxhash.xxh3_128_digest(raw[32:]) == raw[16:32]
        header = json.loads(raw[32:32 + hlen])
        cols = {c["name"]: c for c in header["columns"]}
        off, dtype, shape = cols["id"]["data"]
        assert off % 64 == 0
        ids = np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape)), offset=off)
        if ids[0] == 0:
            found.append((len(ids), cols))
    assert len(found) == 1
    n, cols = found[0]
    assert n == 300  # a.parquet, row group 0
    assert cols["s"]["kind"] == "ragged" and cols["emb"]["data"][2] == [300, 4]


def test_cache_options_are_checked(data, tmp_path):
    # The old flat keywords' own messages ("cache_limit needs cache_dir") are in test_compat.py.
    c = tmp_path / "c"
    with pytest.raises(OptionError, match=r"^Cache.limit 'lots' is not a size"):
        Loader(data, cache=detload.Cache(c, limit="lots"), **OPTS)
    with pytest.raises(OptionError, match=r"^Cache.limit must be positive, got 0$"):
        Loader(data, cache=detload.Cache(c, limit=0), **OPTS)
    with pytest.raises(OptionError, match=r"^Cache.map_limit 'lots' is not a size"):
        Loader(data, cache=detload.Cache(c, map_limit="lots"), **OPTS)
    with pytest.raises(OptionError, match=r"^Cache.map_limit must be 0 or more, got -1$"):
        Loader(data, cache=detload.Cache(c, map_limit=-1), **OPTS)
    for bad in (True, 1.5, [1]):
        with pytest.raises(OptionError, match="^Cache.map_limit must be .*a size such as '20GiB'.*'auto' \\(the default\\) is also accepted"):
            Loader(data, cache=detload.Cache(c, map_limit=bad), **OPTS)
    for bad in ("", "  ", b"/tmp/x", 123):
        with pytest.raises(OptionError, match="^Cache.dir must"):
            Loader(data, cache=detload.Cache(bad), **OPTS)
    f = tmp_path / "f"
    f.write_text("")
    # Refused where it is given: the group at its construction, the shorthand by the Loader,
    # each naming what was typed.
    with pytest.raises(OptionError, match=f"^Cache.dir '{f}' exists and is not a directory$"):
        detload.Cache(f)
    with pytest.raises(OptionError, match=f"^cache '{f}' exists and is not a directory$"):
        Loader(data, cache=f, **OPTS)
    # A file put there after the group was made is still refused when the loader opens it.
    later = tmp_path / "later"
    group = detload.Cache(later)
    later.write_text("")
    with pytest.raises(OptionError, match=f"^Cache.dir '{later}' exists and is not a directory$"):
        Loader(data, cache=group, **OPTS)


def test_cli_cache_info_and_clear(data, tmp_path, capsys):
    cache = tmp_path / "cache"
    run(data, tmp_path / "c.jsonl", cache=cache, epochs=1)
    assert cli_main(["cache", "info", str(cache), "--json", "--verify"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 6 and info["corrupt"] == []
    assert cli_main(["cache", "info", str(cache)]) == 0
    assert "6 entries" in capsys.readouterr().out
    assert cli_main(["cache", "clear", str(cache)]) == 0
    assert "freed" in capsys.readouterr().out
    assert cache_info(cache)["entries"] == 0
    assert cli_main(["cache", "clear", str(tmp_path)]) == 2
    assert "not a detload cache directory" in capsys.readouterr().err
    assert cli_main(["cache", "info", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    for cmd in ("info", "clear"):
        assert cli_main(["cache", cmd, str(tmp_path / "afile")]) == 2
        assert f"{str(tmp_path / 'afile')!r} is a file, not a cache directory" in capsys.readouterr().err


def _write_runs(src) -> None:
    """Two files whose columns form runs of one type: id, d0..d4 (float32), c0..c2 (int64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src.mkdir()
    rng = np.random.default_rng(5)
    for f, n in enumerate([1000, 777]):
        cols = {"id": np.arange(f * 1000, f * 1000 + n, dtype=np.int64)}
        cols.update({f"d{i}": rng.random(n).astype(np.float32) for i in range(5)})
        cols.update({f"c{i}": rng.integers(0, 99, n) for i in range(3)})
        pq.write_table(pa.table(cols), src / f"p{f}.parquet", row_group_size=300)


def test_runs_of_same_typed_columns_take_the_grouped_path(tmp_path):
    """Entries expose back-to-back columns as one strided run, and warm epochs built from
    those runs yield the same manifest as an uncached loader."""
    from detload._cache.entry import _load

    src = tmp_path / "runs"
    _write_runs(src)
    cache = tmp_path / "cache"
    run(src, tmp_path / "plain.jsonl", epochs=3)
    run(src, tmp_path / "cached.jsonl", epochs=3, cache=str(cache))  # epochs 2-3 are warm
    same(tmp_path / "plain.jsonl", tmp_path / "cached.jsonl")
    path = os.path.join(cache, next(iter(entries(cache))))
    unit = _load(path, None)
    assert set(unit.runs) == {f"d{i}" for i in range(5)} | {f"c{i}" for i in range(3)}  # "id" stands alone
    grid, i, names = unit.runs["d2"]
    assert names == tuple(f"d{i}" for i in range(5)) and i == 2
    assert np.array_equal(grid[2], unit["d2"]) and np.shares_memory(grid, unit["d2"])


def test_damage_found_while_a_block_is_built_never_reaches_a_batch(tmp_path, pool):
    """Warm blocks verify an entry's checksum while copying it (PendingCheck): a damaged
    entry makes the worker drop that block and rebuild it from the source."""
    src = tmp_path / "runs"
    _write_runs(src)
    cache = tmp_path / "cache"
    run(src, tmp_path / "plain.jsonl", epochs=1)
    run(src, tmp_path / "cold.jsonl", epochs=1, cache=str(cache))
    paths = sorted(entries(cache))
    for p in paths[:3]:  # a byte in the float run, one past it, one in the last column
        full = os.path.join(cache, p)
        size = os.path.getsize(full)
        _flip(full, {0: size // 2, 1: size * 3 // 4, 2: size - 5}[paths.index(p)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(src, tmp_path / "warm.jsonl", epochs=1, cache=str(cache), pool=pool, workers=2)
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    if pool == "thread":
        assert len(ours) == 1 and "is damaged (checksum mismatch)" in ours[0], ours
    # One warning per loader across processes: the worker that warned left this marker.
    assert [n for n in os.listdir(cache / "v1" / "tmp") if n.endswith("-warned-corrupt")]
    same(tmp_path / "plain.jsonl", tmp_path / "warm.jsonl")
    assert cache_info(cache, verify=True)["corrupt"] == []  # refetched and written again


def test_damaged_header_that_breaks_assembly_is_refetched(tmp_path, pool):
    """A header field is used before a deferred checksum is finished; when it breaks the
    block's assembly (here one column claims 299 rows of 300), the checksum decides:
    the entry is discarded and the block rebuilt, not reported as a worker error."""
    src = tmp_path / "runs"
    _write_runs(src)
    cache = tmp_path / "cache"
    run(src, tmp_path / "plain.jsonl", epochs=1)
    run(src, tmp_path / "cold.jsonl", epochs=1, cache=str(cache))
    damaged = 0
    for p in sorted(entries(cache)):
        full = os.path.join(cache, p)
        with open(full, "r+b") as f:
            raw = f.read()
            at = raw.find(b'"<f4", [300]')
            if at >= 0 and damaged < 2:
                f.seek(at)
                f.write(b'"<f4", [299]')
                damaged += 1
    assert damaged == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        run(src, tmp_path / "warm.jsonl", epochs=1, cache=str(cache), pool=pool, workers=2)
    same(tmp_path / "plain.jsonl", tmp_path / "warm.jsonl")
    assert cache_info(cache, verify=True)["corrupt"] == []


def test_a_pass_that_filled_the_cache_returns_arrows_free_memory(data, tmp_path, monkeypatch):
    """After a cold pass the next one decodes nothing: Arrow's allocator is told to give back
    its free decoding buffers at once, not during the warm epoch. Warm passes skip it."""
    import pyarrow

    real = pyarrow.default_memory_pool()
    calls = []

    class Counting:
        def release_unused(self):
            calls.append(1)
            real.release_unused()

    monkeypatch.setattr(pyarrow, "default_memory_pool", lambda: Counting())
    with Loader(data, cache=str(tmp_path / "cache"), workers=2, **OPTS) as loader:
        for _ in loader:
            pass
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)  # workers end their pass just after the consumer does
        time.sleep(0.3)
        cold = len(calls)
        loader.set_epoch(1)
        for _ in loader:
            pass
        time.sleep(0.3)
        warm = len(calls) - cold
    assert 1 <= cold <= 2  # once per worker that wrote entries
    assert warm == 0


# -- entries kept mapped between passes (cache_map_limit) --------------------------


def _count_maps(monkeypatch):
    """Count the entry files mapped afresh (thread workers share this process's module)."""
    from detload._cache import rowgroups

    mapped = []
    real = rowgroups._map

    def counting(path):
        m = real(path)
        if m is not None:
            mapped.append(path)
        return m

    monkeypatch.setattr(rowgroups, "_map", counting)
    return mapped


def _passes(loader, epochs):
    for e in epochs:
        loader.set_epoch(e)
        for _ in loader:
            pass


# Workers build the first blocks of the next epoch while one ends, so a mapping may
# happen in the epoch before the one it serves: the tests count over whole runs.
def test_warm_epochs_keep_entries_mapped(data, tmp_path, monkeypatch):
    """The first warm pass maps each entry; later passes reuse those mappings (no open, no
    mmap, no page faults), and the manifest is the uncached one."""
    mapped = _count_maps(monkeypatch)
    run(data, tmp_path / "ref.jsonl", epochs=4)
    with Loader(data, cache=tmp_path / "cache", manifest=str(tmp_path / "kept.jsonl"), **OPTS) as loader:
        _passes(loader, range(4))
    assert sorted(collections.Counter(mapped).values()) == [1] * 6  # each once, in the first warm pass
    same(tmp_path / "ref.jsonl", tmp_path / "kept.jsonl")


def test_cache_map_limit_keeps_the_first_entries_mapped(data, tmp_path, monkeypatch):
    mapped = _count_maps(monkeypatch)
    cache = tmp_path / "cache"
    run(data, tmp_path / "ref.jsonl", epochs=4, cache=cache)
    sizes = {os.path.join(cache, p): s for p, (_, _, s) in entries(cache).items()}
    mapped.clear()
    with Loader(data, cache=detload.Cache(cache, map_limit=0), **OPTS) as loader:
        _passes(loader, range(3))
    counts = collections.Counter(mapped)
    assert len(counts) == 6 and min(counts.values()) >= 3, counts  # 0: every pass maps anew
    # Room for the three smallest: the first entries mapped that fit stay mapped; the rest
    # are mapped in every pass (an LRU would drop each kept one just before its next use).
    limit = sum(sorted(sizes.values())[:3])
    mapped.clear()
    with Loader(data, cache=detload.Cache(cache, map_limit=limit), manifest=str(tmp_path / "some.jsonl"),
                **OPTS) as loader:
        _passes(loader, range(4))
    counts = collections.Counter(mapped)
    kept = [p for p, n in counts.items() if n == 1]
    assert len(counts) == 6 and 3 <= len(kept) <= 5, counts
    assert sum(sizes[p] for p in kept) <= limit
    assert all(n >= 4 for p, n in counts.items() if p not in kept), counts
    same(tmp_path / "ref.jsonl", tmp_path / "some.jsonl")


def test_cache_map_limit_is_per_process(data, tmp_path):
    from detload._cache.sizes import memory_available

    with Loader(data, cache=detload.Cache(tmp_path / "c", map_limit="1MB"), workers=4, **OPTS) as loader:
        assert loader.cache.map_budget == 10**6
    with Loader(data, cache=tmp_path / "c", workers=2, **OPTS) as loader:  # "auto"
        assert loader.cache.map_budget == memory_available() // 4
    with Loader(data, cache=detload.Cache(tmp_path / "c", map_limit=None), **OPTS) as loader:  # no byte limit
        assert loader.cache.map_budget >= 2**62


def test_thread_workers_share_their_kept_mappings(data, tmp_path, monkeypatch):
    """Three thread workers map each entry once between them, whichever reads it next."""
    mapped = _count_maps(monkeypatch)
    with Loader(data, cache=tmp_path / "cache", workers=3, **OPTS) as loader:
        _passes(loader, range(5))
        kept = loader._pool.kept
        assert len(kept) == 6 and kept.nbytes == cache_info(tmp_path / "cache")["bytes"]
    assert sorted(collections.Counter(mapped).values()) == [1] * 6
    assert len(kept) == 0 and kept.nbytes == 0  # closing the loader drops them


@pytest.mark.parametrize("shape", ["mixed", "fixed"])
def test_kept_mappings_notice_deleted_replaced_and_damaged_entries(data, tmp_path, pool, shape):
    """Entries changed on disk while a loader keeps them mapped are treated as without the
    mapping: a deleted one is read from the source and written again, one replaced by a copy
    is used, damage anywhere (also in the prefix, which the checksum does not cover) is found,
    warned about once and refetched. "fixed" entries are verified while the block copies
    them, "mixed" ones (variable-length columns) before use."""
    if shape == "fixed":
        src = tmp_path / "runs"
        _write_runs(src)
    else:
        src = data
    opts = {**OPTS, "shuffle_window": 1}  # blocks of one row group: one entry read ahead
    run(src, tmp_path / "ref.jsonl", epochs=4, **opts)
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # One worker: it keeps every entry (with more, one that another worker maps afresh would
        # find the damage without the kept mapping's checks).
        with Loader(src, cache=cache, manifest=str(tmp_path / "kept.jsonl"), pool=detload.Pool(kind=pool, prefetch=1), workers=1, **opts) as loader:
            for e in range(2):  # cold, then warm: every entry is mapped and kept
                loader.set_epoch(e)
                for _ in loader:
                    pass
            # Epoch 2's first block is being built ahead now. Damage only entries it does not
            # read, once it is built: a change made while a worker reads an entry can reach that
            # block (detload never changes an entry in place; this test does, on purpose).
            first = {(loader._unit_files[u], loader._unit_rgs[u]) for u in loader.plan(2).schedule[0].sources}
            busy = {os.path.join(cache, "v1", "objects", loader._cache_keys[f], f"rg{rg:06d}-") for f, rg in first}
            deadline = time.monotonic() + 30
            while loader._pool.outboxes[0].qsize() < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            everything = [os.path.join(cache, p) for p in sorted(entries(cache))]
            paths = [p for p in everything if not any(p.startswith(b) for b in busy)]
            assert len(paths) == len(everything) - 1 >= 5
            # Another entry of the same size written over a kept one, in place (its own prefix
            # and checksum are valid): the kept header must not be used for it.
            size = os.path.getsize
            over = next((p for p in paths if any(size(q) == size(p) for q in everything if q != p)), None)
            assert over is not None or shape == "mixed"  # "mixed" entries all differ in size
            if over is not None:
                twin = next(q for q in everything if q != over and size(q) == size(over))
                with open(twin, "rb") as f:
                    other = f.read()
                paths.remove(over)
                assert len(paths) >= 5
                with open(over, "r+b") as f:
                    f.write(other)
            _flip(paths[0], os.path.getsize(paths[0]) // 2)  # in place: the kept pages change
            _flip(paths[1], 0)  # the magic
            _flip(paths[2], 20)  # the stored checksum
            os.unlink(paths[3])
            shutil.copyfile(paths[4], paths[4] + ".new")
            os.replace(paths[4] + ".new", paths[4])
            for e in (2, 3):
                loader.set_epoch(e)
                for _ in loader:
                    pass
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "damaged" in ours[0], ours
    same(tmp_path / "ref.jsonl", tmp_path / "kept.jsonl")
    info = cache_info(cache, verify=True)
    assert info["corrupt"] == [] and info["entries"] == len(everything)  # all refetched and rewritten


def _dlc_fds():
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".dlc"):
            out.append(target)
    return out


def test_kept_mappings_hold_no_file_descriptors(data, tmp_path):
    """Python's mmap keeps a duplicate descriptor per mapping: thousands of kept entries ran
    a process out of descriptors ("Too many open files"). Entries are mapped without one."""
    with Loader(data, cache=tmp_path / "cache", workers=2, **OPTS) as loader:
        _passes(loader, range(3))
        assert len(loader._pool.kept) == 6
        assert _dlc_fds() == []


def test_kept_mappings_stay_under_the_map_count_cap(data, tmp_path, monkeypatch):
    """Each mapping is one of the process's memory areas (vm.max_map_count): at most a
    quarter of that many entries are kept, whatever the byte limit."""
    from detload._cache import kept

    monkeypatch.setattr(kept, "_max_map_count", lambda: 12)
    mapped = _count_maps(monkeypatch)
    with Loader(data, cache=tmp_path / "cache", manifest=str(tmp_path / "capped.jsonl"), **OPTS) as loader:
        _passes(loader, range(4))
        assert len(loader._pool.kept) == 3
    counts = collections.Counter(mapped)
    assert sorted(counts.values())[:3] == [1, 1, 1] and min(sorted(counts.values())[3:]) >= 3
    run(data, tmp_path / "ref.jsonl", epochs=4)
    same(tmp_path / "ref.jsonl", tmp_path / "capped.jsonl")


def _deleted_entries_mapped(pid):
    with open(f"/proc/{pid}/maps") as f:
        return [line for line in f if ".dlc" in line and "(deleted)" in line]


def test_process_workers_let_go_of_deleted_entries_at_the_next_pass(data, tmp_path):
    """A process worker reads an entry again only every few epochs (blocks move between
    workers): it checks its kept entries when a pass begins, so the disk space of entries
    deleted meanwhile (here by `detload cache clear`) is not held for several epochs."""
    from detload._cache import clear_cache

    cache = tmp_path / "cache"
    with Loader(data, cache=cache, workers=2, pool="process", **OPTS) as loader:
        _passes(loader, range(3))
        pids = loader._pool.pids()
        assert sum(len(_deleted_entries_mapped(p)) for p in pids) == 0
        clear_cache(cache)
        assert sum(len(_deleted_entries_mapped(p)) for p in pids) > 0  # still mapped, space held
        loader.set_epoch(3)
        it = iter(loader)
        next(it)  # the pass has begun in both workers
        deadline = time.monotonic() + 10
        while sum(len(_deleted_entries_mapped(p)) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sum(len(_deleted_entries_mapped(p)) for p in pids) == 0
        for _ in it:
            pass


@pytest.mark.parametrize("bad", ["inf", "nan", "1e400GB", "-inf"])
def test_sizes_that_are_not_finite_are_refused(data, tmp_path, bad, capsys):
    for name in ("limit", "map_limit"):
        with pytest.raises(OptionError, match=f"^Cache.{name} '{bad}' is not a size"):
            Loader(data, cache=detload.Cache(tmp_path / "c", **{name: bad}), **OPTS)
    code = cli_main(["bench", str(data), "--epochs", "1", "--cache-dir", str(tmp_path / "c"),
                     f"--cache-map-limit={bad}"])
    assert code == 2 and f"--cache-map-limit '{bad}' is not a size" in capsys.readouterr().err


def test_map_count_cap_counts_every_loader_of_the_process(data, tmp_path, monkeypatch):
    """vm.max_map_count is per process: two loaders open at once share the cap."""
    from detload._cache import kept

    monkeypatch.setattr(kept, "_max_map_count", lambda: 16)  # 4 kept mappings per process
    with Loader(data, cache=tmp_path / "a", **OPTS) as one, Loader(data, cache=tmp_path / "b", **OPTS) as two:
        _passes(one, range(2))
        _passes(two, range(2))
        assert len(one._pool.kept) + len(two._pool.kept) == 4
    assert kept._KEPT_COUNT[0] == 0


def test_an_entry_cut_short_in_place_while_kept_is_read_again(tmp_path):
    """A kept entry truncated in place (same file, fewer bytes) must not be read through the
    old mapping: past the new end that is a bus error, not an exception."""
    src = tmp_path / "runs"
    _write_runs(src)
    opts = {**OPTS, "shuffle_window": 1}
    run(src, tmp_path / "ref.jsonl", epochs=4, **opts)
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Loader(src, cache=cache, manifest=str(tmp_path / "cut.jsonl"), pool=detload.Pool(kind="process", prefetch=1), workers=1, **opts) as loader:
            _passes(loader, range(2))
            first = {(loader._unit_files[u], loader._unit_rgs[u]) for u in loader.plan(2).schedule[0].sources}
            busy = {os.path.join(cache, "v1", "objects", loader._cache_keys[f], f"rg{rg:06d}-") for f, rg in first}
            deadline = time.monotonic() + 30
            while loader._pool.outboxes[0].qsize() < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            victims = [p for p in (os.path.join(cache, q) for q in sorted(entries(cache)))
                       if not any(p.startswith(b) for b in busy)][:3]
            for p in victims:
                with open(p, "r+b") as f:
                    f.truncate(os.path.getsize(p) // 2)
            _passes(loader, range(2, 4))
    assert [w for w in caught if issubclass(w.category, CacheWarning)]
    same(tmp_path / "ref.jsonl", tmp_path / "cut.jsonl")
    assert cache_info(cache, verify=True)["corrupt"] == []


def test_cache_dir_with_a_tilde_is_the_home_folder(data, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with Loader(data, cache="~/detload-cache", **OPTS) as loader:
        for _ in loader:
            pass
    assert cache_info(tmp_path / "home" / "detload-cache")["entries"] == 6
    assert not (tmp_path / "~").exists()
    assert cache_info("~/detload-cache")["entries"] == 6  # the same string works for the commands
    assert cli_main(["cache", "clear", "~/detload-cache"]) == 0
    assert cache_info(tmp_path / "home" / "detload-cache")["entries"] == 0


def test_cache_folder_deleted_between_epochs_is_made_again(data, tmp_path, pool):
    """Someone removes the whole cache folder while a loader runs: the next pass writes the
    entries again (instead of loading uncached for the rest of the loader's life, with a
    warning from every process worker), and the batches are the same."""
    run(data, tmp_path / "ref.jsonl", epochs=4)
    cache = tmp_path / "cache"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Loader(data, cache=cache, manifest=str(tmp_path / "gone.jsonl"), pool=detload.Pool(kind=pool, prefetch=1), workers=2, **OPTS) as loader:
            _passes(loader, range(2))
            # Once the next pass's first blocks are built (a worker missing an entry during the
            # removal would make the folder again under rmtree's feet).
            deadline = time.monotonic() + 30
            while min(q.qsize() for q in loader._pool.outboxes) < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            shutil.rmtree(cache)
            _passes(loader, range(2, 4))
    assert [str(w.message) for w in caught if issubclass(w.category, CacheWarning)] == []
    same(tmp_path / "ref.jsonl", tmp_path / "gone.jsonl")
    info = cache_info(cache, verify=True)
    assert info["entries"] == 6 and info["corrupt"] == []


def test_thread_loader_lets_go_of_deleted_entries_when_a_pass_begins(data, tmp_path):
    """Entries read ahead for the next pass before `cache clear` are not read again in that
    pass: the loader checks its kept entries when each pass begins."""
    from detload._cache import clear_cache

    cache = tmp_path / "cache"
    with Loader(data, cache=cache, workers=2, **OPTS) as loader:
        _passes(loader, range(3))
        kept = loader._pool.kept
        assert len(kept) == 6
        clear_cache(cache)
        loader.set_epoch(3)
        it = iter(loader)
        assert len(kept) == 0  # before any block of the pass is read
        for _ in it:
            pass


def test_cache_limit_smaller_than_an_entry_says_so_once(data, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(data, tmp_path / "tiny.jsonl", cache=detload.Cache(tmp_path / "cache", limit=1000), workers=2)
    ours = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(ours) == 1 and "Cache.limit (1,000 bytes) is smaller than a row group's cache entry" in ours[0]
    assert cache_info(tmp_path / "cache")["entries"] == 0
    run(data, tmp_path / "ref.jsonl")
    same(tmp_path / "ref.jsonl", tmp_path / "tiny.jsonl")


def test_an_entry_is_one_write(data, tmp_path, monkeypatch):
    from detload._cache import write

    calls = collections.Counter()
    real_v, real_1 = os.pwritev, os.pwrite
    monkeypatch.setattr(write.os, "pwritev", lambda *a: calls.update(["pwritev"]) or real_v(*a))
    monkeypatch.setattr(write.os, "pwrite", lambda *a: calls.update(["pwrite"]) or real_1(*a))
    with Loader(str(data), cache=str(tmp_path / "c"), workers=1, **OPTS) as ld:
        n = sum(1 for _ in ld)
    assert n > 0
    entries = cache_info(str(tmp_path / "c"))["entries"]
    assert entries == 6 and calls["pwritev"] == entries
