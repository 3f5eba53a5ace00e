"""A file rewritten in place (same inode) during a pass: the error says only what detload knows.

detload compares a file with the plan when it opens it and when a pass begins, not on
every read, so batches read through an open handle after the rewrite may hold the new
bytes. The DataError names the file and, from the plan, the delivered batches of the
pass that hold rows of it; it never claims that earlier batches were intact.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import detload
from detload import DataError, Loader

OPTS = dict(batch_size=250, seed=3, shuffle=False, order="windowed", shuffle_window=4)  # step i = unit i


def _cut_in_place(path: str) -> None:
    pq.write_table(pq.read_table(path).slice(0, 10), path)  # opens the same path: same inode, new bytes


def _run_until_error(loader: Loader, rewrite: str) -> tuple[int, str]:
    it = iter(loader)
    next(it)
    _cut_in_place(rewrite)
    delivered = 1
    with pytest.raises(DataError) as info:
        for _ in it:
            delivered += 1
    return delivered, str(info.value)


def test_batches_from_the_changed_file_are_named(fault_data, leaks, pool):
    data = fault_data(files=2, row_groups=24)
    rel = data.files[0]  # steps 0-23 hold its rows; the worker is at most 3 blocks (12 units) ahead
    with Loader(data.root, workers=1, pool=detload.Pool(kind=pool, prefetch=1), **OPTS) as loader:
        leaks.track(loader)
        delivered, msg = _run_until_error(loader, data.path(rel))
    assert delivered <= 24
    steps = "0" if delivered == 1 else f"0-{delivered - 1}"
    assert msg.startswith(f"{rel} row group ") and "the file changed after the loader planned the epoch" in msg
    assert "batches read from it since its last check may hold rows of the new version" in msg
    assert (f"Which batches could hold rows of the changed file: in this pass (epoch 0, {delivered} batch(es) "
            f"delivered since step 0), step(s) {steps} hold rows of it; a batch of an earlier pass could too, "
            "if the file was rewritten while that pass ran.") in msg
    assert "intact" not in msg
    leaks.clean_within(2.0)


def test_a_changed_file_no_delivered_batch_came_from(fault_data, leaks):
    data = fault_data(files=2, row_groups=24)
    rel = data.files[1]  # steps 24-47: not opened yet when it is rewritten
    with Loader(data.root, workers=1, pool=detload.Pool(prefetch=1), **OPTS) as loader:
        leaks.track(loader)
        delivered, msg = _run_until_error(loader, data.path(rel))
    assert delivered == 24
    assert msg.startswith(f"{rel} row group 0: the file changed after the loader planned the epoch: its row groups hold [10] rows")
    assert ("Which batches could hold rows of the changed file: no batch delivered in this pass (epoch 0, since "
            "step 0) holds rows of it;") in msg
    assert "intact" not in msg
    leaks.clean_within(2.0)
