"""A filter at planning time: prune row groups, run the selection pass, build the plan's units.

`filter_units` opens each file's footer, asks `Filter.prune_source` about every
non-empty row group (Hive partition values, then footer statistics, then bloom
filters), and, for a row group that none of them settles, reads only the
filter's stored columns of it and keeps the exact rows `Filter.select` keeps.
The result is deterministic: the same dataset and filter give the same units,
selections and digest whatever the thread count, because each file's answer is
computed on its own and the answers are joined in canonical file order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow.parquet as pq
import xxhash

from .._discovery import chunk_bytes, leaf_columns
from .._read.parquet import open_parquet, read_row_group
from .._storage import object_uri
from ..errors import EmptyDatasetError
from ..plan import Range, Unit
from .bloom import BloomReader
from .canonical import Filter
from .prune import row_group_stats
from .selection import Selection

__all__ = ["FilterStats", "FilteredUnits", "filter_units"]


#: How many row groups `FilterStats.examples` names per verdict.
EXAMPLES = 5


@dataclass
class FilterStats:
    """What planning did with a filter: row groups pruned (by the evidence that settled them),
    read by the selection pass, and rows kept. Plain data (``as_dict`` for printing)."""

    row_groups: int = 0
    pruned: dict[str, int] = field(default_factory=lambda: {"partition": 0, "statistics": 0, "bloom": 0})
    all_rows: int = 0  # row groups whose every row matches (settled without reading)
    selection_pass: int = 0  # row groups whose filter columns were read
    selection_cached: int = 0  # row groups whose selection came from the cache instead
    selected_empty: int = 0  # of those, the ones where no row matched (dropped from the plan)
    rows_total: int = 0
    rows_selected: int = 0
    #: Column-chunk bytes (compressed, from the footers) of the filter columns the selection pass read.
    bytes_read: int = 0
    seconds: float = 0.0  # wall time of the pruning and selection pass
    #: Per verdict ("partition", "statistics", "bloom", "all_rows", "selection_pass",
    #: "selection_cached", "selected_empty"), the first `EXAMPLES` row groups it settled, in
    #: canonical order: (file path, row group, stored rows, rows selected).
    examples: dict[str, list[tuple[str, int, int, int]]] = field(default_factory=dict)

    @property
    def row_groups_skipped(self) -> int:
        """Row groups no epoch reads: pruned, or without a selected row."""
        return sum(self.pruned.values()) + self.selected_empty

    def note(self, verdict: str, path: str, rg: int, rows: int, selected: int) -> None:
        got = self.examples.setdefault(verdict, [])
        if len(got) < EXAMPLES:
            got.append((path, rg, rows, selected))

    def as_dict(self) -> dict[str, Any]:
        return {
            "row_groups": self.row_groups,
            "pruned": dict(self.pruned),
            "pruned_total": sum(self.pruned.values()),
            "all_rows": self.all_rows,
            "selection_pass": self.selection_pass,
            "selection_cached": self.selection_cached,
            "selected_empty": self.selected_empty,
            "row_groups_skipped": self.row_groups_skipped,
            "rows_total": self.rows_total,
            "rows_selected": self.rows_selected,
            "bytes_read": self.bytes_read,
            "seconds": self.seconds,
            "examples": {k: [list(e) for e in v] for k, v in self.examples.items()},
        }


@dataclass
class FilteredUnits:
    """The units of a filtered plan and, per (file index, row group) with a partial selection,
    the stored rows that are delivered (a compact `Selection`)."""

    units: list[Unit]
    selections: dict[tuple[int, int], Selection]
    stats: FilterStats
    #: (planning thread, start, end) of each row group's selection pass (`time.perf_counter`),
    #: for the trace's "select" stage.
    spans: list[tuple[int, float, float]] = field(default_factory=list)


class _Answer(NamedTuple):
    """One file's answer: per non-empty row group (rg, stored rows, verdict, source, indices or
    None); the selection pass's spans (thread, start, end) and the column-chunk bytes it read."""

    groups: list[tuple[int, int, str, str, np.ndarray | None]]
    spans: list[tuple[int, float, float]]
    bytes_read: int


# Which planning thread a span ran on: a small number per thread, for the trace's tracks.
_lane = threading.local()


def _selection_id(flt_digest: str, idx: np.ndarray) -> str:
    # Names the selection by what it keeps, so the UnitList digest covers the rows exactly.
    return f"{flt_digest[:16]}:{len(idx)}:{xxhash.xxh3_128_hexdigest(idx.astype('<i8', copy=False).tobytes())}"


def _selection_identity(flt: Filter, dataset: Any) -> str:
    # What decides a row group's selection besides the file's version: the filter and how
    # partition values are typed (they are compared as typed values).
    types = json.dumps(sorted(dict(dataset.partition_types).items()))
    return f"selection/1/{flt.digest()}/{types}"


def _file_answer(dataset: Any, i: int, flt: Filter, store: Any = None, key: str = "",
                 identity: str = "", footer: pq.FileMetaData | None = None) -> _Answer:
    f = dataset.files[i]
    fs = dataset.filesystem
    stored = list(flt.stored_columns)
    pvals = dict(f.partition_values)
    out = _Answer([], [], 0)
    if not any(n > 0 for n in f.row_groups):
        return out
    lane = getattr(_lane, "n", 0)
    with contextlib.ExitStack() as opened:
        # The file is opened only to read from it (discovery's footer, when given, has the rest):
        # a filter that statistics settle opens no file at all.
        pf: pq.ParquetFile | None = None
        if footer is None:
            pf = open_parquet(opened.enter_context(fs.open_input_file(f.location)))
            footer = pf.metadata
        md = footer
        schema = md.schema.to_arrow_schema()
        leaves = leaf_columns(md, stored) if stored else []
        # Made at the first row group whose footer places a bloom filter in a filtered column:
        # most files have none, and the reader's set-up was ~18 % of planning 2000 such files.
        # A row group before it has no filter to probe: None prunes exactly as a probe would.
        bloom: BloomReader | None = None
        read = 0
        for g, n in enumerate(f.row_groups):
            if n <= 0:
                continue
            rg_md = md.row_group(g)
            stats = row_group_stats(rg_md, schema, columns=stored) if stored else {}
            if bloom is None and _has_bloom(rg_md, leaves):
                bloom = opened.enter_context(BloomReader(f.location, md, filesystem=fs))
            verdict, settled_by = flt.prune_source(stats, pvals, n, bloom=bloom.probe(g) if bloom else None)
            source: str = settled_by  # or "cache": the selection was read back, not computed
            idx: np.ndarray | None = None
            if verdict == "some":
                t0 = time.perf_counter()
                cached = store.get(key, g, identity) if store is not None else None
                rows = cached.get("rows") if cached is not None else None
                if isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1 and (
                        rows.size == 0 or (rows[0] >= 0 and rows[-1] < n and rows.size <= n)):
                    idx, source = rows, "cache"
                else:
                    if pf is None:
                        pf = open_parquet(opened.enter_context(fs.open_input_file(f.location)), metadata=md)
                    # Checksums verified as the workers do: a damaged page must not pick the rows.
                    table = read_row_group(pf, g, stored, object_uri(fs, f.location))
                    read += chunk_bytes(md, g, leaves)
                    idx = flt.select(table, pvals)
                    if store is not None:
                        store.put(key, g, identity, {"rows": np.ascontiguousarray(idx, dtype=np.int64)})
                out.spans.append((lane, t0, time.perf_counter()))
            out.groups.append((g, n, verdict, source, idx))
    return out._replace(bytes_read=read)


def _has_bloom(rg: pq.RowGroupMetaData, leaves: Sequence[int]) -> bool:
    """Whether the footer places a bloom filter in one of the column chunks ``leaves`` of ``rg``."""
    for j in leaves:
        offset = rg.column(j).bloom_filter_offset
        if offset is not None and offset > 0:
            return True
    return False


def _name_lanes(counter: Any) -> None:
    _lane.n = next(counter)


def filter_units(dataset: Any, flt: Filter, *, threads: int = 8, cache: Any = None,
                 cache_keys: Sequence[str] = (), footers: Sequence[pq.FileMetaData] | None = None) -> FilteredUnits:
    """The units, selections and stats of ``dataset`` under ``flt`` (see the module docstring).

    With ``cache`` (a `CacheConfig`) each row group's selection is kept as a derived cache
    entry keyed by the file's version (``cache_keys[i]``) and the filter, and read back
    instead of the filter's columns by the next loader with the same filter.

    ``footers`` are the files' footers as discovery read them (``discover(footers=[])``):
    given, planning reads no footer again and opens only files it reads rows from.

    Raises `EmptyDatasetError` naming the filter when no row matches.
    """
    t_start = time.perf_counter()
    n_files = len(dataset.files)
    if footers is not None and len(footers) != n_files:
        raise ValueError(f"{len(footers)} footers for {n_files} files")  # a caller's bug

    def footer(i: int) -> pq.FileMetaData | None:
        return footers[i] if footers is not None else None

    with ThreadPoolExecutor(max_workers=max(1, min(threads, n_files)), initializer=_name_lanes,
                            initargs=(itertools.count(),)) as ex:
        if cache is not None:
            from .._cache.derived import DerivedStore

            store, identity = DerivedStore(cache), _selection_identity(flt, dataset)
            answers: Sequence[_Answer] = list(ex.map(
                lambda i: _file_answer(dataset, i, flt, store, cache_keys[i], identity, footer(i)), range(n_files)))
        else:
            answers = list(ex.map(lambda i: _file_answer(dataset, i, flt, footer=footer(i)), range(n_files)))
    stats = FilterStats()
    units: list[Unit] = []
    selections: dict[tuple[int, int], Selection] = {}
    digest = flt.digest()
    spans: list[tuple[int, float, float]] = []
    for i, answer in enumerate(answers):
        path = dataset.files[i].path
        stats.bytes_read += answer.bytes_read
        spans.extend(answer.spans)
        for g, n, verdict, source, idx in answer.groups:
            stats.row_groups += 1
            stats.rows_total += n
            if verdict == "none":
                stats.pruned[source] += 1
                stats.note(source, path, g, n, 0)
                continue
            if verdict == "all":
                stats.all_rows += 1
                stats.rows_selected += n
                stats.note("all_rows", path, g, n, n)
                units.append(Unit((Range(i, g, 0, n),)))
                continue
            assert idx is not None
            if source == "cache":
                stats.selection_cached += 1
            else:
                stats.selection_pass += 1
            stats.note("selection_cached" if source == "cache" else "selection_pass", path, g, n, len(idx))
            if len(idx) == 0:
                stats.selected_empty += 1
                stats.note("selected_empty", path, g, n, 0)
                continue
            stats.rows_selected += len(idx)
            if len(idx) == n:  # every row matched: delivered as stored, no selection to apply
                units.append(Unit((Range(i, g, 0, n),)))
                continue
            selections[(i, g)] = Selection.of(idx, n)
            units.append(Unit((Range(i, g, 0, len(idx)),), (), _selection_id(digest, idx)))
    if not units:
        raise EmptyDatasetError(
            f"filter {flt.canonical_json} selects no row of the dataset at {dataset.root!r}: of its "
            f"{stats.row_groups} row group(s) ({stats.rows_total} rows), {sum(stats.pruned.values())} were "
            f"pruned without reading and {stats.selected_empty} had no matching row"
        )
    stats.seconds = time.perf_counter() - t_start
    return FilteredUnits(units, selections, stats, spans)
