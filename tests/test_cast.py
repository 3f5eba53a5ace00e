"""``cast={column: dtype}``: decimals as floats or scaled integers, other timestamp units, narrower numbers.

Every cast is checked value by value: a value the dtype cannot hold is a
DataError naming the column, file, row group and the value, never a wrapped or
rounded-away one. Casts are an order option (in ``order`` only when given), are
part of the cache key, and give the same bytes at any worker count, pool and
cache state.
"""

from __future__ import annotations

import decimal
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import detload
from detload import DataError, Loader, OptionError, StateError, UnsupportedTypeError, read_manifest
from detload.cli import main
from detload.verify import verify


def write(path, table: pa.Table, row_group_size: int | None = None) -> str:
    os.makedirs(os.path.dirname(str(path)) or ".", exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


def load(source, **kw) -> dict[str, np.ndarray]:
    """Every batch of one epoch in canonical order, concatenated per column."""
    with Loader(source, batch_size=kw.pop("batch_size", 7), seed=0, shuffle=False, **kw) as loader:
        batches = list(loader)
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def decimals(n: int, precision: int, scale: int, seed: int = 0) -> list[decimal.Decimal | None]:
    rnd = random.Random(seed)
    out: list[decimal.Decimal | None] = [
        decimal.Decimal(rnd.randrange(-(10**precision) + 1, 10**precision)).scaleb(-scale) for _ in range(n)]
    out[3] = None
    return out


def as_floats(values) -> np.ndarray:
    return np.array([float(v) if v is not None else np.nan for v in values])


# -- decimals ----------------------------------------------------------------------


@pytest.mark.parametrize(("precision", "scale"), [(9, 2), (18, 6), (18, 0), (38, 10), (38, 30), (50, 20)])
def test_decimal_as_float64_is_the_nearest_double(tmp_path, precision, scale):
    """float(Decimal) for every value: correctly rounded, which Arrow's own cast is not."""
    values = decimals(400, precision, scale)
    t = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array(values, t)}), row_group_size=150)
    got = load(src, cast={"p": "float64"})["p"]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, as_floats(values))  # NaN for the null, equal bits elsewhere


def test_negative_scales_convert_exactly():
    """Parquet has no negative scale, but Arrow sources do: the fast path multiplies instead."""
    from detload._types import _decimal_float64

    values = [decimal.Decimal(v).scaleb(3) for v in (1, -7, 123456789, 0)] + [None]
    arr = pa.array(values, pa.decimal128(12, -3))
    np.testing.assert_array_equal(_decimal_float64(arr), as_floats(values))


def test_decimal_as_float32_rounds_the_float64(tmp_path):
    values = decimals(200, 12, 4)
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array(values, pa.decimal128(12, 4))}))
    got = load(src, cast={"p": "float32"})["p"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, as_floats(values).astype(np.float32))


def test_decimal_beyond_float32_is_refused(tmp_path):
    values = [decimal.Decimal(1), decimal.Decimal(10) ** 60]
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array(values, pa.decimal256(70, 0))}))
    with pytest.raises(DataError, match=r"column 'p' in d\.parquet row group 0 cannot be delivered as float32.*"
                                        r"the value 1e\+60 at row 1 is beyond float32's range"):
        load(src, cast={"p": "float32"})


def test_decimal_as_int64_scaled(tmp_path, pool):
    values = [decimal.Decimal("12.34"), decimal.Decimal("-0.05"), decimal.Decimal("9999999999999999.99"),
              decimal.Decimal("-9999999999999999.99"), decimal.Decimal(0)]
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array(values, pa.decimal128(18, 2))}))
    with Loader(src, batch_size=2, seed=0, shuffle=False, pool=pool, cast={"p": "int64-scaled"}) as loader:
        (spec,) = loader.column_specs
        got = np.concatenate([b["p"] for b in loader])
    assert (spec.dtype, spec.scale, spec.cast) == ("<i8", 2, "int64-scaled")
    assert "scale 2" in spec.describe() and "x / 10**2" in spec.describe()
    np.testing.assert_array_equal(got, [1234, -5, 999999999999999999, -999999999999999999, 0])


def test_int64_scaled_nulls_need_null_fill(tmp_path):
    values = [decimal.Decimal("1.50"), None, decimal.Decimal("-2.25")]
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array(values, pa.decimal128(10, 2))}))
    with pytest.raises(DataError, match=r"column 'p' in d\.parquet row group 0 holds 1 null\(s\), but "
                                        r"int64-scaled .* Pass null_fill=\{'p': value\}"):
        load(src, cast={"p": "int64-scaled"})
    np.testing.assert_array_equal(load(src, cast={"p": "int64-scaled"}, null_fill={"p": 0})["p"], [150, 0, -225])
    # float64 turns the null into NaN, like any float column.
    np.testing.assert_array_equal(load(src, cast={"p": "float64"})["p"], [1.5, np.nan, -2.25])


def test_int64_scaled_needs_precision_up_to_18(tmp_path):
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array([decimal.Decimal(1)], pa.decimal128(19, 0))}))
    with pytest.raises(OptionError, match=r"cast\['p'\] = 'int64-scaled' does not apply to column 'p' of Arrow "
                                          r"type decimal128\(19, 0\); the casts allowed for it: float64, float32$"):
        Loader(src, batch_size=1, seed=0, cast={"p": "int64-scaled"})


def test_the_default_for_decimals_is_a_refusal_that_says_what_to_do(tmp_path):
    src = write(tmp_path / "d.parquet", pa.table({"p": pa.array([decimal.Decimal(1)], pa.decimal128(9, 2))}))
    with pytest.raises(UnsupportedTypeError) as err:
        Loader(src, batch_size=1, seed=0)
    msg = str(err.value)
    assert "column 'p' has Arrow type decimal128(9, 2)" in msg
    assert "cast={'p': 'float64'} (on the command line: --cast p=float64)" in msg
    assert "cast={'p': 'int64-scaled'} for the unscaled integers (scale 2)" in msg
    assert "columns=[...]" in msg


# -- narrower numbers, timestamp units, list elements -----------------------------------------


@pytest.fixture
def numbers(tmp_path) -> str:
    t = pa.table({
        "i": pa.array([1, -2, 300, 4], pa.int64()),
        "u": pa.array([1, 2, 3, 250], pa.uint64()),
        "f": pa.array([0.5, -1.25, 3e38, np.nan], pa.float64()),
        "big": pa.array([1.0, 1e300, -1e300, 2.0], pa.float64()),
        "ts": pa.array([0, 1_500, 86_400_000_000, None], pa.timestamp("us", tz="UTC")),
        "emb": pa.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]], pa.list_(pa.float64(), 2)),
        "hist": pa.array([[1, 2], [], [3], [70_000]], pa.list_(pa.int64())),
        "s": pa.array(["a", "b", "c", "d"]),
    })
    return write(tmp_path / "data" / "n.parquet", t, row_group_size=2)


def test_narrower_numbers_where_every_value_fits(numbers):
    got = load(numbers, columns=["i", "u", "f", "emb"],
               cast={"i": "int16", "u": "uint8", "f": "float32", "emb": "float32"})
    assert got["i"].dtype == np.int16 and got["u"].dtype == np.uint8 and got["f"].dtype == np.float32
    np.testing.assert_array_equal(got["i"], [1, -2, 300, 4])
    np.testing.assert_array_equal(got["u"], [1, 2, 3, 250])
    np.testing.assert_array_equal(got["f"], np.array([0.5, -1.25, 3e38, np.nan], np.float32))
    assert got["emb"].dtype == np.float32 and got["emb"].shape == (4, 2)
    np.testing.assert_array_equal(got["emb"], np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]], np.float32))
    # Wider works too (and the column's own dtype is a no-op cast).
    np.testing.assert_array_equal(load(numbers, columns=["u"], cast={"u": "int64"})["u"], [1, 2, 3, 250])


@pytest.mark.parametrize(("column", "dtype", "message"), [
    ("i", "int8", r"column 'i' in n\.parquet row group 1 cannot be delivered as int8, which cast=\{'i': 'int8'\} "
                  r"asks for: the value 300 at row 0 is outside int8's range -128 to 127\. Pick a dtype that holds "
                  r"every value of the column \(its type is int64\), or leave the cast out\."),
    ("i", "uint32", r"column 'i' in n\.parquet row group 0 .* the value -2 at row 1 is outside uint32's range"),
    ("u", "int8", r"row group 1 .* the value 250 at row 1 is outside int8's range"),
    ("big", "float32", r"column 'big' in n\.parquet row group 0 .* the value 1e\+300 at row 1 is beyond "
                       r"float32's range"),
    ("big", "float16", r"row group 0 .* the value 1e\+300 at row 1 is beyond float16's range"),
    ("hist", "int16", r"column 'hist' in n\.parquet row group 1 .* the value 70000 is outside int16's range"),
])
def test_a_value_that_does_not_fit_is_refused_naming_it(numbers, column, dtype, message):
    with pytest.raises(DataError, match=message):
        load(numbers, columns=[column], cast={column: dtype})


def test_timestamp_units(numbers):
    got = load(numbers, columns=["ts"], cast={"ts": "datetime64[ns]"})["ts"]
    assert got.dtype == np.dtype("datetime64[ns]")
    want = np.array(["1970-01-01T00:00:00", "1970-01-01T00:00:00.0015", "1970-01-02T00:00:00", "NaT"],
                    "datetime64[ns]")
    np.testing.assert_array_equal(got, want)
    with pytest.raises(DataError, match=r"column 'ts' in n\.parquet row group 0 cannot be delivered as "
                                        r"datetime64\[ms\].*1970-01-01T00:00:00\.001500 at row 1 is not a whole "
                                        r"number of ms: datetime64\[ms\] would drop digits"):
        load(numbers, columns=["ts"], cast={"ts": "datetime64[ms]"})


def test_the_spelling_of_a_dtype_does_not_matter(numbers):
    names = set()
    for spelling in ("float32", "f4", "<f4", np.float32, np.dtype("float32")):
        with Loader(numbers, batch_size=2, seed=0, columns=["f"], cast={"f": spelling}) as loader:
            assert loader.order["cast"] == {"f": "float32"}
            names.add(loader.fingerprint)
    assert len(names) == 1


# -- refusals at construction ---------------------------------------------------------


@pytest.mark.parametrize(("kw", "message"), [
    (dict(cast=[("i", "int8")]), r"cast must be a dict \{column: dtype\}, got \[\('i', 'int8'\)\]"),
    (dict(cast={"nope": "int8"}), r"cast names \['nope'\], which are not among the loaded columns"),
    (dict(columns=["u"], cast={"i": "int8"}), r"cast names \['i'\], which are not among the loaded columns \['u'\]"),
    (dict(cast={"i": "float32"}), r"cast\['i'\] = 'float32' does not apply to column 'i' of Arrow type int64; the "
                                  r"casts allowed for it: int8, int16, int32, int64, uint8, uint16, uint32, uint64"),
    (dict(cast={"f": "int32"}), r"cast\['f'\] = 'int32' does not apply to column 'f' of Arrow type double; the "
                                r"casts allowed for it: float16, float32, float64"),
    (dict(cast={"ts": "int64"}), r"of Arrow type timestamp\[us, tz=UTC\]; the casts allowed for it: "
                                 r"datetime64\[s\], datetime64\[ms\], datetime64\[us\], datetime64\[ns\]"),
    (dict(cast={"s": "int32"}), r"cast\['s'\] = 'int32' does not apply to column 's' of Arrow type string; "
                                r"no cast applies to that type"),
    (dict(cast={"i": "int64-scaled"}), r"'int64-scaled' does not apply to column 'i' of Arrow type int64"),
    (dict(cast={"i": "bogus"}), r"cast\['i'\] = 'bogus' is not a dtype detload casts to"),
    (dict(cast={"i": "datetime64"}), r"cast\['i'\] = 'datetime64' is not a dtype detload casts to"),
    (dict(cast={"i": True}), r"cast\['i'\] = True is not a dtype detload casts to"),
    (dict(cast={"i": "int8"}, null_fill={"i": 1000}), r"null_fill\['i'\] = 1000 does not fit int8, which "
                                                      r"cast\['i'\] asks for"),
])
def test_bad_casts_are_refused_at_construction(numbers, kw, message):
    with pytest.raises(OptionError, match=message):
        Loader(numbers, batch_size=2, seed=0, **kw)


def test_a_cast_of_a_hive_partition_column_is_refused(tmp_path):
    write(tmp_path / "day=1" / "a.parquet", pa.table({"x": [1, 2]}))
    with pytest.raises(OptionError, match=r"cast\['day'\]: 'day' is a Hive partition column, typed int64 from its "
                                          r"folder names; cast applies to columns stored in the files \(type a "
                                          r"partition column with storage=detload.Storage\(partition_types=\{...\}\) "
                                          r"instead\)$"):
        Loader(str(tmp_path), batch_size=2, seed=0, cast={"day": "int32"})
    # A partition key the folders do not have is named with the option that names it.
    with pytest.raises(OptionError, match=r"^Storage.partition_types names 'month', but the partition keys found "
                                          r"are \['day'\]$"):
        Loader(str(tmp_path), batch_size=2, seed=0, storage=detload.Storage(partition_types={"month": "int64"}))


# -- order, fingerprint, resume, cache, determinism ----------------------------------------


def test_cast_enters_the_order_only_when_given(numbers):
    with Loader(numbers, batch_size=2, seed=0) as plain, Loader(numbers, batch_size=2, seed=0, cast={}) as empty, \
            Loader(numbers, batch_size=2, seed=0, cast={"i": "int32"}) as cast:
        assert "cast" not in plain.order and plain.order == empty.order
        assert plain.fingerprint == empty.fingerprint
        assert cast.order["cast"] == {"i": "int32"} and cast.fingerprint != plain.fingerprint
        state = plain.state_dict()
        with pytest.raises(StateError, match=r"cannot resume: cast: None in the state, \{'i': 'int32'\} here"):
            cast.load_state_dict(state)


def test_the_manifest_header_records_the_cast(numbers, tmp_path):
    with Loader(numbers, batch_size=2, seed=0, cast={"i": "int32"}, manifest=str(tmp_path / "m.jsonl")) as loader:
        list(loader)
    assert read_manifest(str(tmp_path / "m.jsonl")).header["order"]["cast"] == {"i": "int32"}


@pytest.fixture
def prices(tmp_path) -> str:
    """Two files of 3 row groups: a decimal price, an id, an int64 count."""
    root = tmp_path / "prices"
    rnd = random.Random(3)
    for f in range(2):
        n = 90
        ids = np.arange(n, dtype=np.int64) + 1000 * f
        price = [decimal.Decimal(rnd.randrange(-10**9, 10**9)).scaleb(-2) for _ in range(n)]
        price[5] = None
        write(root / f"p{f}.parquet", pa.table({"id": ids, "price": pa.array(price, pa.decimal128(11, 2)),
                                                "n": ids % 100}), row_group_size=30)
    return str(root)


CAST = {"price": "float64", "n": "int8"}


def run(source, manifest, **kw) -> None:
    with Loader(source, batch_size=16, seed=9, order="windowed", shuffle_window=2, manifest=str(manifest), cast=CAST, **kw) as loader:
        for e in range(2):
            loader.set_epoch(e)
            for _ in loader:
                pass


def test_warm_cache_gives_the_cold_bytes_and_the_key_includes_the_cast(prices, tmp_path):
    cache = str(tmp_path / "cache")
    run(prices, tmp_path / "uncached.jsonl")
    run(prices, tmp_path / "cold.jsonl", cache=cache)
    entries = sorted(os.path.relpath(os.path.join(d, n), cache) for d, _, ns in os.walk(cache) for n in ns
                     if n.startswith("rg"))
    run(prices, tmp_path / "warm.jsonl", cache=cache, workers=3, pool="process")
    assert verify(str(tmp_path / "uncached.jsonl"), str(tmp_path / "cold.jsonl")).identical
    assert verify(str(tmp_path / "cold.jsonl"), str(tmp_path / "warm.jsonl")).identical
    assert len(entries) == 6
    # Another cast is another entry, not a hit on the float64 one.
    with Loader(prices, batch_size=16, seed=9, cache=cache, cast={"price": "float32", "n": "int8"}) as loader:
        b = next(iter(loader))
        assert b["price"].dtype == np.float32
    after = [n for d, _, ns in os.walk(cache) for n in ns if n.startswith("rg")]
    assert len(after) > len(entries)


def test_same_batches_at_any_worker_count_and_pool_with_a_cast(prices, tmp_path):
    run(prices, tmp_path / "w1.jsonl", workers=1)
    for workers, pool in [(3, "thread"), (3, "process"), (2, "process")]:
        run(prices, tmp_path / f"w{workers}{pool}.jsonl", workers=workers, pool=pool)
        res = verify(str(tmp_path / "w1.jsonl"), str(tmp_path / f"w{workers}{pool}.jsonl"))
        assert res.identical, res.message


# -- command line ------------------------------------------------------------------


def test_cast_on_the_command_line(prices, tmp_path, capsys):
    args = [prices, "--batch-size", "16", "--seed", "9", "--order", "windowed", "--shuffle-window", "2"]
    assert main(["run", *args, "--manifest", str(tmp_path / "bad.jsonl")]) == 2
    assert "--cast price=float64" in capsys.readouterr().err
    cast = ["--cast", "price=float64", "--cast", "n=int8"]
    assert main(["run", *args, *cast, "--epochs", "2", "--manifest", str(tmp_path / "cli.jsonl")]) == 0
    run(prices, tmp_path / "api.jsonl")
    assert verify(str(tmp_path / "cli.jsonl"), str(tmp_path / "api.jsonl")).identical
    assert read_manifest(str(tmp_path / "cli.jsonl")).header["order"]["cast"] == CAST
    capsys.readouterr()
    assert main(["plan", *args, *cast, "--json"]) == 0
    with Loader(prices, batch_size=16, seed=9, order="windowed", shuffle_window=2, cast=CAST) as loader:
        assert json.loads(capsys.readouterr().out)["fingerprint"] == loader.plan().fingerprint
    assert main(["bench", prices, "--epochs", "1", "--workers", "1", *cast]) == 0
    assert "rows/s" in capsys.readouterr().out
    assert main(["plan", *args, "--cast", "price=float64", "--cast", "n=int64-scaled"]) == 2
    assert "'int64-scaled' does not apply to column 'n' of Arrow type int64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", *args, "--cast", "price"])
    assert "expected COLUMN=DTYPE (e.g. price=float64), got 'price'" in capsys.readouterr().err


def test_inspect_names_the_casts_a_decimal_takes(prices, capsys):
    assert main(["inspect", prices]) == 0
    out = capsys.readouterr().out
    assert "price: decimal128(11, 2) -> only with cast= (float64, float32, int64-scaled; scale 2)" in out
