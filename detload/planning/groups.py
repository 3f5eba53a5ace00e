"""``group_by`` at planning time: a cached pass over the key column gives each unit its groups.

`group_units` reads only the key column of every planned row group (or its cached runs:
the first row and key of each run of equal keys, kept as a derived cache entry per file
version and key), applies a filter's selection to those runs, and joins row groups whose
group continues into the next one into one unit with several ranges. It checks that each
key occurs in one contiguous run of one file, and that every group fits a micro-batch
(or splits it into chunks of ``max_group_items``). The result is a pure function of the
data: each file's runs are computed on their own and joined in canonical order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._cache.derived import DerivedStore
from .._check import check_int
from .._filters.selection import Selection
from .._read.parquet import open_parquet, read_row_group
from .._storage import object_uri
from ..errors import DatasetError, OptionError
from ..plan import Range, Unit

__all__ = ["GroupStats", "GroupedUnits", "group_units", "runs_of"]

#: How a row group's runs are named in the cache: what derived them (the key column). Float
#: keys' runs are bitwise since version 2 (version 1 compared their values).
_IDENTITY = "groups/1/"
_IDENTITY_FLOAT = "groups/2/"


@dataclass
class GroupStats:
    """What the grouping pass found: groups (chunks counted apart), the largest group, the
    row groups whose key column was read and those whose runs came from the cache."""

    groups: int = 0
    chunks: int = 0
    largest: int = 0
    scanned: int = 0
    cached: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"groups": self.groups, "chunks": self.chunks, "largest": self.largest,
                "scanned": self.scanned, "cached": self.cached}


@dataclass
class GroupedUnits:
    units: list[Unit]
    stats: GroupStats


def runs_of(keys: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """(first row of each run of equal adjacent keys, the run's key) of a key column."""
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.int64), arr
    if n == 1:
        return np.zeros(1, dtype=np.int64), arr
    bits = _bitwise(arr)
    change = pc.not_equal(bits.slice(1), bits.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    starts = np.concatenate([[0], np.flatnonzero(change) + 1]).astype(np.int64)
    return starts, arr.take(pa.array(starts))


def _bitwise(keys: pa.Array) -> pa.Array:
    """Float keys as the unsigned integers of their bits, so keys compare as the workers compare
    group columns: NaN equals NaN, and -0.0 is another key than 0.0 (a value comparison said
    otherwise, so the groups depended on where row groups ended)."""
    if pa.types.is_floating(keys.type):
        return keys.view({2: pa.uint16(), 4: pa.uint32(), 8: pa.uint64()}[keys.type.bit_width // 8])
    return keys


def _encode(starts: np.ndarray, keys: pa.Array) -> bytes:
    sink = pa.BufferOutputStream()
    batch = pa.record_batch([pa.array(starts, pa.int64()), keys], names=["start", "key"])
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _decode(data: bytes, n: int) -> tuple[np.ndarray, pa.Array] | None:
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        starts = table.column("start").to_numpy().astype(np.int64)
        keys = table.column("key").combine_chunks()
    except (pa.ArrowInvalid, KeyError, OSError):
        return None
    if len(starts) != len(keys) or (len(starts) and (starts[0] != 0 or starts[-1] >= n
                                                     or (np.diff(starts) <= 0).any())):
        return None
    return starts, keys


# One row group's runs in delivered rows: (row group, delivered rows, starts, keys).
_RgRuns = tuple[int, int, np.ndarray, pa.Array]


def _file_runs(dataset: Any, i: int, rgs: Sequence[tuple[int, int]], key: str,
               selections: Mapping[tuple[int, int], Selection], store: Any, cache_key: str,
               stats: list[int]) -> list[_RgRuns]:
    """The runs of the planned row groups ``rgs`` ((row group, delivered rows)) of file ``i``."""
    f = dataset.files[i]
    floating = pa.types.is_floating(dataset.column_type(key))
    ident = (_IDENTITY_FLOAT if floating else _IDENTITY) + key
    out: list[_RgRuns] = []
    pf = None
    handle = None
    try:
        for g, rows in rgs:
            stored = f.row_groups[g]
            got = None
            if store is not None:
                data = store.get_bytes(cache_key, g, ident)
                got = _decode(data, stored) if data is not None else None
            if got is not None:
                stats[1] += 1
                starts, keys = got
            else:
                if pf is None:
                    handle = dataset.filesystem.open_input_file(f.location)
                    pf = open_parquet(handle)
                # Checksums verified as the workers do: a damaged page must not shape the groups.
                col = read_row_group(pf, g, [key], object_uri(dataset.filesystem, f.location)).column(0)
                if col.null_count:
                    raise DatasetError(f"group_by column {key!r} holds nulls in {f.path} row group {g}: every "
                                       "row needs a group key (fill them, or filter those rows out)")
                starts, keys = runs_of(col)
                stats[0] += 1
                if store is not None:
                    store.put_bytes(cache_key, g, ident, _encode(starts, keys))
            picked = selections.get((i, g))
            sel = picked.indices() if picked is not None else None
            if sel is not None:
                # Selection first: the runs of the delivered rows, in delivered positions.
                run = np.searchsorted(starts, sel, side="right") - 1
                first = np.concatenate([[0], np.flatnonzero(np.diff(run)) + 1]).astype(np.int64)
                keys = keys.take(pa.array(run[first]))
                starts = first
            assert starts.size and (len(sel) if sel is not None else stored) == rows
            out.append((g, rows, starts, keys))
    finally:
        if handle is not None:
            handle.close()
    return out


def _one_type(keys: pa.Array) -> pa.Array:
    """Keys in the type every file's keys of their kind share: writers store one string column as
    string or large_string (and views), which the loader reads alike, so the key runs must join."""
    t = keys.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or str(t) == "string_view":
        return keys if pa.types.is_large_string(t) else keys.cast(pa.large_string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or str(t) == "binary_view":
        return keys if pa.types.is_large_binary(t) else keys.cast(pa.large_binary())
    return keys


def _key_text(v: Any) -> str:
    return repr(v.as_py() if hasattr(v, "as_py") else v)


def group_units(dataset: Any, key: str, units: Sequence[Unit], *,
                selections: Mapping[tuple[int, int], Selection] | None = None,
                micro_batch: int, batch_size: int, world_size: int = 1, partitions: int = 1,
                max_group_items: int | None = None,
                cache: Any = None, cache_keys: Sequence[str] = (), threads: int = 8) -> GroupedUnits:
    """``units`` (one whole row group each, in canonical order, maybe with a selection) with
    their groups: row groups a group runs across joined into one unit of several ranges.

    Raises DatasetError naming the key for a key that occurs in two places of one file, a
    group that runs across files, and (without ``max_group_items``) a group larger than the
    micro-batch.
    """
    selections = selections or {}
    by_file: dict[int, list[tuple[int, int]]] = {}
    sel_of: dict[tuple[int, int], str] = {}
    for u in units:
        (r,) = u.ranges
        by_file.setdefault(r.file, []).append((r.row_group, r.rows))
        sel_of[(r.file, r.row_group)] = u.selection
    files = sorted(by_file)
    store = None
    if cache is not None:
        store = DerivedStore(cache)
    counters = [[0, 0] for _ in files]
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(files)))) as ex:
        per_file = list(ex.map(
            lambda j: _file_runs(dataset, files[j], by_file[files[j]], key, selections, store,
                                 cache_keys[files[j]] if store is not None else "", counters[j]),
            range(len(files))))
    stats = GroupStats(scanned=sum(c[0] for c in counters), cached=sum(c[1] for c in counters))

    # One code per distinct key over the whole dataset: equal keys, equal codes.
    # A key column the files drift on (int32 in some, int64 in others) joins in its promoted type.
    drift = dataset.drift(key)
    promoted = drift.promoted if drift is not None and drift.retyped else None
    all_keys = [_one_type(k if promoted is None or k.type.equals(promoted) else k.cast(promoted))
                for runs in per_file for _, _, _, k in runs]
    typ = all_keys[0].type
    keys_all = pa.chunked_array(all_keys, type=typ).combine_chunks()
    encoded = _bitwise(keys_all).dictionary_encode()
    codes_all = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    # Each code's key as stored (for messages): codes number keys in order of first occurrence.
    dictionary = keys_all.take(pa.array(np.unique(codes_all, return_index=True)[1]))

    out: list[Unit] = []
    # Every group (after joining runs across row groups): code, file, row group, row.
    g_code: list[np.ndarray] = []
    g_file: list[np.ndarray] = []
    g_rg: list[np.ndarray] = []
    g_row: list[np.ndarray] = []
    g_size: list[np.ndarray] = []
    pos = 0
    for fi, runs in zip(files, per_file):
        cur_ranges: list[Range] = []
        cur_groups: list[int] = []
        cur_rows = 0
        cur_sel: list[str] = []
        last_code = -1
        f_code: list[int] = []
        f_rg: list[int] = []
        f_row: list[int] = []
        f_start: list[int] = []  # the group's first row in the file's delivered rows
        f_pos = 0
        for g, rows, starts, _keys in runs:
            codes = codes_all[pos : pos + len(starts)]
            pos += len(starts)
            # Adjacent runs with one key are one group (a selection may have removed what lay between).
            keep = np.ones(len(codes), dtype=bool)
            keep[1:] = codes[1:] != codes[:-1]
            continues = bool(cur_ranges) and int(codes[0]) == last_code
            if continues:
                keep[0] = False
            elif cur_ranges:
                out.append(Unit(tuple(cur_ranges), tuple(cur_groups), _join_selections(cur_sel)))
                cur_ranges, cur_groups, cur_rows, cur_sel = [], [], 0, []
            new = np.flatnonzero(keep)
            cur_groups += (starts[new] + cur_rows).tolist()
            f_code += codes[new].tolist()
            f_rg += [g] * len(new)
            f_row += starts[new].tolist()
            f_start += (starts[new] + f_pos).tolist()
            cur_ranges.append(Range(fi, g, 0, rows))
            cur_sel.append(sel_of[(fi, g)])
            cur_rows += rows
            f_pos += rows
            last_code = int(codes[-1])
        if cur_ranges:
            out.append(Unit(tuple(cur_ranges), tuple(cur_groups), _join_selections(cur_sel)))
        g_code.append(np.asarray(f_code, dtype=np.int64))
        g_file.append(np.full(len(f_code), fi, dtype=np.int64))
        g_rg.append(np.asarray(f_rg, dtype=np.int64))
        g_row.append(np.asarray(f_row, dtype=np.int64))
        g_size.append(np.diff(np.append(np.asarray(f_start, dtype=np.int64), f_pos)))
    code = np.concatenate(g_code)
    gfile, grg, grow, gsize = (np.concatenate(a) for a in (g_file, g_rg, g_row, g_size))
    _check_unique(dataset, key, code, gfile, grg, grow, dictionary)
    stats.groups = len(code)
    stats.largest = int(gsize.max())
    if max_group_items is not None:
        out = [_chunked(u, max_group_items) for u in out]
    elif stats.largest > micro_batch:
        big = int(np.argmax(gsize))
        raise DatasetError(
            f"group {key}={_key_text(dictionary[int(code[big])])} ({dataset.files[int(gfile[big])].path} row "
            f"group {int(grg[big])}) holds {int(gsize[big])} items, more than a micro-batch of {micro_batch} "
            f"items (the global batch, batch_size {batch_size} x world size {world_size}, over {partitions} "
            "partition(s)): a group is never split across batches. Pass a larger batch_size, or "
            "max_group_items=N (N <= the micro-batch) to split large groups into chunks of N items")
    stats.chunks = sum(len(u.groups) for u in out)
    return GroupedUnits(out, stats)


def _join_selections(sel: Sequence[str]) -> str:
    # A unit's selection names what its row groups deliver; "" when all deliver every row.
    return "" if not any(sel) else "+".join(s or "-" for s in sel)


def _chunked(u: Unit, n: int) -> Unit:
    """``u`` with each group longer than ``n`` rows split into chunks of ``n`` (the last shorter)."""
    bounds = [*u.groups, u.rows]
    if max(b - a for a, b in zip(bounds, bounds[1:])) <= n:
        return u
    groups: list[int] = []
    for a, b in zip(bounds, bounds[1:]):
        groups += range(a, b, n)
    return Unit(u.ranges, tuple(groups), u.selection)


def _check_unique(dataset: Any, key: str, code: np.ndarray, gfile: np.ndarray, grg: np.ndarray,
                  grow: np.ndarray, dictionary: pa.Array) -> None:
    """DatasetError at the first key (in canonical order of its second place) found twice."""
    order = np.argsort(code, kind="stable")
    dup = np.flatnonzero(code[order][1:] == code[order][:-1])
    if not dup.size:
        return
    second = order[dup + 1]
    j = int(second.min())  # the earliest place a key occurs again
    i = int(order[np.flatnonzero(order == j)[0] - 1])  # the place before it (sorted stably)
    value = _key_text(dictionary[int(code[j])])
    fa, fb = dataset.files[int(gfile[i])].path, dataset.files[int(gfile[j])].path
    if gfile[i] == gfile[j]:
        raise DatasetError(
            f"group_by={key!r}: key {value} is not contiguous in {fa}: it occurs at row group {int(grg[i])} row "
            f"{int(grow[i])} and again at row group {int(grg[j])} row {int(grow[j])}, with other keys between. "
            f"Rewrite the data with each group's rows together: detload layout SRC DST --group-by {key}")
    raise DatasetError(
        f"group_by={key!r}: group {value} is split across files: it occurs in {fa} (row group {int(grg[i])}) and "
        f"in {fb} (row group {int(grg[j])}). A group must lie in one file: rewrite the data with "
        f"detload layout SRC DST --group-by {key}")


def check_group_options(dataset: Any, names: Sequence[str], group_by: Any, group_columns: Any,
                        max_group_items: Any, micro_batch: int) -> tuple[str, tuple[str, ...], int | None]:
    """``group_by``, ``group_columns`` and ``max_group_items`` checked against the loaded columns
    ``names``: the key, the group columns in the loaded order (the key among them), N or None."""
    if not isinstance(group_by, str) or not group_by:
        raise OptionError(f"group_by must be a column name (str), got {group_by!r}")
    stored = {*dataset.schema.names, *dataset.later_columns()}
    if group_by not in stored:
        if group_by in dataset.partition_keys:
            raise OptionError(f"group_by={group_by!r} is a Hive partition key; group by a column stored in "
                              "the files")
        known = ", ".join(dataset.schema.names[:12]) + (", ..." if len(dataset.schema.names) > 12 else "")
        raise OptionError(f"group_by={group_by!r} is not a column of the dataset (its columns: {known})")
    drift = dataset.drift(group_by)
    if drift is not None and drift.missing:
        raise drift.lacked_error("group_by names column", "every row needs a stored group key", "Group by")
    typ = dataset.column_type(group_by)
    if pa.types.is_nested(typ):
        raise OptionError(f"group_by={group_by!r} is a {typ} column: the key must be a scalar column "
                          "(a number, string, binary, bool, date or time)")
    if group_by not in names:
        raise OptionError(f"group_by={group_by!r} must be among the loaded columns (columns={list(names)}): "
                          "the key is delivered with each group")
    if group_columns is None:
        group_columns = []
    if isinstance(group_columns, str) or not isinstance(group_columns, (list, tuple)) \
            or not all(isinstance(c, str) for c in group_columns):
        raise OptionError(f"group_columns must be a list of column names, got {group_columns!r}")
    for c in group_columns:
        if c not in names:
            where = ("a column of the dataset that is not among the loaded columns" if c in stored
                     or c in dataset.partition_keys else "not a column of the dataset")
            raise OptionError(f"group_columns names {c!r}, {where}: group columns are a subset of "
                              f"columns={list(names)}")
    wanted = {group_by, *group_columns}
    if all(n in wanted for n in names):
        raise OptionError(f"every loaded column is a group column ({list(names)}): a packed batch needs at least "
                          "one item column (a column of columns= outside group_columns)")
    if max_group_items is not None:
        max_group_items = check_int("max_group_items", max_group_items, 1)
        if max_group_items > micro_batch:
            raise OptionError(f"max_group_items={max_group_items} is larger than the micro-batch of "
                              f"{micro_batch} items: a chunk must fit one micro-batch")
    return group_by, tuple(n for n in names if n in wanted), max_group_items
