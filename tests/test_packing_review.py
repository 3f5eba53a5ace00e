"""An outside review of group_by packing, on query-item tables the other packing tests do not use.

The tables: skewed group sizes (1 to 2,000 items), groups running across row-group
boundaries, row groups of 7 rows, a string key, string and list group columns (empty
values among them), a float group column with NaN and -0.0, several files under Hive
folders (the partition column a group column), and a table DuckDB wrote sorted by
an integer key. Each batch is checked against the rows read back with pyarrow, bitwise,
and the batches against themselves at every worker count, pool, cache state, resume
step and world size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import Loader, Packed
from detload._types import Ragged

GROUP_COLUMNS = ["qf", "qlist", "qname", "region"]


def _sizes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Skewed group sizes in [1, 2000]: most small, a long tail, a few of 2,000."""
    s = np.minimum(np.ceil(rng.pareto(0.9, n) * 4).astype(np.int64) + 1, 2000)
    s[rng.integers(0, n, 3)] = 2000
    return s


def write_hive(root: str, seed: int = 0) -> None:
    """Four files in two Hive folders, row groups of 7, 500, 333 and 64 rows."""
    rng = np.random.default_rng(seed)
    files = [("region=eu", "part-0.parquet", 7, 40), ("region=eu", "part-1.parquet", 500, 60),
             ("region=us", "part-0.parquet", 333, 50), ("region=us", "part-1.parquet", 64, 30)]
    gid = item = 0
    for folder, name, rg, n_groups in files:
        g = np.repeat(np.arange(gid, gid + n_groups), _sizes(rng, n_groups))
        gid += n_groups
        n = len(g)
        qf = (g * 0.25).astype(np.float64)
        qf[g % 5 == 1] = np.nan
        qf[g % 7 == 2] = -0.0
        t = pa.table({
            "sid": pa.array([f"s{x:05d}" for x in g]),
            "qf": pa.array(qf),
            "qlist": pa.array([list(range(int(x) % 4)) for x in g], pa.list_(pa.int32())),
            "qname": pa.array(["" if x % 3 == 0 else "n" * (int(x) % 9) for x in g]),
            "item": pa.array(np.arange(item, item + n), pa.int64()),
            "x": pa.array(rng.standard_normal(n).astype(np.float32)),
            "tags": pa.array([list(range(int(i) % 3)) for i in range(n)], pa.list_(pa.int64())),
        })
        item += n
        os.makedirs(os.path.join(root, folder), exist_ok=True)
        pq.write_table(t, os.path.join(root, folder, name), row_group_size=rg)


def write_duckdb(root: str, seed: int = 1) -> None:
    """One file DuckDB wrote from rows in random order, sorted by the key (row groups of 1,000)."""
    duckdb = pytest.importorskip("duckdb")
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(150), _sizes(rng, 150))
    n = len(g)
    perm = rng.permutation(n)
    g = g[perm]
    src = os.path.join(root + "-src.parquet")
    qv = (g * 0.5).astype(np.float32)
    qv[g % 4 == 3] = np.nan
    pq.write_table(pa.table({
        "q": pa.array(g, pa.int64()),
        "qv": pa.array(qv),
        "qs": pa.array([f"query {x}" for x in g]),
        "item": pa.array(np.arange(n), pa.int64()),
        "x": pa.array(rng.standard_normal(n)),
    }), src)
    os.makedirs(root, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM read_parquet('{src}') ORDER BY q, item) TO "
                f"'{os.path.join(root, 'data.parquet')}' (FORMAT parquet, ROW_GROUP_SIZE 1000)")
    con.close()
    os.remove(src)


@pytest.fixture(scope="module")
def hive(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("review") / "hive")
    write_hive(root)
    return root


@pytest.fixture(scope="module")
def duck(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("review") / "duck")
    write_duckdb(root)
    return root


HIVE = dict(group_by="sid", group_columns=GROUP_COLUMNS)
DUCK = dict(group_by="q", group_columns=["qv", "qs"])


# -- the stored rows, read back with pyarrow -------------------------------------------------


class Stored:
    """Every stored row of a dataset, by its ``item`` id: each column's values (fixed columns
    as NumPy, variable ones as per-row bytes), and each row's file and position in it."""

    def __init__(self, root: str) -> None:
        paths = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root)
                       for f in fs if f.endswith(".parquet"))
        tables = []
        where: list[tuple[int, int]] = []
        for i, p in enumerate(paths):
            t = pq.read_table(os.path.join(root, p))
            for part in os.path.dirname(p).split(os.sep):
                if "=" in part:
                    k, v = part.split("=", 1)
                    t = t.append_column(k, pa.array([v] * len(t)))
            tables.append(t)
            where += [(i, r) for r in range(len(t))]
        table = pa.concat_tables(tables)
        items = table.column("item").to_numpy()
        self.n = len(items)
        self.row_of = np.empty(int(items.max()) + 1, dtype=np.int64)
        self.row_of[items] = np.arange(self.n)
        self.where = np.asarray(where, dtype=np.int64)
        self.fixed: dict[str, np.ndarray] = {}
        self.ragged: dict[str, list[bytes]] = {}
        for name in table.column_names:
            col = table.column(name).combine_chunks()
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                self.ragged[name] = [s.encode() for s in col.to_pylist()]
            elif pa.types.is_list(col.type):
                self.ragged[name] = [np.asarray(v, dtype=col.type.value_type.to_pandas_dtype()).tobytes()
                                     for v in col.to_pylist()]
            else:
                self.fixed[name] = col.to_numpy(zero_copy_only=False)

    def check(self, flat: dict[str, Any]) -> np.ndarray:
        """The stored rows of ``flat`` (by its ``item`` ids), after asserting it holds them bitwise."""
        rows = self.row_of[flat["item"]]
        for name, col in flat.items():
            if isinstance(col, Ragged):
                got = [bytes(np.ascontiguousarray(col.values[col.offsets[i]:col.offsets[i + 1]]).tobytes())
                       for i in range(len(col.offsets) - 1)]
                assert got == [self.ragged[name][r] for r in rows], name
            else:
                want = self.fixed[name][rows]
                assert col.dtype == want.dtype and col.tobytes() == np.ascontiguousarray(want).tobytes(), name
        return rows


def _epoch(loader: Loader) -> Iterator[Packed]:
    for b in loader:
        assert isinstance(b, Packed)
        yield b


def check_epoch(loader: Loader, stored: Stored, key: str, *, chunk: int | None = None,
                micro: int | None = None) -> list[int]:
    """One epoch: unpack() bitwise the stored rows; each group a run of consecutive stored rows
    of one file with one key, its row in ``groups`` that of its items; no group split across
    batches (chunks of ``chunk`` rows instead, cut at multiples of it); every item once."""
    seen: list[int] = []
    batch_of: dict[Any, int] = {}
    for step, b in enumerate(_epoch(loader)):
        b.check()
        assert b.n_items <= loader.options.batch_size
        if micro is not None:
            assert b.n_items <= micro
        flat = b.unpack()
        assert list(flat) == [s.name for s in loader.column_specs]
        rows = stored.check(flat)
        assert (np.repeat(np.arange(b.n_groups), np.diff(b.offsets)) == b.group_index).all()
        for g in range(b.n_groups):
            lo, hi = int(b.offsets[g]), int(b.offsets[g + 1])
            assert hi > lo
            w = stored.where[rows[lo:hi]]
            assert (w[:, 0] == w[0, 0]).all() and (np.diff(w[:, 1]) == 1).all(), "a group is not a stored run"
            one = Packed(b.items, {k: _row(v, g) for k, v in b.groups.items()}, np.zeros(hi - lo, dtype=np.int64),
                         np.array([0, hi - lo], dtype=np.int64), b.columns)
            kflat = one.unpack()
            kv = kflat[key]
            k = bytes(kv.values[kv.offsets[0]:kv.offsets[1]]) if isinstance(kv, Ragged) else kv[0].item()
            if chunk is None:
                assert batch_of.setdefault(k, step) == step, f"group {k!r} split across batches"
                assert hi - lo == _group_size(stored, key, rows[lo])
            else:
                assert hi - lo <= chunk
        seen += flat["item"].tolist()
    assert len(seen) == len(set(seen)), "an item delivered twice"
    return seen


def _row(col: Any, g: int) -> Any:
    if isinstance(col, Ragged):
        return Ragged(col.values[col.offsets[g]:col.offsets[g + 1]], np.array([0, col.offsets[g + 1] - col.offsets[g]]),
                      col.kind)
    return col[g:g + 1]


_SIZES: dict[tuple[int, str], np.ndarray] = {}


def _group_size(stored: Stored, key: str, row: int) -> int:
    """The stored size of the group of stored row ``row``."""
    sizes = _SIZES.get((id(stored), key))
    if sizes is None:
        vals = stored.ragged[key] if key in stored.ragged else stored.fixed[key].tolist()
        change = np.flatnonzero([a != b for a, b in zip(vals[1:], vals[:-1])]) + 1
        starts = np.concatenate([[0], change, [len(vals)]])
        sizes = np.repeat(np.diff(starts), np.diff(starts))
        _SIZES[(id(stored), key)] = sizes
    return int(sizes[row])


# -- what each batch holds --------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_hive_batches_unpack_to_the_stored_rows(hive, shuffle):
    stored = Stored(hive)
    with Loader(hive, batch_size=4400, seed=3, shuffle=shuffle, shuffle_window=2, **HIVE) as loader:
        assert loader.group_stats is not None and loader.group_stats["largest"] == 2000
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            n = len(loader)  # the greedy rule packs each epoch's group order: counts may differ
            seen = check_epoch(loader, stored, "sid")
            assert sorted(seen) == sorted(stored.fixed["item"].tolist())
            assert loader.position == n


def test_duckdb_batches_unpack_to_the_stored_rows(duck):
    stored = Stored(duck)
    assert pq.ParquetFile(os.path.join(duck, "data.parquet")).metadata.created_by.lower().startswith("duckdb")
    with Loader(duck, batch_size=2400, seed=8, **DUCK) as loader:
        seen = check_epoch(loader, stored, "q")
        assert sorted(seen) == sorted(stored.fixed["item"].tolist())


@pytest.mark.parametrize("cache", [False, True])
def test_empty_string_and_list_group_values_across_row_groups(tmp_path, cache):
    """A group that runs from one row group into the next, whose string or list group column
    is empty there (no values at all in the row group), is compared without error."""
    os.makedirs(tmp_path / "d")
    q = [1, 1, 1, 2, 2, 2, 2, 3]
    pq.write_table(pa.table({"q": q, "s": [""] * 8, "l": pa.array([[]] * 8, pa.list_(pa.int32())),
                             "item": range(8)}), str(tmp_path / "d" / "a.parquet"), row_group_size=2)
    kw: dict[str, Any] = {"cache": str(tmp_path / "c")} if cache else {}
    stored = Stored(str(tmp_path / "d"))
    with Loader(str(tmp_path / "d"), batch_size=4, seed=0, group_by="q", group_columns=["s", "l"], **kw) as loader:
        for _ in range(2):  # cold, then the compacted group rows (with a cache)
            assert sorted(check_epoch(loader, stored, "q")) == list(range(8))
