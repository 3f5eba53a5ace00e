"""Lists of strings and binary (``list<string>``, polars' ``large_list<large_string>``, ...) as a nested Ragged.

Every value is compared with pyarrow's own reading; the gathers, slices and stitches against
plain Python list operations; the batches across workers, pools, caches, resume points and
world sizes by the determinism matrix; the hash against its documented form recomputed from
pyarrow's values alone; and packing, transforms, ``detload inspect`` and the torch adapter.
"""

from __future__ import annotations

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
from detload import DataError, Loader, Ragged, Transform, UnsupportedTypeError
from detload._columns import slice_rows, take_rows
from detload._engine.block import assemble, views
from detload._engine.cut import concat
from detload._types import column_spec, convert_column
from detload.audit import column_digest, hash_batch

WORDS = ["", "a", "bé", "日本語", "tag", "x" * 40, "nul\x00inside", "😀"]
# Every way a writer spells a list of strings or binary: pyarrow's list<string>, polars'
# large_list<large_string> (its item field is named "item"), and the mixed and binary forms.
TYPES = {
    "tags": pa.list_(pa.string()),
    "cats": pa.large_list(pa.field("item", pa.large_string())),
    "mixed": pa.list_(pa.large_string()),
    "blobs": pa.list_(pa.binary()),
    "lblobs": pa.large_list(pa.large_binary()),
}
FILL = {"tags": []}  # "tags" holds null lists; the others hold none


def _rows(rng: np.random.Generator, n: int, binary: bool, nulls: bool) -> list:
    out: list = []
    for i in range(n):
        if nulls and i % 7 == 3:
            out.append(None)
            continue
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), int(rng.integers(0, 5)))]
        out.append([w.encode("utf-8") for w in words] if binary else words)
    return out


def table(n: int, first: int, seed: int, *, empty: bool = False) -> pa.Table:
    """``n`` rows numbered from ``first``; ``empty``: every list empty or of empty strings only
    (Arrow then writes no value bytes at all)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {"id": pa.array(np.arange(first, first + n, dtype=np.int64))}
    for name, t in TYPES.items():
        binary = pa.types.is_binary(t.value_type) or pa.types.is_large_binary(t.value_type)
        blank = b"" if binary else ""
        rows = ([[] if i % 2 else [blank] * (i % 3) for i in range(n)] if empty
                else _rows(rng, n, binary, nulls=name in FILL))
        cols[name] = pa.array(rows, t)
    return pa.table(cols)


def write(root: str) -> dict[int, dict]:
    """Three files of uneven row groups, one all-empty file; return pyarrow's reading by id,
    the null lists filled as FILL says."""
    os.makedirs(root, exist_ok=True)
    tables = [table(70, 0, 1), table(45, 1000, 2), table(23, 2000, 3, empty=True)]
    for i, (t, rg) in enumerate(zip(tables, (16, 11, 9))):
        pq.write_table(t, os.path.join(root, f"part-{i}.parquet"), row_group_size=rg)
    want = {}
    for f in sorted(os.listdir(root)):
        for row in pq.read_table(os.path.join(root, f)).to_pylist():  # pyarrow's own reading
            want[row["id"]] = {k: (FILL[k] if v is None and k in FILL else v) for k, v in row.items()}
    return want


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, dict[int, dict]]:
    root = str(tmp_path_factory.mktemp("liststr") / "ds")
    return root, write(root)


def rows_of(batch: dict) -> list[dict]:
    n = len(next(iter(batch.values())))
    cols = {k: (c.to_list() if isinstance(c, Ragged) else c.tolist()) for k, c in batch.items()}
    return [{k: cols[k][i] for k in batch} for i in range(n)]


def check_layout(col: Ragged, kind: str) -> None:
    """Arrow's layout as documented: int64 offsets from 0 at both levels, uint8 bytes."""
    assert isinstance(col, Ragged) and col.kind == "list" and isinstance(col.values, Ragged)
    items = col.values
    assert items.kind == kind and items.values.dtype == np.uint8 and items.values.ndim == 1
    for offs, end in ((col.offsets, len(items)), (items.offsets, items.values.shape[0])):
        assert offs.dtype == np.int64 and offs[0] == 0 and offs[-1] == end and (np.diff(offs) >= 0).all()


# -- the mapping ------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "item"), [
    (pa.list_(pa.string()), "utf8"), (pa.large_list(pa.large_string()), "utf8"),
    (pa.large_list(pa.field("item", pa.large_string())), "utf8"), (pa.list_(pa.large_string()), "utf8"),
    (pa.large_list(pa.string()), "utf8"), (pa.list_(pa.binary()), "binary"),
    (pa.large_list(pa.large_binary()), "binary"), (pa.list_(pa.string_view()), "utf8"),
    (pa.list_view(pa.string()), "utf8"),
])
def test_every_spelling_maps_to_a_list_over_strings(t, item):
    spec = column_spec("c", t)
    assert (spec.kind, spec.ragged_kind, spec.item_kind, spec.dtype) == ("ragged", "list", item, "|u1")
    word = "string" if item == "utf8" else "item"
    assert spec.describe() == f"Ragged[list] of Ragged[{item}]: values |u1, {word} offsets int64, row offsets int64"
    vals = [["a", "", "日本"], [], None, ["z"]]
    arr = pa.array([[v.encode() for v in r] if r is not None and item == "binary" else r for r in vals], t)
    got = convert_column(spec, arr.slice(1), ("f.parquet", 0), null_fill=[])
    check_layout(got, item)
    want = [[] if r is None else r for r in arr.slice(1).to_pylist()]
    assert got.to_list() == want


def test_other_columns_keep_their_specs():
    # What decides existing bytes, cache keys and schema checks: unchanged for every other type.
    for t in (pa.list_(pa.int32()), pa.string(), pa.binary(), pa.list_(pa.uint8())):
        assert column_spec("c", t).item_kind is None
    assert column_spec("c", pa.list_(pa.uint8())) != column_spec("c", pa.list_(pa.binary()))


@pytest.mark.parametrize(("t", "advice"), [
    (pa.list_(pa.list_(pa.string())), "Variable-length lists of lists have no flat NumPy layout"),
    (pa.large_list(pa.list_(pa.large_string())), "Variable-length lists of lists have no flat NumPy layout"),
    (pa.list_(pa.string(), 2), "Fixed-size lists of strings are not mapped (variable-length lists of strings are)"),
    (pa.struct([("tags", pa.list_(pa.string()))]), "Write one column per field (flatten the struct)"),
])
def test_deeper_nesting_is_refused_naming_the_column_and_type(tmp_path, t, advice):
    odd = pa.array([None, None], t)
    pq.write_table(pa.table({"id": [1, 2], "tags": pa.array([["a"], []]), "odd": odd}), tmp_path / "a.parquet")
    t_read = pq.read_schema(tmp_path / "a.parquet").field("odd").type
    with pytest.raises(UnsupportedTypeError) as info:
        Loader(str(tmp_path), batch_size=8, seed=0)
    msg = str(info.value)
    assert msg.startswith(f"column 'odd' has Arrow type {t_read}, which detload does not map to NumPy. ")
    assert advice in msg and "columns=[...]" in msg and "lists of strings or binary" in msg
    with Loader(str(tmp_path), batch_size=8, seed=0, columns=["id", "tags"]) as loader:
        assert [b["tags"].to_list() for b in loader] == [[["a"], []]]


# -- values -----------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_value_equals_pyarrows_reading(data, shuffle):
    root, want = data
    with Loader(root, batch_size=13, seed=4, shuffle=shuffle, null_fill=FILL) as loader:
        got = []
        for b in loader:
            for name, t in TYPES.items():
                binary = pa.types.is_binary(t.value_type) or pa.types.is_large_binary(t.value_type)
                check_layout(b[name], "binary" if binary else "utf8")
            got += rows_of(b)
    assert len(got) == len(want)
    assert {r["id"] for r in got} == set(want)
    for r in got:
        assert r == want[r["id"]]
    if not shuffle:
        assert [r["id"] for r in got] == sorted(want)


def test_a_null_list_is_an_error_unless_filled(data):
    root, _ = data
    with Loader(root, batch_size=16, seed=0, shuffle=False) as loader, pytest.raises(
            DataError, match=r"^column 'tags' in part-0\.parquet row group 0 holds 2 null\(s\), but its type "
                             r"list<element: string> has no null value in NumPy\. Pass null_fill=\{'tags': value\}"):
        list(loader)
    with Loader(root, batch_size=16, seed=0, shuffle=False, null_fill={"tags": ["?", ""]}) as loader:
        first = next(iter(loader))["tags"]
    assert first[3] == ["?", ""] and first[10] == ["?", ""]


def test_a_null_string_inside_a_list_is_an_error(tmp_path):
    t = pa.table({"id": [0, 1, 2], "tags": pa.array([["a"], ["b", None, None], []], pa.large_list(pa.large_string())),
                  "blobs": pa.array([[b"x"], [], [None]], pa.list_(pa.binary()))})
    pq.write_table(t, tmp_path / "n.parquet")
    with Loader(str(tmp_path), batch_size=3, seed=0, columns=["id", "tags"]) as loader, pytest.raises(
            DataError, match=r"^column 'tags' in n\.parquet row group 0 holds 2 null string\(s\) inside its lists, "
                             r"which a list of utf8 values cannot represent and null_fill \(which replaces whole-row "
                             r"nulls\) cannot reach\. Rewrite the column without null items"):
        list(loader)
    with Loader(str(tmp_path), batch_size=3, seed=0, columns=["blobs"]) as loader, pytest.raises(
            DataError, match=r"^column 'blobs' in n\.parquet row group 0 holds 1 null binary value\(s\) inside"):
        list(loader)


def test_a_fill_holding_a_null_string_is_refused_where_it_lands(tmp_path):
    pq.write_table(pa.table({"tags": pa.array([["a"], None], pa.list_(pa.string()))}), tmp_path / "f.parquet")
    with Loader(str(tmp_path), batch_size=2, seed=0, null_fill={"tags": ["x", None]}) as loader, \
            pytest.raises(DataError, match=r"^column 'tags' in f\.parquet row group 0 holds 1 null string\(s\) inside"):
        list(loader)


def test_a_list_of_strings_in_one_file_and_a_list_of_bytes_in_another_is_drift(tmp_path):
    pq.write_table(pa.table({"c": pa.array([["a"]], pa.list_(pa.string()))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"c": pa.array([[b"a"]], pa.list_(pa.binary()))}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"c": pa.array([["a"]], pa.large_list(pa.large_string()))}), tmp_path / "c.parquet")
    with pytest.raises(detload.SchemaMismatchError, match=r"'c' is list<element: string> in a\.parquet but "
                                                          r"list<element: binary> in b\.parquet"):
        Loader(str(tmp_path), batch_size=2, seed=0)
    os.remove(tmp_path / "b.parquet")  # list<string> and large_list<large_string> are one column
    with Loader(str(tmp_path), batch_size=2, seed=0, shuffle=False) as loader:
        assert [b["c"].to_list() for b in loader] == [[["a"], ["a"]]]


# -- gathers, slices and stitches, against Python lists ---------------------------------


def nested(rows: list[list[str]]) -> Ragged:
    lens = [len(r) for r in rows]
    strings = [s.encode("utf-8") for r in rows for s in r]
    items = Ragged(np.frombuffer(b"".join(strings), np.uint8).copy(),
                   np.concatenate([[0], np.cumsum([len(s) for s in strings], dtype=np.int64)]).astype(np.int64), "utf8")
    return Ragged(items, np.concatenate([[0], np.cumsum(lens, dtype=np.int64)]).astype(np.int64), "list")


lists = st.lists(st.lists(st.sampled_from(WORDS), max_size=4), max_size=30)


@given(rows=lists, data=st.data())
def test_slices_gathers_and_joins_are_list_operations(rows, data):
    col = nested(rows)
    n = len(rows)
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    part = slice_rows(col, lo, hi)
    check_layout(part, "utf8")
    assert part.to_list() == rows[lo:hi]
    idx = np.asarray(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=40 if n else 0)), dtype=np.int64)
    taken = take_rows(col, idx)
    check_layout(taken, "utf8")
    assert taken.to_list() == [rows[i] for i in idx]
    joined = concat([slice_rows(col, 0, lo), part, slice_rows(col, hi, n)])
    check_layout(joined, "utf8")
    assert joined.to_list() == rows


@given(units=st.lists(lists, min_size=1, max_size=4), shuffle=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_block_assembly_concatenates_and_permutes_rows(units, shuffle, seed):
    specs = (column_spec("id", pa.int64()), column_spec("tags", pa.list_(pa.string())))
    cols, first = [], 0
    for rows in units:
        cols.append({"id": np.arange(first, first + len(rows), dtype=np.int64), "tags": nested(rows)})
        first += len(rows)
    every = [r for rows in units for r in rows]
    perm = np.random.default_rng(seed).permutation(len(every)) if shuffle else None
    buf, layout = assemble(specs, cols, perm, lambda n: np.empty(n, dtype=np.uint8))
    got = views(buf, layout)
    order = perm if perm is not None else np.arange(len(every))
    check_layout(got["tags"], "utf8")
    assert got["tags"].to_list() == [every[i] for i in order]
    assert got["id"].tolist() == order.tolist()
    assert all(s.offset % 64 == 0 for s in (layout.columns[1].offsets, layout.columns[1].item_offsets,
                                            layout.columns[1].data))


# -- determinism, the cache and the hash ------------------------------------------------


def test_batches_are_the_same_in_every_cell_of_the_matrix(data, tmp_path):
    root, _ = data
    check_matrix(root, dict(batch_size=24, seed=9, null_fill=FILL), str(tmp_path))


def ref_digest(name: str, rows: list[list], kind: str) -> str:
    """The documented column digest of a list of strings, from pyarrow's values alone."""
    items = [s.encode("utf-8") if isinstance(s, str) else s for r in rows for s in r]

    def array(dtype: str, values: bytes, n: int) -> bytes:
        return dtype.encode() + b"\0" + struct.pack("<2q", 1, n) + values

    row_offs = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype("<i8")
    item_offs = np.concatenate([[0], np.cumsum([len(s) for s in items])]).astype("<i8")
    text = (name.encode() + b"\0" + b"Rlist\0" + array("<i8", row_offs.tobytes(), len(row_offs))
            + b"R" + kind.encode() + b"\0" + array("<i8", item_offs.tobytes(), len(item_offs))
            + array("|u1", b"".join(items), sum(map(len, items))))
    return xxhash.xxh3_128_hexdigest(text)


def test_the_hash_is_the_documented_form(data, tmp_path):
    root, want = data
    manifest = str(tmp_path / "m.jsonl")
    kept = []
    with Loader(root, batch_size=16, seed=2, null_fill=FILL, manifest=manifest) as loader:
        for b in loader:
            kept.append([r["id"] for r in rows_of(b)])
    with open(manifest) as f:
        lines = [json.loads(x) for x in f if '"type":"batch"' in x]
    assert len(lines) == len(kept)
    for ids, line in zip(kept, lines):
        for name, t in TYPES.items():
            binary = pa.types.is_binary(t.value_type) or pa.types.is_large_binary(t.value_type)
            assert line["columns"][name] == ref_digest(name, [want[i][name] for i in ids],
                                                       "binary" if binary else "utf8")
    # The worked example of docs/audit.md.
    t = Ragged(Ragged(np.frombuffer(b"abc", np.uint8), np.array([0, 1, 3]), "utf8"), np.array([0, 2, 2]), "list")
    assert column_digest("t", t).hex() == ref_digest("t", [["a", "bc"], []], "utf8") \
        == "f72732a9467e51c8375fcb997dea9457"
    assert hash_batch({"id": np.array([5, 7]), "t": t})[0] == "4bb5eb3be5fd4e00a16d4461e84a31d8"


def test_cache_entries_hold_the_three_arrays_and_a_warm_read_equals_a_cold_one(data, tmp_path):
    root, _ = data
    cache = detload.Cache(str(tmp_path / "c"))
    kw = dict(batch_size=20, seed=3, columns=["id", "cats", "blobs"])
    runs = []
    for _ in range(2):  # cold, then warm
        with Loader(root, cache=cache, **kw) as loader:
            runs.append([hash_batch(b)[0] for b in loader])
            (reads,) = loader.stats().reads.epochs
    assert runs[0] == runs[1]
    assert reads.row_groups_read == 0 and reads.row_groups_cached == 5 + 5 + 3  # the warm run read no file
    entries = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "c") for f in fs if f.endswith(".dlc")]
    assert entries
    with open(entries[0], "rb") as f:
        raw = f.read()
    hlen = struct.unpack_from("<Q", raw, 8)[0]
    header = json.loads(raw[32 : 32 + hlen])
    col = {c["name"]: c for c in header["columns"]}["cats"]
    assert (col["kind"], col["ragged_kind"], col["item_kind"]) == ("ragged", "list", "utf8")
    assert [col[k][1] for k in ("offsets", "item_offsets", "values")] == ["<i8", "<i8", "|u1"]
    assert "item_offsets" not in {c["name"]: c for c in header["columns"]}["id"]


# -- packing, transforms, inspect -------------------------------------------------------


def write_groups(root: str) -> dict[int, dict]:
    """Queries with a list-of-strings group column (``qtags``) and item column (``tags``)."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(5)
    want, item = {}, 0
    for f, sizes in enumerate([[3, 5, 1, 4], [2, 6, 3]]):
        q = np.repeat(np.arange(10 * f, 10 * f + len(sizes)), sizes)
        n = len(q)
        qtags = {int(x): [WORDS[j] for j in rng.integers(0, len(WORDS), int(x) % 4)] for x in set(q.tolist())}
        t = pa.table({
            "q": pa.array(q, pa.int64()),
            "qtags": pa.array([qtags[int(x)] for x in q], pa.large_list(pa.large_string())),
            "item": pa.array(np.arange(item, item + n), pa.int64()),
            "tags": pa.array(_rows(rng, n, binary=False, nulls=False), pa.list_(pa.string())),
        })
        item += n
        pq.write_table(t, os.path.join(root, f"g{f}.parquet"), row_group_size=5)
        want.update((r["item"], r) for r in t.to_pylist())
    return want


@pytest.mark.parametrize(("workers", "pool"), [(1, "thread"), (2, "process")])
def test_packed_batches_carry_lists_of_strings_as_items_and_group_columns(tmp_path, workers, pool):
    root = str(tmp_path / "g")
    want = write_groups(root)
    kw = dict(batch_size=12, seed=4, shuffle_window=2, group_by="q", group_columns=["qtags"])
    with Loader(root, workers=1, **kw) as loader:
        ref = [hash_batch(b)[0] for b in loader]
    with Loader(root, workers=workers, pool=pool, cache=detload.Cache(str(tmp_path / "c")), **kw) as loader:
        for epoch in range(2):  # cold, then warm
            got = []
            for b in loader:
                assert isinstance(b, detload.Packed)
                b.check()
                check_layout(b.items["tags"], "utf8")
                check_layout(b.groups["qtags"], "utf8")
                assert len(b.groups["qtags"]) == b.n_groups
                got.append(hash_batch(b)[0])
                for r in rows_of(b.unpack()):
                    assert r == want[r["item"]]
            assert got == ref, f"epoch {epoch}"


def test_a_list_of_strings_group_column_must_be_constant(tmp_path):
    t = pa.table({"q": [1, 1, 2], "qtags": pa.array([["a"], ["a", ""], []], pa.list_(pa.string())), "x": [1, 2, 3]})
    pq.write_table(t, tmp_path / "g.parquet")
    with Loader(str(tmp_path), batch_size=3, seed=0, group_by="q", group_columns=["qtags"]) as loader, \
            pytest.raises(DataError, match=r"^group column 'qtags' is not constant within group q=1: it changes in "
                                           r"g\.parquet row group 0"):
        list(loader)


def reverse_lists(cols, ctx):
    """Each row's strings in reverse order, and how many there are."""
    tags = cols["cats"]
    rows = [r[::-1] for r in tags.to_list()]
    strings = [s.encode() for r in rows for s in r]
    items = Ragged(np.frombuffer(b"".join(strings) or b"", np.uint8).copy(),
                   np.concatenate([[0], np.cumsum([len(s) for s in strings])]).astype(np.int64), "utf8")
    return {"id": np.array(cols["id"]), "rev": Ragged(items, tags.offsets.copy(), "list"),
            "n": np.diff(tags.offsets).astype(np.int32)}


def test_a_transform_reads_and_returns_lists_of_strings(data, tmp_path):
    root, want = data
    xf = Transform(reverse_lists, name="rev", version="1")
    kw = dict(batch_size=17, seed=1, columns=["id", "cats"], transform=xf)
    with Loader(root, cache=detload.Cache(str(tmp_path / "c")), **kw) as loader:
        assert [s.describe() for s in loader.column_specs][1].startswith("Ragged[list] of Ragged[utf8]")
        runs = [[hash_batch(b)[0] for b in loader] for _ in range(2)]  # the second epoch reads the cached output
        for b in loader:
            check_layout(b["rev"], "utf8")
            for r in rows_of(b):
                assert r["rev"] == want[r["id"]]["cats"][::-1] and r["n"] == len(r["rev"])
    assert runs[0] == runs[1]


def bad_nesting(cols, ctx):
    inner = Ragged(np.zeros(len(cols["id"]), np.int64), np.arange(len(cols["id"]) + 1, dtype=np.int64), "list")
    return {"id": np.array(cols["id"]), "bad": Ragged(inner, np.arange(len(cols["id"]) + 1, dtype=np.int64), "list")}


def test_a_transform_returning_another_nesting_is_refused(data):
    root, _ = data
    xf = Transform(bad_nesting, name="bad", version="1")
    with pytest.raises(DataError, match=r"transform 'bad' returned column 'bad' for .* as a Ragged whose values are "
                                        r"a Ragged \(Ragged\[list\] of Ragged\[list\] of int64\); the only nested "
                                        r"Ragged is a list of strings"), \
            Loader(root, batch_size=8, seed=0, columns=["id"], transform=xf) as loader:
        list(loader)


def test_inspect_shows_the_numpy_form(data, capsys):
    from detload.cli import main

    root, _ = data
    assert main(["inspect", root]) == 0
    out = capsys.readouterr().out
    assert ("    cats: large_list<element: large_string> -> Ragged[list] of Ragged[utf8]: values |u1, "
            "string offsets int64, row offsets int64\n") in out
    assert ("    blobs: list<element: binary> -> Ragged[list] of Ragged[binary]: values |u1, "
            "item offsets int64, row offsets int64\n") in out


# -- torch ------------------------------------------------------------------------------


TORCH_KW = dict(batch_size=16, seed=6, null_fill=FILL, columns=["id", "tags", "lblobs"])


def back(b: dict) -> dict:
    """A torch batch as NumPy (from any device), checking each list of strings' nested form."""
    import torch

    from detload.torch import RaggedTensor

    out = {}
    for k, v in b.items():
        if isinstance(v, RaggedTensor):
            assert isinstance(v.values, RaggedTensor) and v.kind == "list"
            assert v.values.values.dtype == torch.uint8 and v.offsets.dtype == v.values.offsets.dtype == torch.int64
            out[k] = Ragged(Ragged(v.values.values.cpu().numpy(), v.values.offsets.cpu().numpy(), v.values.kind),
                            v.offsets.cpu().numpy(), v.kind)
        else:
            out[k] = v.cpu().numpy()
    return out


def test_torch_gets_a_nested_ragged_tensor_of_bytes(data, monkeypatch):
    pytest.importorskip("torch")
    import detload.torch.handoff as dt
    from detload.torch import PackedTensors, RaggedTensor, TorchLoader, to_torch

    root, want = data
    kw = TORCH_KW
    with Loader(root, **kw) as loader:
        ref = [hash_batch(b)[0] for b in loader]

    with Loader(root, **kw) as loader:
        first = next(iter(loader))
        t = to_torch(first)["tags"]
        assert t.values.values.data_ptr() == first["tags"].values.values.ctypes.data  # shares memory
        moved = t.to("cpu")
        assert isinstance(moved.values, RaggedTensor) and moved.values.kind == "utf8"
        with pytest.raises(TypeError, match=r"to_nested\(\) takes a list of numbers"):
            t.to_nested()
    with TorchLoader(Loader(root, workers=2, **kw), device="cpu") as tl:
        assert [hash_batch(back(b))[0] for b in tl] == ref
    real = dt.pack  # the slab path (pinned with an accelerator; unpinned here)
    monkeypatch.setattr(dt, "pack", lambda batches, pin, stack=(): real(batches, pin=False, stack=stack))
    with TorchLoader(Loader(root, workers=2, pool="process", **kw), device="cpu", copy_batches=3) as tl:
        tl.pin_memory = True
        assert [hash_batch(back(b))[0] for b in tl] == ref
    # A packed batch's list-of-strings group column expands to its items on the tensors' device.
    groot = os.path.join(os.path.dirname(root), "groups")
    gwant = write_groups(groot)
    with TorchLoader(Loader(groot, batch_size=12, seed=4, group_by="q", group_columns=["qtags"]),
                     device="cpu", unpack=None) as tl:
        for p in tl:
            assert isinstance(p, PackedTensors)
            flat = back(p.unpack())
            for r in rows_of(flat):
                assert r["qtags"] == gwant[r["item"]]["qtags"] and r["tags"] == gwant[r["item"]]["tags"]


def test_cuda_paths_carry_lists_of_strings(data, tmp_path):  # pragma: no cover - no GPU in CI
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from detload.torch import TorchLoader

    root, _ = data
    with Loader(root, **TORCH_KW) as loader:
        ref = [hash_batch(b)[0] for b in loader]
    for kw in (dict(workers=2, pool="process"), dict(workers=2, pool="thread")):
        with TorchLoader(Loader(root, **kw, **TORCH_KW), device="cuda", prefetch=3) as tl:
            kept = list(tl)
            torch.cuda.synchronize()
            assert all(b["tags"].values.values.is_cuda and b["tags"].offsets.is_cuda for b in kept)
            assert [hash_batch(back(b))[0] for b in kept] == ref, kw
    groot = str(tmp_path / "groups")
    gwant = write_groups(groot)
    with TorchLoader(Loader(groot, batch_size=12, seed=4, group_by="q", group_columns=["qtags"]),
                     device="cuda", unpack="device") as tl:
        for b in tl:
            assert b["qtags"].values.values.is_cuda
            for r in rows_of(back(b)):
                assert r["qtags"] == gwant[r["item"]]["qtags"] and r["tags"] == gwant[r["item"]]["tags"]
