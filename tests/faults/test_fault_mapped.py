"""Data files read through memory maps (Storage.memory_map): the same batches, and a file
that shrinks under a map is reported as the change it is, whether the pre-read size check
sees it or the worker dies of SIGBUS in the middle of the read.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from faultkit import clean_hashes, first_step_needing
from testhooks import hooked

import detload
from detload import DataError, Loader, OptionError, WorkerError
from detload._engine.config import DebugHooks
from detload._read import mapping
from detload._read.mapping import LOCAL_FILESYSTEMS, on_local_disk, open_mapped, parse_mounts, should_map
from detload.audit import hash_batch

OPTS = dict(batch_size=100, seed=7, order="windowed", shuffle_window=2)

MOUNTS = r"""/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw 0 0
server:/export /data nfs4 rw 0 0
s3fs /data/bucket fuse.s3fs rw 0 0
/dev/vdb /data/bucket/local\040disk xfs rw 0 0
"""


def test_mount_table_decides_where_auto_maps():
    table = parse_mounts(MOUNTS)
    assert ("/data/bucket/local disk", "xfs") in table  # \040 is a space
    assert on_local_disk("/home/u/x.parquet", table)
    assert on_local_disk("/dev/shm/x.parquet", table)
    assert not on_local_disk("/data/x.parquet", table)  # nfs
    assert not on_local_disk("/data/bucket/x.parquet", table)  # fuse
    assert on_local_disk("/data/bucket/local disk/x.parquet", table)  # innermost mount wins
    assert not on_local_disk("/data/bucket/local diskette/x.parquet", table)  # a prefix is not a parent
    assert not on_local_disk("/x.parquet", [])  # no mount table (no /proc): plain reads
    assert {"ext4", "xfs", "tmpfs"} <= LOCAL_FILESYSTEMS


def test_should_map_by_mode_and_filesystem(tmp_path):
    here = str(tmp_path / "f.parquet")
    assert not should_map(False, "local", here)
    assert not should_map(True, "s3", here)
    assert should_map(True, "local", here)
    assert should_map("auto", "local", here) == on_local_disk(here)
    assert not should_map("auto", "s3", here)


@pytest.mark.parametrize("value", ["yes", 1, None, "never"])
def test_memory_map_option_is_checked(value):
    with pytest.raises(OptionError) as ei:
        detload.Storage(memory_map=value)
    assert str(ei.value) == f"Storage.memory_map must be True, False or 'auto', got {value!r}"


def _config(root, **kw):
    ld = Loader(root, **OPTS, **kw)
    cfg = ld._worker_config(ld.pool_kind, "x")
    ld.close()
    return cfg.memory_map


def test_auto_is_the_default_and_maps_in_process_workers_only(fault_data):
    root = fault_data().root
    assert detload.Storage().memory_map == "auto"
    # The workers get the option's own values; "auto" in thread workers is False (plain reads).
    assert _config(root, pool="process") == "auto"  # the default
    assert _config(root, pool="thread") is False  # a SIGBUS there would kill the training process
    assert _config(root, pool="process", storage=detload.Storage(memory_map="auto")) == "auto"
    assert _config(root, pool="thread", storage=detload.Storage(memory_map="auto")) is False
    assert _config(root, pool="thread", storage=detload.Storage(memory_map=True)) is True
    assert _config(root, pool="process", storage=detload.Storage(memory_map=False)) is False


@pytest.mark.parametrize("pool", ["process", "thread"])
def test_mapped_reads_give_the_same_batches(fault_data, leaks, pool):
    data = fault_data(files=3)
    plain = clean_hashes(data.root, **OPTS)
    for mm in (True, "auto"):
        with Loader(data.root, workers=2, pool=pool, storage=detload.Storage(memory_map=mm), **OPTS) as loader:
            leaks.track(loader)
            for epoch in (0, 1):
                loader.set_epoch(epoch)
                got = [hash_batch(b)[0] for b in loader]
                if epoch == 0:
                    assert got == plain
                else:
                    assert len(got) == len(plain) and got != plain
    leaks.clean_within(2.0)


@pytest.mark.parametrize("memory_map", [True, False])
def test_a_file_that_shrinks_during_its_read_is_reported_as_changed(fault_data, leaks, memory_map):
    """The hook truncates the file right after the pre-read check, as a rewrite racing the read
    would: through a map the worker dies of SIGBUS, with plain reads the read fails; both are
    the DataError of a changed file, naming it and the row group."""
    data = fault_data(files=2)
    rel, rg = data.units[3][0], data.units[3][1]
    clean = clean_hashes(data.root, **OPTS)
    storage = detload.Storage(memory_map=memory_map)
    with hooked(Loader, data.root, workers=1, pool="process", storage=storage,
                debug=DebugHooks(shrink_unit=(rel, rg)), **OPTS) as loader:
        leaks.track(loader)
        first = first_step_needing(loader, rel, rg)
        got: list[str] = []
        t0 = time.monotonic()
        with pytest.raises(DataError) as ei:
            for batch in loader:
                got.append(hash_batch(batch)[0])
                t0 = time.monotonic()
        assert time.monotonic() - t0 < 5.0
        msg = str(ei.value)
        assert msg.startswith(f"{rel} row group {rg}: the file changed after the loader planned the epoch")
        assert ("was reading it through a memory map and was killed by SIGBUS as it shrank" in msg) == memory_map
        assert "Which batches could hold rows of the changed file" in msg
        assert len(got) <= first and got == clean[: len(got)]
        if memory_map:  # the dead worker is not replaced
            with pytest.raises(WorkerError, match="was killed by signal 7 .SIGBUS: a page of a memory-mapped file"):
                list(loader)
    leaks.clean_within(2.0)


def test_a_shrunk_mapped_file_is_refused_before_its_pages_are_read(fault_data, leaks):
    """A file truncated between two reads of an open map: the size check refuses it, the worker lives."""
    data = fault_data(files=2, row_groups=24)
    rel = data.files[0]
    loader = Loader(data.root, workers=1, pool=detload.Pool(kind="process", prefetch=1),
                    storage=detload.Storage(memory_map=True), batch_size=250, seed=3, shuffle=False, order="windowed", shuffle_window=4)
    with loader:
        leaks.track(loader)
        it = iter(loader)
        next(it)
        # Truncate only while the worker waits for room (idle for 0.3 s on end), not mid-read:
        # a read that the truncation races is the SIGBUS case of the test above.
        st = loader._pool.statuses[0]
        idle_since = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if st.get()[2] >= 0:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > 0.3:
                break
            time.sleep(0.01)
        path = data.path(rel)
        with open(path, "r+b") as f:  # same inode, shorter
            f.truncate(1000)
        with pytest.raises(DataError, match=rf"^{rel} row group \d+: the file changed after the loader planned the "
                                            r"epoch: it holds 1,000 bytes, the plan saw [\d,]+\. "):
            for _ in it:
                pass
        assert all(loader._pool.alive(w) for w in range(loader.workers))
    leaks.clean_within(2.0)


def test_sigbus_without_a_changed_file_is_explained(fault_data, leaks):
    """A SIGBUS whose file still matches the plan (a failing disk, a full /dev/shm): a WorkerError
    that says what SIGBUS means here and how to read without maps."""
    data = fault_data(files=2)
    rel, rg = data.units[2][0], data.units[2][1]
    hooks = DebugHooks(die_unit=(rel, rg), die_signal=int(signal.SIGBUS))
    with hooked(Loader, data.root, workers=1, pool="process", debug=hooks, **OPTS) as loader:
        leaks.track(loader)
        with pytest.raises(WorkerError) as ei:
            list(loader)
    msg = str(ei.value)
    assert "was killed by signal 7 (SIGBUS: a page of a memory-mapped file could not be read or written" in msg
    assert "storage=detload.Storage(memory_map=False) reads data files without maps" in msg
    assert f"reading {rel} row group {rg}" in msg
    leaks.clean_within(2.0)


# -- the pages a map touched go back after each row group -----------------------------

def _write_mapped_data(root, files=3, row_groups=6, rows=4000):
    os.makedirs(root)
    rng = np.random.default_rng(5)
    for i in range(files):
        t = pa.table({f"f{j}": rng.random(rows * row_groups, dtype=np.float32) for j in range(8)})
        pq.write_table(t, os.path.join(root, f"part-{i}.parquet"), row_group_size=rows, compression="snappy")
    return sorted(os.path.join(root, n) for n in os.listdir(root))


def _mapped_rss(pid, paths):
    """{path: Rss bytes} of each data file mapped in process ``pid`` (from /proc/pid/smaps)."""
    out: dict[str, int] = {}
    current = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 6 and "-" in head[0] and head[-1] in paths:
                current = head[-1]
            elif len(head) >= 5 and "-" in head[0]:
                current = None
            elif current is not None and head and head[0] == "Rss:":
                out[current] = out.get(current, 0) + int(head[1]) * 1024
    return out


needs_smaps = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/smaps")


@needs_smaps
def test_process_workers_give_back_the_mapped_pages_of_each_row_group(tmp_path, leaks):
    """By default (process workers, a local disk) files are read through maps, and after an
    epoch each file still open holds at most one row group's pages in a worker's RSS, not
    the file's: the map costs no memory the plain read buffers did not."""
    paths = _write_mapped_data(str(tmp_path / "d"))
    size = min(os.path.getsize(p) for p in paths)
    one_rg = max(pq.ParquetFile(p).metadata.row_group(0).total_byte_size for p in paths)
    with Loader(str(tmp_path / "d"), batch_size=1000, seed=1, order="windowed", shuffle_window=2, workers=2, pool="process") as ld:
        leaks.track(ld)
        for epoch in (0, 1):
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        rss = {}
        for pid in ld._pool.pids():
            for path, n in _mapped_rss(pid, set(paths)).items():
                rss[(pid, path)] = n
        assert rss, "no worker has a data file mapped"
        assert all(n <= one_rg + 64 * 1024 for n in rss.values()), (rss, one_rg, size)
    leaks.clean_within(2.0)


@needs_smaps
@pytest.mark.parametrize("release", [True, False])
def test_a_thread_worker_map_holds_one_row_group_not_the_file(tmp_path, monkeypatch, release):
    """The same in this process (threads, memory_map=True); without the release (the control)
    the map keeps every page of the file it read."""
    paths = _write_mapped_data(str(tmp_path / "d"), files=1)
    size = os.path.getsize(paths[0])
    if not release:
        monkeypatch.setattr(mapping.MappedFile, "release", lambda self: None)
    with Loader(str(tmp_path / "d"), batch_size=1000, seed=1, order="windowed", shuffle_window=2, workers=1, pool="thread",
                storage=detload.Storage(memory_map=True)) as ld:
        for _ in ld:
            pass
        rss = _mapped_rss(os.getpid(), set(paths))
    assert set(rss) == set(paths)
    if release:
        assert rss[paths[0]] <= size / 4
    else:
        assert rss[paths[0]] >= size * 3 / 4


def test_open_mapped_refuses_what_it_cannot_map_and_closes_under_live_views(tmp_path):
    assert open_mapped(str(tmp_path / "missing.parquet")) is None
    (tmp_path / "empty.parquet").write_bytes(b"")
    assert open_mapped(str(tmp_path / "empty.parquet")) is None
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(256)) * 64)
    m = open_mapped(str(path))
    assert m is not None and m.size() == 256 * 64 and os.fstat(m.fileno()).st_size == 256 * 64
    view = m.source.read_buffer(16)  # a zero-copy slice of the map, as Arrow keeps for uncompressed pages
    m.release()
    assert bytes(view) == bytes(range(16))  # the bytes come back from the file after a release
    m.close()  # the live slice keeps the map; the descriptor goes now
    assert m.fileno() == -1 and m.source is None
    assert bytes(view) == bytes(range(16))
