"""The worker's row-group steps and the merger's step cutter follow the configuration: a step or
a cutter is chosen once, from the loader's options, not re-decided inside each row group."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import detload
from detload._engine import worker as _worker
from detload._engine.config import WorkerConfig
from detload._engine.cut import FlatCutter, PackedCutter, make_cutter
from detload._filters.selection import Selection


def _names(cfg: WorkerConfig) -> list[str]:
    return [step.__name__ for step in _worker.row_group_steps(cfg)]


@pytest.mark.parametrize(("selections", "transform", "group_specs", "expected"), [
    (None, None, (), ["_read"]),
    ("sel", None, (), ["_read", "_verify", "_select_rows"]),
    (None, "xf", (), ["_read", "_verify", "_transform"]),
    ("sel", "xf", (), ["_read", "_verify", "_select_rows", "_transform"]),
    ("sel", None, ("g",), ["_read", "_verify", "_select_rows", "_group_rows"]),
])
def test_the_row_group_steps_are_those_the_configuration_needs(selections, transform, group_specs, expected):
    sel = {(0, 0): Selection.__new__(Selection)} if selections else None
    cfg = WorkerConfig((), pafs.LocalFileSystem(), (), {}, "thread", selections=sel,
                       transform=object() if transform else None, group_specs=group_specs)
    assert _names(cfg) == expected


def test_the_worker_kind_is_the_pools(tmp_path, pool):
    pq.write_table(pa.table({"x": np.arange(10)}), tmp_path / "a.parquet")
    with detload.Loader(str(tmp_path), batch_size=5, seed=0, pool=pool) as loader:
        assert len(list(loader)) == 2
        cfg = loader._pool.cfg
        assert cfg.kind == pool
        assert (cfg.shm_dir is not None) == (pool == "process")


def test_a_grouping_loader_cuts_packed_steps_and_any_other_flat(tmp_path):
    pq.write_table(pa.table({"k": np.repeat(np.arange(5), 2), "x": np.arange(10)}), tmp_path / "a.parquet")
    flat = detload.Loader(str(tmp_path), batch_size=4, seed=0)
    grouped = detload.Loader(str(tmp_path), batch_size=4, seed=0, order="windowed", group_by="k")
    assert isinstance(make_cutter(flat.plan(0), flat.specs, None), FlatCutter)
    assert isinstance(make_cutter(grouped.plan(0), grouped.specs, grouped.group_columns), PackedCutter)
    flat.close()
    grouped.close()
