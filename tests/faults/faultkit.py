"""Helpers of the fault-injection suite: the test dataset, clean-run hashes, plan look-ups, leak checks.

The dataset's columns are functions of a unique ``id`` (so a delivered row can
be checked on its own) and its pages carry CRCs, so corrupted bytes are caught.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from leaks import LeakCheck, pid_alive, shm_segments, wait_until  # noqa: F401 - re-exported for the fault tests

from detload import Loader
from detload.audit import hash_batch

FULL = os.environ.get("DETLOAD_FULL") == "1"

SCHEMA = pa.schema([
    pa.field("id", pa.int64()),
    pa.field("x", pa.float64()),
    pa.field("s", pa.string()),
])


def table_for(ids: np.ndarray) -> pa.Table:
    return pa.table(
        [pa.array(ids, pa.int64()), pa.array(ids * 0.5), pa.array([f"r{i}" for i in ids], pa.string())],
        schema=SCHEMA,
    )


@dataclass
class FaultData:
    root: str
    units: list[tuple[str, int, np.ndarray]] = field(default_factory=list)  # canonical order

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    @property
    def files(self) -> list[str]:
        return sorted({rel for rel, _, _ in self.units})


def write_fault_dataset(root: str, *, files: int = 4, row_groups: int = 4, rows: int = 250,
                        compression: str = "snappy") -> FaultData:
    """``files`` files of ``row_groups`` row groups of ``rows`` rows, page CRCs written."""
    os.makedirs(root, exist_ok=True)
    data = FaultData(root)
    next_id = 0
    for f in range(files):
        rel = f"part-{f:03d}.parquet"
        with pq.ParquetWriter(os.path.join(root, rel), SCHEMA, compression=compression,
                              write_page_checksum=True, use_dictionary=False) as w:
            for g in range(row_groups):
                ids = np.arange(next_id, next_id + rows, dtype=np.int64)
                next_id += rows
                w.write_table(table_for(ids), row_group_size=rows)
                data.units.append((rel, g, ids))
    return data


def check_batch(batch: dict[str, Any]) -> None:
    """Every column matches its row's id (so a delivered prefix is intact row by row)."""
    ids = batch["id"]
    np.testing.assert_array_equal(batch["x"], ids * 0.5)
    assert batch["s"].to_list() == [f"r{i}" for i in ids]


def clean_hashes(root: str, **opts: Any) -> list[str]:
    """Batch hashes of an undisturbed run (thread pool, one worker)."""
    opts = {**opts, "workers": 1, "pool": "thread"}
    with Loader(root, **opts) as loader:
        return [hash_batch(b)[0] for b in loader]


def first_step_needing(loader: Loader, rel: str, rg: int) -> int:
    """The first step of the current epoch whose batch needs unit (rel, rg)."""
    files = [f.path for f in loader.dataset.files]
    unit = next(j for j, (f, g) in enumerate(zip(loader._unit_files, loader._unit_rgs))
                if files[f] == rel and g == rg)
    return min(b.first_step for b in loader.plan().schedule if unit in b.sources)


def consume(loader: Iterable[dict[str, Any]], hashes: list[str]) -> None:
    """Iterate, checking rows and recording batch hashes, until the loader stops or raises."""
    for batch in loader:
        check_batch(batch)
        hashes.append(hash_batch(batch)[0])


# -- leaks ---------------------------------------------------------------------

#: The suite-wide leak check (tests/leaks.py), under the name these tests use.
LeakWatch = LeakCheck


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


class PicklesOnlyAtHome(Exception):
    """Pickles in the process that made it (so test hooks can carry it to a worker), nowhere else.

    Raised inside a worker it is therefore an exception that cannot travel back.
    """

    def __init__(self, message: str, home: int | None = None) -> None:
        super().__init__(message)
        self.home = os.getpid() if home is None else home

    def __reduce__(self) -> Any:
        if os.getpid() != self.home:
            raise TypeError("PicklesOnlyAtHome cannot be pickled here")
        return (type(self), (self.args[0], self.home))
