"""`detload check-layout`: is a dataset, written by any tool, sorted by keys and ready for pruning?

Checks that each file's rows are in ascending key order (nulls first or last), that the files follow
each other in file-name order (or finds the order in which they would), and that every row group
has min/max statistics for the keys; reports the page index, bloom filters and declared
sorting_columns. Reads the key columns and the footers only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .._discovery import discover
from .._storage import display_uri
from ..errors import DatasetError, OptionError

__all__ = ["LayoutCheck", "check_layout"]

NullPlacement = Literal["first", "last"]
Presence = Literal["all", "some", "none"]


@dataclass(frozen=True)
class LayoutCheck:
    """What ``check_layout`` found. ``ok``: sorted within and across files, statistics everywhere."""

    source: str
    sort_by: tuple[str, ...]
    files: int
    row_groups: int
    rows: int
    #: Where nulls sort in the order found ("last" when the data has no null key).
    nulls: NullPlacement
    #: The first out-of-order row of each unsorted file: "path: row N ...".
    unsorted_files: tuple[str, ...]
    #: Consecutive files (in file-name order) whose key ranges are out of order.
    file_order_breaks: tuple[str, ...]
    #: When file-name order breaks but another order of the files is sorted: that order.
    file_order_found: tuple[str, ...] | None
    #: "path#row_group: column" for each key column chunk without min/max statistics.
    missing_statistics: tuple[str, ...]
    #: Whether the key columns' chunks have a column index and an offset index.
    page_index: Presence
    bloom_filters: tuple[tuple[str, Presence], ...]
    sorting_columns: tuple[str, ...]

    @property
    def sorted_within_files(self) -> bool:
        return not self.unsorted_files

    @property
    def sorted_across_files(self) -> bool:
        return not self.file_order_breaks

    @property
    def ok(self) -> bool:
        return self.sorted_within_files and self.sorted_across_files and not self.missing_statistics

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "sort_by": list(self.sort_by), "files": self.files,
            "row_groups": self.row_groups, "rows": self.rows, "ok": self.ok, "nulls": self.nulls,
            "sorted_within_files": self.sorted_within_files, "unsorted_files": list(self.unsorted_files),
            "sorted_across_files": self.sorted_across_files, "file_order_breaks": list(self.file_order_breaks),
            "file_order_found": list(self.file_order_found) if self.file_order_found is not None else None,
            "missing_statistics": list(self.missing_statistics), "page_index": self.page_index,
            "bloom_filters": dict(self.bloom_filters), "sorting_columns": list(self.sorting_columns),
        }

    def __str__(self) -> str:
        keys = ", ".join(self.sort_by)
        lines = [f"check-layout {self.source} --sort-by {keys}",
                 f"  {self.files} file(s), {self.row_groups} row groups, {self.rows:,} rows"]
        if self.sorted_within_files:
            lines.append(f"  within files: sorted by ({keys}), ascending, nulls {self.nulls}")
        else:
            lines.append(f"  within files: NOT sorted by ({keys}) in {len(self.unsorted_files)} file(s)")
            lines += [f"    {u}" for u in self.unsorted_files[:10]]
        if self.files > 1:
            if self.sorted_across_files:
                lines.append("  across files: sorted in file-name order")
            else:
                lines.append("  across files: NOT sorted in file-name order")
                lines += [f"    {b}" for b in self.file_order_breaks[:10]]
                if self.file_order_found is not None:
                    lines.append("    the files are sorted when read in this order: " + ", ".join(self.file_order_found))
                elif self.sorted_within_files:
                    lines.append("    no order of the files is sorted: their key ranges overlap")
        if self.missing_statistics:
            lines.append(f"  statistics: {len(self.missing_statistics)} key column chunk(s) without min/max, "
                         "so pruning must read them:")
            lines += [f"    {m}" for m in self.missing_statistics[:10]]
        else:
            lines.append("  statistics: min/max for every key in every row group")
        lines.append(f"  page index of the keys (column and offset index): {self.page_index}"
                     + (" row groups" if self.page_index != "none" else ""))
        blooms = ", ".join(f"{c} ({p} row groups)" for c, p in self.bloom_filters)
        lines.append(f"  bloom filters: {blooms or 'none'}")
        lines.append(f"  sorting_columns declared: {', '.join(self.sorting_columns) or 'none'}")
        lines.append("  result: " + ("OK, ready for pruning by " + self.sort_by[0] if self.ok else "NOT OK"))
        return "\n".join(lines)


def _plain(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The values as a comparable Arrow array: chunks joined, extensions and dictionaries unwrapped."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if isinstance(arr.type, pa.BaseExtensionType):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def _pairs_in_order(prev: Sequence[pa.Array], cur: Sequence[pa.Array], nulls: NullPlacement) -> np.ndarray:
    """For each i, whether the key tuple prev[.][i] <= cur[.][i] (ascending, NaN above every number)."""
    ok: np.ndarray | None = None
    for a, b in reversed(list(zip(prev, cur))):
        an = np.asarray(a.is_null().to_numpy(zero_copy_only=False), bool)
        bn = np.asarray(b.is_null().to_numpy(zero_copy_only=False), bool)
        lt = np.asarray(pc.less(a, b).fill_null(False).to_numpy(zero_copy_only=False), bool)
        eq = np.asarray(pc.equal(a, b).fill_null(False).to_numpy(zero_copy_only=False), bool)
        if pa.types.is_floating(a.type):
            anan = np.asarray(pc.is_nan(a).fill_null(False).to_numpy(zero_copy_only=False), bool)
            bnan = np.asarray(pc.is_nan(b).fill_null(False).to_numpy(zero_copy_only=False), bool)
            lt = (lt & ~anan & ~bnan) | (~anan & bnan & ~an)
            eq = eq | (anan & bnan)
        eq = eq | (an & bn)
        if nulls == "last":
            lt = (lt & ~an & ~bn) | (~an & bn)
        else:
            lt = (lt & ~an & ~bn) | (an & ~bn)
        ok = (lt | eq) if ok is None else (lt | (eq & ok))
    assert ok is not None
    return ok


def _fmt(keys: Sequence[pa.Array], i: int) -> str:
    return "(" + ", ".join(repr(k[i].as_py()) for k in keys) + ")"


def check_layout(source: Any, *, sort_by: Sequence[str], filesystem: Any = None) -> LayoutCheck:
    """Check that ``source`` is sorted by ``sort_by`` within and across files, with key statistics."""
    keys = [sort_by] if isinstance(sort_by, str) else list(sort_by)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise OptionError(f"sort_by must list one or more column names, got {sort_by!r}")
    ds = discover(source, filesystem=filesystem)
    available = ds.column_names()
    missing = [k for k in keys if k not in available]
    if missing:
        raise DatasetError(f"sort key {missing[0]!r} is not a column of {display_uri(ds.filesystem, ds.root)}; the columns are {available}")
    ptypes = dict(ds.partition_types)
    for k in keys:
        if k in ptypes:
            continue
        t = ds.schema.field(k).type
        if pa.types.is_nested(t) or pa.types.is_null(t):
            raise DatasetError(f"cannot check sorting by {k!r}: its type {t} has no order")
    fs = ds.filesystem
    file_keys: list[list[pa.Array]] = []
    names: list[str] = []
    placements: dict[str, list[str]] = {"last": [], "first": []}
    missing_stats: list[str] = []
    chunks = with_index = 0
    bloom_count: dict[str, int] = {}
    sorting_declared: tuple[str, ...] | None = None
    row_groups = 0
    for f in ds.files:
        if not sum(f.row_groups):
            continue
        with fs.open_input_file(f.location) as fh:
            pf = pq.ParquetFile(fh)
            md = pf.metadata
            stored = [k for k in keys if k not in ptypes]
            table = pf.read(columns=stored, use_threads=True) if stored else None
        n = md.num_rows
        values = dict(f.partition_values)
        cols = []
        for k in keys:
            if k in ptypes:
                v = values[k]
                cols.append(pa.repeat(pa.scalar(int(v) if ptypes[k] == "int64" else v,
                                                pa.int64() if ptypes[k] == "int64" else pa.string()), n))
            else:
                assert table is not None
                cols.append(_plain(table.column(k)))
        file_keys.append(cols)
        names.append(f.path)
        if n > 1:
            prev = [c.slice(0, n - 1) for c in cols]
            cur = [c.slice(1) for c in cols]
            for placement in ("last", "first"):
                bad = np.flatnonzero(~_pairs_in_order(prev, cur, placement))  # type: ignore[arg-type]
                if len(bad):
                    i = int(bad[0])
                    placements[placement].append(
                        f"{f.path}: row {i + 1} {_fmt(cols, i + 1)} comes after row {i} {_fmt(cols, i)}"
                        f" ({len(bad)} such place(s))")
        leaf = {md.schema.column(j).path: j for j in range(md.num_columns)}
        by_key = dict(zip(keys, cols))
        first_row = 0
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            rows_here = rg.num_rows
            first_row += rows_here
            if rows_here == 0:
                continue
            row_groups += 1
            for k in stored:
                j = leaf.get(k)
                c = rg.column(j) if j is not None else None
                st = c.statistics if c is not None else None
                # Writers leave min/max out for a chunk of nulls and NaNs only: nothing to prune by.
                nothing = _only_nulls_or_nan(by_key[k].slice(first_row - rows_here, rows_here))
                if not nothing and (st is None or not st.has_min_max):
                    missing_stats.append(f"{f.path}#{g}: {k}")
                if c is not None:
                    chunks += 1
                    with_index += bool(c.has_offset_index and (c.has_column_index or nothing))
            for j in range(md.num_columns):
                c = rg.column(j)
                if c.bloom_filter_offset is not None:
                    bloom_count[c.path_in_schema] = bloom_count.get(c.path_in_schema, 0) + 1
            declared = tuple(md.schema.column(s.column_index).path for s in rg.sorting_columns)
            sorting_declared = declared if sorting_declared is None or sorting_declared == declared else ()
    # Nulls first (Spark's default) or last (DuckDB's, and layout's): whichever the data follows.
    candidates: list[NullPlacement] = [p for p in ("last", "first") if not placements[p]] or ["last"]
    nulls = next((p for p in candidates if not _breaks(file_keys, names, p)), candidates[0])
    breaks = _breaks(file_keys, names, nulls)
    order_found = None
    if breaks:
        order_found = _file_order(file_keys, names, nulls)
    page: Presence = "all" if chunks and with_index == chunks else ("some" if with_index else "none")
    blooms: tuple[tuple[str, Presence], ...] = tuple(
        (c, "all" if cnt == row_groups else "some") for c, cnt in sorted(bloom_count.items()))
    return LayoutCheck(
        source=_describe(source), sort_by=tuple(keys), files=len(names), row_groups=row_groups, rows=ds.rows,
        nulls=nulls, unsorted_files=tuple(placements[nulls]), file_order_breaks=tuple(breaks),
        file_order_found=order_found, missing_statistics=tuple(missing_stats), page_index=page,
        bloom_filters=blooms, sorting_columns=sorting_declared or (),
    )


def _only_nulls_or_nan(arr: pa.Array) -> bool:
    if arr.null_count == len(arr):
        return True
    if pa.types.is_floating(arr.type):
        return bool(pc.all(pc.or_kleene(pc.is_null(arr), pc.is_nan(arr).fill_null(True))).as_py())
    return False


def _describe(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return ", ".join(os.fspath(s) for s in source)


def _boundary_ok(a: list[pa.Array], b: list[pa.Array], nulls: NullPlacement) -> bool:
    """Whether file a's last key tuple <= file b's first."""
    last = [c.slice(len(c) - 1, 1) for c in a]
    first = [c.slice(0, 1) for c in b]
    return bool(_pairs_in_order(last, first, nulls)[0])


def _breaks(file_keys: list[list[pa.Array]], names: list[str], nulls: NullPlacement) -> list[str]:
    out = []
    for i in range(len(file_keys) - 1):
        a, b = file_keys[i], file_keys[i + 1]
        if not _boundary_ok(a, b, nulls):
            out.append(f"{names[i]} ends at {_fmt(a, len(a[0]) - 1)} but the next file, {names[i + 1]}, "
                       f"starts at {_fmt(b, 0)}")
    return out


def _file_order(file_keys: list[list[pa.Array]], names: list[str], nulls: NullPlacement) -> tuple[str, ...] | None:
    """An order of the files in which each ends before the next starts, if the first keys give one."""

    def sort_key(i: int) -> tuple[Any, ...]:
        out: list[Any] = []
        for c in file_keys[i]:
            v = c[0].as_py()
            missing = v is None
            nan = isinstance(v, float) and math.isnan(v)
            rank = (1 if missing else 0) if nulls == "last" else (0 if missing else 1)
            out.append((rank, 1 if nan else 0, 0 if missing or nan else v))
        return tuple(out)

    try:
        order = sorted(range(len(file_keys)), key=sort_key)
    except TypeError:
        return None
    for x, y in zip(order, order[1:]):
        if not _boundary_ok(file_keys[x], file_keys[y], nulls):
            return None
    return tuple(names[i] for i in order)
