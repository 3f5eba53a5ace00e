"""Workers: read a block's row groups, convert them to NumPy, permute, hand the block over.

The same loop runs in a thread or in a process (started with forkserver or
spawn, configured with plain picklable data, see _spawn.py). A thread worker
talks to the pool through two queues (`ThreadLink`), a process worker through
pipes (`ProcessLink`); either way each worker holds at most ``prefetch`` finished
blocks nobody took, and the merger decides what is taken when. Errors travel back
as values (`WorkerFailed`) carrying the worker's traceback and the unit it was on.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import pickle
import platform
import queue
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash

from . import _shm, _spawn
from ._arrow import numpy_of
from ._block import Layout, assemble
from ._buffers import BlockBuffers
from ._cache import CacheConfig, KeptMappings, RowGroupCache
from ._dataset import _etag, _int96_columns
from ._messages import CLOSED, CREDIT, POLL, STOP, BlockReady, Poller, Tasks, WorkerFailed, pack_exception, put_until
from ._remote import describe_attempts
from ._spawn import MainSource, SharedInts
from ._types import INT96_UNIT, Column, ColumnSpec, Ragged, UnitColumns, column_spec, convert_column
from .errors import DataError, DetloadError
from .plan import block_permutation

__all__ = ["DebugHooks", "ProcessLink", "Task", "ThreadLink", "UnitReader", "WorkerConfig", "process_main",
           "worker_loop"]


@dataclass(frozen=True)
class DebugHooks:
    """Test hooks (never set in production): random per-unit delays and injected failures.

    ``delay_max`` seconds of delay, pseudo-random per (seed, epoch, unit) from
    ``delay_seed``; ``fail_unit`` a (relative path, row group) whose read raises
    ``fail_exc`` (an exception instance); ``stall_unit`` a unit whose read blocks
    for ``stall_seconds`` (only in epoch ``stall_epoch`` when that is set);
    ``die_unit`` a unit whose read kills the process.
    """

    delay_max: float = 0.0
    delay_seed: int = 0
    fail_unit: tuple[str, int] | None = None
    fail_exc: BaseException | None = None
    stall_unit: tuple[str, int] | None = None
    stall_seconds: float = 3600.0
    stall_epoch: int | None = None
    die_unit: tuple[str, int] | None = None
    block_delay_max: float = 0.0  # benchmark/test: pseudo-random sleep before each block


@dataclass(frozen=True)
class FileRef:
    """A data file as planned; its size, version and row groups let a worker notice a changed file."""

    location: str
    path: str
    partition_values: tuple[tuple[str, str], ...]
    row_groups: tuple[int, ...] | None = None
    cache_key: str = ""  # this version of the file in the row-group cache (_cache.object_key)
    uri: str = ""  # the object's full name, for messages
    size: int | None = None
    etag: str | None = None  # where the filesystem reports one (S3)
    mtime_ns: int | None = None


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, as plain picklable data."""

    files: tuple[FileRef, ...]
    filesystem: pafs.FileSystem
    specs: tuple[ColumnSpec, ...]
    null_fill: Mapping[str, Any]
    shm_dir: str | None  # None: thread workers, blocks stay in the heap
    shm_prefix: str
    parent_pid: int
    debug: DebugHooks | None = None
    open_files: int = 32
    cache: CacheConfig | None = None
    buffers: BlockBuffers | None = None  # thread workers: reused block buffers (never pickled)
    kept: KeptMappings | None = None  # thread workers: cache entries kept mapped (never pickled)


@dataclass(frozen=True)
class Task:
    """One block to produce: k is its position in the rank's schedule."""

    k: int
    partition: int
    number: int
    units: tuple[tuple[int, int], ...]  # (file index, row group)
    rows: int
    seed: int
    epoch: int
    shuffle: bool


@dataclass
class Timings:
    """A block's stage timings; travels with the block to the merger, which records the spans.

    ``spans`` holds (stage, start, end) in ``time.perf_counter`` seconds, which on
    Linux is the system-wide monotonic clock, so worker processes and the consumer
    share one time axis.
    """

    read: float = 0.0
    convert: float = 0.0
    permute: float = 0.0
    queue_wait: float = 0.0
    units: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    pid: int = 0
    # Warnings a worker process raised since its last block, as (category name, message):
    # the merger raises them again in the consumer's process (see _forward_warnings).
    warnings: list[tuple[str, str]] = field(default_factory=list)

    def add(self, stage: str, t0: float, t1: float) -> None:
        self.spans.append((stage, t0, t1))
        d = t1 - t0
        if stage == "read":
            self.read += d
        elif stage == "convert":
            self.convert += d
        elif stage == "permute":
            self.permute += d
        elif stage == "worker_queue_wait":
            self.queue_wait += d
        else:
            self.extra[stage] = self.extra.get(stage, 0.0) + d


class UnitReader:
    """Reads and converts single row groups; keeps a few files open; uses the row-group cache."""

    def __init__(self, cfg: WorkerConfig) -> None:
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
        # Nothing to cache when only Hive partition columns (constants) are asked for.
        self._cache = (RowGroupCache(cfg.cache, cfg.specs, cfg.null_fill, cfg.kept)
                       if cfg.cache is not None and self._file_cols else None)
        # Remote reads: fetch the requested column chunks in a few coalesced ranged requests.
        self._pre_buffer = cfg.filesystem.type_name != "local"

    def _file(self, i: int, rg: int) -> pq.ParquetFile:
        pf = self._open.get(i)
        if pf is not None:
            self._open.move_to_end(i)
            return pf
        ref = self.cfg.files[i]
        fs = self.cfg.filesystem
        f = fs.open_input_file(ref.location)
        try:
            # Pages written with CRCs are checked: garbage in an uncompressed or
            # zstd page would otherwise decode into wrong values without a word.
            pf = pq.ParquetFile(f, page_checksum_verification=True, pre_buffer=self._pre_buffer,
                                coerce_int96_timestamp_unit=INT96_UNIT)
            here = ([n for n in _int96_columns(pf.metadata, pf.schema_arrow) if n in self._int96]
                    if self._int96 else [])
            if here:
                ms = pq.ParquetFile(f, metadata=pf.metadata, page_checksum_verification=True,
                                    pre_buffer=self._pre_buffer, coerce_int96_timestamp_unit="ms")
                self._int96_ms[i] = (ms, here)
        except BaseException:
            try:
                _check_same_version(fs, f, ref, rg)  # a replaced file explains a bad footer
            finally:
                f.close()
            raise
        try:
            # Row groups and types first: they say more than a new size or version.
            _check_unchanged(pf, ref, rg, self.cfg.specs)
            _check_same_version(fs, f, ref, rg)
        except BaseException:
            self._int96_ms.pop(i, None)
            pf.close()
            raise
        self._open[i] = pf
        if len(self._open) > self.cfg.open_files:
            self._drop(next(iter(self._open)))
        return pf

    def _drop(self, i: int) -> None:
        self._int96_ms.pop(i, None)
        self._open.pop(i).close()

    def _close_files(self) -> None:
        for i in list(self._open):
            self._drop(i)

    def close(self) -> None:
        self._close_files()
        if self._cache is not None:
            self._cache.close()

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
        fs = self.cfg.filesystem
        if fs.type_name != "local":
            self._close_files()
            return
        for i in list(self._open):
            if not self._still_listed(self.cfg.files[i]):
                self._drop(i)

    def read(self, file_idx: int, rg: int, t: Timings, *, defer: bool = False) -> dict[str, Column]:
        """One row group's columns. With ``defer``, a cache hit's checksum is verified
        while the block reads it: call `settle` before using the block."""
        ref = self.cfg.files[file_idx]
        t0 = time.perf_counter()
        cache = self._cache
        cols = (cache.get(ref.cache_key, rg, ref.uri, defer=defer, rows=self._planned_rows(ref, rg))
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

    @staticmethod
    def _planned_rows(ref: FileRef, rg: int) -> int | None:
        return ref.row_groups[rg] if ref.row_groups is not None and 0 <= rg < len(ref.row_groups) else None

    def _read_source(self, file_idx: int, rg: int, t: Timings) -> tuple[dict[str, Column], int]:
        ref = self.cfg.files[file_idx]
        t0 = time.perf_counter()
        try:
            pf = self._file(file_idx, rg)
            table = pf.read_row_group(rg, columns=self._file_cols, use_threads=False)
            at_ms = self._int96_ms.get(file_idx)
            ms = at_ms[0].read_row_group(rg, columns=at_ms[1], use_threads=False) if at_ms else None
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError) and not self._still_listed(ref):
                # Rewritten under an open handle in the middle of a pass ("File too short").
                self._close_files()
                raise _file_changed(ref, rg, f" (reading it failed: {exc})") from exc
            # Name the object, the row group and the last response (pyarrow's text carries it).
            what = ref.uri or ref.location
            msg = f"cannot read row group {rg} of {what}{describe_attempts(self.cfg.filesystem)}: {exc}"
            try:
                err = type(exc)(msg)
            except Exception:
                err = OSError(msg)
            raise err from exc
        t1 = time.perf_counter()
        out: dict[str, Column] = {}
        where = (ref.path, rg)
        fills = self.cfg.null_fill
        # The table's columns come in the order asked for; by position is cheaper than by name.
        arrays = (table.columns if table.column_names == self._file_cols
                  else [table.column(n) for n in self._file_cols])
        # Every column must decode to the rows the footer promised and the plan counted on:
        # a short one (a footer that disagrees with its pages) would shorten the epoch.
        expected = self._planned_rows(ref, rg)
        if expected is None:
            expected = pf.metadata.row_group(rg).num_rows
        for name, arr in zip(self._file_cols, arrays):
            if len(arr) != expected:
                raise _short_unit(ref.path, rg, name, expected, len(arr))
        if ms is not None:
            for name in ms.column_names:
                _check_int96(table.column(name), ms.column(name), ref.path, rg, name)
        for spec, arr in zip(self._file_specs, arrays):
            out[spec.name] = convert_column(spec, arr, where, fills.get(spec.name))
        t.add("read", t0, t1)
        t.add("convert", t1, time.perf_counter())
        return out, expected


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
            problems.append(f"column {spec.name!r} is missing")
            continue
        t = schema.field(idx).type
        try:
            got = column_spec(spec.name, t, cast=spec.cast)
            same = (got.kind, got.dtype, got.inner, got.ragged_kind) == (spec.kind, spec.dtype, spec.inner, spec.ragged_kind)
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


def _debug_before_read(cfg: WorkerConfig, task: Task, file_idx: int, rg: int) -> None:
    d = cfg.debug
    if d is None:
        return
    unit = (cfg.files[file_idx].path, rg)
    if d.block_delay_max > 0 and (file_idx, rg) == task.units[0]:
        h = xxhash.xxh3_64_intdigest(f"{d.delay_seed}/{task.epoch}/{task.k}/{time.monotonic_ns()}".encode())
        time.sleep(d.block_delay_max * (h % 10_000) / 10_000)
    if d.delay_max > 0:
        h = xxhash.xxh3_64_intdigest(f"{d.delay_seed}/{task.epoch}/{unit}/{time.monotonic_ns()}".encode())
        time.sleep(d.delay_max * (h % 10_000) / 10_000)
    if d.fail_unit == unit and d.fail_exc is not None:
        raise d.fail_exc
    if d.stall_unit == unit and d.stall_epoch in (None, task.epoch):
        time.sleep(d.stall_seconds)
    if d.die_unit == unit and cfg.shm_dir is not None:
        os.kill(os.getpid(), 9)


class Status:
    """What a worker is doing, readable by the merger even after the worker died.

    Slots: generation, block k, file index, row group (-1 when idle).
    """

    def __init__(self, shared: Any = None) -> None:
        self.slots = shared if shared is not None else [0, -1, -1, -1]

    def set(self, gen: int, k: int, f: int, rg: int) -> None:
        s = self.slots
        s[0], s[1], s[2], s[3] = gen, k, f, rg

    def get(self) -> tuple[int, int, int, int]:
        s = self.slots
        return int(s[0]), int(s[1]), int(s[2]), int(s[3])


def _produce(cfg: WorkerConfig, reader: UnitReader, task: Task, gen: int, status: Status,
             segs: _shm.WorkerSegments | None, t: Timings) -> tuple[Any, Layout, Timings]:
    payload, layout, intact = _build(cfg, reader, task, gen, status, segs, t, defer=True)
    if not intact:
        # A cache entry failed the checksum verified while the block was built: the
        # block is never handed over; the entry is gone, so the rebuild reads the source.
        _release(segs, payload)
        payload, layout, intact = _build(cfg, reader, task, gen, status, segs, t, defer=False)
        assert intact
    return payload, layout, t


def _build(cfg: WorkerConfig, reader: UnitReader, task: Task, gen: int, status: Status,
           segs: _shm.WorkerSegments | None, t: Timings, *, defer: bool) -> tuple[Any, Layout, bool]:
    """Build the block; False if a cache entry's deferred checksum failed (see _cache.PendingCheck)."""
    units = []
    for f, rg in task.units:
        status.set(gen, task.k, f, rg)
        _debug_before_read(cfg, task, f, rg)
        units.append(reader.read(f, rg, t, defer=defer))
    t0 = time.perf_counter()
    try:
        payload, layout = _assemble(cfg, task, segs, units)
    except Exception:
        # A damaged header field (a row count, say) can break assembly before the
        # deferred checksums are finished: if one fails, rebuild; if none does, it is a bug.
        if all([reader.settle(u, f, rg) for u, (f, rg) in zip(units, task.units)]):
            raise
        return None, None, False  # type: ignore[return-value]
    intact = all([reader.settle(u, f, rg) for u, (f, rg) in zip(units, task.units)])
    t.add("permute", t0, time.perf_counter())
    return payload, layout, intact


def _assemble(cfg: WorkerConfig, task: Task, segs: _shm.WorkerSegments | None,
              units: list[dict[str, Column]]) -> tuple[Any, Layout]:
    perm = (
        block_permutation(task.seed, task.epoch, task.partition, task.number, task.rows)
        if task.shuffle else None
    )
    if segs is None:
        alloc = cfg.buffers.get if cfg.buffers is not None else (lambda n: np.empty(n, dtype=np.uint8))
        buf, layout = assemble(cfg.specs, units, perm, alloc)
        return buf, layout
    got: list[_shm.Segment] = []

    def alloc_shm(n: int) -> np.ndarray:
        seg, arr = segs.get(n, task.rows)
        got.append(seg)
        return arr

    try:
        buf, layout = assemble(cfg.specs, units, perm, alloc_shm)
    except BaseException:
        for seg in got:
            segs.unsent(seg)
        raise
    del buf  # the worker's own array of the segment; the segment stays mapped
    return got[0], layout


def _release(segs: _shm.WorkerSegments | None, payload: Any) -> None:
    """A block that will not be sent: its segment may be built in again."""
    if segs is not None and isinstance(payload, _shm.Segment):
        segs.unsent(payload)


class ThreadLink:
    """A thread worker's ends: tasks come on ``inbox`` (None: stop), blocks go on ``outbox``,
    whose bound (``prefetch``) holds the worker back."""

    def __init__(self, inbox: queue.Queue[Any], outbox: queue.Queue[Any]) -> None:
        self.inbox = inbox
        self.outbox = outbox

    def receive(self) -> Tasks | object | None:
        msg = self.inbox.get()
        return STOP if msg is None else msg

    def send(self, msg: BlockReady | WorkerFailed, stale: Callable[[], bool]) -> bool:
        return put_until(self.outbox, msg, stale)


class ProcessLink:
    """A worker process's ends of its pipes to the consumer.

    Tasks come on ``inbox`` (its end closed: stop). Messages go on ``outbox``;
    blocks only while fewer than ``prefetch`` are sent and not yet taken: the
    consumer says on ``credit`` how many it took. Segments that come back are
    taken in when a block is built and on every wait's timeout, never woken for
    (each would cost both sides a wake-up).
    Every wait also watches the consumer, through the pipe multiprocessing keeps
    to the process that started this one: it closes when that process exits,
    even while it is a zombie nobody reaped yet, so an orphaned worker leaves at
    once (a supervisor that reads the consumer's stdout and stderr to the end
    before reaping would otherwise wait for workers holding them). A child the
    consumer forked (a torch DataLoader worker, say) keeps that pipe open, so a
    wait that times out also checks the consumer's pid.
    """

    def __init__(self, cfg: WorkerConfig, inbox: Any, outbox: Any, credit: Any, segs: _shm.WorkerSegments,
                 prefetch: int, generation: Any, sent: Any) -> None:
        self.cfg = cfg
        self.inbox = inbox
        self.outbox = outbox
        self.credit = credit
        self.segs = segs
        self.prefetch = prefetch
        self.generation = generation
        parent = mp.parent_process()
        self._parent = parent.sentinel if parent is not None else None
        watch = [] if self._parent is None else [self._parent]
        self._for_work = Poller([inbox, *watch])
        self._for_room = Poller([credit, *watch])
        self._credits = Poller([credit])
        self._sent = 0
        self._taken = 0
        self._shared_sent = sent  # the same count, for the consumer's depth samples
        self.gone = False  # the consumer died or closed the pool: leave

    def _wait(self, poller: Poller) -> list[Any]:
        ready = poller.wait(POLL)
        parent_exited = self._parent is not None and self._parent in ready
        # Timed out: the slower checks (a consumer gone while its pipe lives on; a closing pool).
        if parent_exited or (not ready and (not _shm.pid_alive(self.cfg.parent_pid)
                                            or self.generation.value >= CLOSED)):
            self.gone = True
        if self.credit in ready:
            self._take_credits()
        elif not ready:
            self.segs.collect()
            if self.segs.closed:
                self.gone = True
        return ready

    def _take_credits(self) -> None:
        while self._credits.wait(0):
            try:
                (n,) = CREDIT.unpack(self.credit.recv_bytes())
            except (EOFError, OSError):  # the pool closed its end: it is closing
                self.gone = True
                return
            self._taken += n

    def receive(self) -> Tasks | object | None:
        """The next task message; None if none came within `POLL`; `STOP` when it is time to go."""
        if self.gone:
            return STOP
        ready = self._wait(self._for_work)
        if self.gone:
            return STOP
        if self.inbox not in ready:
            return None
        try:
            return self.inbox.recv()
        except (EOFError, OSError):  # the pool closed its end: it is closing
            self.gone = True
            return STOP

    def send(self, msg: BlockReady | WorkerFailed, stale: Callable[[], bool]) -> bool:
        if isinstance(msg, WorkerFailed):
            return not (self.gone or stale()) and self._write(msg)
        segs = self.segs
        if self._sent - self._taken >= self.prefetch:
            self._take_credits()
        while self._sent - self._taken >= self.prefetch and not (self.gone or stale()):
            self._wait(self._for_room)
        if self.gone or stale():
            _release(segs, msg.payload)
            return False
        # Last, right before the hand-over: the drops and names it carries are the
        # worker's to send again (unsent) if this block does not get through.
        msg = msg._replace(payload=segs.sending(msg.payload))
        if not self._write(msg):
            _release(segs, msg.payload)
            return False
        self._sent += 1
        self._shared_sent.value = self._sent
        return True

    def _write(self, msg: BlockReady | WorkerFailed) -> bool:
        try:
            self.outbox.send(msg)
            return True
        except (OSError, ValueError):  # the consumer is gone (a broken pipe)
            self.gone = True
            return False


def worker_loop(cfg: WorkerConfig, index: int, link: ThreadLink | ProcessLink, generation: Any,
                status: Status, segs: _shm.WorkerSegments | None = None) -> None:
    """Serve `Tasks` from ``link`` until it says `STOP`.

    Tasks of an old generation (the consumer restarted the epoch) are dropped;
    a block built for one is released rather than sent. ``segs`` is set in a
    worker process: blocks are built in its shared-memory segments.
    """
    t0 = time.perf_counter()
    _warm_up()
    reader = UnitReader(cfg)
    pid = os.getpid() if cfg.shm_dir is not None else 0
    # A block's wait for room is known only after it was sent: it travels with the
    # worker's next block; so does the start-up, with the first.
    last_wait: tuple[str, float, float] | None = ("worker_startup", t0, time.perf_counter())
    try:
        while True:
            msg = link.receive()
            if msg is STOP:
                return
            if not isinstance(msg, Tasks):
                continue
            gen, tasks = msg.gen, msg.tasks

            def stale(gen: int = gen) -> bool:  # a newer generation (built ahead) is not
                return bool(generation.value > gen)

            # Every message starts (part of) a pass: the first blocks of the next one,
            # built ahead, or the rest of a pass when it begins, perhaps long after.
            reader.new_pass()
            if segs is not None and tasks:
                segs.new_pass(max(task.rows for task in tasks))
            for task in tasks:
                if stale():
                    break
                t = Timings(pid=pid)
                if last_wait is not None:
                    t.spans.append(last_wait)
                    last_wait = None
                try:
                    payload, layout, t = _produce(cfg, reader, task, gen, status, segs, t)
                except BaseException as exc:  # carried back as a value, re-raised by the merger
                    _, k, f, rg = status.get()
                    unit = (cfg.files[f].path, rg) if f >= 0 else None
                    link.send(WorkerFailed(gen, task.k, pack_exception(exc), unit), stale)
                    reader.close()
                    reader = UnitReader(cfg)
                    break
                status.set(gen, task.k, -1, -1)
                if _FORWARDED:  # raised while building this block (or since the last one)
                    t.warnings, _FORWARDED[:] = list(_FORWARDED), []
                t0 = time.perf_counter()
                ok = link.send(BlockReady(gen, task.k, payload, layout, t), stale)
                last_wait = ("worker_queue_wait", t0, time.perf_counter())
                if not ok:
                    break
            if reader.filled_cache:
                # The pass decoded row groups into the cache; the next one will likely be
                # warm and decode nothing. Arrow's allocator (mimalloc) would otherwise give
                # back the decoding buffers bit by bit during that warm epoch, which made
                # the first warm epoch of a CTR run ~40% slower and ~60% more CPU-hungry.
                reader.filled_cache = False
                pa.default_memory_pool().release_unused()
    finally:
        reader.close()


def _warm_up() -> None:
    """Pay a worker's one-time costs before its first block, where they are traced as start-up.

    pyarrow.compute (imported by the first cast, 0.05-0.3 s) would otherwise land in the
    first block's ``convert`` and decide a short benchmark's verdict. Nothing here may
    import pandas (see _arrow.py).
    """
    import pyarrow.compute  # noqa: F401

    pa.nulls(1, pa.string()).cast(pa.large_string())  # the cast kernels' first dispatch


def _parent_alive(cfg: WorkerConfig) -> bool:
    """Whether the consumer's process still runs (see `ProcessLink` for why two checks)."""
    if cfg.shm_dir is not None:
        parent = mp.parent_process()
        if parent is not None and not parent.is_alive():
            return False
    return _shm.pid_alive(cfg.parent_pid)


class _SharedInt:
    """Thread-side stand-in for a shared generation counter."""

    def __init__(self, v: int = 0) -> None:
        self.value = v


def process_main(cfg_data: bytes, index: int, inbox: Any, outbox: Any, credit: Any, ints: SharedInts, returns: Any,
                 prefetch: int, main: MainSource | None = None, main_names: tuple[str, ...] = ()) -> None:
    """Entry point of a worker process.

    ``cfg_data`` is the pickled `WorkerConfig`; ``ints`` holds the generation (slot 0)
    and each worker's slots (`_spawn.worker_slots`); ``credit`` says how many of its blocks
    the consumer took; ``returns`` brings back the segments it is done with; ``main`` is set when the
    configuration refers to ``main_names`` of the main module, which must then be
    imported first. A failure to start is sent as one `WorkerFailed` saying what to
    do; nothing is printed here.
    """
    _spawn.ignore_sigint()
    stage = "set-up"
    try:
        _forward_warnings()
        # One worker is one core of parallelism; pyarrow's own pool would compete.
        pa.set_cpu_count(1)
        pa.set_io_thread_count(2)
        _keep_freed_memory()
        if main is not None:
            stage = "main"
            _spawn.import_main(main)
        stage = "config"
        cfg: WorkerConfig = pickle.loads(cfg_data)
        stage = "set-up"
        assert cfg.shm_dir is not None
        # prefetch blocks sent and the one being built.
        segs = _shm.WorkerSegments(cfg.shm_dir, cfg.shm_prefix, index, returns, reserve=prefetch + 1)
    except BaseException as exc:
        with contextlib.suppress(OSError, ValueError):
            outbox.send(WorkerFailed(-1, -1, pack_exception(exc), None, "start",
                                     _start_hint(stage, exc, main, main_names)))
        raise SystemExit(1) from None
    generation = _spawn.Slot(ints, 0)
    status, sent = _spawn.worker_slots(ints, index)
    link = ProcessLink(cfg, inbox, outbox, credit, segs, prefetch, generation, sent)
    try:
        worker_loop(cfg, index, link, generation, Status(status), segs)
    except Exception as exc:  # a bug outside any block: reported, not printed
        link.send(WorkerFailed(-1, -1, pack_exception(exc), None, "worker"), lambda: False)
        raise SystemExit(1) from None
    finally:
        segs.close()
        # A parent killed with SIGKILL cannot sweep; the segments it never
        # mapped would stay in /dev/shm until the next pool starts.
        if not _parent_alive(cfg):
            _shm.sweep(cfg.shm_dir, cfg.shm_prefix)


def _start_hint(stage: str, exc: BaseException, main: MainSource | None, names: tuple[str, ...]) -> str:
    """Why a worker process could not start and what to do, as the end of a sentence
    (empty when nothing is known: the message then shows the worker's traceback)."""
    what = ", ".join(names) or "something"
    where = os.path.basename(main[1]) if main is not None else "__main__"
    cause = f"{type(exc).__qualname__}: {exc}"
    if stage == "main":
        inner: BaseException | None = exc
        while inner is not None and not isinstance(inner, _spawn.MainReentered):
            inner = inner.__cause__ or inner.__context__
        if inner is not None:
            return (f"it imports the main module {where}, because the loader's configuration refers to "
                    f"{what}, defined there, and that import creates and iterates a Loader again. Put that "
                    "code under `if __name__ == \"__main__\":`, or move "
                    f"{what} into a module of its own.")
        return (f"it imports the main module {where}, because the loader's configuration refers to "
                f"{what}, defined there, and that import failed ({cause}). Move {what} into a module "
                "of its own and import it from there, or use pool='thread'.")
    if stage == "config":
        return (f"{cause}. It could not rebuild the loader's configuration (its filesystem and options): "
                "everything a process pool hands its workers must unpickle in a fresh process. Use "
                "pool='thread', which keeps it in this process.")
    return ""


def _keep_freed_memory() -> None:
    """In a worker process (ours alone): let glibc keep freed memory for the next block.

    A block's NumPy temporaries (the permutation's keys and orders; for string and list
    columns the value index, several MB per block) are freed after it; glibc gave such
    chunks back to the kernel (unmapped, or trimmed off the heap) and the next block
    faulted in zeroed pages again. Thresholds above a block's temporaries keep them.
    """
    if platform.libc_ver()[0] != "glibc":  # the thresholds below are glibc's
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest
    mallopt(m_trim_threshold, 256 << 20)


# Warnings raised in a worker process, waiting to travel with its next block.
_FORWARDED: list[tuple[str, str]] = []


def _forward_warnings() -> None:
    """In a worker process: keep warnings for the consumer instead of printing them on this
    process's stderr, where a user's warnings filters and ``pytest.warns`` never see them."""

    def keep(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        _FORWARDED.append((category.__name__, str(message)))

    warnings.showwarning = keep


def parse_units(units: Sequence[int], file_index: np.ndarray, rg_index: np.ndarray) -> tuple[tuple[int, int], ...]:
    return tuple((int(file_index[u]), int(rg_index[u])) for u in units)
