"""Fixed-shape casts: ``cast={"emb": "float32[16]"}`` delivers a list column as a dense ``(rows, 16)`` array.

The values are pyarrow's own, reshaped and cast (checked like every cast); every
row's length is checked, and a row of another length is a DataError naming the
file, row group and row. The shaped cast is an order option and part of the cache
key; its batches are the same at any worker count, pool and cache state, hash in
the documented 2-D form, and reach PyTorch as dense tensors.
"""

from __future__ import annotations

import glob
import json
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st
from matrix import check_matrix

import detload
import detload._engine.spill
from detload import DataError, Loader, OptionError, hash_batch, read_manifest
from detload._columns import slice_rows, take_rows
from detload._engine.block import assemble, views
from detload._engine.cut import concat
from detload._types import column_spec, convert_column, normalize_cast
from detload.audit import column_digest
from detload.cli import main
from detload.verify import verify

W = 16
CAST = {"emb": "float32[16]", "lemb": "float32[16]", "fx": "float32[16]", "grid": "int32[2,3]"}


def table(n: int, first: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, W)) * 1e3
    lemb = rng.normal(size=(n, W)).astype(np.float32)
    grid = rng.integers(-(2**31), 2**31, size=(n, 6))
    return pa.table({
        "id": pa.array(np.arange(first, first + n), pa.int64()),
        "emb": pa.array(list(emb), pa.list_(pa.float64())),
        "lemb": pa.array(list(lemb), pa.large_list(pa.float32())),
        "fx": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), W),
        "grid": pa.array(list(grid), pa.list_(pa.int64())),
    })


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    """Two files (5 and 3 row groups) and, per column, pyarrow's values by id, reshaped."""
    root = str(tmp_path_factory.mktemp("fixed") / "ds")
    os.makedirs(root)
    tables = [table(45, 0, 1), table(25, 1000, 2)]
    for i, t in enumerate(tables):
        pq.write_table(t, os.path.join(root, f"f{i}.parquet"), row_group_size=9)
    want: dict[str, dict[int, np.ndarray]] = {c: {} for c in CAST}
    for f in range(2):
        t = pq.read_table(os.path.join(root, f"f{f}.parquet"))  # pyarrow's own reading
        ids = t.column("id").to_numpy()
        for c in CAST:
            flat = t.column(c).combine_chunks().flatten().to_numpy()
            shaped = flat.reshape((len(ids), 2, 3) if c == "grid" else (len(ids), W))
            want[c].update(zip(ids.tolist(), shaped))
    return root, {c: np.stack([want[c][i] for i in sorted(want[c])]) for c in CAST}


def rows(want: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Row positions of ``ids`` in ``want`` (ids 0..44, then 1000..1024)."""
    return np.where(ids < 1000, ids, ids - 1000 + 45)


# -- spelling ----------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "canonical"), [
    ("float32[16]", "float32[16]"),
    ("f4[16]", "float32[16]"),
    ("<f4[16]", "float32[16]"),
    (" float64[ 4 ] ", "float64[4]"),
    ("i2[2, 3]", "int16[2,3]"),
    (np.dtype((np.float32, 16)), "float32[16]"),
    (np.dtype((np.uint8, (2, 3))), "uint8[2,3]"),
    ("datetime64[ms]", "datetime64[ms]"),  # a unit, not a shape
    ("f4", "float32"),
])
def test_spellings_normalize(value, canonical):
    assert normalize_cast("emb", value) == canonical


HOW = (r"write an integer or float dtype followed by the number of values of each row, e\.g\. 'float32\[16\]' "
       r"\(or 'float32\[4,4\]' for rows of 4x4 values\)$")


@pytest.mark.parametrize(("value", "message"), [
    ("float32[0]", r"^cast\['emb'\] = 'float32\[0\]' has the shape \[0\], which is not one or more positive "
                   r"whole numbers; " + HOW),
    ("float32[x]", r"^cast\['emb'\] = 'float32\[x\]' has the shape \[x\], which is not one or more positive "
                   r"whole numbers; " + HOW),
    ("float32[-2]", r"^cast\['emb'\] = 'float32\[-2\]' has the shape \[-2\], which is not"),
    ("float32[]", r"^cast\['emb'\] = 'float32\[\]' has the shape \[\], which is not"),
    ("float32[4,]", r"^cast\['emb'\] = 'float32\[4,\]' has the shape \[4,\], which is not"),
    ("[16]", r"^cast\['emb'\] = '\[16\]' gives a shape but no dtype; " + HOW),
    ("datetime64[ms][4]", r"^cast\['emb'\] = 'datetime64\[ms\]\[4\]': a shape applies to integer and float "
                          r"elements only, not datetime64\[ms\]; " + HOW),
    (np.dtype(("M8[ms]", 4)), r"^cast\['emb'\] = dtype\(\('<M8\[ms\]', \(4,\)\)\): a shape applies to integer "
                              r"and float elements only, not datetime64\[ms\]; "),
    # NumPy reads "(x,)f4" as Python and raised a SyntaxError, not an OptionError.
    ("(x,)f4", r"^cast\['emb'\] = '\(x,\)f4' is not a dtype detload casts to; "),
    ("bogus[4]", r"^cast\['emb'\] = 'bogus\[4\]' is not a dtype detload casts to; .* or an integer or float "
                 r"dtype with a shape such as 'float32\[16\]' \(a list column as a dense \(rows, 16\) array\)$"),
])
def test_bad_spellings_are_option_errors(value, message):
    with pytest.raises(OptionError, match=message):
        normalize_cast("emb", value)


@pytest.mark.parametrize(("t", "cast", "message"), [
    (pa.float64(), "float32[16]",
     r"^cast\['c'\] = 'float32\[16\]' gives a shape, which applies to a list, large_list or fixed_size_list of "
     r"integers or floats; column 'c' has Arrow type double\. The casts allowed for it: float16, float32, float64$"),
    (pa.string(), "float32[16]", r"column 'c' has Arrow type string\. No cast applies to that type$"),
    (pa.list_(pa.string()), "float32[2]", r"column 'c' has Arrow type list<item: string>\. No cast applies"),
    (pa.list_(pa.list_(pa.float32())), "float32[2]", r"column 'c' has Arrow type list<item: list<item: float>>"),
    (pa.list_(pa.timestamp("ms")), "float32[2]", r"Arrow type list<item: timestamp\[ms\]>\. The casts allowed "
                                                 r"for it: datetime64\[s\]"),
    (pa.list_(pa.float64()), "int32[16]",
     r"^cast\['c'\] = 'int32\[16\]' does not apply to column 'c' of Arrow type list<item: double>; the casts "
     r"allowed for it: float16\[16\], float32\[16\], float64\[16\]$"),
    (pa.list_(pa.float64(), 16), "float32[8]",
     r"^cast\['c'\] = 'float32\[8\]' does not fit column 'c' of Arrow type fixed_size_list<item: double>\[16\], "
     r"whose rows hold 16 values each; use 'float32\[16\]' \(or 'float32', which keeps that shape\)$"),
    (pa.list_(pa.list_(pa.int8(), 3), 2), "int8[6]", r"whose rows hold 2 x 3 values each; use 'int8\[2,3\]'"),
])
def test_a_shape_that_does_not_apply_is_refused(t, cast, message):
    with pytest.raises(OptionError, match=message):
        column_spec("c", t, cast=cast)


def test_the_spec_and_its_description():
    for t in (pa.list_(pa.float64()), pa.large_list(pa.float64()), pa.list_(pa.float64(), 16)):
        s = column_spec("emb", t, cast="float32[16]")
        assert (s.kind, s.dtype, s.inner, s.null, s.cast) == ("fixed", "<f4", (16,), "nan", "float32[16]")
        assert s.describe() == "ndarray <f4 (rows, 16), cast to float32[16]"
    s = column_spec("g", pa.list_(pa.int64()), cast="int32[2,3]")
    assert (s.inner, s.null) == ((2, 3), "error")
    assert s.describe() == "ndarray <i4 (rows, 2, 3), cast to int32[2,3]"
    s = column_spec("g", pa.list_(pa.list_(pa.int8(), 3), 2), cast="int16[2,3]")
    assert s.inner == (2, 3) and s.dtype == "<i2"
    # Without a cast a fixed-size list was dense already, a list ragged; neither changed.
    assert column_spec("f", pa.list_(pa.float64(), 16)).inner == (16,)
    assert column_spec("e", pa.list_(pa.float64())).kind == "ragged"


# -- values ------------------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "pool", "order"), [
    (1, "thread", "windowed"), (3, "thread", "windowed"), (3, "process", "windowed"), (3, "process", "mix")])
def test_every_value_equals_pyarrows_reading_reshaped(data, workers, pool, order):
    root, want = data
    with Loader(root, batch_size=10, seed=3, order=order, cast=CAST, workers=workers, pool=pool) as loader:
        n = 0
        for b in loader:
            at = rows(want, b["id"])
            for c in ("emb", "lemb", "fx"):
                assert b[c].shape == (len(at), W) and b[c].dtype == np.float32
                assert b[c].flags.c_contiguous
                np.testing.assert_array_equal(b[c], want[c][at].astype(np.float32))
            assert b["grid"].shape == (len(at), 2, 3) and b["grid"].dtype == np.int32
            np.testing.assert_array_equal(b["grid"], want["grid"][at])
            n += len(at)
    assert n == 70


@pytest.mark.parametrize(("kind", "workers", "mix_window"), [("thread", 1, 8), ("thread", 2, 8), ("thread", 1, 2),
                                                             ("process", 2, 8)])
def test_a_spilled_window_keeps_its_shaped_columns_in_memory_beside_the_file(data, tmp_path, monkeypatch, kind,
                                                                             workers, mix_window):
    # id (fixed, 1-D) goes to the spill file, the shaped columns stay in memory beside it
    # (row groups of 9 rows: no chunk is cut into runs, test_mix_kept.py has those; two
    # process workers sharing the window hand them over in files beside the spill file):
    # every value as pyarrow reads it, in the batches of a loader that holds its windows in
    # memory (a process worker's SpillPack is made out of this test's sight).
    monkeypatch.setattr(detload._engine.spill, "SPILL_MIN_BYTES", 0)
    made = []
    real = detload._engine.spill.SpillPack.__init__
    monkeypatch.setattr(detload._engine.spill.SpillPack, "__init__",
                        lambda self, *a, **kw: (made.append(1), real(self, *a, **kw))[1])
    root, want = data
    opts = dict(batch_size=10, seed=3, order="mix", mix_window=mix_window, block_rows=20, cast=CAST, workers=workers)
    runs = []
    beside: set[str] = set()  # files of a shared window's shaped columns, beside its spill file
    for spill in (False, str(tmp_path)):
        with Loader(root, pool=detload.Pool(kind=kind, spill=spill), **opts) as loader:
            got = []
            for e in range(2):
                loader.set_epoch(e)
                for b in loader:
                    beside.update(glob.glob(f"{tmp_path}/*/*.spill.*"))
                    at = rows(want, b["id"])
                    np.testing.assert_array_equal(b["fx"], want["fx"][at].astype(np.float32))
                    np.testing.assert_array_equal(b["grid"], want["grid"][at])
                    got.append(b["id"].copy())
            runs.append(np.concatenate(got))
        assert bool(made) == (bool(spill) and kind == "thread")
    assert bool(beside) == (kind == "process"), beside
    np.testing.assert_array_equal(runs[0], runs[1])


def test_the_ragged_form_is_unchanged_without_a_cast(data):
    root, want = data
    with Loader(root, batch_size=70, seed=0, shuffle=False, columns=["id", "emb"]) as loader:
        (b,) = list(loader)
    assert isinstance(b["emb"], detload.Ragged) and b["emb"].values.dtype == np.float64
    np.testing.assert_array_equal(b["emb"].values.reshape(-1, W), want["emb"])


@pytest.mark.parametrize("order", [dict(order="windowed", shuffle_window=2), dict(order="mix", mix_window=3)])
def test_batches_are_the_same_in_every_cell_of_the_matrix(data, tmp_path, order):
    root, _ = data
    check_matrix(root, dict(batch_size=12, seed=9, cast=CAST, **order), str(tmp_path))


# -- order, cache, hash ------------------------------------------------------------------


def test_the_shape_is_an_order_option_in_one_spelling(data, tmp_path):
    root, _ = data
    kw = dict(batch_size=10, seed=3, columns=["id", "emb"])
    with Loader(root, cast={"emb": "f4[16]"}, manifest=str(tmp_path / "a.jsonl"), **kw) as a, \
            Loader(root, cast={"emb": np.dtype((np.float32, 16))}, **kw) as b, \
            Loader(root, cast={"emb": "float32"}, **kw) as flat:
        assert a.order["cast"] == b.order["cast"] == {"emb": "float32[16]"}
        assert a.plan().fingerprint == b.plan().fingerprint != flat.plan().fingerprint
        list(a)
    assert read_manifest(str(tmp_path / "a.jsonl")).header["order"]["cast"] == {"emb": "float32[16]"}


def entries(cache: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, ns in os.walk(cache) for n in ns if n.endswith(".dlc"))


def test_warm_cache_gives_the_cold_bytes_and_the_ragged_form_is_another_entry(data, tmp_path):
    root, _ = data
    cache = str(tmp_path / "c")
    kw = dict(batch_size=10, seed=3, columns=["id", "emb"])

    def run(name: str, **more) -> list[str]:
        with Loader(root, manifest=str(tmp_path / name), **kw, **more) as loader:
            return [hash_batch(b)[0] for b in loader]

    plain = run("plain.jsonl", cast={"emb": "float32[16]"})
    cold = run("cold.jsonl", cast={"emb": "float32[16]"}, cache=cache)
    dense = entries(cache)
    warm = run("warm.jsonl", cast={"emb": "float32[16]"}, cache=cache, workers=3, pool="process")
    assert plain == cold == warm and len(dense) == 8 and entries(cache) == dense
    assert verify(str(tmp_path / "plain.jsonl"), str(tmp_path / "cold.jsonl")).identical
    assert verify(str(tmp_path / "cold.jsonl"), str(tmp_path / "warm.jsonl")).identical
    with open(dense[0], "rb") as f:
        raw = f.read()
    hlen = struct.unpack_from("<Q", raw, 8)[0]
    col = {c["name"]: c for c in json.loads(raw[32 : 32 + hlen])["columns"]}["emb"]
    assert col["kind"] == "fixed"
    # Cast without the shape (ragged float32) and without any cast: two more entries per row group.
    run("ragged.jsonl", cast={"emb": "float32"}, cache=cache)
    run("none.jsonl", cache=cache)
    assert len(entries(cache)) == 3 * 8


def test_the_hash_is_the_documented_2d_form(data, tmp_path):
    root, want = data
    with Loader(root, batch_size=10, seed=3, columns=["id", "emb"], cast={"emb": "float32[16]"},
                manifest=str(tmp_path / "m.jsonl")) as loader:
        ids = [b["id"].copy() for b in loader]
    with open(tmp_path / "m.jsonl") as f:
        lines = [json.loads(x) for x in f if '"type":"batch"' in x]
    assert len(lines) == len(ids)
    for got, line in zip(ids, lines):
        emb = want["emb"][rows(want, got)].astype("<f4")
        text = b"emb\0A\0<f4\0" + struct.pack("<3q", 2, len(got), W) + emb.tobytes()
        assert line["columns"]["emb"] == xxhash.xxh3_128_hexdigest(text)
    # The worked example of docs/audit.md.
    e = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert column_digest("e", e).hex() == xxhash.xxh3_128_hexdigest(
        b"e\0A\0<f4\0" + struct.pack("<3q", 2, 2, 3) + e.tobytes()) == "ec1e7cad94ef86a1208ff03270e0f2b7"


@given(data=st.data(), width=st.integers(1, 5), n=st.integers(0, 12),
       kind=st.sampled_from(["list", "large_list", "list_view"]))
def test_conversion_equals_pyarrows_values_at_any_slice_and_chunking(data, width, n, kind):
    """Dense where every row has ``width`` values; else the first row of another length is named."""
    lengths = data.draw(st.lists(st.sampled_from([width, width, width, 0, width + 1]), min_size=n, max_size=n))
    values = np.arange(sum(lengths), dtype=np.float64) * 0.5
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    if kind == "list_view":
        if not hasattr(pa, "ListViewArray"):
            return
        arr = pa.ListViewArray.from_arrays(pa.array(offsets[:-1]), pa.array(np.asarray(lengths, np.int32)),
                                           pa.array(values))
    else:
        cls = pa.ListArray if kind == "list" else pa.LargeListArray
        arr = cls.from_arrays(pa.array(offsets.astype(np.int32 if kind == "list" else np.int64)), pa.array(values))
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    cut = data.draw(st.integers(lo, hi))
    col = pa.chunked_array([arr.slice(lo, cut - lo), arr.slice(cut, hi - cut)], arr.type)
    spec = column_spec("e", arr.type, cast=f"float32[{width}]")
    bad = [i for i, k in enumerate(lengths[lo:hi]) if k != width]
    if bad:
        with pytest.raises(DataError, match=rf"asks for: row {bad[0]} holds {lengths[lo + bad[0]]} value\(s\), "
                                            rf"not {width}[ .]"):
            convert_column(spec, col, ("f.parquet", 0))
        return
    got = convert_column(spec, col, ("f.parquet", 0))
    want = values[offsets[lo] : offsets[hi]].astype(np.float32)  # the rows' values, in order
    if hi > lo:
        assert np.array_equal(pa.concat_arrays(col.chunks).flatten().to_numpy(), values[offsets[lo] : offsets[hi]])
    assert got.shape == (hi - lo, width) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want.reshape(hi - lo, width))


@given(units=st.lists(st.integers(0, 6), min_size=1, max_size=4), shuffle=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_block_assembly_permutes_whole_rows(units, shuffle, seed):
    specs = (column_spec("id", pa.int64()), column_spec("e", pa.list_(pa.float64()), cast="float32[2,3]"))
    cols, first = [], 0
    for n in units:
        ids = np.arange(first, first + n, dtype=np.int64)
        cols.append({"id": ids, "e": (ids[:, None, None] * 10 + np.arange(6).reshape(2, 3)).astype(np.float32)})
        first += n
    perm = np.random.default_rng(seed).permutation(first) if shuffle else None
    buf, layout = assemble(specs, cols, perm, lambda k: np.empty(k, dtype=np.uint8))
    got = views(buf, layout)
    order = perm if perm is not None else np.arange(first)
    assert got["id"].tolist() == order.tolist()
    assert got["e"].shape == (first, 2, 3)
    np.testing.assert_array_equal(got["e"], order[:, None, None] * 10 + np.arange(6).reshape(2, 3))
    # Batches are slices, gathers and joins of whole rows.
    e = got["e"]
    cut = first // 2
    assert np.array_equal(concat([slice_rows(e, 0, cut), slice_rows(e, cut, first)]), e)
    idx = np.random.default_rng(seed).integers(0, max(first, 1), size=first if first else 0)
    assert np.array_equal(take_rows(e, idx), e[idx]) and take_rows(e, idx).shape == (len(idx), 2, 3)


# -- bad data ----------------------------------------------------------------------------


def write(tmp_path, column: pa.Array, name: str = "b.parquet") -> str:
    path = str(tmp_path / name)
    n = len(column)
    pq.write_table(pa.table({"id": np.arange(n), "emb": column}), path, row_group_size=4)
    return path


def first_error(path: str, **kw) -> str:
    with pytest.raises(DataError) as info, Loader(path, batch_size=4, seed=0, shuffle=False, **kw) as loader:
        for _ in loader:
            pass
    return str(info.value)


def test_a_row_of_another_length_is_a_data_error_naming_file_row_group_and_row(tmp_path):
    rows_ = [[1.0, 2.0]] * 5 + [[1.0, 2.0, 3.0], [1.0], [1.0, 2.0]]  # rows 5 and 6 (row group 1, rows 1, 2)
    path = write(tmp_path, pa.array(rows_, pa.list_(pa.float64())))
    assert first_error(path, cast={"emb": "float32[2]"}) == (
        "column 'emb' in b.parquet row group 1 cannot be delivered as float32[2], which cast={'emb': "
        "'float32[2]'} asks for: row 1 holds 3 value(s), not 2 (2 rows of another length). Write the column "
        "with 2 values in every row, or cast it without the shape ('float32') to load it as variable-length lists.")
    # An empty list is a row of 0 values.
    path = write(tmp_path, pa.array([[1, 2]] * 2 + [[]] + [[1, 2]], pa.large_list(pa.int64())), "e.parquet")
    assert "e.parquet row group 0 cannot be delivered as int64[2], which cast={'emb': 'int64[2]'} asks for: row 2 " \
           "holds 0 value(s), not 2. Write" in first_error(path, cast={"emb": "int64[2]"})
    # A multi-dimensional shape counts every value of the row.
    path = write(tmp_path, pa.array([list(range(6))] * 3 + [list(range(4))], pa.list_(pa.int64())), "g.parquet")
    assert "row 3 holds 4 value(s), not 6." in first_error(path, cast={"emb": "int8[2,3]"})


def test_rows_before_the_bad_row_group_are_delivered(tmp_path):
    path = write(tmp_path, pa.array([[1.0, 2.0]] * 4 + [[1.0]] * 4, pa.list_(pa.float64())))
    got = []
    # The windowed order: a block per row group, so row group 0's batch comes before row group 1 is read.
    kw = dict(batch_size=4, seed=0, shuffle=False, order="windowed", shuffle_window=1, cast={"emb": "f8[2]"})
    with pytest.raises(DataError, match=r"row group 1 cannot be delivered as float64\[2\]"), \
            Loader(path, **kw) as loader:
        for b in loader:
            got.append(b["emb"])
    assert len(got) == 1 and got[0].tolist() == [[1.0, 2.0]] * 4


def test_a_null_row_is_an_error_naming_the_row_unless_filled(tmp_path):
    rows_ = [[1.0, 2.0]] * 6 + [None, [3.0, 4.0]]
    path = write(tmp_path, pa.array(rows_, pa.list_(pa.float64())))
    assert first_error(path, cast={"emb": "float32[2]"}) == (
        "column 'emb' in b.parquet row group 1 holds 1 null(s) (the first at row 2), but float32[2] (its type "
        "list<element: double>, cast as asked) has no null value in NumPy. Pass null_fill={'emb': [2 values]} (on "
        "the command line: --null-fill emb=VALUE) to replace them.")
    with Loader(path, batch_size=8, seed=0, shuffle=False, cast={"emb": "float32[2]"},
                null_fill={"emb": [0.0, -1.0]}) as loader:
        (b,) = list(loader)
    assert b["emb"].tolist() == [[1.0, 2.0]] * 6 + [[0.0, -1.0], [3.0, 4.0]]


@pytest.mark.parametrize(("fill", "message"), [
    ([0.0], r"^null_fill\['emb'\] = \[0\.0\] holds 1 value\(s\), but cast\['emb'\] = 'float32\[2\]' needs 2 "
            r"values in every row$"),
    (0.0, r"^null_fill\['emb'\] = 0\.0 is not a list, but cast\['emb'\] = 'float32\[2\]' needs 2 values"),
])
def test_a_fill_of_another_length_is_refused_at_construction(tmp_path, fill, message):
    path = write(tmp_path, pa.array([[1.0, 2.0], None], pa.list_(pa.float64())))
    with pytest.raises(OptionError, match=message):
        Loader(path, batch_size=2, seed=0, cast={"emb": "float32[2]"}, null_fill={"emb": fill})


def test_null_elements_follow_the_element_type(tmp_path):
    floats = write(tmp_path, pa.array([[1.0, None], [2.0, 3.0]], pa.list_(pa.float64())), "f.parquet")
    with Loader(floats, batch_size=2, seed=0, shuffle=False, cast={"emb": "float32[2]"}) as loader:
        (b,) = list(loader)
    assert np.isnan(b["emb"][0, 1]) and b["emb"][1].tolist() == [2.0, 3.0]
    ints = write(tmp_path, pa.array([[1, None], [2, 3]], pa.list_(pa.int64())), "i.parquet")
    assert first_error(ints, cast={"emb": "int32[2]"}).startswith(
        "column 'emb' in i.parquet row group 0 holds 1 null(s) inside its list elements, which <i4 cannot "
        "represent and null_fill (which replaces whole-row nulls) cannot reach.")


def test_a_value_the_dtype_cannot_hold_names_its_row(tmp_path):
    big = write(tmp_path, pa.array([[1.0, 2.0]] * 5 + [[1.0, 1e300]], pa.list_(pa.float64())), "f.parquet")
    assert first_error(big, cast={"emb": "float32[2]"}) == (
        "column 'emb' in f.parquet row group 1 cannot be delivered as float32[2], which cast={'emb': 'float32[2]'} "
        "asks for: the value 1e+300 at row 1 (value 1 of the row) is beyond float32[2]'s range. Pick a dtype that "
        "holds every value of the column (its type is list<element: double>), or leave the cast out.")
    ints = write(tmp_path, pa.array([[1, 2], [3, 300]], pa.list_(pa.int64())), "i.parquet")
    assert "the value 300 at row 1 (value 1 of the row) is outside int8[2]'s range -128 to 127" in \
        first_error(ints, cast={"emb": "int8[2]"})
    fixed = write(tmp_path, pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3, 300, 5, 6]), 3), "x.parquet")
    assert "the value 300 at row 1 (value 0 of the row)" in first_error(fixed, cast={"emb": "int8[3]"})


def test_a_list_that_yields_rows_of_the_length_asked_in_one_file_and_another_in_the_next(tmp_path):
    root = tmp_path / "two"
    root.mkdir()
    write(root, pa.array([[1.0, 2.0]] * 4, pa.list_(pa.float64())), "a.parquet")
    write(root, pa.array([[1.0, 2.0]] * 3 + [[1.0, 2.0, 3.0]], pa.list_(pa.float64())), "b.parquet")
    assert "column 'emb' in b.parquet row group 0 cannot be delivered as float32[2], which cast={'emb': " \
           "'float32[2]'} asks for: row 3 holds 3 value(s), not 2." in first_error(str(root), cast={"emb": "f4[2]"})


# -- packing, torch, command line --------------------------------------------------------


@pytest.mark.parametrize(("workers", "pool"), [(1, "thread"), (2, "process")])
def test_packed_batches_carry_the_dense_column(tmp_path, workers, pool):
    n = 30
    q = np.repeat(np.arange(10), 3)
    emb = np.arange(n * 4, dtype=np.float64).reshape(n, 4)
    qe = np.repeat(np.arange(20).reshape(10, 2), 3, axis=0)  # one per query: a group column
    path = str(tmp_path / "q.parquet")
    pq.write_table(pa.table({"q": q, "item": np.arange(n), "emb": pa.array(list(emb), pa.list_(pa.float64())),
                             "qe": pa.array(list(qe), pa.large_list(pa.int64()))}), path, row_group_size=9)
    kw = dict(batch_size=6, seed=4, shuffle_window=2, group_by="q", group_columns=["qe"],
              cast={"emb": "float32[4]", "qe": "int16[2]"})
    with Loader(path, workers=1, **kw) as loader:
        ref = [hash_batch(b)[0] for b in loader]
    with Loader(path, workers=workers, pool=pool, cache=detload.Cache(str(tmp_path / "c")), **kw) as loader:
        got = []
        for b in loader:
            assert isinstance(b, detload.Packed)
            flat = b.unpack()
            assert flat["emb"].shape == (len(flat["item"]), 4) and flat["emb"].dtype == np.float32
            np.testing.assert_array_equal(flat["emb"], emb[flat["item"]].astype(np.float32))
            assert b.groups["qe"].shape == (b.n_groups, 2) and b.groups["qe"].dtype == np.int16
            np.testing.assert_array_equal(flat["qe"], qe[flat["item"]])
            got.append(hash_batch(b)[0])
    assert got == ref


def test_torch_gets_a_dense_tensor(data):
    torch = pytest.importorskip("torch")
    from detload.torch import TorchLoader

    root, want = data
    kw = dict(batch_size=10, seed=3, cast={c: CAST[c] for c in ("emb", "grid")}, columns=["id", "emb", "grid"])
    for copy_batches in (1, 3):  # shared with the batch, and packed by the background thread
        with TorchLoader(Loader(root, workers=2, **kw), device="cpu", copy_batches=copy_batches) as tl:
            n = 0
            for b in tl:
                at = rows(want, b["id"].numpy())
                assert b["emb"].shape == (len(at), W) and b["emb"].dtype == torch.float32
                assert b["grid"].shape == (len(at), 2, 3) and b["grid"].dtype == torch.int32
                assert torch.equal(b["emb"], torch.from_numpy(want["emb"][at].astype(np.float32)))
                assert torch.equal(b["grid"], torch.from_numpy(want["grid"][at].astype(np.int32)))
                n += len(at)
        assert n == 70
    with pytest.raises(OptionError, match=r"stack\['x'\]: column 'emb' is 2-D; only one-value-per-row columns "
                                          r"can be stacked"):
        TorchLoader(Loader(root, **kw), device="cpu", stack={"x": ["emb"]})


def test_the_command_line_takes_the_shape(data, tmp_path, capsys):
    root, _ = data
    args = [root, "--batch-size", "10", "--seed", "3", "--columns", "id,emb", "--manifest"]
    assert main(["run", *args, str(tmp_path / "cli.jsonl"), "--cast", "emb=f4[16]"]) == 0
    with Loader(root, batch_size=10, seed=3, columns=["id", "emb"], cast={"emb": "float32[16]"},
                manifest=str(tmp_path / "api.jsonl")) as loader:
        list(loader)
    assert verify(str(tmp_path / "cli.jsonl"), str(tmp_path / "api.jsonl")).identical
    capsys.readouterr()
    assert main(["run", *args, str(tmp_path / "bad.jsonl"), "--cast", "emb=float32[x]"]) == 2
    assert "cast['emb'] = 'float32[x]' has the shape [x]" in capsys.readouterr().err
    assert main(["inspect", root, "--cast", "emb=float32[16]"]) == 0
    out = capsys.readouterr().out
    assert "emb: list<element: double> -> ndarray <f4 (rows, 16), cast to float32[16]" in out
    assert "fx: fixed_size_list<element: double>[16] -> ndarray <f8 (rows, 16)\n" in out


def test_cuda_gets_the_dense_tensor_on_the_device(data):  # pragma: no cover - no GPU in CI
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from detload.torch import TorchLoader

    root, want = data
    kw = dict(batch_size=10, seed=3, cast={"emb": "float32[16]"}, columns=["id", "emb"])
    # One batch a copy, several batches a copy, and straight from registered worker segments.
    for copy_batches, pool in ((1, "thread"), (3, "thread"), (1, "process")):
        with TorchLoader(Loader(root, workers=2, pool=pool, **kw), device="cuda", copy_batches=copy_batches) as tl:
            for b in tl:
                assert b["emb"].is_cuda and b["emb"].shape == (len(b["id"]), W)
                at = rows(want, b["id"].cpu().numpy())
                assert torch.equal(b["emb"].cpu(), torch.from_numpy(want["emb"][at].astype(np.float32)))
