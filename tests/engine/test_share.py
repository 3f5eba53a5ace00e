"""Shared windows of the mixed order (_engine/share.py): the claim protocol's waits end (an
entry written, a claimer that finished without one, nobody claiming, a stale pass, the limit),
thread workers hand each other row groups, and nothing a pass shared outlives it or the pool."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import detload._engine.block
from detload import Cache, Loader, Pool
from detload._engine import share
from detload._engine.mapped import MappedPack
from detload._engine.merge import make_tasks
from detload._engine.worker import _shared_pack

# One task per epoch: fewer tasks than workers, so the workers share its window.
MIX = {"order": "mix", "mix_window": 64, "block_rows": 150}
FILES = {"a.parquet": [300, 200, 250, 120], "c.parquet": [250, 0, 250, 1, 90], "d/e.parquet": [210, 180, 75, 300]}


def _never() -> bool:
    return False


def test_a_waiter_gets_the_entry_once_it_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d, entry = str(tmp_path), str(tmp_path / "entry")
    assert share.claim(d, 3, 1, 2) and not share.claim(d, 3, 1, 2)  # one claimer per pass and row group
    assert share.claim(d, 4, 1, 2)  # another pass claims apart

    def write() -> None:
        time.sleep(0.05)
        with open(entry, "wb") as f:
            f.write(b"x")
        share.finish(d, 3, 1, 2)

    threading.Thread(target=write).start()
    assert share.wait_for(d, 3, 1, 2, entry, _never, limit=10.0)


def test_a_waiter_converts_itself_when_nothing_will_come(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d, entry = str(tmp_path), str(tmp_path / "entry")
    # Nobody claimed it: no wait at all.
    t0 = time.monotonic()
    assert not share.wait_for(d, 1, 0, 0, entry, _never, limit=10.0)
    # Claimed and finished without an entry (a full cache): no wait either.
    assert share.claim(d, 1, 0, 1)
    share.finish(d, 1, 0, 1)
    assert not share.wait_for(d, 1, 0, 1, entry, _never, limit=10.0)
    assert time.monotonic() - t0 < 5.0
    # Claimed and never finished: the wait ends at the limit, or at once when the pass is stale.
    assert share.claim(d, 1, 0, 2)
    t0 = time.monotonic()
    assert not share.wait_for(d, 1, 0, 2, entry, _never, limit=0.2)
    assert 0.15 < time.monotonic() - t0 < 5.0
    assert not share.wait_for(d, 1, 0, 2, entry, lambda: True, limit=10.0)


@pytest.mark.parametrize("tag", ["", share.SPILLED, share.MAPPED])
def test_a_finished_claim_is_never_claimed_again_in_its_pass(tmp_path, tag) -> None:  # type: ignore[no-untyped-def]
    # Finishing renames the claim, which frees its name: a worker reaching the row group after
    # its claimer finished must not convert it again (it did: every process worker sharing a
    # spilled window read every row group it came to after another worker had).
    d = str(tmp_path)
    assert share.claim(d, 2, 0, 5, tag)
    share.finish(d, 2, 0, 5, tag)
    assert not share.claim(d, 2, 0, 5, tag)
    assert sorted(os.listdir(d)) == [f"2-0-5{tag}.done"]  # the refused claim left nothing behind
    assert share.wait_done(d, 2, 0, 5, _never, tag, limit=10.0)
    assert share.claim(d, 3, 0, 5, tag)  # the next pass claims anew


def test_a_withdrawn_claim_sends_its_waiters_to_convert_it_themselves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A claimer whose conversion into a shared file failed withdraws its claim: finishing it
    # would tell the waiters its rows lie in the file. A waiter then converts the row group,
    # at once and without a claim of its own getting in the way of another's.
    d = str(tmp_path)
    assert share.claim(d, 1, 2, 3, share.MAPPED)
    share.withdraw(d, 1, 2, 3, share.MAPPED)
    t0 = time.monotonic()
    assert not share.wait_done(d, 1, 2, 3, _never, share.MAPPED, limit=10.0)
    assert time.monotonic() - t0 < 5.0
    assert os.listdir(d) == []
    assert share.claim(d, 1, 2, 3, share.MAPPED)
    # A claim of one kind is not one of another: each kind's waiters wait on their own.
    assert share.claim(d, 1, 2, 3, share.SPILLED)
    share.finish(d, 1, 2, 3, share.SPILLED)
    assert not share.wait_done(d, 1, 2, 3, _never, share.MAPPED, limit=0.2)


def test_remove_claims_of_a_task_or_of_a_stopped_pass(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = str(tmp_path)
    for f, rg in [(0, 0), (0, 1), (1, 0)]:
        assert share.claim(d, 7, f, rg)
    assert share.claim(d, 8, 0, 0)
    share.finish(d, 7, 0, 1)
    # Claims of task (1, 0)'s and (2, 0)'s shared files: the same row group, one claim each.
    for task in ((1, 0), (2, 0)):
        assert share.claim(d, 7, 0, 0, share.file_tag(share.SPILLED, *task))
    entry = tmp_path / "e"
    entry.write_bytes(b"x")
    share.remove_claims(d, 7, [(0, 0), (0, 1)], [str(entry)], task=(1, 0))
    assert sorted(os.listdir(d)) == ["7-0-0.s2.0", "7-1-0", "8-0-0"]
    share.remove_claims(d, 7, None)
    assert os.listdir(d) == ["8-0-0"]


def test_a_shared_files_claims_are_its_tasks() -> None:
    # A row group cut by a partition boundary is a piece of two tasks' windows in one pass:
    # a claim of one task's shared file says nothing of the other's.
    tags = {share.file_tag(kind, p, n) for kind in (share.SPILLED, share.MAPPED) for p, n in ((0, 0), (1, 0), (0, 1))}
    assert len(tags) == 6 and "" not in tags


def test_memory_share_hands_over_or_says_convert_it() -> None:
    m = share.MemoryShare()
    assert m.fetch(1, 0, 0, _never) is None  # nobody claimed it
    assert m.claim(1, 0, 0) and not m.claim(1, 0, 0)
    threading.Timer(0.05, m.publish, (1, 0, 0, {"id": np.arange(3)})).start()
    got = m.fetch(1, 0, 0, _never, limit=10.0)
    assert got is not None and got["id"].tolist() == [0, 1, 2]
    assert m.claim(1, 0, 1)
    m.publish(1, 0, 1, None)  # the claimer failed: the waiter converts it
    assert m.fetch(1, 0, 1, _never) is None
    assert m.claim(1, 0, 2)  # never published: the limit, or a stale pass, ends the wait
    assert m.fetch(1, 0, 2, _never, limit=0.1) is None
    assert m.fetch(1, 0, 2, lambda: True) is None
    m.drop(1, [(0, 0)])
    assert m.claim(1, 0, 0)  # forgotten: claimable again
    m.drop(1)  # a stopped pass: everything forgotten, and nothing of it kept again
    assert not m._items and not m.claim(1, 0, 1)
    assert m.fetch(1, 0, 1, _never) is None
    assert m.claim(2, 0, 1)  # the next pass claims as usual


def test_sweep_removes_share_folders_of_dead_processes() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    leftover = os.path.join(share.share_root(), f"detload-mix-{dead}-abc")
    mine = share.make_share_dir()
    os.makedirs(os.path.join(leftover, "claims"), exist_ok=True)
    try:
        share.sweep_share_dirs()
        assert not os.path.exists(leftover) and os.path.isdir(mine)
    finally:
        share.remove_share_dir(mine)
        share.remove_share_dir(leftover)


def _ids(loader: Loader, stop: int | None = None) -> list[np.ndarray]:
    out = []
    for i, b in enumerate(loader):
        if stop is not None and i == stop:
            break
        out.append(np.asarray(b["id"]).copy())
    return out


def test_thread_workers_forget_what_a_stopped_or_finished_pass_shared(make_dataset) -> None:  # type: ignore[no-untyped-def]
    ds = make_dataset(FILES)
    with Loader(ds.root, batch_size=40, seed=1, workers=3, **MIX) as loader:
        ref = _ids(loader)
        _ids(loader, stop=4)  # a break mid-epoch stops the pass
        assert np.array_equal(np.concatenate(ref), np.concatenate(_ids(loader)))
        pool = loader._pool
        assert pool is not None and pool.cfg.share_windows
        time.sleep(0.2)  # the stopped pass's workers drop the rest of it
        # What is left is at most the next epoch's first tasks, built ahead.
        assert all(gen > loader._gen for gen, _, _ in pool.cfg.window_share._items)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_workers_share_only_when_a_partition_has_fewer_tasks_than_workers(make_dataset, kind) -> None:  # type: ignore[no-untyped-def]
    # 12 row groups: mix_window 4 makes 3 tasks an epoch, 8 makes 2, 64 makes 1. With at least
    # as many tasks as workers each worker builds whole tasks of its own; the batches are the
    # plan's either way.
    ds = make_dataset(FILES)
    for window, workers, shared in ((64, 2, True), (4, 2, False), (4, 3, False), (8, 3, True)):
        with Loader(ds.root, batch_size=40, seed=1, workers=workers, pool=kind, order="mix", mix_window=window,
                    block_rows=150) as loader:
            assert len(loader.plan().tasks[0]) == {64: 1, 8: 2, 4: 3}[window]
            got = np.concatenate(_ids(loader))
            pool = loader._pool
            assert pool is not None and pool.cfg.share_windows is shared, (window, workers)
            assert np.array_equal(got, ds.all_ids[loader.plan().row_ids()])


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("limit", [None, "1GB"])
def test_with_a_cache_workers_share_windows_at_any_task_count(make_dataset, tmp_path, kind, limit) -> None:  # type: ignore[no-untyped-def]
    # Three tasks an epoch, two workers: without a cache each builds whole tasks (above);
    # with one a warm window is mapped entries, ready at once, so they share every window,
    # unless the cache has a limit (it may not keep a window's entries, which each worker
    # would then convert). The batches are the plan's, cold and warm, and each row group of
    # an epoch is one read (cold) or one cache hit (warm), not one per worker.
    ds = make_dataset(FILES)
    units = sum(1 for rgs in FILES.values() for n in rgs if n)
    with Loader(ds.root, batch_size=40, seed=1, workers=2, pool=kind, order="mix", mix_window=4, block_rows=150,
                cache=Cache(str(tmp_path / "cache"), limit=limit)) as loader:
        assert len(loader.plan().tasks[0]) == 3
        counts = []
        for e in range(2):
            loader.set_epoch(e)
            got = np.concatenate(_ids(loader))
            assert np.array_equal(got, ds.all_ids[loader.plan().row_ids()])
            r = loader.stats().reads.epochs[-1]
            counts.append((r.row_groups_read, r.row_groups_cached))
        pool = loader._pool
        assert pool is not None and pool.cfg.share_windows is (limit is None)
    if limit is None:  # (unshared, a worker may keep a window for the next pass: neither)
        assert counts == [(units, 0), (0, units)]


@pytest.mark.parametrize(("block_rows", "packed"), [(10_000, False), (1_000, True)])
def test_threads_share_a_window_of_cache_entries_unpacked_unless_its_chunks_are_small(
        make_dataset, tmp_path, monkeypatch, block_rows, packed) -> None:  # type: ignore[no-untyped-def]
    # Eight row groups of 5,000 rows, four tasks an epoch, shared through a cache by two
    # thread workers: each window is read for one pass (a worker keeps none: it builds
    # blocks of every task). Chunks of 5,000 rows (blocks of 10,000) are
    # taken from the mapped entries as they are; chunks of 500 (blocks of 1,000, under 768
    # rows) are packed, as a worker's own window of them is. Cold and warm, the plan's rows.
    made: list[int] = []
    real = detload._engine.block.WindowPack.__init__

    def init(self, *a, **kw):  # type: ignore[no-untyped-def]
        made.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(detload._engine.block.WindowPack, "__init__", init)
    ds = make_dataset({"a.parquet": [5_000] * 4, "b.parquet": [5_000] * 4})
    with Loader(ds.root, batch_size=500, seed=8, workers=2, pool="thread", order="mix", mix_window=2,
                block_rows=block_rows, cache=str(tmp_path / "cache")) as loader:
        for e in range(2):
            loader.set_epoch(e)
            assert np.array_equal(np.concatenate(_ids(loader)), ds.all_ids[loader.plan().row_ids()])
        assert loader._pool is not None and loader._pool.cfg.share_windows
    assert bool(made) is packed, made


@pytest.mark.parametrize(("workers", "block_rows", "cache", "mapped"), [
    (2, 10_000, True, False),   # a user's cache, one pass, chunks of 5,000 rows: its entries
    (2, 1_000, True, True),     # chunks of 500 rows: one mapped file
    (3, 10_000, False, True),   # no cache (the pool's scratch cache): one mapped file
])
def test_process_workers_share_a_window_of_cache_entries_as_the_entries_unless_its_chunks_are_small(
        make_dataset, tmp_path, workers, block_rows, cache, mapped) -> None:  # type: ignore[no-untyped-def]
    # Which file process workers share a window of fixed 1-D columns in (`_shared_pack`), not
    # spilled (spill off): two tasks an epoch, each read for one pass.
    ds = make_dataset({"a.parquet": [5_000, 5_000], "b.parquet": [5_000, 5_000]})
    with Loader(ds.root, batch_size=500, seed=8, workers=workers, pool=Pool(kind="process", spill=False),
                order="mix", mix_window=2, block_rows=block_rows, columns=["id", "f32", "nf", "ni"],
                cache=str(tmp_path / "cache") if cache else None) as loader:
        cfg = loader._worker_config("process", "test")
        assert cfg.share_windows and cfg.share_dir is not None and cfg.scratch is not cache
        try:
            task = make_tasks(loader.plan(), 0, workers, True)[0][0]
            assert not task.repeats
            got = _shared_pack(cfg, task, 0, None)
            assert isinstance(got, MappedPack) if mapped else got is None, got
        finally:
            share.remove_share_dir(os.path.dirname(cfg.share_dir))


def _share_dirs() -> set[str]:
    return set(glob.glob(os.path.join(share.share_root(), f"detload-mix-{os.getpid()}-*")))


def test_process_workers_share_through_a_scratch_cache_removed_at_close(make_dataset) -> None:  # type: ignore[no-untyped-def]
    ds = make_dataset(FILES)
    before = _share_dirs()
    with Loader(ds.root, batch_size=40, seed=1, workers=2, pool="process", **MIX) as loader:
        got = _ids(loader)
        pool = loader._pool
        assert pool is not None and pool.cfg.scratch and pool.cfg.share_dir is not None
        base = os.path.dirname(pool.cfg.share_dir)
        assert _share_dirs() - before == {base}
        # A finished pass's tasks let go of their claims and scratch entries.
        assert not [n for n in os.listdir(pool.cfg.share_dir) if n.startswith(f"{loader._gen}-")]
        with Loader(ds.root, batch_size=40, seed=1, workers=1, **MIX) as one:
            assert np.array_equal(np.concatenate(got), np.concatenate(_ids(one)))
    assert _share_dirs() == before


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_user_cache_holds_the_shared_windows(make_dataset, tmp_path, pool) -> None:  # type: ignore[no-untyped-def]
    from detload import Cache

    ds = make_dataset(FILES)
    with Loader(ds.root, batch_size=40, seed=1, workers=1, **MIX) as one:
        ref = np.concatenate(_ids(one))
    cache = Cache(dir=str(tmp_path / "c"))
    for _ in range(2):  # cold, then warm
        with Loader(ds.root, batch_size=40, seed=1, workers=3, pool=pool, cache=cache, **MIX) as loader:
            assert np.array_equal(ref, np.concatenate(_ids(loader)))
            assert pool == "thread" or not loader._pool.cfg.scratch
