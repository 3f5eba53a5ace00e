"""Hypothesis strategies for filter tests: small Hive datasets and random filters from the supported subset.

A dataset is a few files under ``p=<int>/q=<str>/`` folders, each with a
unique ``rid`` per row and nullable columns ``i`` (int64), ``f`` (float64 with
NaN, ±0.0 and ±inf), ``s`` (string, non-ASCII included) and ``d`` (date32),
split into small row groups and sometimes sorted so that statistics prune.
A filter spec is a nested tuple (so failures print readably) that
`spec_expression` turns into a pyarrow expression.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import strategies as st

PARTITION_TYPES = {"p": "int64", "q": "string"}
TYPES = {"i": pa.int64(), "f": pa.float64(), "s": pa.string(), "d": pa.date32(), "p": pa.int64(), "q": pa.string()}
SCHEMA = pa.schema([("rid", pa.int64()), *((k, TYPES[k]) for k in "ifsd")])

_EPOCH = dt.date(2026, 1, 1)
_F = [0.0, -0.0, 1.5, -2.0, 3.25, float("inf"), float("-inf")]
_S = ["", "a", "ab", "b", "é", "zz"]

VALUES = {
    "i": st.integers(-2, 11),
    "f": st.sampled_from([*_F, 2.0, -1.0]),
    "s": st.sampled_from([*_S, "c", "aa"]),
    "d": st.integers(-1, 11).map(lambda k: _EPOCH + dt.timedelta(days=k)),
    "p": st.integers(0, 3),
    "q": st.sampled_from(["x", "y", "z"]),
}


@dataclass(frozen=True)
class FilterFile:
    path: str
    partition_values: dict[str, str]


def _column(draw: Any, name: str, n: int, null_p: float) -> list[Any]:
    base = {
        "i": st.integers(0, 9),
        "f": st.one_of(st.sampled_from(_F), st.just(float("nan"))),
        "s": st.sampled_from(_S),
        "d": st.integers(0, 9).map(lambda k: _EPOCH + dt.timedelta(days=k)),
    }[name]
    return [None if draw(st.floats(0, 1)) < null_p else draw(base) for _ in range(n)]


@st.composite
def hive_tables(draw: Any) -> list[tuple[dict[str, str], pa.Table, int]]:
    """(partition values, table, row-group size) for each file of a dataset."""
    out = []
    rid = 0
    for p, q in draw(st.lists(st.sampled_from([(1, "x"), (1, "y"), (2, "x"), (3, "é")]), min_size=1, max_size=3, unique=True)):
        n = draw(st.integers(1, 24))
        null_p = draw(st.sampled_from([0.0, 0.2, 1.0]))
        cols = {k: _column(draw, k, n, null_p if k != "s" else draw(st.sampled_from([0.0, 0.3]))) for k in "ifsd"}
        if draw(st.booleans()):  # sorted data: statistics then rule out whole row groups
            key = draw(st.sampled_from("isd"))
            order = sorted(range(n), key=lambda r: (cols[key][r] is None, cols[key][r] if cols[key][r] is not None else 0))
            cols = {k: [v[r] for r in order] for k, v in cols.items()}
        table = pa.table({"rid": pa.array(range(rid, rid + n), pa.int64()), **{k: pa.array(v, TYPES[k]) for k, v in cols.items()}})
        rid += n
        out.append(({"p": str(p), "q": q}, table, draw(st.integers(1, 8))))
    return out


def write_hive(root: str, tables: list[tuple[dict[str, str], pa.Table, int]]) -> list[FilterFile]:
    files = []
    for pv, table, rg in tables:
        folder = os.path.join(root, f"p={pv['p']}", f"q={pv['q']}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "part-0.parquet")
        pq.write_table(table, path, row_group_size=rg)
        files.append(FilterFile(path, pv))
    return files


# -- filters -------------------------------------------------------------------------

_COLUMNS = list(VALUES)


@st.composite
def leaf_specs(draw: Any) -> tuple[Any, ...]:
    col = draw(st.sampled_from(_COLUMNS))
    kind = draw(st.sampled_from(["cmp"] * 5 + ["isin", "isin", "is_null", "is_valid"]))
    if kind == "cmp":
        return ("cmp", draw(st.sampled_from(["==", "!=", "<", "<=", ">", ">="])), col, draw(VALUES[col]))
    if kind == "isin":
        values = draw(st.lists(VALUES[col], max_size=4))
        return ("isin", col, tuple(values), draw(st.booleans()))
    return (kind, col)


filter_specs = st.recursive(
    leaf_specs(),
    lambda inner: st.one_of(
        st.tuples(st.just("and"), inner, inner),
        st.tuples(st.just("or"), inner, inner),
        st.tuples(st.just("not"), inner),
    ),
    max_leaves=5,
)

_OPS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def spec_expression(spec: tuple[Any, ...]) -> pc.Expression:
    tag = spec[0]
    if tag == "cmp":
        _, op, col, v = spec
        return _OPS[op](pc.field(col), v)
    if tag == "isin":
        _, col, values, with_null = spec
        return pc.field(col).isin(pa.array([*values, *([None] if with_null else [])], TYPES[col]))
    if tag == "is_null":
        return pc.field(spec[1]).is_null()
    if tag == "is_valid":
        return pc.field(spec[1]).is_valid()
    if tag == "and":
        return spec_expression(spec[1]) & spec_expression(spec[2])
    if tag == "or":
        return spec_expression(spec[1]) | spec_expression(spec[2])
    return ~spec_expression(spec[1])


def with_partitions(table: pa.Table, pv: dict[str, str]) -> pa.Table:
    """A row group's table with its Hive columns added, as pyarrow's dataset types them."""
    n = table.num_rows
    return table.append_column("p", pa.array([int(pv["p"])] * n, pa.int64())).append_column("q", pa.array([pv["q"]] * n, pa.string()))
