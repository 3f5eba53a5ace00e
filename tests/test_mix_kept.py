"""The mixed order's kept windows: a worker whose pass had a single task keeps that window, and
the next pass's window takes the row groups it holds instead of reading them again (with one
task per partition, all of them: such a dataset is read once per loader). The batches stay the
plan's at every epoch, with thread and process workers, with and without a cache; with several
tasks a worker, every epoch reads its row groups once.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import check_rows

import detload._engine.block
import detload._engine.spill
import detload._engine.worker
import detload._read.reader
from detload import BlockMemoryWarning, Distributed, Loader, Pool
from detload._engine.share import share_root
from detload.plan import MixPlan

FILES = {"a.parquet": [300, 200, 250, 120], "c.parquet": [250, 40, 250, 90], "d/e.parquet": [210, 180, 75, 300]}
# One task per epoch (mix_window >= the row groups): every epoch's start needs a whole window.
ONE_TASK = {"order": "mix", "mix_window": 64, "block_rows": 100}
#: The standard dataset's fixed-width 1-D columns (a window of only these may be spilled).
FLAT = ["id", "f32", "nf", "ni"]


@pytest.fixture
def ds(make_dataset):  # type: ignore[no-untyped-def]
    return make_dataset(FILES)


@pytest.fixture
def decodes(monkeypatch) -> list[tuple[int, int, str, int]]:  # type: ignore[no-untyped-def]
    """Every (epoch the consumer is in, batches it took of it, file, row group) a thread worker decodes."""
    log: list[tuple[int, int, str, int]] = []
    real = detload._read.reader.UnitReader.read

    def read(self, file_idx, rg, t, **kw):  # type: ignore[no-untyped-def]
        log.append((_Consumer.epoch, _Consumer.batch, self.cfg.files[file_idx].path, rg))
        return real(self, file_idx, rg, t, **kw)

    monkeypatch.setattr(detload._read.reader.UnitReader, "read", read)
    return log


def _epochs_made(monkeypatch, cls) -> list[int]:  # type: ignore[no-untyped-def]
    """The epoch the consumer is in at each ``cls`` a worker of this process makes."""
    made: list[int] = []
    real = cls.__init__

    def init(self, *a, **kw):  # type: ignore[no-untyped-def]
        made.append(_Consumer.epoch)
        real(self, *a, **kw)

    monkeypatch.setattr(cls, "__init__", init)
    return made


@pytest.fixture
def packs_made(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The epoch the consumer is in at each `WindowPack` a worker makes."""
    return _epochs_made(monkeypatch, detload._engine.block.WindowPack)


class _Consumer:
    epoch = -1
    batch = 0


def _are_the_plans_rows(ds, runs: list[np.ndarray], **opts) -> None:  # type: ignore[no-untyped-def]
    """Each epoch's ids in ``runs`` are the rows a fresh loader's plan of that epoch names."""
    for e, got in enumerate(runs):
        with Loader(ds.root, **opts) as fresh:
            fresh.set_epoch(e)
            assert np.array_equal(got, ds.all_ids[fresh.plan().row_ids()])


def _slow_epochs(loader: Loader, epochs: range) -> list[np.ndarray]:
    out = []
    for e in epochs:
        _Consumer.epoch, _Consumer.batch = e, 0
        loader.set_epoch(e)
        got = []
        for b in loader:
            check_rows(b)
            got.append(np.asarray(b["id"]).copy())
            _Consumer.batch = len(got)
            time.sleep(0.004)  # a training step: the workers' queues fill up
        out.append(np.concatenate(got))
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_a_window_that_is_the_whole_partition_is_read_once_for_every_epoch(ds, decodes, workers) -> None:  # type: ignore[no-untyped-def]
    # One task per epoch: the worker keeps its window after the epoch's last block, and the
    # next epoch's window (the same row groups, cut and permuted anew) takes it as it is.
    with Loader(ds.root, batch_size=50, seed=5, workers=workers, pool=Pool(kind="thread", prefetch=1),
                **ONE_TASK) as loader:
        plan = loader.plan()
        assert isinstance(plan, MixPlan) and len(plan.tasks[0]) == 1
        runs = _slow_epochs(loader, range(3))
    per_unit = collections.Counter((f, rg) for _, _, f, rg in decodes)
    assert len(per_unit) == len(ds.units) and set(per_unit.values()) == {1}, per_unit
    assert {e for e, _, _, _ in decodes} == {0}
    for e, got in enumerate(runs):
        with Loader(ds.root, batch_size=50, seed=5, **ONE_TASK) as fresh:
            fresh.set_epoch(e)
            assert np.array_equal(got, np.concatenate([np.asarray(b["id"]) for b in fresh]))
            assert np.array_equal(got, ds.all_ids[fresh.plan().row_ids()])
    assert not np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_several_tasks_per_epoch_match_fresh_epochs(ds, kind) -> None:  # type: ignore[no-untyped-def]
    # Four tasks, two workers: a worker has two tasks an epoch, keeps nothing.
    opts = {"order": "mix", "mix_window": 3, "block_rows": 80}
    with Loader(ds.root, batch_size=40, seed=8, workers=2, pool=Pool(kind=kind, prefetch=1), **opts) as loader:
        assert len(loader.plan().tasks[0]) > 2
        runs = _slow_epochs(loader, range(2))
    _are_the_plans_rows(ds, runs, batch_size=40, seed=8, **opts)


@pytest.mark.parametrize("cache", [False, True])
def test_process_workers_keep_a_one_task_window_and_match_fresh_epochs(ds, tmp_path, cache) -> None:  # type: ignore[no-untyped-def]
    # Process workers share the one task's window (through the scratch cache or the user's
    # cache), keep it after the epoch's last block, and cut the next epochs from it.
    kw = {"cache": str(tmp_path / "c")} if cache else {}
    with Loader(ds.root, batch_size=50, seed=6, workers=2, pool=Pool(kind="process", prefetch=1), **ONE_TASK,
                **kw) as loader:
        runs = _slow_epochs(loader, range(3))
        per_epoch = [(e.epoch, e.row_groups_read + e.row_groups_cached) for e in loader.stats().reads.epochs]
    # Epoch 0 reads every row group (once from the source, the other worker's share mapped
    # from the cache); epochs 1 and 2 take the kept window and read nothing.
    assert per_epoch[0][1] >= len(ds.units) and [n for _, n in per_epoch[1:]] == [0, 0], per_epoch
    _are_the_plans_rows(ds, runs, batch_size=50, seed=6, **ONE_TASK)


def test_several_tasks_read_every_row_group_every_epoch(ds, decodes) -> None:  # type: ignore[no-untyped-def]
    with Loader(ds.root, batch_size=40, seed=8, workers=2, pool=Pool(kind="thread", prefetch=1), order="mix",
                mix_window=3, block_rows=80) as loader:
        _slow_epochs(loader, range(2))
    # Once an epoch, and some a third time: the first blocks of epoch 2, built ahead while
    # epoch 1 ran (a worker keeps nothing: it has two tasks a pass).
    per_unit = collections.Counter((f, rg) for _, _, f, rg in decodes)
    assert len(per_unit) == len(ds.units) and set(per_unit.values()) <= {2, 3}, per_unit


def test_a_kept_window_is_packed_once_and_its_pack_taken_as_it_is(ds, packs_made) -> None:  # type: ignore[no-untyped-def]
    # One thread worker, one task an epoch: epoch 0's window (the worker's only task, kept
    # for the next pass) puts its pieces in one pack, which epochs 1 to 3 take unchanged.
    with Loader(ds.root, batch_size=50, seed=5, workers=1, pool=Pool(kind="thread", prefetch=1),
                **ONE_TASK) as loader:
        runs = _slow_epochs(loader, range(4))
    assert packs_made == [0], packs_made
    _are_the_plans_rows(ds, runs, batch_size=50, seed=5, **ONE_TASK)


@pytest.mark.parametrize("mix_window", [6, 3])
def test_a_window_that_does_not_repeat_is_not_packed(ds, packs_made, mix_window, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Two or four tasks an epoch, two thread workers with whole tasks: a task's pieces are
    # dealt anew every epoch, so a window is read for one pass, and a pack (a copy of it) would
    # not be repaid, also where a worker's pass comes in two messages (built ahead: its first
    # task alone in one). (These chunks are small, which packs a window for its chunks' sake:
    # here that rule is off, to see the rule of repeats alone.)
    monkeypatch.setattr(detload._engine.worker, "_PACK_CHUNK_ROWS", 1)
    opts = {"order": "mix", "mix_window": mix_window, "block_rows": 100}
    with Loader(ds.root, batch_size=50, seed=5, workers=2, pool=Pool(kind="thread", prefetch=1), **opts) as loader:
        assert len(loader.plan().tasks[0]) >= 2
        runs = _slow_epochs(loader, range(4))
    assert packs_made == [], packs_made
    _are_the_plans_rows(ds, runs, batch_size=50, seed=5, **opts)


@pytest.mark.parametrize(("block_rows", "packed"), [(10_000, False), (2_000, True)])
@pytest.mark.parametrize(("workers", "kind"), [(1, "thread"), (2, "thread"), (2, "process")])
def test_a_window_of_small_chunks_is_packed_for_one_pass(make_dataset, packs_made, monkeypatch, block_rows, packed,
                                                         workers, kind) -> None:  # type: ignore[no-untyped-def]
    # Four row groups of 5,000 rows, two tasks an epoch: each window is read for one pass (or
    # kept, where a worker's next task is the same pieces). Blocks of 10,000 rows take one chunk
    # of 5,000 rows of each piece, copied from the pieces as they were read; blocks of 2,000 rows
    # take chunks of 1,000 (runs spread over the piece), and every window is packed
    # block-ordered as it is read (under _PACK_CHUNK_ROWS = 2,048 rows a chunk on average). So
    # with small chunks a run makes a pack for each of its 2 x 3 windows, more than with that
    # rule off; with large ones as many as with it off. The batches are the plan's either way.
    ds = make_dataset({"a.parquet": [5_000, 5_000], "b.parquet": [5_000, 5_000]})
    opts = {"order": "mix", "mix_window": 2, "block_rows": block_rows}
    made = []
    for rule in (True, False):
        monkeypatch.setattr(detload._engine.worker, "_PACK_CHUNK_ROWS", 2048 if rule else 1)
        packs_made.clear()
        with Loader(ds.root, batch_size=500, seed=8, workers=workers, pool=Pool(kind=kind, prefetch=1),
                    **opts) as loader:
            plan = loader.plan()
            assert isinstance(plan, MixPlan) and [len(t.units) for t in plan.tasks[0]] == [2, 2]
            runs = _slow_epochs(loader, range(3))
        made.append(len(packs_made))
        _are_the_plans_rows(ds, runs, batch_size=500, seed=8, **opts)
    if kind == "thread":  # process workers make theirs in their own processes
        assert (made[0] == 6 and made[1] < 6) if packed else made[0] == made[1] < 6, made


@pytest.mark.parametrize(("block_rows", "packed"), [(2_000, False), (1_000, True)])
def test_a_window_read_through_a_cache_is_packed_for_smaller_chunks_only(make_dataset, packs_made, tmp_path,
                                                                         monkeypatch, block_rows,
                                                                         packed) -> None:  # type: ignore[no-untyped-def]
    # Through a cache a window's row groups are mapped entries, and a pack would copy the whole
    # window into memory: it is packed only where chunks average under _PACK_CHUNK_ROWS_MAPPED
    # (768) rows, not under _PACK_CHUNK_ROWS (2,048) as without a cache. Four row groups of
    # 5,000 rows, two tasks an epoch: chunks of 1,000 rows are not packed by that rule, of
    # 500 they are (a pack for each of the 2 x 3 windows, the epoch that fills the cache
    # too); with the rule off, only a window kept for the next pass is packed.
    ds = make_dataset({"a.parquet": [5_000, 5_000], "b.parquet": [5_000, 5_000]})
    opts = {"order": "mix", "mix_window": 2, "block_rows": block_rows}
    made = []
    for rule in (True, False):
        if not rule:  # the rule as it stands first, then off
            monkeypatch.setattr(detload._engine.worker, "_PACK_CHUNK_ROWS_MAPPED", 1)
        packs_made.clear()
        with Loader(ds.root, batch_size=500, seed=8, workers=1, pool=Pool(kind="thread", prefetch=1),
                    cache=str(tmp_path / f"cache-{rule}"), **opts) as loader:
            runs = _slow_epochs(loader, range(3))
        made.append(len(packs_made))
        _are_the_plans_rows(ds, runs, batch_size=500, seed=8, **opts)
    assert (made[0] == 6 and made[1] < 6) if packed else made[0] == made[1] < 6, made


@pytest.mark.parametrize(("workers", "kind"), [(1, "thread"), (2, "thread"), (2, "process")])
def test_block_ordered_windows_give_the_plans_rows(make_dataset, packs_made, workers, kind) -> None:  # type: ignore[no-untyped-def]
    # Row groups large enough that a block's chunk of each is runs spread over it: the one
    # task's window is packed block-ordered once (one thread worker: kept for the next passes;
    # two: shared, then kept) and every epoch's batches are the plan's rows, every column
    # right (check_rows: the string and list columns are held block-ordered too). Process
    # workers share the window as mapped entries, in stored order.
    ds = make_dataset({"r.parquet": [1200, 900], "s/t.parquet": [1000, 1100]})
    opts = {"order": "mix", "block_rows": 400}
    with Loader(ds.root, batch_size=64, seed=2, workers=workers, pool=Pool(kind=kind, prefetch=1), **opts) as loader:
        plan = loader.plan()
        assert isinstance(plan, MixPlan)
        (task,) = plan.tasks[0]
        assert {q for q, _, n, run, _ in task.block_chunks(0) if run < n} == set(range(4))  # every piece in runs
        runs = _slow_epochs(loader, range(3))
    assert packs_made == ([0] if kind == "thread" else []), packs_made
    _are_the_plans_rows(ds, runs, batch_size=64, seed=2, **opts)


@pytest.mark.parametrize("partitions", [2, 5])
def test_thread_workers_sharing_windows_cut_by_partitions_match_fresh_epochs(ds, partitions) -> None:  # type: ignore[no-untyped-def]
    # One task a partition, two thread workers: they share each window's pack. A row group cut
    # by a partition boundary is a piece of two windows (two packs): the second takes it from
    # the row group the first converted.
    _cut_windows_give_the_plans_rows(ds, 3, Pool(kind="thread", prefetch=1), **ONE_TASK, partitions=partitions)


def _cut_windows_give_the_plans_rows(ds, epochs: int, pool: Pool, **opts) -> None:  # type: ignore[no-untyped-def]
    """Two workers of ``pool``, one task a partition, some row group cut by a partition
    boundary (a piece of two windows): ``epochs`` epochs give the plan's rows."""
    with Loader(ds.root, batch_size=50, seed=9, workers=2, pool=pool, **opts) as loader:
        plan = loader.plan()
        assert isinstance(plan, MixPlan) and all(len(ts) == 1 for ts in plan.tasks)
        cut = collections.Counter((r.file, r.row_group) for ts in plan.tasks for t in ts for u in t.units
                                  for r in u.ranges)
        assert max(cut.values()) == 2  # some row group lies in two partitions' windows
        runs = _slow_epochs(loader, range(epochs))
    _are_the_plans_rows(ds, runs, batch_size=50, seed=9, **opts)


@pytest.mark.parametrize(("columns", "spill"), [("flat", True), ("flat", False), ("all", True)])
@pytest.mark.parametrize("partitions", [2, 5])
def test_process_workers_sharing_windows_cut_by_partitions_give_the_plans_rows(ds, make_dataset, monkeypatch,
                                                                               partitions, columns, spill
                                                                               ) -> None:  # type: ignore[no-untyped-def]
    # One task a partition, two process workers sharing each window in one file of the task's
    # (spilled, or a mapped pack with spill=False; strings and lists published beside the
    # spill file). A row group cut by a partition boundary is a piece of two windows in one
    # pass: its claims name the task, so each task's file gets its rows. (Claimed once per
    # row group, the second task found it done and read rows nobody wrote to its own file.)
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    folder = make_dataset({}, name=f"spill-{uuid.uuid4().hex[:8]}")
    opts = {**ONE_TASK, "partitions": partitions, **({"columns": FLAT} if columns == "flat" else {})}
    _cut_windows_give_the_plans_rows(ds, 2, Pool(kind="process", prefetch=1, spill=folder.root if spill else False),
                                     **opts)


@pytest.mark.parametrize(("columns", "spill"), [("flat", False), ("flat", True), ("all", True)])
@pytest.mark.parametrize("workers", [2, 3])
def test_a_ranks_process_workers_keep_a_shared_window_with_a_cut_piece(ds, make_dataset, monkeypatch, workers,
                                                                       columns, spill) -> None:  # type: ignore[no-untyped-def]
    # Two ranks, two partitions: each rank's one task holds a piece cut by the partition
    # boundary, and its process workers share the window in one file of the task's. A worker
    # that took the cut piece from the file keeps it for the next pass only as a piece of
    # that row group, never as the row group: the next epoch cuts it elsewhere (or not at
    # all), and a kept piece taken for the whole row group failed the worker
    # ("could not broadcast input array from shape (1,16) into shape (1,158)").
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    folder = make_dataset({}, name=f"spill-{uuid.uuid4().hex[:8]}")
    opts = {**ONE_TASK, "partitions": 2, **({"columns": FLAT} if columns == "flat" else {})}
    for rank in range(2):
        dist = Distributed(rank, 2)
        with Loader(ds.root, batch_size=50, seed=9, workers=workers, distributed=dist,
                    pool=Pool(kind="process", prefetch=1, spill=folder.root if spill else False), **opts) as loader:
            runs = _slow_epochs(loader, range(3))
        for e, got in enumerate(runs):
            with Loader(ds.root, batch_size=50, seed=9, distributed=dist, **opts) as fresh:
                fresh.set_epoch(e)
                assert np.array_equal(got, ds.all_ids[fresh.plan().row_ids()]), (rank, e)


@pytest.fixture
def spills_made(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The epoch the consumer is in at each `SpillPack` a thread worker makes."""
    return _epochs_made(monkeypatch, detload._engine.spill.SpillPack)


def _ids_of(ds, epochs: int, **opts) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    with Loader(ds.root, **opts) as loader:
        return _slow_epochs(loader, range(epochs))


@pytest.mark.parametrize(("workers", "kind", "mix_window"), [(1, "thread", 64), (2, "thread", 64), (1, "process", 64),
                                                             (2, "process", 64), (2, "thread", 4)])
def test_a_spilled_window_gives_the_batches_held_in_memory(ds, make_dataset, spills_made, monkeypatch, workers, kind,
                                                           mix_window) -> None:  # type: ignore[no-untyped-def]
    # A window of fixed 1-D columns of at least spill.SPILL_MIN_BYTES (here 0: every packed
    # window) is spilled to a file in the Pool.spill folder. One task an epoch (mix_window 64): a worker spills it once, in epoch 0, and
    # keeps it for every epoch after (one process worker too, in its own process: not
    # counted here); two process workers share it as cache entries. Four tasks an epoch with
    # small chunks (mix_window 4): packed, so spilled, for one pass each. Every batch is the
    # one a loader holding its windows in memory gives.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    opts = {"batch_size": 50, "seed": 5, "workers": workers, "order": "mix", "mix_window": mix_window,
            "block_rows": 100, "columns": FLAT}
    kept = _ids_of(ds, 3, pool=Pool(kind=kind, prefetch=1, spill=False), **opts)
    assert spills_made == []
    folder = make_dataset({}, name="spill")  # an empty folder of our own
    spilled = _ids_of(ds, 3, pool=Pool(kind=kind, prefetch=1, spill=folder.root), **opts)
    assert all(np.array_equal(a, b) for a, b in zip(kept, spilled))
    _are_the_plans_rows(ds, spilled, batch_size=50, seed=5, order="mix", mix_window=mix_window, block_rows=100,
                        columns=FLAT)
    if kind == "process":
        pass
    elif mix_window == 64:
        assert spills_made == [0], spills_made
    else:
        assert len(spills_made) >= 3 * 3 and set(spills_made) == {0, 1, 2}, spills_made
    assert os.listdir(folder.root) == []  # the files are unlinked: nothing is left there


@pytest.mark.parametrize(("workers", "kind", "mix_window"), [(1, "thread", 64), (2, "thread", 4), (2, "process", 64),
                                                             (2, "process", 4)])
def test_a_spilled_window_of_timestamps_dates_and_durations_gives_the_batches_held_in_memory(
        tmp_path, make_dataset, spills_made, monkeypatch, workers, kind, mix_window) -> None:  # type: ignore[no-untyped-def]
    # datetime64 and timedelta64 arrays have no buffer-protocol format, and the spill file was
    # written and read through `array.data`: every spilled window holding a timestamp failed
    # its worker ("cannot include dtype 'M' in a buffer"). One task an epoch (64, the process
    # workers sharing its file) and four (4, each worker its own windows).
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    ids = np.arange(2_000, dtype=np.int64)
    pq.write_table(pa.table({
        "id": ids, "ts": pa.array(ids * 1_000_003, pa.timestamp("us")),
        "utc": pa.array(ids * 7, pa.timestamp("ms", tz="UTC")), "day": pa.array(ids.astype(np.int32), pa.date32()),
        "d64": pa.array(ids * 86_400_000, pa.date64()), "took": pa.array(ids * 11, pa.duration("ns")),
    }), tmp_path / "t.parquet", row_group_size=125)
    opts = {"batch_size": 100, "seed": 2, "workers": workers, "order": "mix", "mix_window": mix_window,
            "block_rows": 500}

    def epochs(spill: str | bool) -> list[dict[str, np.ndarray]]:
        out = []
        with Loader(str(tmp_path / "t.parquet"), pool=Pool(kind=kind, prefetch=1, spill=spill), **opts) as loader:
            for e in range(2):
                loader.set_epoch(e)
                got = [{k: np.asarray(v).copy() for k, v in b.items()} for b in loader]
                out.append({k: np.concatenate([b[k] for b in got]) for k in got[0]})
        return out

    kept = epochs(False)
    folder = make_dataset({}, name="spill")
    spilled = epochs(folder.root)
    if kind == "thread":
        assert spills_made, "no window was spilled"
    for a, b in zip(kept, spilled):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        i = b["id"]
        assert np.array_equal(np.sort(i), ids)
        assert b["ts"].dtype == np.dtype("datetime64[us]") and np.array_equal(b["ts"].view(np.int64), i * 1_000_003)
        assert np.array_equal(b["utc"].view(np.int64), i * 7) and np.array_equal(b["took"].view(np.int64), i * 11)
        assert np.array_equal(b["day"], i.astype("datetime64[D]"))
        assert np.array_equal(b["d64"], (i * 86_400_000).astype("datetime64[ms]"))
    assert os.listdir(folder.root) == []


def test_a_spilled_window_of_tiny_row_groups_holds_a_blocks_rows_not_the_window(make_dataset, monkeypatch
                                                                                ) -> None:  # type: ignore[no-untyped-def]
    # 240 row groups of 256 rows, one task, 16 blocks of 3,840 rows: a chunk of 16 rows of
    # each piece a block, too short to be cut into runs, so part of its piece's one segment of the
    # file. Each unit's segment was read into arrays of its own and all of them held until the
    # block's stages ran: the whole window in memory at every block (row groups of 256 rows:
    # 880 against the windowed order's 489 MiB). Now each segment passes through one reused
    # buffer and only the unit's rows are kept. Traced by tracemalloc around each gather.
    import tracemalloc

    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    ds = make_dataset({f"f{i}.parquet": [256] * 24 for i in range(10)})
    folder = make_dataset({}, name="spill")
    spill_cls = detload._engine.spill.SpillPack
    real = spill_cls.gather
    peaks: list[int] = []

    def gather(self, outs, units, ranges, spans, perm):  # type: ignore[no-untyped-def]
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        real(self, outs, units, ranges, spans, perm)
        peaks.append(tracemalloc.get_traced_memory()[1] - before)

    monkeypatch.setattr(spill_cls, "gather", gather)
    opts = {"order": "mix", "mix_window": 240, "block_rows": 3840, "columns": FLAT}
    tracemalloc.start()
    try:
        with Loader(ds.root, batch_size=384, seed=3, workers=1, pool=Pool(kind="thread", prefetch=1, spill=folder.root),
                    **opts) as loader:
            plan = loader.plan()
            assert isinstance(plan, MixPlan) and [len(t.units) for t in plan.tasks[0]] == [240]
            runs = _slow_epochs(loader, range(2))
    finally:
        tracemalloc.stop()
    _are_the_plans_rows(ds, runs, batch_size=384, seed=3, **opts)
    window = 240 * 256 * (8 + 4 + 8 + 8)  # id, f32, nf, ni: 1.7 MB
    assert len(peaks) >= 2 * plan.tasks[0][0].blocks  # (and the next pass's first, built ahead)
    # The first block makes the reused buffers (a block's rows); no block holds the window
    # (a block is a sixteenth of it; the rest is the units' few Python objects).
    assert max(peaks) < window / 3, (peaks, window)


@pytest.mark.parametrize(("workers", "kind"), [(1, "thread"), (2, "thread"), (2, "process")])
def test_a_window_of_large_chunks_is_spilled_too(make_dataset, spills_made, monkeypatch, workers,
                                                 kind) -> None:  # type: ignore[no-untyped-def]
    # Four row groups of 5,000 rows, two tasks an epoch, blocks of 10,000 rows: chunks of
    # 5,000 rows, too large to be packed for their own sake (_PACK_CHUNK_ROWS), so a window
    # read for one pass was held in memory as read, whatever its size. Now, at
    # SPILL_MIN_BYTES or more of fixed columns (here any), it is packed and spilled; under
    # that it stays in memory. The batches are the same either way, and the plan's.
    ds = make_dataset({"a.parquet": [5_000, 5_000], "b.parquet": [5_000, 5_000]})
    opts = {"order": "mix", "mix_window": 2, "block_rows": 10_000, "columns": FLAT}
    folder = make_dataset({}, name="spill")
    runs, made = [], []
    for least in (1 << 62, 0):
        monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", least)
        spills_made.clear()
        with Loader(ds.root, batch_size=500, seed=8, workers=workers, pool=Pool(kind=kind, prefetch=1, spill=folder.root),
                    **opts) as loader:
            plan = loader.plan()
            assert isinstance(plan, MixPlan) and [len(t.units) for t in plan.tasks[0]] == [2, 2]
            runs.append(_slow_epochs(loader, range(3)))
        made.append(len(spills_made))
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    _are_the_plans_rows(ds, runs[1], batch_size=500, seed=8, **opts)
    if kind == "thread":  # process workers make theirs in their own processes
        assert made[0] == 0 and made[1] >= 3, made
    assert os.listdir(folder.root) == []


@pytest.mark.parametrize(("workers", "mix_window", "block_rows"), [(1, 64, 100), (1, 64, 1000), (2, 4, 400)])
def test_a_spilled_window_read_a_column_at_a_time_gives_the_same_batches(ds, make_dataset, spills_made, monkeypatch,
                                                                         workers, mix_window, block_rows
                                                                         ) -> None:  # type: ignore[no-untyped-def]
    # A block's rows are read from the spill file a few columns at a time (`_STAGE_BYTES` of
    # them); here one column at a time, so that a group's second column (id, ni: int64) is
    # read at its own place in each segment (columns of one dtype next to each other make a
    # group), of chunks cut into runs (block_rows 1000 and 400: a chunk of a piece is a whole
    # segment of the file) and of pieces not cut (100: chunks under 32 rows, parts of a
    # segment). check_rows ties every column to its row's id.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    monkeypatch.setattr(detload._engine.spill, "_STAGE_BYTES", 1)
    opts = {"batch_size": 50, "seed": 5, "workers": workers, "order": "mix", "mix_window": mix_window,
            "block_rows": block_rows, "columns": ["id", "ni", "f32", "nf"]}
    kept = _ids_of(ds, 2, pool=Pool(kind="thread", prefetch=1, spill=False), **opts)
    folder = make_dataset({}, name="spill")
    spilled = _ids_of(ds, 2, pool=Pool(kind="thread", prefetch=1, spill=folder.root), **opts)
    assert spills_made, "no window was spilled"
    assert all(np.array_equal(a, b) for a, b in zip(kept, spilled))


def test_spill_files_are_reused_while_the_pool_lives_and_closed_with_it(ds, make_dataset, spills_made,
                                                                      monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Three tasks an epoch, each window spilled for one pass: a worker's next window writes
    # into the file its last one left (not a new file: allocating and freeing its pages
    # cost as much as the writes); closing the loader closes the files no window holds.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    created: list[object] = []
    real = detload._engine.spill.tempfile.TemporaryFile

    def temporary_file(*a, **kw):  # type: ignore[no-untyped-def]
        f = real(*a, **kw)
        created.append(f)
        return f

    monkeypatch.setattr(detload._engine.spill.tempfile, "TemporaryFile", temporary_file)
    folder = make_dataset({}, name="spill")
    opts = {"batch_size": 50, "seed": 5, "workers": 2, "order": "mix", "mix_window": 4, "block_rows": 400,
            "columns": FLAT}
    got = _ids_of(ds, 3, pool=Pool(kind="thread", prefetch=1, spill=folder.root), **opts)
    assert len(spills_made) >= 9  # three windows an epoch
    assert 1 <= len(created) <= 4, len(created)  # at most two free files a folder, and two windows open
    assert all(f.closed for f in created)  # type: ignore[attr-defined]
    assert not detload._engine.spill._REUSE.free.get(folder.root)
    kept = _ids_of(ds, 3, pool=Pool(kind="thread", prefetch=1, spill=False), **opts)
    assert all(np.array_equal(a, b) for a, b in zip(kept, got))


def test_a_small_window_is_held_in_memory(ds, spills_made, packs_made) -> None:  # type: ignore[no-untyped-def]
    # Under spill.SPILL_MIN_BYTES (32 MiB of fixed columns) a window is packed in memory:
    # a spill would save less than the windowed order's blocks hold anyway.
    _ids_of(ds, 2, batch_size=50, seed=5, workers=1, pool=Pool(kind="thread", prefetch=1), columns=FLAT, **ONE_TASK)
    assert spills_made == [] and packs_made == [0]


@pytest.mark.parametrize(("kind", "workers", "mix_window"), [("thread", 1, 64), ("thread", 2, 64), ("process", 1, 64),
                                                             ("thread", 2, 4), ("thread", 1, 4)])
def test_a_window_with_string_and_list_columns_spills_its_fixed_columns(ds, make_dataset, spills_made, monkeypatch, kind,
                                                                         workers, mix_window
                                                                         ) -> None:  # type: ignore[no-untyped-def]
    # The fixed 1-D columns (id, f32, nf, ni) go to the spill file; the string and list
    # columns stay in memory beside it, held in the pieces' block order. One task an epoch
    # (mix_window 64): the window is kept and taken again from the file in epochs 1 and 2,
    # by one worker or by two threads sharing it; four tasks with small chunks (mix_window
    # 4): a file per window and pass. Every batch is the one a loader holding its windows in
    # memory gives, and check_rows ties the strings and lists to each row's id.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    opts = {"batch_size": 50, "seed": 5, "workers": workers, "order": "mix", "mix_window": mix_window,
            "block_rows": 100}
    held = _ids_of(ds, 3, pool=Pool(kind=kind, prefetch=1, spill=False), **opts)
    assert spills_made == []
    folder = make_dataset({}, name="spill")
    spilled = _ids_of(ds, 3, pool=Pool(kind=kind, prefetch=1, spill=folder.root), **opts)
    assert all(np.array_equal(a, b) for a, b in zip(held, spilled))
    _are_the_plans_rows(ds, spilled, batch_size=50, seed=5, order="mix", mix_window=mix_window, block_rows=100)
    if kind == "thread":
        assert spills_made == [0] if mix_window == 64 else len(spills_made) >= 3 * 3, spills_made
    assert os.listdir(folder.root) == []


def test_a_window_of_string_and_list_columns_only_is_spilled_too(ds, make_dataset, spills_made, packs_made,
                                                                 monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # No fixed 1-D column: the spill file holds no column, and each piece's strings and lists
    # go to a file beside it (`SpillPack.publish`); a pack in memory had held them whole.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    folder = make_dataset({}, name="spill")
    _ids_of(ds, 2, batch_size=50, seed=5, workers=1, pool=Pool(kind="thread", prefetch=1, spill=folder.root),
            columns=["id", "s", "lf"], **ONE_TASK)
    assert spills_made == [0] and packs_made == []  # id is fixed and 1-D: spilled
    with Loader(ds.root, batch_size=50, seed=5, workers=1, pool=Pool(kind="thread", prefetch=1, spill=folder.root),
                columns=["s", "lf"], **ONE_TASK) as loader:
        _Consumer.epoch = 0
        assert sum(len(b["s"]) for b in loader) == len(ds.all_ids)
    assert spills_made == [0, 0] and packs_made == []  # spilled too, nothing packed in memory
    assert os.listdir(folder.root) == []


def test_a_window_of_cache_entries_is_not_spilled(ds, tmp_path, spills_made, packs_made, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # With cache= a window is mapped cache entries, pages of files already: it is packed in
    # memory (what makes warm epochs fast), never spilled, whatever its size.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    got = _ids_of(ds, 2, batch_size=50, seed=5, workers=1, pool=Pool(kind="thread", prefetch=1),
                  cache=str(tmp_path / "cache"), columns=FLAT, **ONE_TASK)
    assert spills_made == [] and packs_made == [0]
    _are_the_plans_rows(ds, got, batch_size=50, seed=5, columns=FLAT, **ONE_TASK)


@pytest.mark.parametrize(("kind", "workers"), [("thread", 1), ("process", 1), ("thread", 2), ("process", 2)])
def test_a_folder_that_cannot_take_the_spill_file_holds_windows_in_memory(ds, tmp_path, monkeypatch, kind,
                                                                           workers) -> None:  # type: ignore[no-untyped-def]
    # The spill folder went after the Pool was made: the window is packed in memory instead,
    # with one warning naming the folder and what to do; the batches are the same. A process
    # worker's warning reaches the consumer too, as a ResourceWarning (Python ignores those
    # by default, and the worker never sees the consumer's filters). Two process workers
    # share the window in a file in a folder of the pool's, made in the spill folder when the
    # loader starts: that failing warns alike (each worker may warn once: the same text).
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    monkeypatch.setattr(detload._engine.worker, "_WARNED", set())
    folder = tmp_path / "spill"
    folder.mkdir()
    pool = Pool(kind=kind, prefetch=1, spill=str(folder))
    folder.rmdir()
    with pytest.warns(ResourceWarning) as caught:
        got = _ids_of(ds, 2, batch_size=50, seed=5, workers=workers, pool=pool, columns=FLAT, **ONE_TASK)
    texts = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert 1 <= len(texts) <= workers and len(set(texts)) == 1, texts
    assert texts[0].startswith(f"could not spill a mixed-order window to {str(folder)!r} (")
    assert texts[0].endswith("windows are held in memory instead. Free space there, or pass Pool(spill=FOLDER) "
                             "for another folder (on the command line: --spill FOLDER), or spill=False")
    _are_the_plans_rows(ds, got, batch_size=50, seed=5, columns=FLAT, **ONE_TASK)


@pytest.mark.parametrize("case", ["large chunks", "strings and lists"])
def test_process_workers_spill_the_windows_thread_workers_do(make_dataset, tmp_path, monkeypatch, case) -> None:  # type: ignore[no-untyped-def]
    # A worker process spills in its own process, out of the test's sight: its attempt is
    # seen here through a spill folder gone after the Pool was made (one ResourceWarning, the
    # batches the same). Two process workers, each its own tasks (two an epoch), chunks of
    # 5,000 rows; one process worker, a window with string and list columns. With
    # SPILL_MIN_BYTES above the window nothing is tried, so nothing warns.
    if case == "large chunks":
        ds = make_dataset({"a.parquet": [5_000, 5_000], "b.parquet": [5_000, 5_000]})
        opts = {"workers": 2, "order": "mix", "mix_window": 2, "block_rows": 10_000, "columns": FLAT}
    else:
        ds = make_dataset(FILES)
        opts = {"workers": 1, **ONE_TASK}
    for least, tried in ((1 << 62, False), (0, True)):
        monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", least)
        folder = tmp_path / f"spill{least}"
        folder.mkdir()
        pool = Pool(kind="process", prefetch=1, spill=str(folder))
        folder.rmdir()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            got = _ids_of(ds, 2, batch_size=500, seed=8, pool=pool, **opts)
        texts = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert any(t.startswith("could not spill a mixed-order window") for t in texts) is tried, texts
        _are_the_plans_rows(ds, got, batch_size=500, seed=8, **opts)


def test_the_default_spill_folder_is_never_in_memory(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # spill=True takes the system's temporary folder, unless a tmpfs holds it: a spill there
    # would move the window from the workers' memory into the page cache's, saving nothing.
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\ntmpfs /run/user\\0401 tmpfs rw 0 0\n")
    monkeypatch.setattr(detload._engine.spill, "_MOUNTS", str(mounts))
    monkeypatch.setattr(tempfile, "tempdir", "/dev/shm/x")
    assert detload._engine.spill.spill_folder(True) is None
    monkeypatch.setattr(tempfile, "tempdir", "/run/user 1/t")
    assert detload._engine.spill.spill_folder(True) is None
    monkeypatch.setattr(tempfile, "tempdir", "/var/tmp")
    assert detload._engine.spill.spill_folder(True) == "/var/tmp"
    assert detload._engine.spill.spill_folder("/dev/shm") == "/dev/shm"  # a folder given is taken as it is
    assert detload._engine.spill.spill_folder(False) is None


def _epochs_looking(loader: Loader, epochs: int, look: Callable[[], None],
                    after_epoch: Callable[[], None] = lambda: None) -> list[np.ndarray]:
    """Each epoch's ids, every batch's rows checked, ``look()`` after each batch and
    ``after_epoch()`` after each epoch."""
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        ids = []
        for b in loader:
            check_rows(b)
            ids.append(np.asarray(b["id"]).copy())
            look()
        out.append(np.concatenate(ids))
        after_epoch()
    return out


#: The row groups of the standard dataset (FILES).
GROUPS = sum(1 for rows in FILES.values() for n in rows if n)


@pytest.mark.parametrize("columns", ["flat", "all"])
@pytest.mark.parametrize("workers", [2, 3])
def test_process_workers_share_a_spilled_window(ds, tmp_path, monkeypatch, workers, columns) -> None:  # type: ignore[no-untyped-def]
    # Process workers sharing a task's window, no cache: its fixed 1-D columns are one spill
    # file in a folder of the pool's in the spill folder, each worker writing the row groups
    # it claims and reading the others' rows from it (kept for the passes after, the file
    # removed after the task's last block, the folder with the pool). With string and list
    # columns too ("all"), the worker that converted a row group publishes those columns in a
    # file of the piece's beside the spill file ("N-0-0-0.spill.Q"), which the others map,
    # and no worker writes a scratch cache entry of the whole row group (in /dev/shm: memory).
    # Every batch is the one a single thread worker holding the window in memory gives.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    opts = {"batch_size": 50, "seed": 5, **ONE_TASK, **({"columns": FLAT} if columns == "flat" else {})}
    want = _ids_of(ds, 3, workers=1, pool=Pool(kind="thread", prefetch=1, spill=False), **opts)
    folder = tmp_path / "spill"
    folder.mkdir()
    seen: set[str] = set()
    scratch = os.path.join(share_root(), f"detload-mix-{os.getpid()}-*", "cache", "**")
    entries: set[str] = set()

    def look() -> None:
        seen.update(glob.glob(f"{folder}/*/*"))
        entries.update(p for p in glob.glob(scratch, recursive=True) if os.path.basename(p).startswith("rg"))

    def none_left() -> None:  # the merger removed the task's files after its last block
        assert glob.glob(f"{folder}/*/*") == []

    with Loader(ds.root, workers=workers, pool=Pool(kind="process", prefetch=1, spill=str(folder)), **opts) as loader:
        got = _epochs_looking(loader, 3, look, none_left)
        reads = [e.row_groups_read for e in loader.stats().reads.epochs]
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert reads == [GROUPS, 0, 0], reads  # each row group read once, by the worker that claimed it
    assert entries == set(), entries
    # Epoch 0's, named by its pass too; the others took it as kept.
    names = {os.path.basename(p) for p in seen}
    spill = [n for n in names if n.endswith(".spill")]
    assert len(spill) == 1 and re.fullmatch(r"[0-9]+-0-0-0\.spill", spill[0]), names
    beside = {f"{spill[0]}.{q}" for q in range(GROUPS)} if columns == "all" else set()
    assert names == {spill[0]} | beside, names
    assert os.listdir(folder) == []


def _resident_kib(maps: list[tuple[np.ndarray, int, int]]) -> int:
    """KiB of this process's pages resident in ``maps`` (a SpillPack's: buffer, address, bytes; /proc/self/smaps)."""
    spans = [(int(b.ctypes.data), int(b.ctypes.data) + b.nbytes) for b, _, _ in maps]
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = any(lo < b and a < hi for a, b in spans)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_spilled_windows_strings_and_lists_are_mapped_a_block_at_a_time(ds, make_dataset, spills_made, monkeypatch,
                                                                          workers) -> None:  # type: ignore[no-untyped-def]
    # A spilled window's string, list and multi-dimensional columns leave the heap too: each
    # piece's are written to an unlinked file in the spill folder and mapped unpopulated, and
    # after each block their pages are dropped from the process (the page cache keeps them),
    # so a thread worker maps about a block's rows of them, not the window's (the heap had
    # held every worker's window of strings whole). The batches are the in-memory window's.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    seen: list[tuple[int, int, int]] = []  # (maps, KiB resident before the drop, after)
    real = detload._engine.spill.SpillPack.settle_beside

    def settle(self) -> None:  # type: ignore[no-untyped-def]
        before = _resident_kib(self.mapped)
        real(self)
        seen.append((len(self.mapped), before, _resident_kib(self.mapped)))

    monkeypatch.setattr(detload._engine.spill.SpillPack, "settle_beside", settle)
    opts = {"batch_size": 50, "seed": 5, "workers": workers, "order": "mix", "mix_window": 4, "block_rows": 200}
    held = _ids_of(ds, 2, pool=Pool(kind="thread", prefetch=1, spill=False), **opts)
    assert seen == [] and spills_made == []
    folder = make_dataset({}, name="spill")
    with Loader(ds.root, pool=Pool(kind="thread", prefetch=1, spill=folder.root), **opts) as loader:
        got = []
        for e in range(2):
            loader.set_epoch(e)
            ids = []
            for b in loader:
                check_rows(b)  # every column its row's
                ids.append(np.asarray(b["id"]))
            got.append(np.concatenate(ids))
    assert all(np.array_equal(a, b) for a, b in zip(held, got))
    assert spills_made and seen, (spills_made, seen)
    assert all(maps >= 1 for maps, _, _ in seen), seen  # every block's window had its columns mapped
    assert any(before > 0 for _, before, _ in seen), seen  # a block touched them
    assert all(after == 0 for _, _, after in seen), seen  # and none stayed mapped after it
    assert os.listdir(folder.root) == []  # unlinked: nothing is left there


def _columns_of(loader: Loader, epochs: range, look: Callable[[], None] = lambda: None
                ) -> list[dict[str, np.ndarray]]:
    """Each batch's columns as flat arrays (a ragged column as its values and offsets); ``look`` after each."""
    out = []
    for e in epochs:
        loader.set_epoch(e)
        for b in loader:
            look()
            flat = {}
            for k, c in b.items():
                if isinstance(c, np.ndarray):
                    flat[k] = c
                else:
                    flat[k + ".offsets"] = np.asarray(c.offsets)
                    values = c.values
                    while not isinstance(values, np.ndarray):  # a list of strings: its strings' values
                        flat[k + ".inner"] = np.asarray(values.offsets)
                        values = values.values
                    flat[k + ".values"] = values
            out.append(flat)
    return out


@pytest.mark.parametrize(("columns", "workers", "kind"), [(["id", "s", "lf"], 1, "thread"), (["id", "s", "lf"], 2, "thread"),
                                                           (["s", "lf"], 1, "thread"), (["s", "lf"], 2, "process")])
def test_a_window_of_mostly_strings_is_spilled(ds, make_dataset, spills_made, monkeypatch, columns, workers,
                                               kind) -> None:  # type: ignore[no-untyped-def]
    # A window is spilled by what it holds: its fixed 1-D columns and its strings and lists
    # (estimated from the Parquet metadata). Counted by its fixed columns alone, a window of
    # text features (here under the threshold: the id column, or no fixed column at all)
    # stayed whole on every worker's heap. Its batches are the in-memory window's (process
    # workers share it: a spill file of no column, and each piece's columns beside it).
    opts = {"batch_size": 50, "seed": 5, "workers": workers, "columns": columns, **ONE_TASK}
    with Loader(ds.root, **opts) as loader:
        plan = loader.plan()
        assert isinstance(plan, MixPlan)
        rows = max(t.rows for part in plan.tasks for t in part)
    fixed = 8 * rows if "id" in columns else 0
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", fixed + 1)  # the fixed columns alone: under it
    with pytest.warns(BlockMemoryWarning, match=r"^a task of the mixed order holds 12 row groups .*Lower mix_window"), \
            Loader(ds.root, pool=Pool(kind="thread", prefetch=1, spill=False, block_memory="10KB"), **opts) as loader:
        held = _columns_of(loader, range(2))
    assert spills_made == []
    folder = make_dataset({}, name="spill")
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlockMemoryWarning)  # spilled, it is not warned of
        with Loader(ds.root, pool=Pool(kind=kind, prefetch=1, spill=folder.root, block_memory="10KB"),
                    **opts) as loader:
            seen: set[str] = set()
            got = _columns_of(loader, range(2), lambda: seen.update(glob.glob(f"{folder.root}/*/*")))
    assert bool(spills_made) is (kind == "thread"), spills_made  # (process workers make theirs in their processes)
    if kind == "process":  # the shared spill file and its pieces' files beside it
        names = {os.path.basename(p) for p in seen}
        assert any(n.endswith(".spill") for n in names) and any(re.search(r"\.spill\.[0-9]+$", n) for n in names), names
    assert len(held) == len(got) and all(a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
                                         for a, b in zip(held, got))
    if "id" in columns:
        for b in got:
            check_rows({k: v for k, v in b.items() if k == "id"})
    assert os.listdir(folder.root) == []


@pytest.mark.parametrize("columns", [FLAT, None])
def test_a_spilled_window_is_not_warned_of(ds, spills_made, monkeypatch, columns) -> None:  # type: ignore[no-untyped-def]
    # The block memory budget warns of a mixed-order window the workers hold in memory
    # (BlockMemoryWarning, naming mix_window); one they spill lives in the page cache (its
    # strings and lists too, mapped beside the file), so the same window spilled is not
    # warned of, and held in memory (spill=False) it is.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    opts = {"batch_size": 50, "seed": 5, "workers": 1, "columns": columns, **ONE_TASK}
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlockMemoryWarning)
        _ids_of(ds, 1, pool=Pool(kind="thread", prefetch=1, block_memory="20KB"), **opts)
    assert spills_made == [0]
    with pytest.warns(BlockMemoryWarning, match=r"a task of the mixed order holds 12 row groups .*Lower mix_window"):
        _ids_of(ds, 1, pool=Pool(kind="thread", prefetch=1, block_memory="20KB", spill=False), **opts)
    assert spills_made == [0]


def _pack_files() -> set[str]:
    return {os.path.basename(p) for p in glob.glob(os.path.join(share_root(), f"detload-mix-{os.getpid()}-*", "packs", "*"))}


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("workers", [2, 3])
def test_process_workers_share_a_mapped_window(ds, tmp_path, workers, cache) -> None:  # type: ignore[no-untyped-def]
    # Process workers sharing a task's window of fixed 1-D columns, not spilled (here
    # spill=False; also a window under the spill threshold, or read through cache=): the
    # window is one file of the pool's, mapped by every worker, each piece block-ordered, as a
    # thread worker's in-memory pack holds it (its blocks' gathers then read contiguous
    # chunks, not runs spread over cache entries). Each worker copies in the row groups it
    # claims: every row group is read once for the loader (the window is kept for the passes
    # after), through the user's cache when there is one. Every batch is the one a single
    # thread worker holding the window in memory gives; the file goes after the task's last
    # block, its folder with the pool.
    opts = {"batch_size": 50, "seed": 5, "columns": FLAT, **ONE_TASK}
    want = _ids_of(ds, 3, workers=1, pool=Pool(kind="thread", prefetch=1, spill=False), **opts)
    for run in ("cold", "warm") if cache else ("cold",):
        seen: set[str] = set()
        with Loader(ds.root, workers=workers, pool=Pool(kind="process", prefetch=1, spill=False),
                    cache=str(tmp_path / "cache") if cache else None, **opts) as loader:

            def unmapped() -> None:  # its rows copied into the pack, no worker keeps an entry mapped
                maps = [Path(f"/proc/{pid}/maps").read_text() for pid in loader._pool.pids()]
                assert len(maps) == workers and not [m for m in maps if str(tmp_path / "cache") in m]

            got = _epochs_looking(loader, 3, lambda s=seen: s.update(_pack_files()),  # type: ignore[misc]
                                  unmapped if cache else lambda: None)
            assert _pack_files() == set()  # unlinked after the task's last block
            reads = loader.stats().reads
        assert all(np.array_equal(a, b) for a, b in zip(want, got)), run
        assert len(seen) == 1 and re.fullmatch(r"[0-9]+-0-0-0\.pack", seen.pop()), seen  # epoch 0's; then kept
        counts = [(e.row_groups_read, e.row_groups_cached) for e in reads.epochs]
        assert counts == [(GROUPS, 0) if run == "cold" else (0, GROUPS), (0, 0), (0, 0)], (run, counts)
    assert not glob.glob(os.path.join(share_root(), f"detload-mix-{os.getpid()}-*"))


def test_a_shared_window_without_room_for_its_file_is_shared_as_cache_entries(ds, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The pool's folder for mapped windows went (as a /dev/shm without room for the file would
    # fail): each process worker warns, as a ResourceWarning the consumer sees once, naming the
    # folder and what to do, and the workers share the window as cache entries; the batches
    # are the same.
    opts = {"batch_size": 50, "seed": 5, "columns": FLAT, **ONE_TASK}
    want = _ids_of(ds, 2, workers=1, pool=Pool(kind="thread", prefetch=1, spill=False), **opts)
    with Loader(ds.root, workers=2, pool=Pool(kind="process", prefetch=1, spill=False), **opts) as loader:
        loader._ensure_pool()
        folder = loader._pool.cfg.pack_share
        os.rmdir(folder)
        with pytest.warns(ResourceWarning) as caught:
            got = _epochs_looking(loader, 2, lambda: None)
    texts = {str(w.message) for w in caught if issubclass(w.category, ResourceWarning)}
    assert len(texts) == 1, texts
    text = texts.pop()
    assert text.startswith(f"could not hold a mixed-order window the process workers share in one file in "
                           f"{share_root()!r} (")
    assert text.endswith("they share it as cache entries instead, whose blocks are slower to cut. Give that folder "
                         "more room (a container: --shm-size), or use thread workers")
    assert all(np.array_equal(a, b) for a, b in zip(want, got))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=8, deadline=None)
@given(workers=st.integers(1, 3), mix_window=st.sampled_from([2, 3, 64]), block_rows=st.sampled_from([100, 400, 1000]),
       seed=st.integers(0, 2**32 - 1), stage=st.sampled_from([1, 2 << 20]), resume=st.floats(0.0, 1.0))
def test_spilled_windows_give_the_batches_held_in_memory_and_resume_alike(ds, make_dataset, monkeypatch, workers,
                                                                           mix_window, block_rows, seed, stage,
                                                                           resume) -> None:  # type: ignore[no-untyped-def]
    # Every window spilled (SPILL_MIN_BYTES 0), its file reused by the pool's next windows,
    # its blocks read back a column at a time or in 2 MiB stages: two epochs give the batches a
    # loader holding its windows in memory gives, and a loader resumed at any step of the
    # second epoch gives the rest of them (its landing task's window read again, its first
    # block cut from part of a chunk).
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    monkeypatch.setattr(detload._engine.spill, "_STAGE_BYTES", stage)
    opts = {"batch_size": 50, "seed": seed, "workers": workers, "order": "mix", "mix_window": mix_window,
            "block_rows": block_rows, "columns": ["id", "ni", "f32", "nf"]}
    def epochs(loader: Loader) -> list[list[np.ndarray]]:
        out = []
        for e in range(2):
            loader.set_epoch(e)
            out.append([np.asarray(b["id"]).copy() for b in loader if check_rows(b) is None])
        return out

    with Loader(ds.root, pool=Pool(kind="thread", prefetch=1, spill=False), **opts) as loader:
        want = epochs(loader)
    folder = make_dataset({}, name=f"spill-{uuid.uuid4().hex[:8]}")
    with Loader(ds.root, pool=Pool(kind="thread", prefetch=1, spill=folder.root), **opts) as loader:
        got = epochs(loader)
        assert [len(g) for g in got] == [len(w) for w in want]
        assert all(np.array_equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
        step = min(len(got[1]) - 1, int(resume * len(got[1])))
        loader.set_epoch(1)
        loader.load_state_dict(loader.state_dict() | {"step": step})
        rest = [np.asarray(b["id"]).copy() for b in loader if check_rows(b) is None]
    assert len(rest) == len(got[1]) - step
    assert all(np.array_equal(a, b) for a, b in zip(got[1][step:], rest))


@pytest.mark.parametrize("at", [0.0, 0.4, 0.9])
def test_process_workers_sharing_a_spilled_window_of_strings_and_lists_resume_alike(ds, make_dataset, monkeypatch,
                                                                                     at) -> None:  # type: ignore[no-untyped-def]
    # Two process workers share the window (fixed columns in one spill file, strings and lists
    # published beside it); a new loader resumed at a step of the second epoch reads the
    # landing task's window again, shared anew, and gives the rest of the uninterrupted run.
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    folder = make_dataset({}, name=f"spill-{uuid.uuid4().hex[:8]}")
    opts = {"batch_size": 50, "seed": 11, "workers": 2, **ONE_TASK,
            "pool": Pool(kind="process", prefetch=1, spill=folder.root)}
    with Loader(ds.root, **opts) as loader:
        loader.set_epoch(0)
        list(loader)
        loader.set_epoch(1)
        whole = [np.asarray(b["id"]).copy() for b in loader if check_rows(b) is None]
        state = loader.state_dict()
    step = int(at * len(whole))
    with Loader(ds.root, **opts) as loader:
        loader.load_state_dict(state | {"step": step})
        rest = [np.asarray(b["id"]).copy() for b in loader if check_rows(b) is None]
    assert len(rest) == len(whole) - step
    assert all(np.array_equal(a, b) for a, b in zip(whole[step:], rest))
    with Loader(ds.root, batch_size=50, seed=11, **ONE_TASK) as fresh:
        fresh.set_epoch(1)
        assert np.array_equal(np.concatenate(whole), ds.all_ids[fresh.plan().row_ids()])
    assert os.listdir(folder.root) == []
