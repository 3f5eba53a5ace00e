"""The engine running the mixed order (plan format 3): a worker builds a plan task's blocks from
one read of its window; the batches are the plan's rows (`MixPlan.row_ids`) at any worker
count, pool, cache state, resume point (mid-task too), and across epochs built ahead; each row
group is read once per epoch; the window memory warning names what to change.
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
from strategies import check_rows

import detload._read.reader
from detload import BlockMemoryWarning, Loader, Pool
from detload.plan import MixPlan

FILES = {"a.parquet": [300, 200, 250, 120], "b.parquet": [], "c.parquet": [250, 0, 250, 1, 90],
         "d/e.parquet": [210, 180, 75, 300]}
MIX = {"order": "mix", "mix_window": 4, "block_rows": 150}


def _ids(loader: Loader) -> list[np.ndarray]:
    out = []
    for b in loader:
        check_rows(b)
        out.append(np.asarray(b["id"]).copy())
    return out


@pytest.fixture
def ds(make_dataset):  # type: ignore[no-untyped-def]
    return make_dataset(FILES)


def test_batches_are_the_plans_rows_at_any_worker_count(ds, pool) -> None:  # type: ignore[no-untyped-def]
    ref = None
    for workers in (1, 2, 3, 4):
        with Loader(ds.root, batch_size=64, seed=11, workers=workers, pool=pool, **MIX) as loader:
            plan = loader.plan()
            assert isinstance(plan, MixPlan) and len(plan.tasks[0]) == 3
            got = _ids(loader)
        flat = np.concatenate(got)
        assert np.array_equal(flat, ds.all_ids[plan.row_ids()])
        assert np.array_equal(np.sort(flat), np.sort(ds.all_ids))  # every row once
        ref = got if ref is None else ref
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)) and len(ref) == len(got)


@pytest.fixture
def source_log(monkeypatch) -> list[tuple[str, int]]:  # type: ignore[no-untyped-def]
    """Every (file, row group) a thread worker decodes from the source (not a cache entry)."""
    log: list[tuple[str, int]] = []
    real = detload._read.reader.UnitReader.read

    def read(self, file_idx, rg, t, **kw):  # type: ignore[no-untyped-def]
        hits = self._cache.hits if self._cache is not None else 0
        out = real(self, file_idx, rg, t, **kw)
        if self._cache is None or self._cache.hits == hits:
            log.append((self.cfg.files[file_idx].path, rg))
        return out

    monkeypatch.setattr(detload._read.reader.UnitReader, "read", read)
    return log


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("window", [4, 64])
def test_each_row_group_is_decoded_once_per_epoch(ds, source_log, workers, window) -> None:  # type: ignore[no-untyped-def]
    # mix_window 4: three tasks, each built whole by one worker. 64: one task, whose blocks
    # (k mod W) several workers build, sharing its window: still one decode per row group.
    with Loader(ds.root, batch_size=64, seed=2, workers=workers, **(MIX | {"mix_window": window})) as loader:
        _ids(loader)
        assert loader._pool is not None and loader._pool.cfg.share_windows is (window == 64)
    counts = collections.Counter(source_log)
    assert len(counts) == len(ds.units) and set(counts.values()) == {1}


def test_partitions_on_one_rank_interleave_tasks_without_deadlock(ds) -> None:  # type: ignore[no-untyped-def]
    # Two partitions on one rank: a worker holds a task of each while both are being merged.
    for workers in (1, 2):
        with Loader(ds.root, batch_size=64, seed=4, workers=workers, partitions=2, **MIX) as loader:
            plan = loader.plan()
            flat = np.concatenate(_ids(loader))
        assert np.array_equal(flat, ds.all_ids[plan.row_ids()])


def test_resume_mid_task_and_cache_warm_cold(ds, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Loader(ds.root, batch_size=32, seed=9, **MIX) as ref_loader:
        ref = _ids(ref_loader)
        plan = ref_loader.plan()
    # A step inside the second block of a task (not at a block or task start).
    block = plan.schedule[1]
    step = block.first_step + 1
    assert block.index == 1 and block.first_step < step <= block.last_step  # type: ignore[attr-defined]
    for cache in (None, tmp_path / "c", tmp_path / "c"):  # none, cold, warm
        with Loader(ds.root, batch_size=32, seed=9, workers=2, cache=cache, **MIX) as loader:
            assert all(np.array_equal(a, b) for a, b in zip(ref, _ids(loader)))
            state = loader.state_dict() | {"step": step}
            loader.load_state_dict(state)
            rest = _ids(loader)
        assert len(rest) == len(ref) - step
        assert all(np.array_equal(a, b) for a, b in zip(ref[step:], rest))


def test_epochs_built_ahead_equal_fresh_epochs(ds, pool) -> None:  # type: ignore[no-untyped-def]
    with Loader(ds.root, batch_size=48, seed=3, workers=2, pool=pool, **MIX) as loader:
        runs = []
        for e in range(3):
            loader.set_epoch(e)
            runs.append(np.concatenate(_ids(loader)))
        assert loader.ahead_used >= 1
    for e in range(3):
        with Loader(ds.root, batch_size=48, seed=3, **MIX) as fresh:
            fresh.set_epoch(e)
            assert np.array_equal(runs[e], np.concatenate(_ids(fresh)))
    assert not np.array_equal(runs[0], runs[1])


def test_break_and_iterate_again(ds) -> None:  # type: ignore[no-untyped-def]
    with Loader(ds.root, batch_size=40, seed=1, workers=2, **MIX) as loader:
        ref = _ids(loader)
        for i, _ in enumerate(loader):
            if i == 5:
                break
        assert all(np.array_equal(a, b) for a, b in zip(ref, _ids(loader)))


def test_window_memory_warning(ds) -> None:  # type: ignore[no-untyped-def]
    with (pytest.warns(BlockMemoryWarning, match=r"Lower mix_window \(now 4.*pass cache=.*--row-group-rows N"),
          Loader(ds.root, batch_size=32, seed=1, pool=_pool("20KB"), **MIX) as loader):
        loader.plan()
    # With a cache the window is mapped entries: no window warning (blocks are small here).
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlockMemoryWarning)
        with Loader(ds.root, batch_size=32, seed=1, pool=_pool("200KB"), cache=str(ds.root) + "-cache",
                    **MIX) as loader:
            loader.plan()


def _pool(budget: str) -> Pool:
    return Pool(block_memory=budget)


def test_a_windowed_state_is_refused_by_a_mix_loader_with_how_to_resume(ds) -> None:  # type: ignore[no-untyped-def]
    from detload.errors import StateError

    with Loader(ds.root, batch_size=32, seed=1, order="windowed", shuffle_window=3) as old:
        for i, _ in enumerate(old):
            if i == 2:
                break
        state = old.state_dict()
    assert state["plan_format"] == 2
    with Loader(ds.root, batch_size=32, seed=1, order="mix") as new, pytest.raises(
            StateError, match=r"plan format 2 \(the windowed order\).*pass order=\"windowed\" and "
                              r"shuffle_window=3 as in the state, or start a new run"):
        new.load_state_dict(state)
    with Loader(ds.root, batch_size=32, seed=1, order="windowed", shuffle_window=3) as again:
        again.load_state_dict(state)  # the old order by name resumes it
        assert again.position == 3
    with Loader(ds.root, batch_size=32, seed=1, order="mix") as mixed:
        mstate = mixed.state_dict()
    with Loader(ds.root, batch_size=32, seed=1, order="windowed") as old, pytest.raises(
            StateError, match=r"plan format 3 \(the mixed order"):
        old.load_state_dict(mstate)


def test_verify_names_the_formats_and_the_old_order(ds, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from detload.verify import verify

    paths = []
    for name, kw in (("w", {"order": "windowed", "shuffle_window": 2}), ("m", {"order": "mix"})):
        path = str(tmp_path / f"{name}.jsonl")
        with Loader(ds.root, batch_size=32, seed=1, manifest=path, **kw) as loader:
            list(loader)
        paths.append(path)
    res = verify(paths[0], paths[1])
    assert not res.identical and res.kind == "formats"
    assert "A was planned with plan format 2 (the windowed order)" in res.message
    assert "--order windowed --shuffle-window 2" in res.message


def test_group_by_needs_the_windowed_order(ds) -> None:  # type: ignore[no-untyped-def]
    from detload.errors import OptionError

    with pytest.raises(OptionError, match=r"group_by='id' is not available with order=\"mix\": the mixed order"
                                          r".*Pass order=\"windowed\""):
        Loader(ds.root, batch_size=32, seed=1, order="mix", group_by="id")
