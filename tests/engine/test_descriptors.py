"""File descriptors: a block's memory map keeps none, so a process pool over many small row groups
runs under a low open-files limit; running out anywhere says which limit, once.

The limited runs happen in child processes (RLIMIT_NOFILE is per process and inherited by
the workers); ``DETLOAD_FULL=1`` runs the issue's size (10,000 files, batch_size=65536).
"""

from __future__ import annotations

import errno
import mmap
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testhooks import hooked

import detload
from detload._engine import shm as _shm
from detload._engine.config import DebugHooks
from detload._fdless import map_file

FULL = os.environ.get("DETLOAD_FULL") == "1"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")


def _tiny_files(path: str, files: int, rows: int) -> None:
    """``files`` one-row-group files of ``rows`` rows each; ids 0.. in file order."""
    os.makedirs(path)
    for i in range(files):
        pq.write_table(pa.table({"id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64)}),
                       os.path.join(path, f"f{i:05d}.parquet"))


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


_EPOCH = """
    import os, resource, sys
    import numpy as np
    import detload
    path, limit, rows, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    with detload.Loader(path, batch_size=batch, seed=3, workers=2, pool="process") as loader:
        got = np.sort(np.concatenate([b["id"] for b in loader]))
    assert got.tolist() == list(range(rows)), (len(got), rows)
    print("delivered", len(got))
"""


@needs_proc
def test_a_process_pool_over_many_small_row_groups_runs_under_a_low_open_files_limit(tmp_path):
    # Each batch spans hundreds of one-row-group blocks, all alive at once on both sides.
    # A map that kept its descriptor needed one per block: EMFILE at 256 (the reduced form)
    # and at 1,024 (the full one).
    files, rows_each, limit, batch = (10_000, 8, 1024, 65_536) if FULL else (1_200, 4, 256, 4_800)
    path = str(tmp_path / "tiny")
    _tiny_files(path, files, rows_each)
    out = _run(_EPOCH, path, str(limit), str(files * rows_each), str(batch), timeout=600 if FULL else 120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"delivered {files * rows_each}" in out.stdout
    assert "Traceback" not in out.stderr


@needs_proc
def test_a_map_holds_no_descriptor_once_its_file_is_closed(tmp_path):
    path = tmp_path / "seg"
    path.write_bytes(b"\1" * 8192)
    before = _open_fds()
    maps = []
    for _ in range(50):
        fd = os.open(path, os.O_RDWR)
        maps.append(map_file(fd, 8192))
        os.close(fd)
    assert _open_fds() == before
    # Still the file's pages: shared with every other map of it, and madvise/close work.
    maps[0][0] = 7
    assert maps[1][0] == 7 and path.read_bytes()[0] == 7
    maps[1].madvise(mmap.MADV_DONTNEED)
    assert maps[1][:2] == b"\7\1"
    for m in maps:
        m.close()


@needs_proc
def test_both_sides_of_a_segment_keep_no_descriptor(tmp_path):
    r, w = mp.Pipe(duplex=False)
    worker = _shm.WorkerSegments(str(tmp_path), "detload-1-t-", 0, r, reserve=1)
    consumer = _shm.ConsumerSegments(str(tmp_path), [w])
    before = _open_fds()
    blocks = []
    for i in range(40):  # none given back: 40 segments alive on each side
        seg, arr = worker.get(4096 * (i + 1))
        arr[:] = i
        del arr
        blocks.append(consumer.attach(worker.sending(seg), 4096 * (i + 1)))
    assert worker.made == 40 and consumer.mapped == 40
    assert _open_fds() == before
    assert [int(b[-1]) for b in blocks] == list(range(40))
    del blocks
    worker.close()
    consumer.close()


def test_mapped_files_keep_one_descriptor_each(tmp_path):
    from detload._read.mapping import open_mapped

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    before = _open_fds()
    mapped = [open_mapped(str(path)) for _ in range(10)]
    assert all(m is not None for m in mapped)
    assert _open_fds() == before + 10  # the one each keeps for fstat, none for its map
    for m in mapped:
        assert m is not None
        m.close()
    assert _open_fds() == before


_START = """
    import resource, sys
    import detload
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    loader = detload.Loader(sys.argv[1], batch_size=8, seed=0, workers=4, pool="process")
    for _ in loader:
        pass
"""


@needs_proc
def test_too_low_a_limit_to_start_the_workers_is_one_error_naming_the_limit(tmp_path):
    path = str(tmp_path / "tiny")
    _tiny_files(path, 4, 4)
    out = _run(_START, path, "24")
    assert out.returncode == 1
    assert "DetloadError: out of file descriptors starting 4 worker processes" in out.stderr
    assert "RLIMIT_NOFILE" in out.stderr and "`ulimit -n`) is 24" in out.stderr
    # Refused before any process starts: no forkserver traceback, none at exit.
    assert out.stderr.count("Traceback") == 1, out.stderr


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_worker_out_of_descriptors_says_which_limit(tmp_path, kind):
    path = str(tmp_path / "tiny")
    _tiny_files(path, 4, 4)
    exc = OSError(errno.EMFILE, "Too many open files")
    loader = hooked(detload.Loader, path, batch_size=4, seed=0, workers=2, pool=kind,
                    debug=DebugHooks(fail_unit=("f00002.parquet", 0), fail_exc=exc))
    with loader, pytest.raises(detload.DetloadError,
                               match=r"out of file descriptors in worker \d: the open-files limit "
                                     r"\(RLIMIT_NOFILE, `ulimit -n`\) is \d+.*Too many open files"):
        list(loader)


def test_the_loaders_process_out_of_descriptors_says_which_limit(tmp_path, monkeypatch):
    path = str(tmp_path / "tiny")
    _tiny_files(path, 4, 4)

    def no_descriptor(directory: str, name: str, nbytes: int) -> mmap.mmap:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(_shm, "_map", no_descriptor)
    with detload.Loader(path, batch_size=4, seed=0, workers=2, pool="process") as loader, \
            pytest.raises(detload.DetloadError,
                          match=r"out of file descriptors in the loader's process: .*RLIMIT_NOFILE.*"
                                r"Raise it \(`ulimit -n 65536`"):
        list(loader)
