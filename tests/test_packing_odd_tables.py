"""group_by packing keeps every group whole and every row once on the query-item tables real data has.

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

import detload
from detload import Loader, Packed
from detload._types import Ragged
from detload.audit import hash_batch

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
        table = pa.concat_tables(tables, promote_options="permissive")
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

    def runs(self, key: str) -> np.ndarray:
        """Each stored row's run: rows of one file with one key, back to back."""
        # bitwise, as the loader compares keys: NaN equals NaN, -0.0 is not 0.0
        vals = self.ragged[key] if key in self.ragged else [v.tobytes() for v in self.fixed[key]]
        change = [i for i in range(1, self.n) if vals[i] != vals[i - 1] or self.where[i, 0] != self.where[i - 1, 0]]
        ids = np.zeros(self.n, dtype=np.int64)
        ids[change] = 1
        return np.cumsum(ids)

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
                micro: int | None = None, mask: np.ndarray | None = None) -> list[int]:
    """One epoch: unpack() bitwise the stored rows; each group the rows of one stored run of its
    key that ``mask`` selects (all of them, in stored order; with ``chunk``, the k-th chunk of
    ``chunk`` of them), its row in ``groups`` that of its items; no group split across batches;
    batches of at most ``micro`` items; every item once."""
    run = stored.runs(key)
    sel = np.ones(stored.n, dtype=bool) if mask is None else mask
    seen: list[int] = []
    batch_of: dict[int, int] = {}
    steps = len(loader)  # exact before any batch is read
    for step, b in enumerate(_epoch(loader)):
        b.check()
        assert b.n_items <= loader.options.batch_size
        if micro is not None:
            assert b.n_items <= micro
        flat = b.unpack()
        assert list(flat) == [s.name for s in loader.column_specs]
        rows = stored.check(flat)
        assert sel[rows].all(), "a row the filter drops was delivered"
        assert (np.repeat(np.arange(b.n_groups), np.diff(b.offsets)) == b.group_index).all()
        for g in range(b.n_groups):
            lo, hi = int(b.offsets[g]), int(b.offsets[g + 1])
            assert hi > lo
            r = rows[lo:hi]
            rid = int(run[r[0]])
            assert (run[r] == rid).all(), "a group holds rows of two keys"
            whole = np.flatnonzero((run == rid) & sel)
            if chunk is None:
                assert r.tolist() == whole.tolist(), "a group is not its key's (selected) rows in stored order"
                assert batch_of.setdefault(rid, step) == step, "a group split across batches"
            else:
                at = int(np.searchsorted(whole, r[0]))
                assert at % chunk == 0 and r.tolist() == whole[at:at + chunk].tolist(), "not a chunk"
        seen += flat["item"].tolist()
    assert len(seen) == len(set(seen)), "an item delivered twice"
    assert loader.position == steps
    if mask is not None:
        assert sorted(seen) == sorted(stored.fixed["item"][mask].tolist()), "not every selected item once"
    return seen


# -- what each batch holds --------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_hive_batches_unpack_to_the_stored_rows(hive, shuffle):
    stored = Stored(hive)
    with Loader(hive, batch_size=4400, seed=3, shuffle=shuffle, order="windowed", shuffle_window=2, **HIVE) as loader:
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
    with Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="q", group_columns=["s", "l"], **kw) as loader:
        for _ in range(2):  # cold, then the compacted group rows (with a cache)
            assert sorted(check_epoch(loader, stored, "q")) == list(range(8))


# -- the same batches at every worker count, pool, cache state, resume step and world size -----


def concat(parts: list[Packed]) -> Packed:
    """The ranks' batches of one step as one (the documented union: in rank order, offsets shifted)."""
    def cat(cols: list[Any]) -> Any:
        if isinstance(cols[0], Ragged):
            offs, base = [np.zeros(1, dtype=np.int64)], 0
            for c in cols:
                offs.append(c.offsets[1:] + base)
                base += int(c.offsets[-1])
            return Ragged(np.concatenate([c.values for c in cols]), np.concatenate(offs), cols[0].kind)
        return np.concatenate(cols)

    offs, base = [np.zeros(1, dtype=np.int64)], 0
    for p in parts:
        offs.append(p.offsets[1:] + base)
        base += p.n_items
    offsets = np.concatenate(offs)
    return Packed({k: cat([p.items[k] for p in parts]) for k in parts[0].items},
                  {k: cat([p.groups[k] for p in parts]) for k in parts[0].groups},
                  np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)), offsets, parts[0].columns)


def run_hashes(root: str, opts: dict[str, Any], *, world: int = 1, stop: int | None = None, epochs: int = 2,
               **execution: Any) -> list[str]:
    """Each global step's hash over ``epochs`` epochs (the ranks' batches joined), each rank
    stopped after ``stop`` batches and resumed from its state_dict in a new loader."""
    per_rank: list[list[Packed]] = []
    for rank in range(world):
        kw = dict(opts, batch_size=opts["batch_size"] // world, **execution)
        if world > 1:
            kw["distributed"] = detload.Distributed(rank, world)
        got: list[Packed] = []
        state = None
        with Loader(root, **kw) as loader:
            for e in range(epochs):
                loader.set_epoch(e)
                for b in loader:
                    got.append(b)
                    if len(got) == stop:
                        state = loader.state_dict()
                        break
                if state is not None:
                    break
        if state is not None:
            with Loader(root, **kw) as loader:
                loader.load_state_dict(state)
                for e in range(loader.epoch, epochs):
                    loader.set_epoch(e)
                    got += list(loader)
        per_rank.append(got)
    assert len({len(g) for g in per_rank}) == 1, "ranks gave different step counts"
    return [hash_batch(concat([g[i] for g in per_rank]) if world > 1 else per_rank[0][i])[0]
            for i in range(len(per_rank[0]))]


HIVE_MATRIX = dict(batch_size=8800, seed=21, order="windowed", shuffle_window=3, partitions=4, **HIVE)


def test_hive_batches_are_the_same_every_way_they_run(hive, tmp_path):
    """Workers, pools, cache states, resume points and world sizes. CI runs a reduced form (each
    dimension still varied; process pools started less often); ``DETLOAD_FULL=1`` all of it."""
    from matrix import FULL

    ref = run_hashes(hive, HIVE_MATRIX)
    n0 = len(ref)
    assert n0 > 6
    one = run_hashes(hive, HIVE_MATRIX, epochs=1)
    ways = ((3, "thread"), (8, "thread"), (3, "process"), (8, "process")) if FULL else ((8, "thread"), (3, "process"))
    for workers, pool in ways:
        assert run_hashes(hive, HIVE_MATRIX, workers=workers, pool=pool, epochs=1) == one, (workers, pool)
    cache = str(tmp_path / "cache")
    for state in ("cold", "warm"):
        for pool in ("thread", "process") if FULL else ("thread",):
            c = cache + pool
            assert run_hashes(hive, HIVE_MATRIX, workers=3, pool=pool, cache=c) == ref, (state, pool)
    for stop in (1, 3, n0 // 2, n0 // 2 + 1, n0 - 1) if FULL else (1, n0 // 2 + 1):
        assert run_hashes(hive, HIVE_MATRIX, stop=stop, workers=2) == ref, stop
    for world in (2, 4):
        assert run_hashes(hive, HIVE_MATRIX, world=world, workers=2) == ref, world
    # A warm cache read by processes, resumed at another world size (the thread run above filled it).
    assert run_hashes(hive, HIVE_MATRIX, world=4, stop=2, cache=cache + "thread", workers=3, pool="process") == ref


# -- the batching rule, recomputed from docs/packing.md ---------------------------------------


def documented_group_order(seed: int, epoch: int, p: int, block: int, g: int) -> np.ndarray:
    """Rule 2: a stable argsort of PCG64(SeedSequence([TAG_GROUPS, seed_lo32, seed_hi32, epoch,
    partition, block])).random_raw(G)."""
    bits = np.random.PCG64(np.random.SeedSequence([0x47525053, seed & 0xFFFFFFFF, seed >> 32, epoch, p, block]))
    return np.argsort(np.asarray(bits.random_raw(g), dtype=np.uint64), kind="stable")


def documented_micro_batches(sizes: list[int], m: int) -> list[list[int]]:
    """Rule 3: consecutive groups while their items total at most m; the next starts at the
    first group that did not fit."""
    out: list[list[int]] = []
    cur: list[int] = []
    for s in sizes:
        assert s <= m
        if sum(cur) + s > m:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_follow_the_documented_rule_with_drop_last_and_empty_micro_batches(hive, seed, shuffle):
    P, m = 4, 2200
    stored = Stored(hive)
    total = stored.n
    kw = dict(batch_size=m, seed=seed, shuffle=shuffle, order="windowed", shuffle_window=3, partitions=P, **HIVE)
    got: dict[bool, list[list[Packed]]] = {}
    plans = {}
    for drop_last in (False, True):
        ranks = []
        for r in range(P):
            with Loader(hive, **kw, drop_last=drop_last, distributed=detload.Distributed(r, P)) as loader:
                ranks.append(list(_epoch(loader)))
                plans[drop_last] = loader.plan()
        got[drop_last] = ranks
    plan = plans[False]
    counts = []
    for p in range(P):
        sizes: list[int] = []
        for b in plan.blocks[p]:
            starts = np.asarray(b.group_starts, dtype=np.int64)
            gs = np.diff(np.append(starts, b.rows))
            if shuffle:
                gs = gs[documented_group_order(seed, 0, p, b.number, len(gs))]
            sizes += gs.tolist()
        want = documented_micro_batches(sizes, m)
        counts.append(len(want))
        mine = got[False][p]
        delivered = [np.diff(b.offsets).tolist() for b in mine if b.n_items]
        assert delivered == want, f"partition {p}: batches are not the documented greedy fill"
        # Partitions balanced by items to within one group.
        assert abs(sum(sizes) - total / P) <= max(sizes)
    steps = max(counts)
    assert all(len(r) == steps for r in got[False])
    for p in range(P):
        for b in got[False][p][counts[p]:]:  # a partition that ran out: empty micro-batches
            assert b.n_items == 0 and b.n_groups == 0 and b.offsets.tolist() == [0]
            assert b.offsets.dtype == np.int64 and b.group_index.dtype == np.int64
            full = got[False][p][0]
            for part, ref in ((b.items, full.items), (b.groups, full.groups)):
                assert list(part) == list(ref)
                for k, v in part.items():
                    assert type(v) is type(ref[k])
                    if isinstance(v, Ragged):
                        assert len(v.offsets) == 1 and v.values.dtype == ref[k].values.dtype
                    else:
                        assert len(v) == 0 and v.dtype == ref[k].dtype and v.shape[1:] == ref[k].shape[1:]
            assert b.unpack().keys() == full.unpack().keys()
    # drop_last: the smallest count, the same batches up to it, the rest reported.
    low = min(counts)
    assert all(len(r) == low for r in got[True])
    for p in range(P):
        assert [hash_batch(b)[0] for b in got[True][p]] == [hash_batch(b)[0] for b in got[False][p][:low]]
    kept = sum(b.n_items for r in got[True] for b in r)
    assert plans[True].dropped_rows == total - kept and plans[True].steps == low
    assert plans[False].dropped_rows == 0 and plans[False].steps == steps


# -- max_group_items, filter=, transform= ------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 300, 1100])
def test_max_group_items_cuts_chunks_at_multiples_of_n(hive, n):
    stored = Stored(hive)
    m = 1100
    with Loader(hive, batch_size=2 * m, partitions=2, seed=4, max_group_items=n, **HIVE) as loader:
        assert loader.group_stats is not None and loader.group_stats["largest"] == 2000
        seen = check_epoch(loader, stored, "sid", chunk=n)
        assert sorted(seen) == sorted(stored.fixed["item"].tolist())
        assert loader.group_stats["chunks"] == sum(-(-int(s) // n) for s in np.bincount(stored.runs("sid")))


def test_filter_delivers_each_partly_selected_group_as_its_selected_part(hive):
    stored = Stored(hive)
    x = stored.fixed["x"]
    mask = x < 0.3
    with Loader(hive, batch_size=4400, seed=6, filter="x < 0.3", **HIVE) as loader:
        check_epoch(loader, stored, "sid", mask=mask)
    # On a group column too, and with chunks: whole groups dropped, the others chunked.
    qf = stored.fixed["qf"]
    mask = (x < 0.3) & ~(qf < 10)  # NaN < 10 is False: NaN groups stay
    with Loader(hive, batch_size=4400, seed=6, filter="x < 0.3 and not (qf < 10)", max_group_items=50,
                **HIVE) as loader:
        check_epoch(loader, stored, "sid", mask=mask, chunk=50)


def _double_x(cols: dict[str, Any], ctx: Any) -> dict[str, Any]:
    out = dict(cols)
    out["x"] = cols["x"] * np.float32(2)
    out["qf"] = cols["qf"] + 1.0  # a group column may change, if it stays constant in each group
    return out


def test_transform_with_rows_same_and_the_key_kept(hive, tmp_path):
    stored = Stored(hive)
    stored.fixed["x"] = stored.fixed["x"] * np.float32(2)
    stored.fixed["qf"] = stored.fixed["qf"] + 1.0
    xf = detload.Transform(_double_x, name="double_x", version="1", rows="same")
    kw = dict(batch_size=4400, seed=6, transform=xf, **HIVE)
    hashes = []
    for cache in (None, str(tmp_path / "c"), str(tmp_path / "c")):
        with Loader(hive, **kw, cache=cache, workers=2) as loader:
            check_epoch(loader, stored, "sid")
            hashes.append([hash_batch(b)[0] for b in loader])
    assert hashes[0] == hashes[1] == hashes[2]
    with Loader(hive, **kw, filter="x < 0.3") as loader:  # the filter sees the stored x
        check_epoch(loader, stored, "sid", mask=Stored(hive).fixed["x"] < 0.3)


def test_duckdb_table_with_a_filter_and_chunks_is_the_same_in_every_cell_of_the_matrix(duck, tmp_path):
    from matrix import check_matrix

    check_matrix(duck, dict(batch_size=2400, seed=13, order="windowed", shuffle_window=2, max_group_items=500,
                            filter="x < 1.0", partitions=4, **DUCK), str(tmp_path / "m"))


# -- keys of other types -----------------------------------------------------------------------


@pytest.mark.parametrize("cache", [False, True])
def test_a_string_key_stored_as_string_in_one_file_and_large_string_in_another(tmp_path, cache):
    """Writers differ (Polars writes large_string, DuckDB string); the loader reads both as one
    string column, so grouping must too (it raised Arrow's "chunks must all be same type")."""
    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"k": pa.array(["a", "a", "b"], pa.large_string()), "item": [0, 1, 2]}),
                   str(tmp_path / "d" / "a.parquet"))
    pq.write_table(pa.table({"k": pa.array(["c", "c", "d", "d"], pa.string()), "item": [3, 4, 5, 6]}),
                   str(tmp_path / "d" / "b.parquet"))
    stored = Stored(str(tmp_path / "d"))
    kw: dict[str, Any] = {"cache": str(tmp_path / "c")} if cache else {}
    for _ in range(2):  # cold, then the runs from the cache
        with Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="k", **kw) as loader:
            assert loader.group_stats is not None and loader.group_stats["groups"] == 4
            assert sorted(check_epoch(loader, stored, "k")) == list(range(7))
    os.remove(tmp_path / "d" / "b.parquet")  # and a key split across such files is still found
    pq.write_table(pa.table({"k": pa.array(["b", "c"], pa.string()), "item": [3, 4]}), str(tmp_path / "d" / "b.parquet"))
    with pytest.raises(detload.DatasetError, match=r"group_by='k': group 'b' is split across files: it occurs in "
                                                   r"a.parquet \(row group 0\) and in b.parquet \(row group 0\)"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="k")


@pytest.mark.parametrize("typ", [pa.list_(pa.int64()), pa.list_(pa.int64(), 1)])
def test_error_a_list_key_column(tmp_path, typ):
    """A list key was Arrow's "no kernel matching input types" from deep in planning."""
    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"k": pa.array([[1], [1], [2]], typ), "item": [0, 1, 2]}),
                   str(tmp_path / "d" / "a.parquet"))
    with pytest.raises(detload.OptionError, match=r"group_by='k' is a (fixed_size_)?list<element: int64>(\[1\])? "
                                                  r"column: the key must be a scalar column \(a number, string, "
                                                  r"binary, bool, date or time\)"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="k")


def test_chunks_are_groups_of_their_own_so_shuffling_places_them_apart(hive):
    """max_group_items: each chunk is a group of its own (docs/packing.md), so without shuffling
    a split group's chunks follow one another, and with shuffling each is placed on its own."""
    def apart(shuffle: bool) -> int:
        with Loader(hive, batch_size=4400, seed=4, shuffle=shuffle, max_group_items=300, **HIVE) as loader:
            keys: list[bytes] = []
            for b in _epoch(loader):
                k = b.groups["sid"]
                keys += [bytes(k.values[k.offsets[g]:k.offsets[g + 1]]) for g in range(b.n_groups)]
        runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
        return len(runs) - len(set(runs))

    assert apart(False) == 0
    assert apart(True) > 0


# -- the command line: detload plan and detload bench with --group-by ---------------------------


def test_detload_plan_with_group_by_plans_what_the_loader_plans(hive, capsys):
    import json

    from detload.cli import main as cli_main

    args = ["plan", hive, "--batch-size", "4400", "--seed", "1", "--partitions", "2", "--group-by", "sid",
            "--group-columns", "qf,qname", "--max-group-items", "1000"]
    assert cli_main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    with Loader(hive, batch_size=4400, seed=1, partitions=2, order="windowed", group_by="sid", group_columns=["qf", "qname"],
                max_group_items=1000) as loader:
        plan = loader.plan()
        assert d["fingerprint"] == plan.fingerprint
        assert d["micro_batch_starts"] == [s.tolist() for s in plan.step_starts]
        assert d["groups"] == {"group_by": "sid", "group_columns": ["sid", "qf", "qname"], **loader.group_stats}
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert (f"groups by 'sid' (group columns sid, qf, qname): 180 groups in {d['groups']['chunks']:,} chunks, "
            f"the largest 2,000 items; micro-batches per partition [") in out
    # A unit a group joined shows its whole row groups as a span, not one name each.
    assert "region=eu/part-0.parquet#0-" in out and "region=eu/part-0.parquet#1+" not in out
    assert cli_main(["plan", hive, "--batch-size", "1000", "--seed", "1", "--group-by", "sid"]) == 2
    assert "holds 2000 items, more than a micro-batch of 1000 items" in capsys.readouterr().err


def test_detload_bench_with_group_by_counts_items(hive, capsys):
    from detload.cli import main as cli_main

    assert cli_main(["bench", hive, "--batch-size", "4400", "--workers", "2", "--epochs", "1", "--group-by", "sid",
                     "--group-columns", "qf", "--max-group-items", "1000", "--quiet"]) == 0
    assert "epoch 0: 32,121 rows in" in capsys.readouterr().out


@pytest.mark.parametrize("rg", [2, 3, 100])
@pytest.mark.parametrize("cache", [False, True])
def test_a_float_key_is_compared_bitwise_wherever_the_row_groups_end(tmp_path, rg, cache):
    """The workers compare group columns (the key among them) bitwise; planning compared keys by
    value, so -0.0 then 0.0 in one row group made one group that the workers' check then refused
    ("leave 'k' out of group_columns", which cannot be done), and the groups depended on where the
    row groups ended. Keys are now compared bitwise at planning too: NaN equals NaN, -0.0 is
    not 0.0."""
    os.makedirs(tmp_path / "d")
    nan = float("nan")
    k = [1.0, 1.0, -0.0, 0.0, 0.0, nan, nan, nan, 2.0]
    pq.write_table(pa.table({"k": pa.array(k), "item": range(9)}), str(tmp_path / "d" / "a.parquet"),
                   row_group_size=rg)
    kw: dict[str, Any] = {"cache": str(tmp_path / "c")} if cache else {}
    stored = Stored(str(tmp_path / "d"))
    with Loader(str(tmp_path / "d"), batch_size=4, seed=0, shuffle=False, order="windowed", group_by="k", **kw) as loader:
        assert loader.group_stats is not None and loader.group_stats["groups"] == 5
        got = [np.diff(b.offsets).tolist() for b in _epoch(loader)]
        assert [s for b in got for s in b] == [2, 1, 2, 3, 1]
        check_epoch(loader, stored, "k")
    os.remove(tmp_path / "d" / "a.parquet")
    pq.write_table(pa.table({"k": pa.array([0.0, 1.0, -0.0, nan, 2.0, nan]), "item": range(6)}),
                   str(tmp_path / "d" / "a.parquet"), row_group_size=rg)
    with pytest.raises(detload.DatasetError, match=r"group_by='k': key nan is not contiguous in a.parquet: it occurs "
                                                   r"at row group \d+ row \d+ and again"):
        Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="k")


# -- PyTorch ---------------------------------------------------------------------------------------


def _rows_of(col: Any) -> list[bytes]:
    """Each row's bytes of a column (NumPy or torch, fixed or variable)."""
    if hasattr(col, "offsets"):
        vals = col.values.numpy() if hasattr(col.values, "numpy") else col.values
        offs = col.offsets.numpy() if hasattr(col.offsets, "numpy") else col.offsets
        return [np.ascontiguousarray(vals[offs[i]:offs[i + 1]]).tobytes() for i in range(len(offs) - 1)]
    a = col.numpy() if hasattr(col, "numpy") else col
    return [np.ascontiguousarray(r).tobytes() for r in a]


@pytest.mark.parametrize("unpack", [None, "host", "device"])
def test_torch_unpack_modes_on_the_review_table_with_empty_micro_batches(hive, unpack):
    torch = pytest.importorskip("torch")
    from detload.torch import PackedTensors, TorchLoader

    kw = dict(batch_size=2200, seed=0, order="windowed", shuffle_window=3, partitions=4, distributed=detload.Distributed(1, 4), **HIVE)
    with Loader(hive, **kw) as loader:
        want = [b.unpack() for b in loader]
    assert any(len(w["item"]) == 0 for w in want)  # partition 1 runs out at seed 0
    with TorchLoader(Loader(hive, **kw), unpack=unpack, **({"device": "cpu"} if unpack == "device" else {})) as tl:
        got = list(tl)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if unpack is None:
            assert isinstance(g, PackedTensors)
            assert g.group_index.dtype == torch.int64 and g.n_items == len(w["item"])
            g = g.unpack()
        assert list(g) == list(w)
        for k in w:
            assert _rows_of(g[k]) == _rows_of(w[k]), k


def test_a_filter_that_prunes_row_groups_inside_a_group(hive, tmp_path):
    """Row groups of 7 rows: the statistics drop whole row groups in the middle of groups, whose
    remaining parts must still come as one group each (with and without a cache)."""
    stored = Stored(hive)
    item = stored.fixed["item"]
    run = stored.runs("sid")
    in_first = stored.where[:, 0] == 0  # region=eu/part-0.parquet: row groups of 7 rows
    big = int(np.argmax(np.bincount(run[in_first])))
    rows = np.flatnonzero(run == big)
    assert len(rows) >= 200
    lo, hi = int(item[rows[50]]), int(item[rows[120]])  # ten row groups inside the group
    mask = (item < lo) | (item > hi)
    text = f"item < {lo} or item > {hi}"
    for cache in (None, str(tmp_path / "c"), str(tmp_path / "c")):
        with Loader(hive, batch_size=4400, seed=2, filter=text, cache=cache, **HIVE) as loader:
            assert loader.filter_stats is not None and loader.filter_stats["row_groups_skipped"] >= 9
            check_epoch(loader, stored, "sid", mask=mask)


def test_resume_at_another_world_size_with_fixed_partitions(hive):
    """State saved by the ranks of world size 2, loaded by those of world size 4 (rank r from
    the state of rank r // 2): the global steps go on as at world size 1."""
    ref = run_hashes(hive, HIVE_MATRIX, epochs=1)
    first: list[list[Packed]] = []
    states = []
    for r in range(2):
        with Loader(hive, **dict(HIVE_MATRIX, batch_size=4400), distributed=detload.Distributed(r, 2)) as loader:
            first.append([b for _, b in zip(range(2), loader)])
            states.append(loader.state_dict())
    rest = []
    for r in range(4):
        with Loader(hive, **dict(HIVE_MATRIX, batch_size=2200), distributed=detload.Distributed(r, 4)) as loader:
            loader.load_state_dict(states[r // 2])
            rest.append(list(loader))
    got = [hash_batch(concat([f[i] for f in first]))[0] for i in range(2)]
    got += [hash_batch(concat([g[i] for g in rest]))[0] for i in range(len(rest[0]))]
    assert got == ref


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("rg", [1, 100])  # 1: the group runs across two row groups
def test_error_two_nans_with_different_bits_in_a_group_column(tmp_path, cache, rg):
    """numpy.nan and an arithmetic NaN (0 * inf: sign bit set) are both NaN but not the same bits,
    so one group row cannot give both back; the message said only 'NaN equals NaN'."""
    os.makedirs(tmp_path / "d")
    qf = np.array([np.nan, np.nan, 1.0, 1.0])
    qf[1] = -np.nan if np.signbit(qf[0]) else np.copysign(np.nan, -1.0)
    pq.write_table(pa.table({"k": [1, 1, 2, 2], "qf": qf, "item": range(4)}), str(tmp_path / "d" / "a.parquet"),
                   row_group_size=rg)
    kw: dict[str, Any] = {"cache": str(tmp_path / "c")} if cache else {}
    a, b = (f"0x{int(v):016x}" for v in qf[:2].view(np.uint64))
    with Loader(str(tmp_path / "d"), batch_size=4, seed=0, order="windowed", group_by="k", group_columns=["qf"], **kw) as loader, \
            pytest.raises(detload.DataError, match=rf"group column 'qf' is not constant within group k=1: it changes "
                                                   rf"in a.parquet row group {1 if rg == 1 else 0} \(compared bitwise, "
                                                   rf"so NaN equals NaN: two NaNs with different bits \({a}, {b}\), "
                                                   r"which one group row cannot both give back\)"):
        list(loader)


def test_partitions_are_within_one_group_of_their_ideal_size_not_half(tmp_path):
    """Each boundary moves at most half a group, so a partition can be off by half a group at
    each end: groups of 7, 11, 11 and 7 rows in 3 partitions (ideal 12 rows) give 7, 22 and 7.
    docs/packing.md said each partition was within half a group."""
    os.makedirs(tmp_path / "d")
    q = np.repeat(np.arange(4), [7, 11, 11, 7])
    # One group a file: four row groups, so three partitions are allowed (one a row group at most).
    for g in range(4):
        pq.write_table(pa.table({"q": q[q == g], "item": np.flatnonzero(q == g)}), str(tmp_path / "d" / f"a{g}.parquet"))
    with Loader(str(tmp_path / "d"), batch_size=33, seed=0, shuffle=False, partitions=3, order="windowed", group_by="q") as loader:
        plan = loader.plan()
        assert plan.partition_rows == (7, 22, 7)
        assert all(abs(n - 12) <= 11 for n in plan.partition_rows)  # within one group
        assert [abs(b - i * 12) for i, b in enumerate(plan.boundaries)] == [0, 5, 5, 0]  # each within half a group


def _same_rows(cols: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return dict(cols)


@pytest.mark.parametrize("cache", [False, True])
def test_a_verdict_of_constant_group_columns_holds_for_their_null_fill_only(tmp_path, cache):
    """A range found constant with null_fill={'qf': 0.0} (null, 0.0 -> 0.0, 0.0) is not constant
    with NaN as the fill (NaN, 0.0); the verdict named the file, key, columns and group starts
    but not how the columns are filled, so a second loader in the process (or, with a cache
    and a transform, in another process) skipped the check and delivered NaN for the 0.0."""
    import detload._engine.groups as groups

    os.makedirs(tmp_path / "d")
    pq.write_table(pa.table({"k": [1, 1, 2], "qf": pa.array([None, 0.0, 2.0]), "item": range(3)}),
                   str(tmp_path / "d" / "a.parquet"))
    kw: dict[str, Any] = dict(batch_size=4, seed=0, order="windowed", group_by="k", group_columns=["qf"])
    if cache:  # with a transform the cache keeps every column, and the verdicts as derived entries
        kw.update(cache=str(tmp_path / "c"), transform=detload.Transform(_same_rows, name="same", version="1"))
    groups._Verdicts._memo.clear()
    with Loader(str(tmp_path / "d"), **kw, null_fill={"qf": 0.0}) as loader:
        assert sorted(v for b in loader for v in b.unpack()["qf"].tolist()) == [0.0, 0.0, 2.0]
    if cache:
        groups._Verdicts._memo.clear()  # as a new process would start
    with Loader(str(tmp_path / "d"), **kw, null_fill={"qf": float("nan")}) as loader, \
            pytest.raises(detload.DataError, match=r"group column 'qf' is not constant within group k=1"):
        list(loader)
