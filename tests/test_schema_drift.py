"""Schema drift across files: the promotion rule, the values delivered, and every refusal's message.

Values are compared with pyarrow's own reading of each file cast to the promoted type
(docs/types.md, "Schema drift").
"""

from __future__ import annotations

import datetime as dt
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from matrix import check_matrix

import detload
from detload import Loader, SchemaMismatchError
from detload._cache.keys import specs_key
from detload._drift import promote
from detload.cli import main

# -- the rule -------------------------------------------------------------------------------

I8, I16, I32, I64 = pa.int8(), pa.int16(), pa.int32(), pa.int64()
U8, U16, U32, U64 = pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()
F16, F32, F64 = pa.float16(), pa.float32(), pa.float64()


@pytest.mark.parametrize(("types", "want"), [
    ([I8, I16], I16), ([I32, I64], I64), ([I64, I8, I32], I64),
    ([U8, U32], U32), ([U16, U64], U64),
    ([U8, I8], I16), ([U8, I16], I16), ([U16, I8], I32), ([U32, I32], I64), ([U32, I64], I64),
    ([U64, I8], None), ([U64, I64], None),
    ([F16, F32], F32), ([F32, F64], F64),
    ([I32, F32], F64), ([I8, F16], F64), ([U32, F64], F64), ([I64, F64], None), ([U64, F32], None),
    # Decided on the set: uint32 with int8 alone is int64, which no float holds, but float64
    # holds uint32, int8 and float32 together.
    ([U32, F32, I8], F64), ([I8, U32, F32], F64),
    ([pa.list_(I32), pa.list_(I64)], pa.list_(I64)),
    ([pa.list_(F32), pa.large_list(F64)], pa.large_list(F64)),
    ([pa.list_(I32, 4), pa.list_(F32, 4)], pa.list_(F64, 4)),
    ([pa.list_(I32, 4), pa.list_(I32, 3)], None),
    ([pa.list_(I32), pa.list_(I32, 4)], None),
    ([pa.list_(I64), pa.list_(F64)], None),
    ([pa.list_(pa.string()), pa.list_(I64)], None),
    ([pa.dictionary(I32, I16), I32], I32),
    ([pa.null(), I32], I32),
    ([pa.string(), pa.large_string()], pa.string()),  # one form: not drift
    ([I64, pa.string()], None), ([pa.bool_(), I8], None), ([pa.date32(), pa.timestamp("ms")], None),
    ([pa.timestamp("ms"), pa.timestamp("us")], None),
    ([pa.decimal128(10, 2), pa.decimal128(12, 2)], pa.decimal128(12, 2)),
    ([pa.decimal128(10, 2), pa.decimal128(10, 4)], pa.decimal128(12, 4)),
    ([pa.decimal128(38, 0), pa.decimal128(38, 10)], pa.decimal256(48, 10)),
    ([pa.decimal256(70, 0), pa.decimal128(38, 10)], None),
    ([pa.decimal128(10, 2), I32], None),
])
def test_promotion_table(types, want):
    got = promote(types)
    assert (got is None) == (want is None), (types, got)
    if want is not None:
        assert got.equals(want), (types, got)
    again = promote(list(reversed(types)))  # the order of the files does not matter
    assert (again is None) == (want is None)
    if want is not None and not pa.types.is_string(want):
        assert again.equals(want)


_NUMERIC = [I8, I16, I32, I64, U8, U16, U32, U64, F16, F32, F64]


def _extremes(t: pa.DataType) -> list[object]:
    """Values at the edges of ``t``: what a lossy promotion would change."""
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return [int(info.min), int(info.max), 0, int(info.max) - 1, 1]
    info = np.finfo(t.to_pandas_dtype())
    return [float(info.max), float(info.min), float(info.smallest_subnormal), -1.5, 0.0]


def _holds(target: pa.DataType, t: pa.DataType) -> bool:
    """An independent model: whether ``target`` holds every value of ``t`` exactly."""
    if t.equals(target):
        return True
    if pa.types.is_integer(t):
        lo, hi = np.iinfo(t.to_pandas_dtype()).min, np.iinfo(t.to_pandas_dtype()).max
        if pa.types.is_integer(target):
            info = np.iinfo(target.to_pandas_dtype())
            return bool(info.min <= lo and hi <= info.max)
        mantissa = np.finfo(target.to_pandas_dtype()).nmant + 1
        return max(abs(int(lo)), int(hi)) <= 2**mantissa
    return pa.types.is_floating(target) and target.bit_width >= t.bit_width


@given(a=st.sampled_from(_NUMERIC), b=st.sampled_from(_NUMERIC))
def test_numeric_pairs_promote_iff_a_type_holds_both_and_values_are_exact(tmp_path_factory, a, b):
    got = promote([a, b])
    exists = any(_holds(t, a) and _holds(t, b) for t in _NUMERIC)
    assert (got is not None) == exists, (a, b, got)
    if got is None:
        return
    assert _holds(got, a) and _holds(got, b)
    d = tmp_path_factory.mktemp("pair")
    va, vb = _extremes(a), _extremes(b)
    pq.write_table(pa.table({"x": pa.array(va, a)}), d / "a.parquet")
    pq.write_table(pa.table({"x": pa.array(vb, b)}), d / "b.parquet")
    with Loader(d, batch_size=64, seed=0, shuffle=False) as ld:
        (batch,) = list(ld)
    assert batch["x"].dtype == np.dtype(got.to_pandas_dtype())
    delivered = batch["x"].tolist()
    assert delivered == va + vb  # Python ints and floats compare exactly
    assert [type(v) for v in delivered] == [type(delivered[0])] * len(delivered)


# -- values -----------------------------------------------------------------------------------

def _write_drifted(root) -> pa.Table:
    """Three files that drift on every column; returns pyarrow's reading after the promotion."""
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(3)
    parts = []
    for i, (ti, tf, tl, ts) in enumerate([
        (I16, F32, pa.list_(I32), pa.string()),
        (I64, F64, pa.large_list(I64), pa.large_string()),
        (I32, F32, pa.list_(I16), pa.string()),
    ]):
        n = 300 + 50 * i
        ids = np.arange(n) + 1000 * i
        t = pa.table({
            "id": pa.array(ids * (2**40 if ti == I64 else 1), ti),
            "f": pa.array(rng.standard_normal(n), tf),
            "lst": pa.array([list(range(k % 4)) for k in range(n)], tl),
            "s": pa.array([f"r{i}-{k}" for k in range(n)], ts),
        })
        pq.write_table(t, root / f"part-{i}.parquet", row_group_size=120)
        parts.append(t)
    target = pa.schema([("id", I64), ("f", F64), ("lst", pa.large_list(I64)), ("s", pa.large_string())])
    return pa.concat_tables([p.cast(target) for p in parts])


def _concat(batches: list[dict], name: str) -> list:
    out: list = []
    for b in batches:
        col = b[name]
        out.extend(col.tolist() if isinstance(col, np.ndarray) else [list(v) if isinstance(v, np.ndarray) else v
                                                                        for v in col.to_list()])
    return out


@pytest.mark.parametrize(("workers", "pool"), [(1, "thread"), (3, "thread"), (1, "process"), (3, "process")])
def test_values_equal_pyarrow_after_the_promotion(tmp_path, workers, pool):
    want = _write_drifted(tmp_path / "d")
    permissive = pa.concat_tables([pq.read_table(tmp_path / "d" / f"part-{i}.parquet") for i in range(3)],
                                  promote_options="permissive")
    assert permissive.column("id").to_pylist() == want.column("id").to_pylist()
    with Loader(tmp_path / "d", batch_size=97, seed=0, shuffle=False, workers=workers, pool=pool) as ld:
        batches = list(ld)
        specs = {s.name: s for s in ld.column_specs}
        order = dict(ld.order)
    assert batches[0]["id"].dtype == np.int64 and batches[0]["f"].dtype == np.float64
    for name in ("id", "f", "lst", "s"):
        got = _concat(batches, name)
        assert got == want.column(name).to_pylist(), name
    assert specs["id"].drift == ("int16", "int64", "int32")
    assert "promoted to int64 from int16 and int64 and int32" in specs["id"].describe()
    assert specs["s"].drift == () and "s" not in order["schema_drift"]  # one form: not drift
    assert order["schema_drift"]["lst"] == {"type": "large_list<element: int64>",
                                            "from": ["list<element: int32>", "large_list<element: int64>",
                                                     "list<element: int16>"]}


@pytest.mark.parametrize("order", [{"mix_window": 2}, {"order": "windowed", "shuffle_window": 2}])
def test_determinism_matrix_with_drift(tmp_path, order):
    """Every worker count, pool, cache state (cold and warm give the same manifest), resume
    point and world size delivers the reference's bytes, in either order."""
    _write_drifted(tmp_path / "d")
    check_matrix(str(tmp_path / "d"), dict(batch_size=64, seed=5, **order), str(tmp_path / "m"))


def test_cache_key_names_the_promotion(tmp_path):
    _write_drifted(tmp_path / "d")
    pq.write_table(pq.read_table(tmp_path / "d" / "part-1.parquet"), tmp_path / "alone.parquet")
    with Loader(tmp_path / "d", batch_size=8, seed=0, columns=["id"]) as ld:
        drifted = ld.column_specs
    with Loader(tmp_path / "alone.parquet", batch_size=8, seed=0, columns=["id"]) as ld:
        plain = ld.column_specs
    # The same file's int64 column, with and without the rule, are cached under two names.
    assert drifted[0].dtype == plain[0].dtype == "<i8"
    assert specs_key(drifted, {}) != specs_key(plain, {})


def test_cast_and_null_fill_apply_to_the_promoted_type(tmp_path):
    pq.write_table(pa.table({"x": pa.array([1, None, 3], I32)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([2**40, 5], I64)}), tmp_path / "b.parquet")
    with Loader(tmp_path, batch_size=8, seed=0, shuffle=False, null_fill={"x": -7}) as ld:
        (b,) = list(ld)
    assert b["x"].dtype == np.int64 and b["x"].tolist() == [1, -7, 3, 2**40, 5]
    with (Loader(tmp_path, batch_size=8, seed=0, null_fill={"x": -7}, cast={"x": "int32"}) as ld,
          pytest.raises(detload.DataError, match=r"column 'x' in b\.parquet row group 0 cannot be delivered "
                                                 r"as int32.*1099511627776")):
        list(ld)


def test_decimals_of_several_precisions_and_scales_are_read_as_one(tmp_path):
    from decimal import Decimal

    pq.write_table(pa.table({"d": pa.array([Decimal("12345678.91"), None], pa.decimal128(10, 2))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"d": pa.array([Decimal("1.2345"), Decimal("-0.0001")], pa.decimal128(6, 4))}),
                   tmp_path / "b.parquet")
    with Loader(tmp_path, batch_size=8, seed=0, shuffle=False, cast={"d": "int64-scaled"}, null_fill={"d": 0}) as ld:
        (b,) = list(ld)
        (spec,) = ld.column_specs
    assert spec.arrow_type == "decimal128(12, 4)" and spec.scale == 4
    assert b["d"].tolist() == [123456789100, 0, 12345, -1]
    with Loader(tmp_path, batch_size=8, seed=0, shuffle=False, cast={"d": "float64"}) as ld:
        (b,) = list(ld)
    assert b["d"][[0, 2, 3]].tolist() == [12345678.91, 1.2345, -0.0001] and np.isnan(b["d"][1])


def test_a_fixed_shape_cast_applies_to_a_promoted_list(tmp_path):
    pq.write_table(pa.table({"e": pa.array([[1.5, 2.0], [3.0, 4.0]], pa.list_(F32))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"e": pa.array([[5.0, 6.25]], pa.large_list(F64))}), tmp_path / "b.parquet")
    with Loader(tmp_path, batch_size=8, seed=0, shuffle=False, cast={"e": "float32[2]"}) as ld:
        (b,) = list(ld)
    assert b["e"].dtype == np.float32 and b["e"].tolist() == [[1.5, 2.0], [3.0, 4.0], [5.0, 6.25]]


def test_fingerprint_differs_by_a_files_type_and_records_the_drift(tmp_path):
    for sub, t in (("narrow", I32), ("wide", I64)):
        (tmp_path / sub).mkdir()
        pq.write_table(pa.table({"x": pa.array([1, 2], I64)}), tmp_path / sub / "a.parquet")
        pq.write_table(pa.table({"x": pa.array([3], t)}), tmp_path / sub / "b.parquet")
    with Loader(tmp_path / "narrow", batch_size=8, seed=0) as a, Loader(tmp_path / "wide", batch_size=8, seed=0) as b:
        assert a.fingerprint != b.fingerprint
        assert a.order["schema_drift"] == {"x": {"type": "int64", "from": ["int64", "int32"]}}
        assert "schema_drift" not in b.order
        header = a.state_dict()["order"]
    assert header["schema_drift"]["x"]["type"] == "int64"


# -- filters ----------------------------------------------------------------------------------

def test_filter_on_a_drifted_column_compares_on_the_promoted_type(tmp_path):
    pq.write_table(pa.table({"x": pa.array(np.arange(100), I32), "f": pa.array(np.arange(100) / 4, F32)}),
                   tmp_path / "a.parquet", row_group_size=25)
    pq.write_table(pa.table({"x": pa.array(np.arange(100) * 2**33, I64), "f": pa.array(np.arange(100) / 3, F64)}),
                   tmp_path / "b.parquet", row_group_size=25)
    table = pa.concat_tables([pq.read_table(tmp_path / n) for n in ("a.parquet", "b.parquet")],
                             promote_options="permissive")
    # 2**32 does not fit the first file's int32; the promoted type holds it.
    for flt, mask in ((("x", ">", 2**32), table["x"].to_numpy() > 2**32),
                      (("f", ">=", 20.5), table["f"].to_numpy() >= 20.5),
                      (("x", "in", [3, 2**34]), np.isin(table["x"].to_numpy(), [3, 2**34]))):
        with Loader(tmp_path, batch_size=1000, seed=0, shuffle=False, filter=[flt]) as ld:
            (b,) = list(ld)
        assert b["x"].tolist() == table["x"].to_numpy()[mask].tolist(), flt


def test_filter_on_a_column_some_files_lack_is_refused(tmp_path):
    pq.write_table(pa.table({"id": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3], "y": [5]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"^the filter reads column 'y', which 1 file lacks, e\.g\. "
                                                  r"a\.parquet \(b\.parquet has it\): a filter compares stored "
                                                  r"values only\. Filter on a column every file holds"):
        Loader(tmp_path, batch_size=8, seed=0, columns=["id", "y"], null_fill={"y": 0}, filter=[("y", "==", 5)])


# -- missing columns --------------------------------------------------------------------------

def _missing(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "s": ["a", "b"]}), d / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4, 5], "s": ["c", "d", "e"], "y": pa.array([7.5, None, 9.0], F32),
                             "t": ["x", "y", "z"]}), d / "b.parquet")
    pq.write_table(pa.table({"id": [6]}), d / "c.parquet")
    return d


def test_a_missing_column_is_filled_with_its_null_fill(tmp_path):
    _missing(tmp_path)
    with Loader(tmp_path / "data", batch_size=8, seed=0, shuffle=False, columns=["id", "s", "y", "t"],
                null_fill={"s": "?", "y": -1.0, "t": ""}, workers=2, pool="process") as ld:
        (b,) = list(ld)
        order = dict(ld.order)
    assert b["id"].tolist() == [1, 2, 3, 4, 5, 6]
    assert b["s"].to_list() == ["a", "b", "c", "d", "e", "?"]
    assert b["y"].dtype == np.float32 and b["y"].tolist() == [-1.0, -1.0, 7.5, -1.0, 9.0, -1.0]
    assert b["t"].to_list() == ["", "", "x", "y", "z", ""]
    assert order["null_fill"] == {"s": "?", "t": "", "y": -1.0}
    assert order["schema_drift"]["y"] == {"type": "float", "missing": "null_fill"}
    # Through the cache: a cold pass stores the filled form, a warm one reads it back.
    kw = dict(batch_size=8, seed=0, shuffle=False, columns=["id", "s", "y", "t"],
              null_fill={"s": "?", "y": -1.0, "t": ""}, cache=detload.Cache(str(tmp_path / "cache")))
    for _ in ("cold", "warm"):
        with Loader(tmp_path / "data", **kw) as ld:
            (again,) = list(ld)
        assert again["t"].to_list() == b["t"].to_list() and again["y"].tolist() == b["y"].tolist()
    # columns=None loads the first file's columns, as before.
    with Loader(tmp_path / "data", batch_size=8, seed=0, null_fill={"s": "?"}) as ld:
        assert [s.name for s in ld.column_specs] == ["id", "s"]


def test_a_missing_column_without_a_fill_names_the_files_and_the_fix(tmp_path):
    _missing(tmp_path)
    with pytest.raises(SchemaMismatchError, match=(
            r"^column 'y' is missing from 2 files, e\.g\. a\.parquet, but b\.parquet has it \(float\)\. "
            r"Pass null_fill=\{'y': value\} to fill every row of the files that lack it with that value "
            r"\(on the command line: --null-fill y=VALUE\), or leave the column out with columns=\[\.\.\.\]\.$")):
        Loader(tmp_path / "data", batch_size=8, seed=0, columns=["id", "y"])
    with pytest.raises(SchemaMismatchError, match=r"^column 's' is missing from 1 file, e\.g\. c\.parquet, "
                                                  r"but a\.parquet has it \(string\)"):
        Loader(tmp_path / "data", batch_size=8, seed=0)


def test_a_fill_that_does_not_fit_the_promoted_type_is_refused(tmp_path):
    _missing(tmp_path)
    with pytest.raises(detload.OptionError, match=r"null_fill\['y'\] = 'no' does not fit the column's type float"):
        Loader(tmp_path / "data", batch_size=8, seed=0, columns=["id", "y"], null_fill={"y": "no"})


# -- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("ta", "va", "tb", "vb"), [
    (I64, [1], pa.string(), ["1"]),
    (I64, [1], F64, [1.0]),
    (U64, [1], I8, [1]),
    (pa.timestamp("ms"), [1], pa.timestamp("us"), [1]),
    (pa.list_(I32), [[1]], pa.list_(I32, 1), [[1]]),
    (pa.list_(F32, 2), [[1, 2]], pa.list_(F32, 3), [[1, 2, 3]]),
    (pa.bool_(), [True], I8, [1]),
])
def test_a_refused_drift_names_both_files_both_types_and_the_fix(tmp_path, ta, va, tb, vb):
    pq.write_table(pa.table({"id": [1], "x": pa.array(va, ta)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [2], "x": pa.array(vb, tb)}), tmp_path / "b.parquet")
    ta, tb = (pq.read_schema(tmp_path / f"{n}.parquet").field("x").type for n in "ab")  # as read back
    with pytest.raises(SchemaMismatchError) as info:
        Loader(tmp_path, batch_size=8, seed=0)
    assert str(info.value) == (
        f"schema drift between a.parquet and b.parquet: 'x' is {ta} in a.parquet but {tb} in b.parquet, and no "
        "type holds both without changing a value (detload promotes only widening integers, floats and decimals, "
        "and lists of them: docs/types.md, \"Schema drift\"). Leave the column out with columns=[...], or rewrite the files "
        "of one type with the other (e.g. pyarrow's Table.cast, where every value fits); cast= converts the "
        "promoted type, so it cannot unify types that do not promote.")
    with Loader(tmp_path, batch_size=8, seed=0, columns=["id"]) as ld:
        assert sorted(np.concatenate([b["id"] for b in ld]).tolist()) == [1, 2]


def test_a_refusal_names_the_pair_that_does_not_promote(tmp_path):
    for name, t, v in (("a", I8, [1]), ("b", I16, [2]), ("c", pa.string(), ["z"])):
        pq.write_table(pa.table({"x": pa.array(v, t)}), tmp_path / f"{name}.parquet")
    with pytest.raises(SchemaMismatchError, match=r"^schema drift between a\.parquet and c\.parquet: 'x' is int8 "
                                                  r"in a\.parquet but string in c\.parquet"):
        Loader(tmp_path, batch_size=8, seed=0)


# -- inspect ----------------------------------------------------------------------------------

def test_inspect_shows_each_drifted_column(tmp_path, capsys):
    for name, cols in (("a", {"id": pa.array([1], I32), "s": ["x"]}),
                       ("b", {"id": pa.array([2], I32), "s": ["y"]}),
                       ("c", {"id": pa.array([3], I64), "s": pa.array([1], I64), "new": [1.5]})):
        pq.write_table(pa.table(cols), tmp_path / f"{name}.parquet")
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "    id: int32 -> ndarray <i8 (rows), promoted to int64 from int32 and int64\n" in out
    assert "    new: double -> ndarray <f8 (rows), null_fill in files that lack it\n" in out
    assert ("  schema drift (files with rows that disagree on a column; docs/types.md, \"Schema drift\"):\n"
            "    id: int32 in 2 files, int64 in 1 file -> int64\n"
            "    s: string in 2 files, int64 in 1 file -> refused (no widening holds every value)\n"
            "    new: double in 1 file, missing from 2 files -> double (load it with null_fill)\n") in out
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = __import__("json").loads(capsys.readouterr().out)
    assert info["drift"][0] == {"name": "id", "promoted": "int64", "missing_files": 0,
                                "types": [{"arrow": "int32", "files": 2, "first": "a.parquet"},
                                          {"arrow": "int64", "files": 1, "first": "c.parquet"}]}
    assert info["drift"][1]["promoted"] is None and info["drift"][2]["missing_files"] == 2


# -- group_by ---------------------------------------------------------------------------------

def test_group_by_a_drifted_key_compares_keys_across_files_in_the_promoted_type(tmp_path):
    pq.write_table(pa.table({"k": pa.array([1, 1, 2, 2], I32), "v": [0, 1, 2, 3]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": pa.array([3, 3, 4], I64), "v": [4, 5, 6]}), tmp_path / "b.parquet")
    with Loader(tmp_path, batch_size=4, seed=0, shuffle=False, group_by="k") as ld:
        batches = list(ld)
    keys = [b.groups["k"] for b in batches]
    assert [k for ks in keys for k in ks.tolist()] == [1, 2, 3, 4]
    assert all(ks.dtype == np.int64 for ks in keys)
    assert [v for b in batches for v in b.items["v"].tolist()] == [0, 1, 2, 3, 4, 5, 6]
    # Key 2 in an int32 and an int64 file is one key: a group split across files, named as such.
    pq.write_table(pa.table({"k": pa.array([2, 3, 3], I64), "v": [4, 5, 6]}), tmp_path / "b.parquet")
    with pytest.raises(detload.DatasetError, match=r"group 2 is split across files: it occurs in a\.parquet"):
        Loader(tmp_path, batch_size=4, seed=0, group_by="k")


def test_group_by_a_column_some_files_lack_is_refused(tmp_path):
    pq.write_table(pa.table({"v": [0, 1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"v": [2], "k": [5]}), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatchError, match=r"^group_by names column 'k', which 1 file lacks, e\.g\. a\.parquet "
                                                  r"\(b\.parquet has it\): every row needs a stored group key\. "
                                                  r"Group by a column every file holds"):
        Loader(tmp_path, batch_size=4, seed=0, columns=["v", "k"], null_fill={"k": 0}, group_by="k")


def test_bloom_filters_of_each_files_own_type_prune_a_drifted_column_exactly(tmp_path):
    # Each file's filter hashes its own PLAIN encoding (4 bytes in the int32 file, 8 in the
    # int64 one): a key is probed in each file's width, never ruled out by the other's.
    rng = np.random.default_rng(0)
    xs = [rng.permutation(4000)[:1000], rng.permutation(4000)[:1000] * 3]
    for name, t, x in (("a", I32, xs[0]), ("b", I64, xs[1])):
        pq.write_table(pa.table({"x": pa.array(x, t)}), tmp_path / f"{name}.parquet", row_group_size=100,
                       bloom_filter_options={"x": {"ndv": 100, "fpp": 0.01}})
    every = np.concatenate(xs)
    keys = [int(xs[0][5]), int(xs[1][7]), 4001, 2**40]
    with Loader(tmp_path, batch_size=5000, seed=0, shuffle=False, filter=[("x", "in", keys)]) as ld:
        (b,) = list(ld)
        pruned = ld.filter_stats["pruned"]["bloom"]
    assert b["x"].tolist() == every[np.isin(every, keys)].tolist()
    assert pruned > 0  # the filters were used, not skipped


# -- the mixing report ------------------------------------------------------------------------

def _mix_data(root) -> None:
    root.mkdir()
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int32()), "u": pa.array(range(100), pa.uint64())}),
                   root / "a.parquet", row_group_size=25)
    pq.write_table(pa.table({"id": pa.array(range(100, 150), pa.int64()), "u": pa.array(range(50), pa.int64()),
                             "tag": ["x"] * 50}), root / "b.parquet", row_group_size=25)


def test_the_mixing_report_reads_a_drifted_column_as_its_promoted_type(tmp_path):
    """Each file's values are cast before the pieces are joined (int32 and int64 do not concatenate)."""
    _mix_data(tmp_path / "d")
    with Loader(str(tmp_path / "d"), batch_size=10, seed=0, columns=["id"]) as loader:
        got = loader.plan_stats(mix_column="id")["mix_column"]
    # The same report on one file holding every value as int64: the promoted column.
    pq.write_table(pa.concat_tables([pq.read_table(tmp_path / "d" / n, columns=["id"]).cast(pa.schema([("id", I64)]))
                                     for n in ("a.parquet", "b.parquet")]), tmp_path / "one.parquet", row_group_size=25)
    with Loader(str(tmp_path / "one.parquet"), batch_size=10, seed=0) as one:
        want = one.plan_stats(mix_column="id")["mix_column"]
    assert got["labels"] == want["labels"] and got["codes"] == want["codes"] == 20


def test_the_mixing_report_refuses_a_column_some_files_lack_or_a_refused_drift(tmp_path):
    _mix_data(tmp_path / "d")
    with Loader(str(tmp_path / "d"), batch_size=10, seed=0, columns=["id"]) as loader:
        with pytest.raises(SchemaMismatchError, match=r"^mix_column names column 'tag', which 1 file lacks, e\.g\. "
                                                      r"a\.parquet \(b\.parquet has it\): the mixing report reads "
                                                      r"stored values\. Measure a column every file holds"):
            loader.plan_stats(mix_column="tag")
        with pytest.raises(SchemaMismatchError, match=r"'u' is uint64 in a\.parquet but int64 in b\.parquet"):
            loader.plan_stats(mix_column="u")


# -- time zones: one dtype, two meanings ------------------------------------------------------

def _ts_files(tmp_path, zone_a, zone_b, unit="us"):
    """Two files whose column ``ts`` holds the same stored integers, typed with ``zone_a`` and ``zone_b``."""
    for i, zone in enumerate((zone_a, zone_b)):
        t = pa.table({"id": pa.array([2 * i, 2 * i + 1], pa.int64()),
                      "ts": pa.array([1_700_000_000_000_000, 1_700_000_003_600_000], pa.timestamp(unit, tz=zone))})
        pq.write_table(t, tmp_path / f"part-{i}.parquet")
    return str(tmp_path)


def test_a_timestamp_with_a_zone_in_one_file_and_none_in_another_warns_naming_both(tmp_path):
    src = _ts_files(tmp_path, "Europe/Paris", None)
    with pytest.warns(detload.TimeZoneWarning) as seen, Loader(src, batch_size=4, seed=0, shuffle=False) as ld:
        batch = next(iter(ld))
    assert len(seen) == 1
    text = str(seen[0].message)
    assert "'ts' has time zone Europe/Paris in" in text and "part-0.parquet" in text
    assert "no time zone in" in text and "part-1.parquet" in text
    assert "assume_timezone" in text and "columns=[...]" in text and "TimeZoneWarning" in text
    # Delivered as stored, both: the warning is all that tells the two kinds apart.
    assert batch["ts"].dtype == np.dtype("<M8[us]")
    assert batch["ts"][0] == batch["ts"][2] and batch["ts"][1] == batch["ts"][3]


@pytest.mark.parametrize(("zone_a", "zone_b"), [("UTC", "Europe/Paris"), (None, None), ("UTC", "UTC")])
def test_zones_that_agree_on_instants_do_not_warn(tmp_path, zone_a, zone_b, recwarn):
    src = _ts_files(tmp_path, zone_a, zone_b)
    with Loader(src, batch_size=4, seed=0, shuffle=False) as ld:
        next(iter(ld))
    assert not [w for w in recwarn if issubclass(w.category, detload.TimeZoneWarning)]


def test_no_warning_when_the_mixed_column_is_not_loaded(tmp_path, recwarn):
    src = _ts_files(tmp_path, "UTC", None)
    with Loader(src, batch_size=4, seed=0, shuffle=False, columns=["id"]) as ld:
        next(iter(ld))
    assert not [w for w in recwarn if issubclass(w.category, detload.TimeZoneWarning)]


def test_a_list_of_timestamps_with_and_without_a_zone_warns_too(tmp_path):
    for i, zone in enumerate(("UTC", None)):
        t = pa.table({"ts": pa.array([[1, 2], [3]], pa.list_(pa.timestamp("ms", tz=zone)))})
        pq.write_table(t, tmp_path / f"part-{i}.parquet")
    from detload._discovery import discover

    ds = discover(str(tmp_path))
    with pytest.warns(detload.TimeZoneWarning, match="'ts' has time zone UTC"):
        ds.warn_zone_mix(["ts"])


@pytest.mark.parametrize("third", [None, "UTC"])
def test_int96_files_count_as_neither_zoned_nor_zone_less(tmp_path, third, recwarn):
    # INT96 holds UTC instants from Spark, local times from Impala: nothing to compare it with.
    # Beside it, a zoned and a zone-less file still make a mix.
    pq.write_table(pa.table({"ts": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us"))}),
                   tmp_path / "a.parquet", use_deprecated_int96_timestamps=True)
    pq.write_table(pa.table({"ts": pa.array([dt.datetime(2024, 1, 2)], pa.timestamp("us"))}), tmp_path / "b.parquet")
    if third is None:
        Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False)
        assert not [w for w in recwarn if issubclass(w.category, detload.TimeZoneWarning)]
        return
    pq.write_table(pa.table({"ts": pa.array([dt.datetime(2024, 1, 3)], pa.timestamp("us", tz=third))}),
                   tmp_path / "c.parquet")
    with pytest.warns(detload.TimeZoneWarning,
                      match=r"'ts' has time zone UTC in c\.parquet but no time zone in b\.parquet"):
        Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False)


def test_the_warning_points_at_the_users_line_and_a_missing_column_is_not_zone_less(tmp_path):
    _ts_files(tmp_path, "UTC", None)
    pq.write_table(pa.table({"id": pa.array([9], pa.int64())}), tmp_path / "part-2.parquet")  # no ts at all
    with pytest.warns(detload.TimeZoneWarning) as seen:
        Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False, null_fill={"ts": 0})
    assert seen[0].filename == __file__
    assert "no time zone in part-1.parquet" in str(seen[0].message)
    # Without the zone-less file, the file lacking the column makes no mix.
    (tmp_path / "part-1.parquet").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error", detload.TimeZoneWarning)
        Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False, null_fill={"ts": 0})


def test_inspect_warns_about_the_mix_too(tmp_path, capsys):
    src = _ts_files(tmp_path, "Asia/Tokyo", None)
    assert main(["inspect", src]) == 0
    err = capsys.readouterr().err
    assert "warning: column 'ts' has time zone Asia/Tokyo in part-0.parquet but no time zone in part-1.parquet" in err


def test_spark_int96_beside_zoned_timestamps_does_not_warn(tmp_path, recwarn):
    # INT96 (Spark's legacy timestamps) are UTC instants, as a zoned column's values are.
    pq.write_table(pa.table({"ts": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("us"))}),
                   tmp_path / "a.parquet", use_deprecated_int96_timestamps=True)
    pq.write_table(pa.table({"ts": pa.array([dt.datetime(2024, 1, 2)], pa.timestamp("us", tz="UTC"))}),
                   tmp_path / "b.parquet")
    with Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False) as ld:
        got = next(iter(ld))["ts"]
    assert list(got) == [np.datetime64("2024-01-01T00:00:00", "us"), np.datetime64("2024-01-02T00:00:00", "us")]
    assert not [w for w in recwarn if issubclass(w.category, detload.TimeZoneWarning)]
