"""Process-pool hand-off through /dev/shm: kept batches never change, and no segment outlives its use."""

from __future__ import annotations

import gc
import mmap
import os
import signal

import numpy as np
import pytest
from _perfdata import write_small

import detload
from detload import Loader, WorkerError, hash_batch
from detload._engine.shm import SHM_DIR


def _ours() -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"detload-{os.getpid()}-")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("handoff") / "d", files=4, rows=4000)


def test_kept_batches_never_change(data):
    kept, digests = [], []
    with Loader(data, batch_size=300, seed=1, workers=2, pool=detload.Pool(kind="process", prefetch=1)) as ld:
        for epoch in range(3):  # later epochs allocate many more segments after the kept ones
            ld.set_epoch(epoch)
            for i, b in enumerate(ld):
                if epoch == 0 and i % 7 == 0:
                    kept.append(b)
                    digests.append(hash_batch(b)[0])
    # The arrays view shared memory (no copy was made for the consumer)...
    for b in kept:
        root = b["x"]
        while isinstance(root, np.ndarray) and root.base is not None:
            root = root.base
        if isinstance(root, memoryview):
            root = root.obj
        assert isinstance(root, mmap.mmap)
    # ...and still hold exactly what they held when yielded, after the loader is gone.
    gc.collect()
    assert [hash_batch(b)[0] for b in kept] == digests
    assert _ours() == []  # unlinked on receipt: only our mappings keep the memory


@pytest.mark.parametrize("how", ["break", "exception", "end"])
def test_no_segment_left_after(data, how):
    ld = Loader(data, batch_size=300, seed=1, workers=2, pool="process")
    try:
        for i, _ in enumerate(ld):
            if how == "break" and i == 3:
                break
            if how == "exception" and i == 3:
                raise KeyError("from the training loop")
    except KeyError:
        pass
    ld.close()
    gc.collect()
    assert _ours() == []


def test_no_segment_left_after_a_killed_worker(data):
    # mix_window=4: several tasks, so that the killed worker has work (one task would be one worker's).
    ld = Loader(data, batch_size=300, seed=1, workers=2, pool=detload.Pool(kind="process", prefetch=1), mix_window=4)
    with pytest.raises(WorkerError, match="killed by signal"):
        for i, _ in enumerate(ld):
            if i == 2:
                os.kill(ld._pool.pids()[1], signal.SIGKILL)
    ld.close()
    gc.collect()
    assert _ours() == []


def test_full_shared_memory_raises_a_clear_error(tmp_path, monkeypatch):
    """/dev/shm out of space: SharedMemoryError saying how to raise it, and no file left behind."""
    import errno

    from detload import SharedMemoryError
    from detload._engine import shm as _shm

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_shm.os, "posix_fallocate", full)
    with pytest.raises(SharedMemoryError, match=r"not enough shared memory .*--shm-size.*pool='thread'"):
        _shm.create(str(tmp_path), "detload-1-x-0-1", 1 << 20)
    assert list(tmp_path.iterdir()) == []
