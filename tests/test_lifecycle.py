"""What dead, killed and interrupted processes leave behind, and what close() releases.

A zombie counts as dead (for segments and cache temp files alike).
"""

from __future__ import annotations

import socket
import subprocess
import sys

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from leaks import wait_until

from detload import Loader
from detload._cache import _safe_host, cache_info


@pytest.fixture
def root(tmp_path) -> str:
    d = tmp_path / "data"
    d.mkdir()
    for f in range(3):
        ids = np.arange(f * 1000, (f + 1) * 1000, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), d / f"part-{f}.parquet", row_group_size=250)
    return str(d)


def _zombie() -> subprocess.Popen:
    """A child killed and not reaped yet (what a SIGKILLed pool worker is for a second or two)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.kill()
    wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, 10.0)
    return proc


def test_a_zombie_writers_cache_temp_file_goes_at_the_next_open(root, tmp_path):
    cache = tmp_path / "cache"
    with Loader(root, batch_size=100, seed=1, cache_dir=str(cache)) as ld:
        for _ in ld:
            pass
    entries = cache_info(cache)["bytes"]
    assert entries > 0
    proc = _zombie()
    try:
        tmp = cache / "v1" / "tmp" / f"{_safe_host(socket.gethostname())}-{proc.pid}-0000abcd.tmp"
        tmp.write_bytes(b"\0" * 100_000)  # a half-written entry of the killed writer
        with Loader(root, batch_size=100, seed=1, cache_dir=str(cache)):
            pass
        assert not tmp.exists(), "the temp file of a dead (zombie) writer survived the next open"
        info = cache_info(cache)
        assert info["usage_counter"] == info["bytes"] == entries
    finally:
        proc.wait()
