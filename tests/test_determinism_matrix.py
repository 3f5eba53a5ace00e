"""The determinism matrix (tests/matrix.py) for a few configurations of the options that decide the batches.

Each configuration runs in every cell of workers x pool x cache state x resume
point x world size (a reduced set in CI, all of them with ``DETLOAD_FULL=1``),
and every cell must yield and record what the reference cell does. A new order
option adds its configuration here.
"""

from __future__ import annotations

import pytest
from matrix import CACHES, CI_CELLS, POOLS, RESUMES, WORKERS, WORLDS, check_matrix, spill_every_window

CONFIGS = {
    "shuffle": dict(batch_size=64, seed=7, order="windowed", shuffle_window=2),
    "ordered-drop-last": dict(batch_size=50, seed=7, shuffle=False, drop_last=True, columns=["id", "s", "lf"]),
    "null-fill-and-cast": dict(batch_size=64, seed=3, order="windowed", shuffle_window=3, columns=["nf", "id", "ni"],
                               null_fill={"nf": -1.0}, cast={"nf": "float32", "ni": "int32"}),
    # Plan format 2 with more partitions than the world sizes: boundaries cut row groups,
    # and a cut row group is read by two partitions (and, at world size 2, two ranks).
    "partitions-4": dict(batch_size=64, seed=5, order="windowed", shuffle_window=2, partitions=4),
    # The mixed order (plan format 3): one task of every row group, and small
    # windows and blocks so that tasks have several blocks and a resume lands inside a task.
    "mix-default": dict(batch_size=64, seed=9, order="mix"),
    "mix-tasks": dict(batch_size=64, seed=7, order="mix", mix_window=4, block_rows=120),
    # Fixed partitions over world sizes: tasks within each partition, cut row groups read twice.
    "mix-partitions-4": dict(batch_size=64, seed=5, order="mix", partitions=4, mix_window=2, block_rows=100),
    # One task a partition, fixed 1-D columns only: process workers share each window in one
    # file of the task's (a mapped pack), and a row group cut by the partition boundary is a
    # piece of two tasks' files in one pass.
    "mix-flat-shared": dict(batch_size=64, seed=4, order="mix", block_rows=100, columns=["id", "f32", "nf", "ni"]),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    from strategies import write_dataset

    # Uneven row groups (one empty) over three files: blocks and partitions of unequal sizes.
    layout = {"a.parquet": [300, 200, 17], "b.parquet": [250, 0, 99], "c/d.parquet": [210, 90, 33, 120]}
    return write_dataset(str(tmp_path_factory.mktemp("matrix") / "ds"), layout, seed=2).root


def test_the_ci_cells_cover_every_value_of_every_axis():
    for axis, values in (("workers", WORKERS), ("pool", POOLS), ("cache", CACHES), ("resume", RESUMES),
                         ("world", WORLDS)):
        assert {getattr(c, axis) for c in CI_CELLS} == set(values), axis


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_cell_gives_the_reference_batches(root, tmp_path, config):
    check_matrix(root, CONFIGS[config], str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(c for c in CONFIGS if CONFIGS[c].get("order") == "mix"))
def test_every_cell_gives_the_reference_batches_with_every_window_spilled(root, tmp_path, monkeypatch, config):
    # The mixed order's windows are spilled from 32 MiB of fixed columns (Pool.spill), which
    # this data never reaches: here every window is (the threshold travels to worker processes
    # in their configuration), so the spilled paths (a worker's own file, threads sharing
    # one, process workers sharing a task's file with strings and lists beside it) run in
    # every cell.
    import detload._engine.spill as spill

    spill_every_window(monkeypatch, str(tmp_path / "spill"))
    real_init = spill.SpillPack.__init__
    made: list[int] = []

    def init(self, *a, **kw):  # type: ignore[no-untyped-def]
        made.append(1)
        real_init(self, *a, **kw)

    monkeypatch.setattr(spill.SpillPack, "__init__", init)
    check_matrix(root, CONFIGS[config], str(tmp_path / "cells"))
    assert made  # (thread workers' windows, seen here; process workers' spill in their processes)


@pytest.mark.parametrize("odd", ["cache_cold", "world2"])
def test_a_cell_that_differs_is_named(root, tmp_path, monkeypatch, odd):
    """The helper compares for real: a cell run with another seed fails, naming that cell."""
    import matrix

    class OddLoader(matrix.Loader):
        def __init__(self, source, **kw):
            if odd in str(kw.get("manifest")):  # a cell's manifest path names the cell
                kw["seed"] = 8
            super().__init__(source, **kw)

    monkeypatch.setattr(matrix, "Loader", OddLoader)
    with pytest.raises(AssertionError, match=f"cell .*{odd}.*(batches|partition hashes) differ"):
        check_matrix(root, CONFIGS["shuffle"], str(tmp_path))
