"""Odd datasets and transforms for the transform tests on odd datasets (tests/test_transform_odd_datasets.py):
many small row groups, a one-row row group, an empty file, string and list columns with nulls, Hive
partition folders and a file written by DuckDB. Module-level, so process workers can import them."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from detload import Ragged, Transform


def _table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    s = [None if i % 5 == 0 else "w" * int(i % 4) + str(i) for i in ids]
    lst = [None if i % 7 == 0 else list(range(int(i % 3))) for i in ids]
    f = [None if i % 6 == 0 else float(i) / 3 for i in ids]
    return pa.table({"id": pa.array(ids), "g": pa.array(ids // 3), "s": pa.array(s, pa.string()),
                     "l": pa.array(lst, pa.list_(pa.int32())), "f": pa.array(f, pa.float64())})


def write_odd(root: str) -> str:
    """The odd dataset (ids 0.. unique): Hive folders part=a|b, and a DuckDB file in part=c."""
    os.makedirs(root, exist_ok=True)
    a = os.path.join(root, "part=a")
    b = os.path.join(root, "part=b")
    c = os.path.join(root, "part=c")
    for d in (a, b, c):
        os.makedirs(d, exist_ok=True)
    pq.write_table(_table(0, 230), os.path.join(a, "many.parquet"), row_group_size=7)  # 33 row groups, last of 6
    pq.write_table(_table(1000, 1), os.path.join(a, "one.parquet"))  # one row group of 1 row
    pq.write_table(_table(2000, 0), os.path.join(b, "empty.parquet"))  # no rows at all
    t = pa.concat_tables([_table(3000, 40), _table(3040, 1), _table(3041, 55)])
    pq.write_table(t, os.path.join(b, "mixed.parquet"), row_group_size=41)  # 41, 41, 14
    import duckdb

    con = duckdb.connect()
    con.register("t", _table(4000, 300))
    path = os.path.join(c, "duck.parquet").replace("'", "''")
    con.execute(f"COPY t TO '{path}' (FORMAT PARQUET, ROW_GROUP_SIZE 64)")
    con.close()
    return root


FILL = {"s": "", "l": [], "f": 0.0}
COLUMNS = ["id", "s", "l", "f", "part"]  # and "g" = id // 3, a group key


def feats(cols, ctx):
    """Deterministic: bucket the id, the string's length, the list's sum, the partition as a code."""
    ids = cols["id"]
    s, lst = cols["s"], cols["l"]
    slen = np.diff(s.offsets)
    llen = np.diff(lst.offsets)
    row = np.repeat(np.arange(len(lst)), llen)
    lsum = np.zeros(len(lst), dtype=np.int64)
    np.add.at(lsum, row, lst.values.astype(np.int64))
    part = cols["part"]
    code = part.values[part.offsets[:-1]].astype(np.int8)  # the partition's first letter
    return {"id": np.array(ids), "bucket": (ids * 2654435761 % 101).astype(np.int32), "slen": slen,
            "lsum": lsum, "f2": np.asarray(cols["f"]) * 2, "s": s, "l": lst, "code": code,
            **({"g": cols["g"]} if "g" in cols else {})}


def feats_v2(cols, ctx):
    out = feats(cols, ctx)
    out["bucket"] = out["bucket"] + np.int32(1000)
    return out


def noise(cols, ctx):
    """Random: dropout from ctx.rng, raw-bit negatives and a permutation."""
    n = ctx.rows
    keep = ctx.rng.random(n) >= 0.5
    return {"id": np.array(cols["id"]), "f": np.where(keep, cols["f"], 0.0), "neg": ctx.integers(n, 10_000),
            "u": ctx.uniform(n), "perm": np.asarray(cols["id"])[ctx.permutation(n)], "s": cols["s"]}


def drop_odd(cols, ctx):
    """rows='changes': keep even ids, twice when divisible by 4."""
    ids = cols["id"]
    keep = np.flatnonzero(ids % 2 == 0)
    keep = np.repeat(keep, np.where(ids[keep] % 4 == 0, 2, 1))
    return {"id": ids[keep], "s": _take(cols["s"], keep)}


def _take(r: Ragged, idx: np.ndarray) -> Ragged:
    lengths = np.diff(r.offsets)[idx]
    offsets = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    parts = [r.values[r.offsets[i]:r.offsets[i + 1]] for i in idx]
    values = np.concatenate(parts) if parts else r.values[:0]
    return Ragged(np.ascontiguousarray(values), offsets, r.kind)


FEATS = Transform(feats, name="feats", version="1")
FEATS_V2 = Transform(feats_v2, name="feats", version="2")
NOISE = Transform(noise, name="noise", version="1", random=True)
DROP_ODD = Transform(drop_odd, name="drop-odd", version="1", rows="changes")


def path_len(cols, ctx):
    """Deterministic, and depends on ctx.file (the path relative to the dataset root)."""
    return {"id": np.array(cols["id"]), "plen": np.full(ctx.rows, len(ctx.file), dtype=np.int64)}


def odd_arrays(cols, ctx):
    """Outputs of unusual layouts: big-endian, a strided view, Fortran order, 3-D, bool, datetime,
    float16, and a Ragged whose values are a strided view."""
    ids = np.asarray(cols["id"])
    n = len(ids)
    two = np.stack([ids, ids * 2, ids * 3], axis=0)  # (3, n)
    wide = np.arange(n * 4, dtype=np.int64).reshape(2, n, 2)
    vals = np.repeat(ids, 2)[::2].astype(np.int16)  # a strided view, n values
    return {
        "id": ids,
        "be": ids.astype(">i4"),
        "strided": np.repeat(ids, 3)[::3],
        "fortran": two.T,  # (n, 3), not C-contiguous
        "cube": np.ascontiguousarray(wide.transpose(1, 0, 2)),  # (n, 2, 2)
        "flag": ids % 2 == 0,
        "when": ids.astype("datetime64[s]"),
        "half": ids.astype(np.float16),
        "rag": Ragged(vals, np.arange(n + 1, dtype=np.int64), "list"),
    }


def odd_expected(ids):
    """What `odd_arrays` delivers for the rows ``ids`` (but ``cube`` and ``rag``)."""
    return {"be": ids.astype(np.int32), "strided": ids, "fortran": np.stack([ids, ids * 2, ids * 3], axis=1),
            "flag": ids % 2 == 0, "when": ids.astype("datetime64[s]"), "half": ids.astype(np.float16)}


def fails_after_first_file(cols, ctx):
    """rows='changes', raising on every row group of every file after the first."""
    if ctx.file_index >= 1:
        raise LookupError(f"no table for file {ctx.file_index}")
    return {"id": np.array(cols["id"])}


def noise_keyed(cols, ctx):
    """`noise`, keeping the group key g (for group_by)."""
    return {"g": cols["g"], **noise(cols, ctx)}


NOISE_KEYED = Transform(noise_keyed, name="noise-keyed", version="1", random=True)


def ragged_2d(cols, ctx):
    """A Ragged whose values are 2-D (rows of 3): not detload's layout, which is 1-D values."""
    ids = np.asarray(cols["id"])
    n = len(ids)
    return {"id": ids, "r": Ragged(np.ones((n, 3), dtype=np.int32), np.arange(n + 1, dtype=np.int64), "list")}


def with_nan_and_nat(cols, ctx):
    """Deterministic, with NaN in a Ragged of floats and NaT in datetime and timedelta columns."""
    ids = np.asarray(cols["id"])
    n = len(ids)
    vals = np.where(ids % 2 == 0, np.nan, ids.astype(np.float64))
    when = ids.astype("datetime64[s]")
    when[ids % 3 == 0] = np.datetime64("NaT")
    return {"id": ids, "r": Ragged(vals, np.arange(n + 1, dtype=np.int64), "list"), "when": when,
            "gap": np.full(n, np.timedelta64("NaT"), dtype="timedelta64[ms]")}
