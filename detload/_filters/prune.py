"""Row-group pruning: a three-valued verdict from partition values, statistics and bloom filters.

`compile_prune` turns a canonical filter tree into one closure per node that
returns the set of outcomes (true, false, null) a row group's rows can have,
combined in Kleene logic; `verdict` reads "none", "some" or "all" from it.
`row_group_stats` reads pyarrow's statistics into `ColumnStats`.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from .scalars import compare_key, family_of, node_literal, parse_type_name, value_type

__all__ = [
    "BloomProbe",
    "ColumnStats",
    "Leaf",
    "PruneResult",
    "PruneSource",
    "SortedKeys",
    "compile_prune",
    "row_group_stats",
    "verdict",
]

#: "none": no row of the row group can match; "all": every row matches; "some": check the rows.
PruneResult = Literal["none", "some", "all"]
#: Which evidence settled a row group, for `detload plan` ("selection" when none did).
PruneSource = Literal["partition", "statistics", "bloom", "selection"]
#: ``(column, keys) -> may any of these values be stored in this row group's column``.
BloomProbe = Callable[[str, Sequence[Any]], bool]


# -- outcome sets ---------------------------------------------------------------------

_T, _F, _N = 1, 2, 4
_TFN = _T | _F | _N


def _kleene(op: str, a: int, b: int) -> int:
    if op == "and":
        return _F if _F in (a, b) else _N if _N in (a, b) else _T
    return _T if _T in (a, b) else _N if _N in (a, b) else _F


def _table(op: str) -> tuple[tuple[int, ...], ...]:
    # Outcome sets of x op y, where each side is a set of possible outcomes (bit mask).
    rows = []
    for x in range(8):
        row = []
        for y in range(8):
            m = 0
            for a in (_T, _F, _N):
                for b in (_T, _F, _N):
                    if x & a and y & b:
                        m |= _kleene(op, a, b)
            row.append(m)
        rows.append(tuple(row))
    return tuple(rows)


_AND, _OR = _table("and"), _table("or")
_NOT = tuple((m & _N) | (_F if m & _T else 0) | (_T if m & _F else 0) for m in range(8))

#: ``(stats, partition_values, num_rows, bloom) -> outcome set`` of one node of a filter.
Leaf = Callable[[Mapping[str, Any], Mapping[str, Any], int, Any], int]


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """What a row group's statistics say about one column.

    ``min``/``max`` are in the comparison domain of the column's family: int
    for integers (unsigned as their value), float, bool, UTF-8 ``bytes`` for
    strings, ``bytes`` for binary, days since 1970-01-01 for dates, nanoseconds
    since the epoch for timestamps (UTC for zoned ones), the unscaled int for
    decimals (at the column's scale). ``None``: unknown. ``min`` is always a
    lower bound; ``max`` is an upper bound only when ``max_exact`` (a truncated
    maximum is not one). ``min_exact`` is recorded for completeness.
    Float statistics ignore NaN: a float column may always hold NaN.
    """

    min: Any = None
    max: Any = None
    null_count: int | None = None
    min_exact: bool = True
    max_exact: bool = True


def _partition_key(ptype: str, value: Any) -> Any:
    if ptype == "int64":
        return int(value)
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


_MISSING = object()


class SortedKeys:
    """An ``isin`` list's keys in the statistics' comparison domain, sorted, and what is derived
    from them once and kept (`memo`: a bloom filter's hashes of every key, per encoding), so that
    a row group costs a binary search and a slice, not a pass over the list."""

    __slots__ = ("items", "_memo", "_lock")

    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self._memo: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.items)

    def memo(self, key: Any, build: Callable[[list[Any]], Any]) -> Any:
        """``build(items)``, computed once per ``key`` (thread-safe)."""
        got = self._memo.get(key, _MISSING)
        if got is _MISSING:
            with self._lock:
                got = self._memo.get(key, _MISSING)
                if got is _MISSING:
                    got = self._memo[key] = build(self.items)
        return got


def compile_prune(node: Mapping[str, Any], partitions: Mapping[str, str],
                  keys_of: Callable[[Mapping[str, Any]], SortedKeys] | None = None) -> Leaf:
    """One closure for a canonical tree; ``partitions`` maps the Hive columns it reads to their types.

    ``keys_of(node)`` gives an ``isin`` node's `SortedKeys` when the caller already built them.
    """
    op = node["op"]
    if op in ("and", "or"):
        kids = [compile_prune(a, partitions, keys_of) for a in node["args"]]
        table = _AND if op == "and" else _OR
        stop = _F if op == "and" else _T

        def combine(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
            m = kids[0](stats, pv, n, bloom)
            for k in kids[1:]:
                if m == stop:
                    return m
                m = table[m][k(stats, pv, n, bloom)]
            return m

        return combine
    if op == "not":
        kid = compile_prune(node["arg"], partitions, keys_of)
        return lambda stats, pv, n, bloom: _NOT[kid(stats, pv, n, bloom)]
    field = node["field"]
    if op in ("is_null", "is_valid"):
        want = op == "is_null"
        if field in partitions:
            def part_null(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
                v = pv.get(field, _MISSING)
                if v is _MISSING:
                    return _T | _F
                return _T if (v is None) == want else _F
            return part_null

        def null_leaf(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
            s = stats.get(field)
            nc = None if s is None else s.null_count
            if nc is None:
                return _T | _F
            some_null = _T if want else _F
            some_valid = _F if want else _T
            return (some_null if nc > 0 else 0) | (some_valid if nc < n else 0)
        return null_leaf
    t = parse_type_name(node["type"])
    is_float = family_of(t) == "float"
    if op == "isin":
        if keys_of is not None:
            keys = keys_of(node)
        else:
            keys = SortedKeys(sorted(compare_key(t, node_literal(node, j)[1]) for j in node["values"] if j is not None))
        null_hit = _T if None in node["values"] else _F
        if field in partitions:
            ptype = partitions[field]
            keyset = set(keys.items)

            def part_isin(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
                v = pv.get(field, _MISSING)
                if v is _MISSING:
                    return _TFN
                if v is None:
                    return null_hit
                return _T if _partition_key(ptype, v) in keyset else _F
            return part_isin
        return _isin_leaf(field, keys, null_hit, is_float)
    key = compare_key(t, node_literal(node, node["value"])[1])
    if field in partitions:
        ptype = partitions[field]
        test = _CMP_FUNC_PY[op]

        def part_cmp(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
            v = pv.get(field, _MISSING)
            if v is _MISSING:
                return _TFN
            if v is None:
                return _N
            return _T if test(_partition_key(ptype, v), key) else _F
        return part_cmp
    return _cmp_leaf(field, op, key, is_float)


_UNKNOWN = ColumnStats()

def verdict(mask: int) -> PruneResult:
    """The row group's verdict from the outcome set of the whole filter."""
    return "none" if not mask & _T else "all" if mask == _T else "some"


_CMP_FUNC_PY: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _cmp_leaf(field: str, op: str, v: Any, is_float: bool) -> Leaf:
    # NaN (never in float statistics) is false for every comparison but !=.
    nan = (_T if op == "!=" else _F) if is_float else 0

    def leaf(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
        s = stats.get(field) or _UNKNOWN  # a bloom filter may still rule the value out
        nc = s.null_count
        if nc is not None and nc >= n:
            return _N
        out = _N if nc is None or nc > 0 else 0
        lo = s.min
        hi = s.max if s.max_exact else None
        if op == "==":
            t = (lo is None or lo <= v) and (hi is None or v <= hi)
            f = lo is None or hi is None or not (lo == hi == v)
            if t and bloom is not None and not bloom(field, (v,)):
                t = False
        elif op == "!=":
            t = lo is None or hi is None or not (lo == hi == v)
            f = (lo is None or lo <= v) and (hi is None or v <= hi)
        elif op == "<":
            t = lo is None or lo < v
            f = hi is None or hi >= v
        elif op == "<=":
            t = lo is None or lo <= v
            f = hi is None or hi > v
        elif op == ">":
            t = hi is None or hi > v
            f = lo is None or lo <= v
        else:  # ">="
            t = hi is None or hi >= v
            f = lo is None or lo < v
        return out | nan | (_T if t else 0) | (_F if f else 0)

    return leaf


def _isin_leaf(field: str, sorted_keys: SortedKeys, null_hit: int, is_float: bool) -> Leaf:
    nan = _F if is_float else 0
    keys = sorted_keys.items

    def leaf(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
        s = stats.get(field) or _UNKNOWN
        nc = s.null_count
        if nc is not None and nc >= n:
            return null_hit
        out = null_hit if nc is None or nc > 0 else 0
        lo = s.min
        hi = s.max if s.max_exact else None
        i = 0 if lo is None else bisect.bisect_left(keys, lo)
        j = len(keys) if hi is None else bisect.bisect_right(keys, hi)
        t = i < j
        if t and bloom is not None:
            # A bloom reader's probe hashes the whole list once and slices the hashes.
            ranged = getattr(bloom, "sorted_range", None)
            if not (ranged(field, sorted_keys, i, j) if ranged is not None else bloom(field, keys[i:j])):
                t = False
        f = lo is None or hi is None or lo != hi or j - i != 1
        return out | nan | (_T if t else 0) | (_F if f else 0)

    return leaf


# -- statistics -------------------------------------------------------------------------

_UNIT_RE = re.compile(r"timeUnit=(milliseconds|microseconds|nanoseconds)")
_UNIT_NS = {"milliseconds": 1_000_000, "microseconds": 1_000, "nanoseconds": 1}


def row_group_stats(
    row_group: pq.RowGroupMetaData,
    schema: pa.Schema,
    *,
    columns: Iterable[str] | None = None,
) -> dict[str, ColumnStats | None]:
    """`ColumnStats` of every top-level primitive column of a row group (or of ``columns``).

    ``schema`` is the file's Arrow schema. A column without statistics, or of a
    type whose statistics detload cannot read (INT96 timestamps, float16,
    nested types), maps to None or has no min/max: "may match".
    """
    index, types = _leaf_index(schema)
    names = list(index) if columns is None else [c for c in columns if c in index]
    out: dict[str, ColumnStats | None] = {}
    n = row_group.num_columns
    for name in names:
        i = index.get(name)
        if i is None or i >= n:
            continue
        cc = row_group.column(i)
        if cc.path_in_schema != name:  # a layout this index does not know: look the column up
            found = [j for j in range(n) if row_group.column(j).path_in_schema == name]
            if not found:
                continue
            cc = row_group.column(found[0])
        out[name] = _column_stats(cc, types[name])
    return out


def _leaves(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaves(t.value_type)
    return 1


# Keyed by identity: hashing a pa.Schema costs ~100 µs, more than reading the statistics.
_INDEX_CACHE: dict[int, tuple[pa.Schema, dict[str, int], dict[str, pa.DataType]]] = {}


def _leaf_index(schema: pa.Schema) -> tuple[dict[str, int], dict[str, pa.DataType]]:
    """Top-level primitive column → its Parquet leaf index (pyarrow writes leaves in schema order), and its type."""
    got = _INDEX_CACHE.get(id(schema))
    if got is None or got[0] is not schema:
        index, types, i = {}, {}, 0
        for f in schema:
            k = _leaves(f.type)
            if k == 1 and not pa.types.is_nested(f.type):
                index[f.name] = i
                types[f.name] = f.type
            i += k
        if len(_INDEX_CACHE) > 256:
            _INDEX_CACHE.clear()
        got = _INDEX_CACHE[id(schema)] = (schema, index, types)
    return got[1], got[2]


def _column_stats(cc: pq.ColumnChunkMetaData, t: pa.DataType) -> ColumnStats | None:
    s = cc.statistics
    if s is None:
        return None
    nc = s.null_count if s.has_null_count else None
    lo = hi = None
    if s.has_min_max:
        conv = _converter(value_type(t), s)
        if conv is not None:
            try:
                lo, hi = conv(s.min_raw), conv(s.max_raw)
            except (TypeError, ValueError, OverflowError):
                lo = hi = None
            if isinstance(lo, float) and isinstance(hi, float) and (math.isnan(lo) or math.isnan(hi)):
                lo = hi = None  # an old writer's NaN bound orders nothing
    return ColumnStats(
        lo, hi, nc,
        bool(getattr(s, "is_min_value_exact", True)),
        bool(getattr(s, "is_max_value_exact", True)),
    )


def _converter(t: pa.DataType, s: Any) -> Callable[[Any], Any] | None:
    fam = family_of(t)
    phys = s.physical_type
    if fam == "int" and phys in ("INT32", "INT64"):
        if pa.types.is_unsigned_integer(t):
            mask = (1 << (32 if phys == "INT32" else 64)) - 1
            return lambda r: int(r) & mask
        return int
    if fam == "float" and phys in ("FLOAT", "DOUBLE"):
        return float
    if fam == "bool" and phys == "BOOLEAN":
        return bool
    if fam in ("string", "binary") and phys in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"):
        return lambda r: r if isinstance(r, bytes) else str(r).encode("utf-8")
    if fam == "date" and phys == "INT32":
        return int
    if fam == "timestamp" and phys == "INT64":
        m = _UNIT_RE.search(str(s.logical_type))
        if m is None:
            return None
        step = _UNIT_NS[m.group(1)]
        return lambda r: int(r) * step
    if fam == "decimal":
        if phys in ("INT32", "INT64"):
            return int
        if phys in ("FIXED_LEN_BYTE_ARRAY", "BYTE_ARRAY"):
            return lambda r: int.from_bytes(r, "big", signed=True)
    return None
