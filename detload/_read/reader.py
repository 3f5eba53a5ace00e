"""The reader: one row group of one file, as checked NumPy columns.

It opens files (a few kept open), checks that a file is the version planned,
reads through the row-group cache when there is one, converts to NumPy and
checks that every column decoded as many rows as the footer promised.
Planning (a transform's first row group and row counts) and the engine's
workers read through it alike; it imports neither.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .._arrow import numpy_of
from .._cache import RowGroupCache
from .._columns import slice_rows, take_rows
from .._discovery import _etag, _int96_columns, chunk_bytes, leaf_columns
from .._drift import promote, same_form
from .._filters.selection import Selection
from .._storage import describe_attempts
from .._types import INT96_UNIT, Column, ColumnSpec, Ragged, UnitColumns, column_spec, convert_column
from .._xform import TransformRunner
from ..errors import DataError, DetloadError
from .mapping import MappedFile, open_mapped, should_map
from .parquet import checksum_error, open_parquet

__all__ = ["FileRef", "ReadConfig", "ReadSettings", "StageTimes", "UnitReader", "planned_rows", "select_rows"]


@dataclass(frozen=True)
class FileRef:
    """A data file as planned; its size, version and row groups let a reader notice a changed file."""

    location: str
    path: str
    partition_values: tuple[tuple[str, str], ...]
    row_groups: tuple[int, ...] | None = None
    cache_key: str = ""  # this version of the file in the row-group cache (_cache.object_key)
    uri: str = ""  # the object's full name, for messages
    size: int | None = None
    etag: str | None = None  # where the filesystem reports one (S3)
    mtime_ns: int | None = None


def planned_rows(ref: FileRef, rg: int) -> int | None:
    """Row group ``rg`` of ``ref``'s rows as planned, if the plan knows them."""
    return ref.row_groups[rg] if ref.row_groups is not None and 0 <= rg < len(ref.row_groups) else None


class ReadSettings(Protocol):
    """What a `UnitReader` reads with: a worker's configuration (_engine.config.WorkerConfig)
    or planning's `ReadConfig`. Read-only attributes, so either frozen dataclass fits."""

    @property
    def files(self) -> tuple[FileRef, ...]: ...
    @property
    def filesystem(self) -> pafs.FileSystem: ...
    @property
    def specs(self) -> tuple[ColumnSpec, ...]: ...
    @property
    def null_fill(self) -> Mapping[str, Any]: ...
    @property
    def cache(self) -> Any: ...  # _cache.CacheConfig | None
    @property
    def kept(self) -> Any: ...  # _cache.KeptMappings | None: thread workers' cache entries kept mapped
    @property
    def transform(self) -> Any: ...  # _xform.TransformPlan | None
    @property
    def memory_map(self) -> bool | str: ...
    @property
    def hooks(self) -> Any: ...  # test hooks (_hooks.DebugHooks: shrink_unit), or None


@dataclass(frozen=True)
class ReadConfig:
    """`ReadSettings` for reads outside the workers (planning): no hooks, no kept mappings."""

    files: tuple[FileRef, ...]
    filesystem: pafs.FileSystem
    specs: tuple[ColumnSpec, ...]
    null_fill: Mapping[str, Any]
    cache: Any = None
    kept: Any = None
    transform: Any = None
    memory_map: bool | str = False  # Storage.memory_map's values (False, "auto", True)
    hooks: Any = None


class StageTimes(Protocol):
    """Where a read records its stage spans and counts: a worker's `Timings` (sent to the
    trace with the block), or planning's, which nobody reads."""

    units: int
    source_reads: int
    source_bytes: int
    extra: dict[str, float]

    def add(self, stage: str, t0: float, t1: float) -> None: ...


def select_rows(cols: UnitColumns, picked: Selection) -> UnitColumns:
    """The rows ``picked`` of a row group's columns (a filter's selection): views of one run,
    else new arrays."""
    run = picked.single_run()
    if run is not None:
        return UnitColumns({k: slice_rows(v, *run) for k, v in cols.items()})
    idx = picked.indices()
    return UnitColumns({k: take_rows(v, idx) for k, v in cols.items()})

#: Files a reader keeps open (with their footers) between row groups; each holds one descriptor.
OPEN_FILES = 32


class UnitReader:
    """Reads and converts single row groups; keeps a few files open; uses the row-group cache."""

    def __init__(self, cfg: ReadSettings) -> None:
        self.cfg = cfg
        self._open: OrderedDict[int, pq.ParquetFile] = OrderedDict()
        self.filled_cache = False  # a row group went into the cache since the pass began
        self._file_specs = [s for s in cfg.specs if not s.partition]
        self._file_cols = [s.name for s in self._file_specs]
        # INT96 columns are also read at milliseconds, which no INT96 value overflows,
        # to catch values that overflowed on the way to INT96_UNIT (see _check_int96):
        # per open file, a reader at milliseconds and the columns that are INT96 there.
        self._int96 = [s.name for s in self._file_specs if s.int96]
        self._int96_ms: dict[int, tuple[pq.ParquetFile, list[str]]] = {}
        # Per open file, the column chunks the requested columns are stored in (for the bytes read).
        self._leaves: dict[int, list[int]] = {}
        # Nothing to cache when only Hive partition columns (constants) are asked for, nor when
        # a transform's output is cached instead (a warm epoch reads that, never these).
        xf = cfg.transform
        self._cache = (RowGroupCache(cfg.cache, cfg.specs, cfg.null_fill, cfg.kept)
                       if cfg.cache is not None and self._file_cols and not (xf is not None and xf.cached)
                       else None)
        #: The transform run on each row group after the selection (_xform.TransformRunner), or None.
        self.transform = TransformRunner(xf, cfg) if xf is not None else None
        # Remote reads: fetch the requested column chunks in a few coalesced ranged requests.
        self._pre_buffer = cfg.filesystem.type_name != "local"
        # Per open file read through a memory map: the map (its descriptor, the size mapped).
        self._mapped: dict[int, MappedFile] = {}
        # Schema drift, per open file: the requested columns it holds (the others are missing
        # from it and filled), and those whose type it casts to the promoted one first.
        self._drifts = any(s.promote is not None for s in self._file_specs)
        self._here: dict[int, list[str]] = {}
        self._retype: dict[int, dict[str, pa.DataType]] = {}

    def _file(self, i: int, rg: int) -> pq.ParquetFile:
        pf = self._open.get(i)
        if pf is not None:
            self._open.move_to_end(i)
            return pf
        ref = self.cfg.files[i]
        fs = self.cfg.filesystem
        mapped = (open_mapped(ref.location) if should_map(self.cfg.memory_map, fs.type_name, ref.location)
                  else None)
        f: Any
        if mapped is not None:
            self._mapped[i] = f = mapped
            source: Any = mapped.source
        else:
            f = source = fs.open_input_file(ref.location)
        try:
            # Pages written with CRCs are checked (open_parquet), here as in planning's passes.
            pf = open_parquet(source, pre_buffer=self._pre_buffer)
            here = ([n for n in _int96_columns(pf.metadata, pf.schema_arrow) if n in self._int96]
                    if self._int96 else [])
            if here:
                ms = open_parquet(source, metadata=pf.metadata, pre_buffer=self._pre_buffer, int96_unit="ms")
                self._int96_ms[i] = (ms, here)
        except BaseException:
            try:
                _check_same_version(fs, f, ref, rg)  # a replaced file explains a bad footer
            finally:
                self._int96_ms.pop(i, None)
                self._mapped.pop(i, None)
                del source
                f.close()
            raise
        try:
            # Row groups and types first: they say more than a new size or version.
            _check_unchanged(pf, ref, rg, self.cfg.specs)
            _check_same_version(fs, f, ref, rg)
        except BaseException:
            self._int96_ms.pop(i, None)
            pf.close()
            del pf, source
            self._unmap(i)
            raise
        if self._drifts:
            self._here[i], self._retype[i] = _drift_reads(pf.schema_arrow, self._file_specs)
        self._open[i] = pf
        if len(self._open) > OPEN_FILES:
            self._drop(next(iter(self._open)))
        return pf

    def _drop(self, i: int) -> None:
        self._int96_ms.pop(i, None)
        self._here.pop(i, None)
        self._retype.pop(i, None)
        self._leaves.pop(i, None)
        self._open.pop(i).close()
        self._unmap(i)

    def _unmap(self, i: int) -> None:
        # After the ParquetFiles reading it are gone: a map with live exports cannot close.
        mapped = self._mapped.pop(i, None)
        if mapped is not None:
            mapped.close()

    def _close_files(self) -> None:
        for i in list(self._open):
            self._drop(i)

    def close(self) -> None:
        self._close_files()
        if self._cache is not None:
            self._cache.close()
        if self.transform is not None:
            self.transform.close()

    def _still_listed(self, ref: FileRef) -> bool:
        """False if a local file's size or mtime differs from the plan's (True when unknown)."""
        fs = self.cfg.filesystem
        if fs.type_name != "local":
            return True
        try:
            info = fs.get_file_info(ref.location)
        except OSError:
            return True
        if info.type == pafs.FileType.NotFound:
            return True  # deleted: open handles still read the listed version
        return _stat_matches(info, ref)

    def new_pass(self) -> None:
        """Drop the open files that changed since planning, so that opening them again
        refuses them (see _check_same_version) rather than read through a handle that
        may now serve other bytes. Local files are checked with a stat (reopening every
        file each pass cost ~3% of an uncached CTR epoch); remote ones, where the check
        would be a request anyway, are simply reopened."""
        if self._cache is not None:
            self._cache.new_pass()
        if self.transform is not None:
            self.transform.new_pass()
        fs = self.cfg.filesystem
        if fs.type_name != "local":
            self._close_files()
            return
        for i in list(self._open):
            if not self._still_listed(self.cfg.files[i]):
                self._drop(i)

    @contextlib.contextmanager
    def uncached(self) -> Iterator[None]:
        """Reads that neither look in the cache nor fill it: the row groups of a window that
        process workers hold in a shared file (spilled, _engine/spill.py, or mapped,
        _engine/mapped.py) where no cache was given, whose scratch cache entries would be a
        second copy of it in /dev/shm."""
        cache, self._cache = self._cache, None
        try:
            yield
        finally:
            self._cache = cache

    def unmap(self, file_idx: int, rg: int) -> None:
        """Keep the row group's cache entry mapped no longer (`KeptMappings`): its rows were
        copied into a window pack that outlives the pass (_engine/mapped.py), so the mapping
        would hold the window a second time, in this process's memory, for nothing."""
        ref = self.cfg.files[file_idx]
        if self._cache is not None and ref.cache_key:
            self._cache.kept.forget(self._cache.path(ref.cache_key, rg))

    def entry_path(self, file_idx: int, rg: int) -> str | None:
        """Where the row group's cache entry lies (None: it is not cached by this reader)."""
        ref = self.cfg.files[file_idx]
        if self._cache is None or not ref.cache_key or not self._cache.writes_on:
            return None
        return self._cache.path(ref.cache_key, rg)

    def read(self, file_idx: int, rg: int, t: StageTimes, *, defer: bool = False) -> UnitColumns:
        """One row group's columns. With ``defer``, a cache hit's checksum is verified
        while the block reads it: call `settle` before using the block."""
        ref = self.cfg.files[file_idx]
        t0 = time.perf_counter()
        cache = self._cache
        cols = (cache.get(ref.cache_key, rg, ref.uri, defer=defer, rows=planned_rows(ref, rg))
                if cache is not None and ref.cache_key else None)
        if cols is not None:
            rows = len(next(iter(cols.values())))
            t.add("cache_read", t0, time.perf_counter())
            t.extra["cache_hits"] = t.extra.get("cache_hits", 0.0) + 1
        else:
            cols, rows = self._read_source(file_idx, rg, t)
            if cache is not None and ref.cache_key:
                t1 = time.perf_counter()
                cache.put(ref.cache_key, rg, cols, ref.uri)
                self.filled_cache = True
                t.add("cache_write", t1, time.perf_counter())
        out = UnitColumns()
        runs = getattr(cols, "runs", None)
        if runs:
            out.runs = runs
        out.check = getattr(cols, "check", None)
        pvals = dict(ref.partition_values)
        for spec in self.cfg.specs:
            if spec.partition:
                out[spec.name] = _constant(spec, pvals[spec.name], rows)
            else:
                out[spec.name] = cols[spec.name]
        t.units += 1
        return out

    def settle(self, unit: dict[str, Column], file_idx: int, rg: int) -> bool:
        """Finish a unit's deferred cache check; False if the entry was damaged (now discarded)."""
        return self._cache is None or self._cache.settle(unit, rg, self.cfg.files[file_idx].uri)

    def _check_mapped(self, file_idx: int, ref: FileRef, rg: int) -> None:
        """Refuse a mapped file that shrank since it was mapped, before touching its pages: a
        page past the new end would kill this process (SIGBUS) instead of failing a read. A
        file that shrinks during the read still does; `Watch.death` then reports the change."""
        m = self._mapped[file_idx]
        mapped = m.size()
        try:
            now = os.fstat(m.fileno()).st_size  # the mapped file itself, even if its path was replaced
        except OSError:
            now = mapped
        if now < mapped:
            self._close_files()
            raise _file_changed(ref, rg, f": it holds {now:,} bytes, the plan saw {mapped:,}")

    def _read_source(self, file_idx: int, rg: int, t: StageTimes) -> tuple[dict[str, Column], int]:
        ref = self.cfg.files[file_idx]
        t0 = time.perf_counter()
        pf: pq.ParquetFile | None = None
        try:
            pf = self._file(file_idx, rg)
            if file_idx in self._mapped:
                self._check_mapped(file_idx, ref, rg)
            d = self.cfg.hooks
            if d is not None and d.shrink_unit == (ref.path, rg):  # test hook: a rewrite racing this read
                os.truncate(ref.location, os.stat(ref.location).st_size // 2)
            wanted = self._here.get(file_idx, self._file_cols)
            table = pf.read_row_group(rg, columns=wanted, use_threads=False)
            at_ms = self._int96_ms.get(file_idx)
            ms = at_ms[0].read_row_group(rg, columns=at_ms[1], use_threads=False) if at_ms else None
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError) and not self._still_listed(ref):
                # Rewritten under an open handle in the middle of a pass ("File too short").
                self._close_files()
                raise _file_changed(ref, rg, f" (reading it failed: {exc})") from exc
            # Name the object, the row group and the last response (pyarrow's text carries it).
            what = ref.uri or ref.location
            crc = checksum_error(exc, pf, rg, self._file_cols, what) if pf is not None else None
            if crc is not None:
                raise crc from exc
            msg = f"cannot read row group {rg} of {what}{describe_attempts(self.cfg.filesystem)}: {exc}"
            try:
                err = type(exc)(msg)
            except Exception:
                err = OSError(msg)
            raise err from exc
        m = self._mapped.get(file_idx)
        if m is not None:
            # The row group is decoded (compressed pages into Arrow's memory): the pages it
            # touched leave this process's RSS, so a map holds no more memory than a plain read.
            m.release()
        t1 = time.perf_counter()
        out: dict[str, Column] = {}
        where = (ref.path, rg)
        fills = self.cfg.null_fill
        # The table's columns come in the order asked for; by position is cheaper than by name.
        arrays = (table.columns if table.column_names == self._file_cols
                  else [table.column(n) for n in wanted])
        # Every column must decode to the rows the footer promised and the plan counted on:
        # a short one (a footer that disagrees with its pages) would shorten the epoch.
        expected = planned_rows(ref, rg)
        if expected is None:
            expected = pf.metadata.row_group(rg).num_rows
        for name, arr in zip(wanted, arrays):
            if len(arr) != expected:
                raise _short_unit(ref.path, rg, name, expected, len(arr))
        if wanted is not self._file_cols or file_idx in self._retype:
            arrays = _promoted(self._file_specs, wanted, arrays, self._retype.get(file_idx, {}), expected)
        if ms is not None:
            for name in ms.column_names:
                _check_int96(table.column(name), ms.column(name), ref.path, rg, name)
        for spec, arr in zip(self._file_specs, arrays):
            out[spec.name] = convert_column(spec, arr, where, fills.get(spec.name))
        t.add("read", t0, t1)
        t.add("convert", t1, time.perf_counter())
        leaves = self._leaves.get(file_idx)
        if leaves is None:
            leaves = self._leaves[file_idx] = leaf_columns(pf.metadata, wanted)
        t.source_reads += 1
        t.source_bytes += chunk_bytes(pf.metadata, rg, leaves)
        return out, expected


def _drift_reads(schema: pa.Schema, specs: Sequence[ColumnSpec]) -> tuple[list[str], dict[str, pa.DataType]]:
    """Of the columns ``specs``, those a file of ``schema`` holds, and those among them whose
    type differs in form from the promoted one (cast before conversion)."""
    here, retype = [], {}
    for s in specs:
        i = schema.get_field_index(s.name)
        if i < 0:
            continue  # missing: planning made sure it has a fill (_discovery.Dataset.check_drift)
        here.append(s.name)
        if s.promote is not None and not same_form(schema.field(i).type, s.promote):
            retype[s.name] = s.promote
    return here, retype


def _promoted(specs: Sequence[ColumnSpec], here: Sequence[str], arrays: Sequence[Any],
              retype: Mapping[str, pa.DataType], rows: int) -> list[Any]:
    """One file's columns as the dataset types them: each drifted column cast to its promoted
    type (a widening, so every value is kept), each missing one all nulls, which its
    null_fill replaces in `convert_column`."""
    got = dict(zip(here, arrays))
    out = []
    for s in specs:
        arr = got.get(s.name)
        if arr is None:
            t = s.promote.value_type if pa.types.is_dictionary(s.promote) else s.promote
            arr = pa.nulls(rows, type=t)
        elif s.name in retype:
            arr = arr.cast(retype[s.name])
        out.append(arr)
    return out


def _short_unit(path: str, rg: int, column: str, expected: int, got: int) -> DataError:
    """The error for a row group whose column does not decode to the rows the plan counted on."""
    return DataError(
        f"{path} row group {rg}: column {column!r} decodes to {got:,} rows, but the file's footer (which the "
        f"plan follows) says the row group holds {expected:,}. The file is damaged or was written by "
        "a faulty writer; nothing of this row group was delivered, and every batch before it was "
        "delivered intact. Rewrite the file, or leave the column out with columns=[...]."
    )


def _leaf_values(arr: pa.ChunkedArray) -> np.ndarray:
    """A timestamp column's values, of lists too, as int64 ticks (NaT: the int64 minimum)."""
    a: Any = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    while not pa.types.is_timestamp(a.type):
        a = a.flatten()
    return numpy_of(a).view(np.int64)


def _check_int96(us: pa.ChunkedArray, ms: pa.ChunkedArray, path: str, rg: int, name: str) -> None:
    """Refuse INT96 values that wrapped around when read at INT96_UNIT.

    An INT96 holds a Julian day (32 bits) and nanoseconds of the day: dates up to
    millions of years from now, while datetime64[us] ends at year 294,247, and pyarrow's
    reader wraps what lies beyond without a word. At milliseconds no INT96 value
    wraps, and a value read correctly at both units agrees once the microseconds
    are floored; so a disagreement is exactly a wrapped value.
    """
    u, m = _leaf_values(us), _leaf_values(ms)
    nat = np.iinfo(np.int64).min
    bad = np.flatnonzero((u // 1000 != m) & (m != nat))
    if bad.size:
        i = int(bad[0])
        at = f" at row {i}" if pa.types.is_timestamp(us.type) else ""
        wrapped = u[i : i + 1].view(f"datetime64[{INT96_UNIT}]")[0]
        raise DataError(
            f"column {name!r} in {path} row group {rg} holds an INT96 timestamp{at} that does not fit "
            f"datetime64[{INT96_UNIT}] (years -290308 to 294247): read at that unit it wraps around (to "
            f"{wrapped}), and detload does not deliver wrapped values. Such "
            "a value lies outside those years, or is malformed (Spark writes dates after about year "
            "287,000 that way). Rewrite the column as timestamp[us], or leave it out with columns=[...]."
        )


def _file_changed(ref: FileRef, rg: int, detail: str) -> DataError:
    # Honest about what was checked: the size, version and footer are compared when a file is
    # opened and when a pass begins, not on every read, so a file rewritten in place (same
    # inode) between two checks may already have served its new bytes through an open handle.
    err = DataError(
        f"{ref.path} row group {rg}: the file changed after the loader planned the epoch{detail}. "
        "detload compares a file with the plan when it opens it and when a pass begins, not on every "
        "read, so batches read from it since its last check may hold rows of the new version. Do not "
        "rewrite a dataset while it is being loaded; create a new Loader to plan the new files.")
    err.changed_file = ref.path  # type: ignore[attr-defined]  # the loader names the batches concerned
    return err


def _stat_matches(info: pafs.FileInfo, ref: FileRef) -> bool:
    """A stat agrees with the plan's size and mtime (either unknown counts as agreeing)."""
    return (ref.size is None or info.size == ref.size) and (
        ref.mtime_ns is None or info.mtime is None or info.mtime_ns == ref.mtime_ns)


def _check_same_version(fs: pafs.FileSystem, f: Any, ref: FileRef, rg: int) -> None:
    """Refuse a file whose size or version (ETag, else local mtime) is not the one planned.

    A loader reads each file as it was when the loader listed it; that is also the
    version its cache entries hold. Without this a rewritten file of the same
    layout would be read as new data by uncached workers while cache hits served
    the old, and one of another size would fail deep in the Parquet reader.
    """
    problems = []
    if ref.size is not None:
        try:
            size = int(f.size())
        except (OSError, pa.ArrowException):
            size = None
        if size is not None and size != ref.size:
            problems.append(f"it holds {size:,} bytes, the plan saw {ref.size:,}")
    if not problems and ref.etag is not None:
        now = _etag(f)
        if now is not None and now != ref.etag:
            problems.append(f"its ETag is {now}, the plan saw {ref.etag}")
    elif (not problems and ref.mtime_ns is not None and fs.type_name == "local"
          and not _stat_matches(fs.get_file_info(ref.location), ref)):
        problems.append("it was modified after the loader listed it")
    if problems:
        raise _file_changed(ref, rg, ": " + "; ".join(problems))


def _check_unchanged(pf: pq.ParquetFile, ref: FileRef, rg: int, specs: Sequence[ColumnSpec]) -> None:
    """Refuse a file whose row groups or column types differ from what was planned.

    The plan cut batches from the footers read at planning; a file rewritten
    since then (same path, other rows or types) would shift or silently re-type
    every later row, so it stops the epoch here, naming the file.
    """
    md = pf.metadata
    problems = []
    if ref.row_groups is not None:
        now = tuple(md.row_group(g).num_rows for g in range(md.num_row_groups))
        if now != ref.row_groups:
            problems.append(f"its row groups hold {_rows_text(now)} rows, the plan has {_rows_text(ref.row_groups)}")
    schema = pf.schema_arrow
    for spec in specs:
        if spec.partition:
            continue
        idx = schema.get_field_index(spec.name)
        if idx < 0:
            if not spec.missing:
                problems.append(f"column {spec.name!r} is missing")
            continue
        t = schema.field(idx).type
        if spec.promote is not None:
            # A drifted column: the file's type must still widen to the one planned.
            widened = promote([t, spec.promote])
            if widened is None or not same_form(widened, spec.promote):
                problems.append(f"column {spec.name!r} is {t}, planned as {spec.arrow_type}")
            continue
        try:
            got = column_spec(spec.name, t, cast=spec.cast)
            same = ((got.kind, got.dtype, got.inner, got.ragged_kind, got.item_kind)
                    == (spec.kind, spec.dtype, spec.inner, spec.ragged_kind, spec.item_kind))
        except DetloadError:
            same = False
        if not same:
            problems.append(f"column {spec.name!r} is {t}, planned as {spec.arrow_type}")
    if problems:
        raise _file_changed(ref, rg, ": " + "; ".join(problems))


def _rows_text(rows: Sequence[int]) -> str:
    shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    return f"[{shown}]"


def _constant(spec: ColumnSpec, value: str, rows: int) -> Column:
    if spec.kind == "fixed":
        return np.full(rows, int(value), dtype=np.dtype(spec.dtype))
    raw = np.frombuffer(value.encode("utf-8"), dtype=np.uint8)
    return Ragged(np.tile(raw, rows), np.arange(rows + 1, dtype=np.int64) * raw.shape[0], "utf8")
