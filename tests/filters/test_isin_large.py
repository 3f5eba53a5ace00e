"""Long isin lists: the rows kept equal pyarrow's own is_in for every column type, the canonical
form is the one fitting value by value gives, and planning builds each value set once however
many row groups it prunes and selects (counted, not timed)."""

from __future__ import annotations

import datetime as dt
import decimal
import glob
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import xxhash

import detload
from detload._discovery import discover
from detload._filters import bloom as bloom_mod
from detload._filters import canonical, isin, planning
from detload._filters.bloom import BloomReader, _int_encoder, _key_hashes, xxh64_words
from detload._filters.canonical import parse_filter
from detload._filters.prune import SortedKeys

f = pc.field
N = 600  # rows per table: the lists below are longer, so the selection narrows them


def _cases() -> list[tuple[str, pa.DataType, list, list]]:
    """(name, column type, column values, isin values): each list longer than the column."""
    rng = random.Random(7)
    ints = [rng.randint(-50, 2000) for _ in range(N)]
    big = [rng.randint(-50, 2000) for _ in range(3000)]
    floats = [rng.choice([0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), 2.25, -3.0]) for _ in range(N)]
    fvals = [0.0, -0.0, 1.5, float("-inf")] + [float(v) + 0.5 for v in range(2000)]
    strs = [rng.choice(["", "a", "é", "zz", "a\x00", "k17", "k18", "日本"]) for _ in range(N)]
    svals = ["", "a\x00", "é", "日本"] + [f"k{v}" for v in range(0, 3000, 3)]
    day = dt.date(2026, 1, 1)
    dates = [day + dt.timedelta(days=rng.randint(0, 3000)) for _ in range(N)]
    dvals = [day + dt.timedelta(days=k) for k in range(0, 3000, 2)]
    ts = [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=rng.randint(0, 3000)) for _ in range(N)]
    tvals = [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=k) for k in range(0, 3000, 2)]
    decs = [decimal.Decimal(rng.randint(-500, 3000)).scaleb(-2) for _ in range(N)]
    dcvals = [decimal.Decimal(k).scaleb(-2) for k in range(0, 3000, 2)]
    u64 = [rng.choice([0, 2**64 - 1, 2**63, 5, 2**63 + 7]) + 0 for _ in range(N)]
    u64vals = [2**64 - 1, 2**63 + 7] + list(range(1000, 3000))

    def nulls(xs):
        return [None if i % 13 == 0 else x for i, x in enumerate(xs)]

    return [
        ("int64", pa.int64(), nulls(ints), big),
        ("int32", pa.int32(), ints, big),
        ("int16 + None", pa.int16(), nulls(ints), [None, *big]),
        ("uint64", pa.uint64(), u64, u64vals),
        ("float64", pa.float64(), nulls(floats), fvals),
        ("float32", pa.float32(), floats, fvals),
        ("float32 inexact", pa.float32(), floats, [0.1, *fvals]),
        ("string", pa.string(), nulls(strs), svals),
        ("large_string", pa.large_string(), strs, svals),
        ("binary", pa.binary(), [s.encode() for s in strs], [s.encode() for s in svals]),
        ("fixed_size_binary", pa.binary(6), [s.encode().ljust(6, b"-")[:6] for s in strs],
         [s.encode().ljust(6, b"-")[:6] for s in svals]),
        ("date32", pa.date32(), nulls(dates), dvals),
        ("date64", pa.date64(), dates, dvals),
        ("timestamp tz", pa.timestamp("us", "UTC"), nulls(ts), tvals),
        ("decimal", pa.decimal128(9, 2), nulls(decs), dcvals),
    ]


def _expected(col: pa.Array, values: list, expr: pc.Expression) -> list[int]:
    t = pa.table({"c": col})
    mask = ds.dataset(t).to_table(columns={"m": expr}).column("m").fill_null(False)
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False)).tolist()


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
@pytest.mark.parametrize("shape", ["isin", "not isin", "isin or", "dictionary"])
def test_long_isin_selects_what_pyarrow_selects(case, shape):
    _, typ, rows, values = case
    col = pa.array(rows, typ)
    if shape == "dictionary":
        col = col.dictionary_encode()
    expr = f("c").isin(pa.array(values, typ))
    if shape == "not isin":
        expr = ~expr
    if shape == "isin or":
        expr = expr | f("c").is_null()
    flt = parse_filter(expr, pa.schema([("c", col.type)]))
    got = flt.select(pa.table({"c": col})).tolist()
    assert got == _expected(col, values, expr)
    narrowed = any(vs.size > max(isin.NARROW_MIN, N) for vs in flt.prepare().value_sets)
    assert narrowed, "the case must exercise the narrowed set"


def test_narrowing_keeps_the_rows_of_chunked_columns_and_nulls_in_the_list():
    col = pa.chunked_array([pa.array([1, None, 5], pa.int64()), pa.array([7, 2000, None], pa.int64())])
    values = [None, *range(0, 3000, 2)]
    flt = parse_filter(f("c").isin(values), pa.schema([("c", pa.int64())]))
    subset = flt.prepare().value_sets[0].narrowed(col)
    assert subset is not None and subset.to_pylist() == [None, 2000]
    assert flt.select(pa.table({"c": col})).tolist() == [1, 4, 5]


def test_narrowing_leaves_a_set_no_longer_than_the_rows_alone():
    vs = isin.ValueSet({"op": "isin", "field": "c", "type": "int64", "values": list(range(300))})
    assert vs.narrowed(pa.array(range(400), pa.int64())) is None  # 300 values, 400 rows
    assert vs.narrowed(pa.array(range(100), pa.int32())) is None  # the column's type differs: is_in casts
    assert vs.narrowed(pa.array([5, 7, 9999], pa.int64())).to_pylist() == [5, 7]


# -- the canonical form -------------------------------------------------------------------------

def _lists():
    rng = random.Random(3)
    yield pa.int64(), [rng.randint(-10**12, 10**12) for _ in range(500)] + [None, 3, 3]
    yield pa.uint64(), [0, 2**64 - 1, 2**63, 1, 1]
    yield pa.int8(), [-128, 127, 0, 0, None]
    yield pa.int8(), [-128, 128]  # out of range: refused as fitting one by one refuses it
    yield pa.int64(), [1, True, 2]  # a bool: fitted one by one
    yield pa.int64(), [1, 2.0, np.int64(4)]
    yield pa.string(), [rng.choice(["b", "a", "é", "日本", "", "a\x00", "Z"]) for _ in range(300)] + [None]
    yield pa.large_string(), ["x", "y", "x"]
    yield pa.string(), ["a", b"b"]  # bytes for a string column: refused
    yield pa.int64(), []
    yield pa.string(), [None]


@pytest.mark.parametrize("typ, values", list(_lists()), ids=lambda v: str(v)[:30])
@pytest.mark.parametrize("form", ["dnf", "json", "text", "expression"])
def test_the_one_pass_fit_gives_the_canonical_form_of_fitting_each_value(monkeypatch, typ, values, form):
    schema = pa.schema([("c", typ)])
    if form == "dnf":
        flt = [("c", "in", values)]
    elif form == "json":
        if any(isinstance(v, (bytes, np.generic)) for v in values):
            pytest.skip("not JSON")
        flt = json.dumps([["c", "in", values]])
    elif form == "text":
        if any(isinstance(v, (bytes, np.generic)) for v in values):
            pytest.skip("not written in text")
        flt = "c in (" + ", ".join(repr(v) for v in values) + ("," if len(values) == 1 else "") + ")"
    else:
        try:
            flt = f("c").isin(pa.array(values))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pytest.skip("pyarrow cannot make this array")

    def outcome():
        try:
            got = parse_filter(flt, schema)
            return got.canonical_json, got.digest()
        except detload.OptionError as e:
            return "error", str(e)

    quick = outcome()
    monkeypatch.setattr(canonical, "_quick_isin", lambda values, t: None)
    assert quick == outcome()


# -- work per row group ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def many_groups(tmp_path_factory):
    """4 files of 10 row groups of 20 rows, ids at random (min/max settle little), bloom filters on id."""
    root = tmp_path_factory.mktemp("isinlarge")
    rng = np.random.default_rng(5)
    for i in range(4):
        ids = rng.integers(0, 100_000, 200)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), root / f"part-{i}.parquet", row_group_size=20,
                       bloom_filter_options={"id": {"ndv": 20, "fpp": 0.05}})
    return str(root)


def test_planning_builds_each_value_set_once_whatever_the_row_group_count(many_groups, monkeypatch):
    values = np.random.default_rng(6).choice(100_000, 5000, replace=False).tolist()
    built, decoded, hashed, narrowed = [], [], [], []
    real_array, real_literal, real_hashes = isin.value_array, isin.node_literal, bloom_mod._key_hashes
    real_narrowed = isin.ValueSet.narrowed
    monkeypatch.setattr(isin, "value_array", lambda t, v: built.append(len(v)) or real_array(t, v))
    monkeypatch.setattr(isin, "node_literal", lambda n, j: decoded.append(j) or real_literal(n, j))
    monkeypatch.setattr(canonical, "node_literal", lambda n, j: decoded.append(j) or real_literal(n, j))
    monkeypatch.setattr(bloom_mod, "_key_hashes", lambda *a: hashed.append(len(a[1])) or real_hashes(*a))

    def spy(self, column):
        out = real_narrowed(self, column)
        narrowed.append((len(column), None if out is None else len(out)))
        return out

    monkeypatch.setattr(isin.ValueSet, "narrowed", spy)
    loader = detload.Loader(many_groups, batch_size=8, seed=0, filter=[("id", "in", values)])
    stats = loader.filter_stats
    loader.close()
    assert stats["row_groups"] == 40 and stats["selection_pass"] >= 20, stats
    assert built == [5000]  # one Arrow value set for 40 row groups
    assert decoded == []  # plain ints are never decoded one by one
    assert hashed == [5000]  # one pass of bloom hashes, shared by the 4 files
    assert len(narrowed) == stats["selection_pass"]
    # is_in gets at most the row group's distinct values, never the 5000.
    assert all(size is not None and size <= rows for rows, size in narrowed), narrowed
    want = set(values)
    ids = pa.concat_tables(pq.read_table(p) for p in sorted(glob.glob(many_groups + "/*.parquet")))
    assert stats["rows_selected"] == sum(v in want for v in ids.column("id").to_pylist())


def test_planning_rows_equal_pyarrow_dataset_filter(many_groups):
    values = np.random.default_rng(8).integers(0, 100_000, 3000).tolist()
    footers: list = []
    dataset = discover(many_groups, footers=footers)
    flt = parse_filter([("id", "in", values)], dataset.schema)
    chosen = planning.filter_units(dataset, flt, footers=footers)
    got = []
    for unit in chosen.units:
        for r in unit.ranges:
            table = pq.ParquetFile(dataset.files[r.file].location).read_row_group(r.row_group)
            sel = chosen.selections.get((r.file, r.row_group))
            idx = sel.indices() if sel is not None else np.arange(table.num_rows)
            got += table.column("id").take(pa.array(idx)).to_pylist()
    want = ds.dataset(many_groups).to_table(filter=f("id").isin(values)).column("id").to_pylist()
    assert sorted(got) == sorted(want) and len(want) > 0


# -- bloom hashes of a whole list -------------------------------------------------------------------

@pytest.mark.parametrize("width", [4, 8])
def test_numpy_xxh64_is_xxhash(width):
    rng = np.random.default_rng(width)
    words = rng.integers(0, 2**63, 2000, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 2000, dtype=np.uint64)
    if width == 4:
        words &= np.uint64(0xFFFFFFFF)
    want = [xxhash.xxh64_intdigest(int(w).to_bytes(width, "little")) for w in words]
    assert xxh64_words(words, width).tolist() == want


@pytest.mark.parametrize("width, step", [(4, 1), (8, 1), (8, 1000)])
def test_int_hashes_of_a_list_equal_encoding_each_key(width, step):
    rng = random.Random(width * step)
    keys = sorted({rng.randint(-2**63, 2**63 - 1) for _ in range(500)}
                  | {rng.randint(-2**33, 2**33) * rng.choice([1, step]) for _ in range(500)} | {0, -1, 2**32 - 1})
    enc = _int_encoder(width, step)
    fast = _key_hashes(enc, keys, ("int", width, step))
    slow = _key_hashes(enc, keys)
    assert bloom_mod._int_key_hashes(keys, width, step) is not None  # the NumPy path ran
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    # Some keys have no encoding of 4 bytes or of a unit of 1000 (an int64 always has 8 bytes).
    assert (int(slow[2][-1]) > 0) == ((width, step) != (8, 1))


def test_range_probe_answers_as_probing_the_slice(many_groups):
    path = sorted(glob.glob(many_groups + "/*.parquet"))[0]
    md = pq.ParquetFile(path).metadata
    keys = SortedKeys(sorted(np.random.default_rng(9).integers(0, 100_000, 400).tolist()))
    rng = random.Random(1)
    seen = set()
    with BloomReader(path, md) as reader:
        for g in range(md.num_row_groups):
            probe = reader.probe(g)
            for _ in range(30):
                i = rng.randrange(len(keys))
                j = rng.randrange(i, min(len(keys), i + rng.choice([1, 3, 50, 400])) + 1)
                got = probe.sorted_range("id", keys, i, j)
                assert got == probe("id", keys.items[i:j])
                seen.add(got)
    assert seen == {True, False}
