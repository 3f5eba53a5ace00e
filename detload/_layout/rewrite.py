"""`detload layout`: rewrite a dataset sorted (or grouped) by keys, so that a slice is a few contiguous row groups.

DuckDB sorts out of core (memory limit, spill folder); the sorted rows stream back to pyarrow's
ParquetWriter, cast to the source's Arrow schema, with statistics, the page index, sorting_columns
and optional bloom filters. Row groups end early at key changes where that costs little. The run
ends by comparing the order-independent digests of the source and the result (docs/layout.md).
Everything is written into a locked, marked folder beside DST that becomes DST by one rename once
the digests match, so an interrupted or failed run never leaves a DST behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .._cache.sizes import parse_size
from .._check import check_int
from .._discovery import UNFINISHED_LAYOUT, UnfinishedLayoutWarning, discover
from ..errors import (
    DatasetError,
    DetloadError,
    DigestMismatchError,
    EmptyDatasetError,
    LayoutError,
    OptionError,
    SchemaMismatchError,
)
from .digest import Digest, column_seed, digest, hash_values

__all__ = ["DigestMismatchError", "LayoutError", "LayoutReport", "REPORT_NAME", "layout"]

#: The report written beside the data; the underscore keeps it out of dataset discovery.
REPORT_NAME = "_detload_layout.json"
_TMP_NAME = "_detload_sort_tmp"
#: The folder a run writes into: ".<DST's name>.detload-layout-partial-<pid>-<random>", beside DST.
_PARTIAL_INFIX = ".detload-layout-partial-"
#: The Parquet codecs pyarrow writes ("none": uncompressed), of which those built in are offered.
_CODECS = ("snappy", "gzip", "brotli", "lz4", "lz4_raw", "zstd")
#: How the options are named in messages: the keywords here, the flags on the command line (`named`).
_API_NAMES = {k: k for k in ("memory_limit", "threads", "compression", "temp_directory", "row_group_rows", "files")}
_names: ContextVar[Mapping[str, str]] = ContextVar("detload_layout_names", default=_API_NAMES)
_FILE_COL = "__detload_file__"
_ROW_COL = "__detload_row__"
#: Rows per batch read from the source and fetched from the sorter.
_BATCH = 65_536
_INSTALL_HINT = "detload layout needs DuckDB: pip install 'detload[layout]'"






@dataclass(frozen=True)
class LayoutReport:
    """What ``layout`` wrote, the predicates the layout serves, and the two digests."""

    src: str
    dst: str
    rows: int
    files: int
    row_groups: int
    bytes: int
    sort_by: tuple[str, ...]
    group_by: str | None
    row_group_rows: int
    #: Smallest, median and largest row group written.
    row_group_sizes: tuple[int, int, int]
    bloom_filter: tuple[str, ...]
    #: The ``sorting_columns`` the files declare (empty when the rows are not sorted by a column list).
    sorting_columns: tuple[str, ...]
    serves: tuple[str, ...]
    src_digest: Digest
    dst_digest: Digest
    seconds: float
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """True when the output holds exactly the source's rows (equal digests)."""
        return self.src_digest == self.dst_digest

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src, "dst": self.dst, "rows": self.rows, "files": self.files,
            "row_groups": self.row_groups, "bytes": self.bytes, "sort_by": list(self.sort_by),
            "group_by": self.group_by, "row_group_rows": self.row_group_rows,
            "row_group_sizes": {"min": self.row_group_sizes[0], "median": self.row_group_sizes[1],
                                "max": self.row_group_sizes[2]},
            "bloom_filter": list(self.bloom_filter), "sorting_columns": list(self.sorting_columns),
            "page_index": True, "statistics": True, "serves": list(self.serves), "notes": list(self.notes),
            "src_digest": self.src_digest.to_dict(), "dst_digest": self.dst_digest.to_dict(),
            "digests_match": self.ok, "seconds": round(self.seconds, 3),
        }

    def __str__(self) -> str:
        keys = ", ".join(self.sort_by) or "-"
        lo, med, hi = self.row_group_sizes
        lines = [
            f"layout {self.src} -> {self.dst}",
            f"  {self.rows:,} rows in {self.files} file(s), {self.row_groups} row groups "
            f"({lo:,} / {med:,} / {hi:,} rows min/median/max; target {self.row_group_rows:,}), {self.bytes:,} bytes",
            f"  sorted by: {keys}" + (f"; grouped by: {self.group_by}" if self.group_by else ""),
            f"  sorting_columns declared: {', '.join(self.sorting_columns) or 'none'}; statistics and page index: "
            f"written; bloom filters: {', '.join(self.bloom_filter) or 'none'}",
            "  serves:",
            *(f"    - {s}" for s in self.serves),
            *(f"  note: {n}" for n in self.notes),
            f"  digest SRC {self.src_digest}",
            f"  digest DST {self.dst_digest}",
            f"  {'digests match' if self.ok else 'DIGESTS DIFFER'} ({self.seconds:.1f} s)",
        ]
        return "\n".join(lines)


# -- types: what travels through the sorter, and what may be a key ----------------------------------------

def _nested(t: pa.DataType, leaf: Callable[[pa.DataType], pa.DataType]) -> pa.DataType:
    """``t`` with ``leaf`` applied to each type inside maps, lists and structs (and to ``t`` itself
    when it is none of those), the nesting, field names and list sizes kept."""
    if pa.types.is_map(t):
        return pa.map_(_nested(t.key_type, leaf), t.item_field.with_type(_nested(t.item_type, leaf)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(_nested(t.value_type, leaf)), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_nested(t.value_type, leaf)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_nested(t.value_type, leaf)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_nested(f.type, leaf)) for f in t])
    return leaf(t)


def _decoded(t: pa.DataType) -> pa.DataType:
    """``t`` with every dictionary replaced by its value type."""
    return _nested(t, lambda u: _decoded(u.value_type) if pa.types.is_dictionary(u) else u)


def _carrier(t: pa.DataType) -> pa.DataType:
    """The type a (decoded) column travels through DuckDB as: one it keeps bit for bit.

    DuckDB changes some Arrow types on the way (time zones to UTC, nanoseconds to microseconds,
    decimal256 to double, strings by collation); these travel as integers or bytes of the same
    layout instead, so a zero-copy view restores them, and integers sort as the values they encode.
    """
    return _nested(t, _carrier_leaf)


def _carrier_leaf(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_float16(t):
        return pa.uint16()
    if pa.types.is_decimal256(t):
        return pa.binary(32)
    if pa.types.is_interval(t):
        return pa.binary(16)
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_string_view(t):
        return pa.binary_view()
    return t


@dataclass(frozen=True)
class _Column:
    """How one column goes to the sorter and back."""

    name: str
    type: pa.DataType  # the source's type
    storage: pa.DataType  # without an extension wrapper
    decoded: pa.DataType  # storage without dictionaries
    carrier: pa.DataType

    @classmethod
    def of(cls, name: str, t: pa.DataType) -> _Column:
        storage = t.storage_type if isinstance(t, pa.BaseExtensionType) else t
        decoded = _decoded(storage)
        return cls(name, t, storage, decoded, _carrier(decoded))

    def to_carrier(self, arr: pa.Array) -> pa.Array:
        if isinstance(arr.type, pa.BaseExtensionType):
            arr = arr.storage
        if self.decoded != self.storage:
            arr = arr.cast(self.decoded)
        return arr if self.carrier == self.decoded else arr.view(self.carrier)

    def from_sorter(self, arr: pa.Array) -> pa.Array:
        if arr.type != self.carrier:
            arr = arr.cast(self.carrier)
        if self.carrier != self.decoded:
            arr = arr.view(self.decoded)
        if self.decoded != self.storage:
            arr = arr.cast(self.storage)
        if isinstance(self.type, pa.BaseExtensionType):
            arr = pa.ExtensionArray.from_storage(self.type, arr)
        return arr


def _sortable(t: pa.DataType) -> bool:
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    return ((pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
             or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
             or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
             or pa.types.is_fixed_size_binary(t) or pa.types.is_date(t) or pa.types.is_time(t)
             or pa.types.is_timestamp(t) or pa.types.is_duration(t)
             or (pa.types.is_decimal(t) and not pa.types.is_decimal256(t)))
            and not pa.types.is_float16(t))


def _bloom_ok(t: pa.DataType) -> bool:
    """Types pyarrow writes a bloom filter for, whose equality predicates one can probe (no nesting)."""
    if isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t) or pa.types.is_null(t) or pa.types.is_float16(t) or pa.types.is_nested(t):
        return False
    return _sortable(t) or pa.types.is_decimal(t)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# -- the pure part: where row groups and files end ----------------------------------------------------------

def cut_point(lead: np.ndarray, group: np.ndarray | None, *, available: int, row_group_rows: int,
              slack: float, at_end: bool) -> int:
    """Rows in the next row group, given hashes of the leading key (and group key) of the buffered rows.

    A row group holds ``row_group_rows`` rows, or ends earlier at the last change of the leading key
    within the last ``slack`` of that size. With a group key it may only end where the group changes,
    unless the group alone holds more than ``row_group_rows`` rows. Needs ``row_group_rows + 1``
    buffered rows unless ``at_end``.
    """
    r = row_group_rows
    if at_end and available <= r:
        return available
    top = min(r, available - 1)  # a change at p means rows p-1 and p differ: p <= available - 1
    lo = max(1, math.ceil(r * (1.0 - slack)))
    lead_change = lead[1 : top + 1] != lead[:top]
    if group is not None:
        group_change = group[1 : top + 1] != group[:top]
        allowed = lead_change & group_change
    else:
        group_change = None
        allowed = lead_change
    window = np.flatnonzero(allowed[lo - 1 :]) if lo <= top else np.zeros(0, np.int64)
    if len(window):
        return int(window[-1]) + lo
    if group_change is not None:
        ends = np.flatnonzero(group_change)
        if len(ends):
            return int(ends[-1]) + 1
    return r


# -- the tool ----------------------------------------------------------------------------------------------

def layout(
    src: Any,
    dst: str | os.PathLike[str],
    *,
    sort_by: Sequence[str] = (),
    group_by: str | None = None,
    row_group_rows: int = 65_536,
    bloom_filter: Sequence[str] = (),
    files: int = 1,
    boundary_slack: float = 0.25,
    memory_limit: str | None = None,
    temp_directory: str | os.PathLike[str] | None = None,
    threads: int | None = None,
    compression: str = "snappy",
    progress: bool | None = None,
    filesystem: Any = None,
) -> LayoutReport:
    """Rewrite ``src`` into the new folder ``dst`` sorted by ``sort_by`` (and grouped by ``group_by``).

    ``dst`` keeps the source's Arrow schema (Hive partition columns become ordinary columns, typed
    as detload types them, at the end), gets statistics, the page index, ``sorting_columns`` and
    bloom filters for ``bloom_filter`` columns, in ``files`` files of row groups of about
    ``row_group_rows`` rows. DuckDB sorts within ``memory_limit`` (bytes, or a size such as "4GB";
    default DuckDB's own) and spills to ``temp_directory`` (default: a folder inside the output,
    removed at the end). The files are written into a folder beside ``dst`` that is renamed to
    ``dst`` once the digests match, with the report in ``dst/_detload_layout.json``; on any error
    or interrupt that folder is removed and ``dst`` is not created. Raises DigestMismatchError if
    the output's digest differs from the source's, LayoutError if the run cannot finish (out of
    memory, a full disk, another run writing ``dst``).
    """
    t0 = time.perf_counter()
    sort_keys = _key_list(sort_by, "sort_by")
    blooms = _key_list(bloom_filter, "bloom_filter")
    if group_by is not None and not isinstance(group_by, str):
        raise OptionError(f"group_by must be a column name, got {group_by!r}")
    if not sort_keys and group_by is None:
        raise OptionError("layout needs sort_by (--sort-by) or group_by (--group-by): there is nothing to order by")
    if group_by is not None and group_by in sort_keys:
        raise OptionError(f"group_by {group_by!r} is also listed in sort_by; groups are always ordered by their key, "
                          "leave it out of sort_by")
    shown = _names.get()
    row_group_rows = check_int(shown["row_group_rows"], row_group_rows, 1, what="rows per output row group")
    files = check_int(shown["files"], files, 1, what="output files")
    if not 0.0 <= boundary_slack < 1.0:
        raise OptionError(f"boundary_slack must be in [0, 1), got {boundary_slack!r}")
    # Refused here, before anything is read: DuckDB and the writer would fail only minutes in.
    memory_bytes = parse_size(memory_limit, shown["memory_limit"])
    if threads is not None:
        threads = check_int(shown["threads"], threads, 1, what="DuckDB threads")
    _check_compression(compression, shown["compression"])
    dst_path = _check_dst(dst)
    try:
        import duckdb
    except ImportError:
        raise ImportError(_INSTALL_HINT) from None
    try:
        ds = discover(src, filesystem=filesystem)
    except EmptyDatasetError as exc:
        raise EmptyDatasetError(f"SRC has no rows, there is nothing to lay out: {exc}") from None
    _check_not_inside(src, ds, dst_path)
    schema = _source_schema(ds)
    columns = [_Column.of(f.name, f.type) for f in schema]
    names = schema.names
    for role, keys in (("sort key", sort_keys), ("group key", [group_by] if group_by else []),
                       ("bloom filter column", blooms)):
        missing = [k for k in keys if k not in names]
        if missing:
            raise DatasetError(f"{role} {missing[0]!r} is not a column of SRC; the columns are {names}")
    for k in [*sort_keys, *([group_by] if group_by else [])]:
        t = schema.field(k).type
        if not _sortable(t):
            raise DatasetError(f"cannot sort by {k!r}: its type {t} has no order layout can use; sort by a column "
                               "of an integer, float, boolean, string, binary, date, time, timestamp or decimal type")
    if group_by is not None:
        gt = schema.field(group_by).type
        if pa.types.is_floating(gt.value_type if pa.types.is_dictionary(gt) else gt):
            raise DatasetError(f"cannot group by {group_by!r}: it is a float column ({gt}), and NaN and -0.0 make "
                               "float keys ambiguous; group by an integer or string key")
    for k in blooms:
        t = schema.field(k).type
        if not _bloom_ok(t):
            raise DatasetError(f"cannot write a bloom filter for {k!r}: its type {t} is not supported (bloom filters "
                               "are written for top-level integer, float, string, binary, date, time, timestamp and "
                               "decimal columns; not for booleans, nulls, half floats or nested types)")

    on = sys.stderr.isatty() if progress is None else progress
    partial = _Partial(dst_path)
    try:
        partial.claim()
        _phase("claimed")
        tmp = os.fspath(temp_directory) if temp_directory is not None else os.path.join(partial.path, _TMP_NAME)
        written: list[str] = []
        config: dict[str, Any] = {"temp_directory": tmp, "preserve_insertion_order": False}
        if memory_bytes is not None:
            config["memory_limit"] = f"{memory_bytes}B"
        if threads is not None:
            config["threads"] = threads
        failure = _DuckDBFailure(duckdb, shown, memory_limit, tmp)
        try:
            try:
                con = duckdb.connect(config=config)
            except duckdb.Error as exc:
                raise failure(exc) from None
            watch = _SignalWatch(con)
            try:
                with watch:
                    # DuckDB's own progress bar would print on stdout; tqdm's bars on stderr show the run instead.
                    con.execute("SET enable_progress_bar = false")
                    result = _sort_and_write(con, ds, schema, columns, sort_keys, group_by, blooms, partial.path,
                                             row_group_rows, files, boundary_slack, compression, on, written)
            except Exception as exc:
                if watch.signum is not None:  # Ctrl-C or SIGTERM, seen by DuckDB or inside its callback first
                    raise _Interrupted(watch.signum) from None
                if isinstance(exc, duckdb.Error) or type(exc) is RuntimeError:
                    raise failure(exc) from None
                raise
            finally:
                con.close()
        finally:
            if temp_directory is None:
                shutil.rmtree(tmp, ignore_errors=True)
        _phase("written")
        sizes, sorting, notes = result
        src_d = digest(src, filesystem=filesystem)
        with warnings.catch_warnings():  # the marker is there until the rename: this run's own
            warnings.simplefilter("ignore", UnfinishedLayoutWarning)
            dst_d = digest(partial.path)
        total_bytes = sum(os.path.getsize(p) for p in written)
        ordered = sorted(sizes)
        report = LayoutReport(
            src=_describe(src), dst=dst_path, rows=ds.rows, files=len(written), row_groups=len(sizes),
            bytes=total_bytes, sort_by=tuple(sort_keys), group_by=group_by, row_group_rows=row_group_rows,
            row_group_sizes=(ordered[0], ordered[len(ordered) // 2], ordered[-1]), bloom_filter=tuple(blooms),
            sorting_columns=tuple(sorting), serves=_serves(sort_keys, group_by, blooms, sorting),
            src_digest=src_d, dst_digest=dst_d, seconds=time.perf_counter() - t0, notes=tuple(notes),
        )
        if not report.ok:
            raise DigestMismatchError(
                f"the digest of the output ({dst_d}) differs from the digest of SRC ({src_d}): the rewrite lost, "
                f"duplicated or changed rows, so DST {dst_path} was not created; the report holds both digests",
                report=report,
            )
        report_path = os.path.join(partial.path, REPORT_NAME)
        with _writing(report_path), open(report_path, "w", encoding="utf-8") as f:
            json.dump(report.to_dict(), f, indent=2)
        _phase("digested")
        partial.commit([*written, report_path])
    except BaseException:
        partial.discard()
        raise
    _phase("renamed")
    return report


# -- the folder beside DST, and what can stop a run -----------------------------------------------------

def _phase(name: str) -> None:
    """A test hook between the phases of a run (tests/layout/test_interrupt.py; never set otherwise):
    with $DETLOAD_TEST_LAYOUT_FD, write the phase's name and a newline to that descriptor, and
    wait there when $DETLOAD_TEST_LAYOUT_HOLD names it, so a signal can be sent at that moment.

    The wait ends with the signal: in the main thread its handler raises out of the sleep; in a
    DuckDB thread (reading the source) the `_SignalWatch` says so, as a read would end there."""
    fd = os.environ.get("DETLOAD_TEST_LAYOUT_FD")
    if fd is None:
        return
    os.write(int(fd), f"{name}\n".encode())
    if os.environ.get("DETLOAD_TEST_LAYOUT_HOLD") == name:
        _signalled.wait(300)


#: Set by `_SignalWatch` when Ctrl-C or SIGTERM arrived (read by the test hook above).
_signalled = threading.Event()


class _Partial:
    """The folder a run writes into, beside DST: marked unfinished, locked (flock) while this
    process lives, and renamed to DST only after the digests matched.

    The lock is what proves a leftover folder abandoned: the kernel drops it when its process dies,
    even by SIGKILL, so a later run removes such a folder itself, and refuses to start while another
    live run holds one for the same DST. The parent folder's lock makes finding and creating these
    one step, so two runs started together cannot both proceed.
    """

    def __init__(self, dst: str) -> None:
        self.dst = dst
        self.parent, self.name = os.path.split(dst)
        self.prefix = f".{self.name}{_PARTIAL_INFIX}"
        self.path = os.path.join(self.parent, f"{self.prefix}{os.getpid()}-{secrets.token_hex(4)}")
        self.marker = os.path.join(self.path, UNFINISHED_LAYOUT)
        self.fd: int | None = None

    def claim(self) -> None:
        os.makedirs(self.parent, exist_ok=True)
        parent_fd = _open_dir(self.parent)
        try:
            if parent_fd is not None:
                with contextlib.suppress(OSError):  # no locks on this filesystem: the names still differ
                    fcntl.flock(parent_fd, fcntl.LOCK_EX)
            for entry in sorted(os.listdir(self.parent)):
                if entry.startswith(self.prefix):
                    self._clear(os.path.join(self.parent, entry))
            _check_dst(self.dst)  # again, under the lock: a run that finished meanwhile made DST
            os.mkdir(self.path)
            self.fd = _open_dir(self.path)
            if self.fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            info = {"what": "the unfinished output of `detload layout`; it becomes DST by a rename once its digest "
                            "matches the source's. Not data to read.",
                    "dst": self.dst, "pid": os.getpid(), "host": socket.gethostname(),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            with _writing(self.marker), open(self.marker, "w", encoding="utf-8") as f:
                json.dump(info, f, indent=2)
        finally:
            if parent_fd is not None:
                os.close(parent_fd)

    def _clear(self, other: str) -> None:
        """Remove another run's folder for this DST when its process is gone; refuse while it lives."""
        fd = _open_dir(other)
        if fd is None:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_json(os.path.join(other, UNFINISHED_LAYOUT))
                who = f"pid {owner.get('pid')} on {owner.get('host')}, " if owner else ""
                raise LayoutError(f"another `detload layout` is writing DST {self.dst} right now ({who}into {other}); "
                                  "wait for it to finish, or stop it and run again") from None
            except OSError:  # no locks on this filesystem: whether that run lives cannot be told
                raise LayoutError(f"{other} is the unfinished output of an earlier `detload layout` into DST "
                                  f"{self.dst}, and this filesystem cannot tell whether that run still lives; "
                                  "if it does not, remove that folder and run again") from None
            entries = set(os.listdir(other))
            marker = _read_json(os.path.join(other, UNFINISHED_LAYOUT))
            report = _read_json(os.path.join(other, REPORT_NAME))
            # Ours: its marker or (killed between removing the marker and the rename) its report names this
            # DST; or nothing but a marker begun, from a run killed as it started.
            ours = any(d and os.path.basename(str(d.get("dst", ""))) == self.name for d in (marker, report))
            if ours or entries <= {UNFINISHED_LAYOUT}:
                shutil.rmtree(other, ignore_errors=True)
            else:
                warnings.warn(UnfinishedLayoutWarning(
                    f"{other} looks like an unfinished layout of {self.dst} but holds no marker of one; it was "
                    "left alone: remove it if nothing uses it"), stacklevel=4)
        finally:
            os.close(fd)

    def commit(self, files: Sequence[str]) -> None:
        """Make the folder DST: durable first, then renamed (the marker removed just before)."""
        for p in files:
            with _writing(p):
                _fsync(p)
        os.remove(self.marker)
        _fsync(self.path, directory=True)
        try:
            os.rename(self.path, self.dst)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise LayoutError(f"DST {self.dst} was created or filled by something else while the layout ran; "
                                  "the output was removed. Choose another DST or remove that one") from None
            raise
        _fsync(self.parent, directory=True)
        self._unlock()

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._unlock()

    def _unlock(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_dir(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _fsync(path: str, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        if directory:
            with contextlib.suppress(OSError):  # not every filesystem syncs a folder
                os.fsync(fd)
        else:
            os.fsync(fd)  # a delayed write error (a full disk, on some filesystems) comes out here
    finally:
        os.close(fd)


@contextlib.contextmanager
def _writing(path: str) -> Iterator[None]:
    """Name the file, and say that the disk is full, when writing ``path`` fails."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, DetloadError):
            raise
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(exc)
        if full:
            raise LayoutError(f"the disk is full: writing {path} failed (no space left on device). DST was not "
                              "created and the partial output was removed; free space on that disk, or choose a "
                              "DST on a disk with room for about the size of SRC") from None
        raise LayoutError(f"writing {path} failed: {' '.join(str(exc).split())}; DST was not created") from None


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM that DuckDB turned into its own error: raised as the interrupt it was."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


class _SignalWatch:
    """While DuckDB runs, cancel its query as soon as Ctrl-C or SIGTERM arrives.

    A signal's Python handler runs only when the main thread returns to Python, which a sort may
    not do for minutes; the signal's number also goes to a wakeup descriptor, and a thread that
    reads it interrupts the connection at once. ``signum`` is the signal seen, once the block ends.
    """

    def __init__(self, con: Any) -> None:
        self.con = con
        self.signum: int | None = None
        self._fds: tuple[int, int] | None = None
        self._old = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _SignalWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._old = signal.set_wakeup_fd(w)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return self
        self._fds = (r, w)
        _signalled.clear()
        self._thread = threading.Thread(target=self._watch, name="detload-layout-signals", daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        assert self._fds is not None
        while True:
            data = os.read(self._fds[0], 64)
            if not data:
                return
            theirs = data.split(b"\0")[0]
            if self._old >= 0 and theirs:  # whoever watched before (an event loop) still hears of its signals
                with contextlib.suppress(OSError):
                    os.write(self._old, theirs)
            for sig in data:
                if sig == 0:  # the block ended
                    return
                if sig in (signal.SIGINT, signal.SIGTERM) and self.signum is None:
                    self.signum = sig
                    _signalled.set()
                    with contextlib.suppress(Exception):
                        self.con.interrupt()

    def __exit__(self, *exc: object) -> None:
        if self._fds is None or self._thread is None:
            return
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(self._old)
        r, w = self._fds
        os.set_blocking(w, True)
        os.write(w, b"\0")  # after any signal's byte: the thread has seen those when it stops
        self._thread.join()
        os.close(r)
        os.close(w)


class _DuckDBFailure:
    """DuckDB's errors as one line that names the option or the path to change."""

    def __init__(self, duckdb: Any, shown: Mapping[str, str], memory_limit: Any, spill: str) -> None:
        self.duckdb = duckdb
        self.shown = shown
        self.memory_limit = memory_limit
        self.spill = os.path.abspath(spill)

    def __call__(self, exc: BaseException) -> LayoutError:
        text = str(exc)
        first = text.strip().splitlines()[0].rstrip(".") if text.strip() else type(exc).__name__
        mem, spill_opt = self.shown["memory_limit"], self.shown["temp_directory"]
        if "No space left" in text or "max_temp_directory_size" in text:
            return LayoutError(f"the disk is full: the sort could not write its spill files in {self.spill} "
                               f"({first}). DST was not created; free space on that disk, or give {spill_opt} a "
                               "folder on a disk with room for about the size of SRC")
        if isinstance(exc, self.duckdb.OutOfMemoryException):
            if self.memory_limit is not None:
                return LayoutError(f"the sort ran out of memory under {mem} {self.memory_limit} ({first}); raise "
                                   f"{mem}, or lower {self.shown['threads']} (each thread sorts in buffers of its own)")
            return LayoutError(f"the sort ran out of memory ({first}); set {mem} below the free memory, so that "
                               f"it spills to {spill_opt} instead")
        if isinstance(exc, self.duckdb.IOException):
            return LayoutError(f"the sort failed to read or write a file ({first}); its spill folder is {self.spill}")
        return LayoutError(f"the sort failed in DuckDB: {first}")


def _check_compression(value: Any, name: str) -> None:
    codecs = ["none", *(c for c in _CODECS if pa.Codec.is_available(c))]
    values = list(value.values()) if isinstance(value, Mapping) else [value]
    for v in values:
        if not isinstance(v, str) or v.lower() not in codecs:
            raise OptionError(f"{name} {v!r} is not a Parquet codec this pyarrow writes; use one of "
                              f"{', '.join(codecs)}")


@contextlib.contextmanager
def named(names: Mapping[str, str]) -> Iterator[None]:
    """Within the block, layout's messages call its options ``names`` (the command line's flags)."""
    token = _names.set({**_API_NAMES, **names})
    try:
        yield
    finally:
        _names.reset(token)


def prepare() -> None:
    """Import now what a layout imports on first use: an interrupt inside an extension's import
    comes out as an ImportError (see detload._signals.interruptible)."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        raise ImportError(_INSTALL_HINT) from None
    import concurrent.futures.thread  # noqa: F401

    import tqdm  # noqa: F401


def _describe(src: Any) -> str:
    if isinstance(src, (str, os.PathLike)):
        return os.fspath(src)
    return ", ".join(os.fspath(s) for s in src)


def _key_list(keys: Sequence[str] | str, what: str) -> list[str]:
    if isinstance(keys, str):
        keys = [keys]
    out = list(keys)
    if not all(isinstance(k, str) and k for k in out):
        raise OptionError(f"{what} must be a list of column names, got {keys!r}")
    dup = sorted({k for k in out if out.count(k) > 1})
    if dup:
        raise OptionError(f"{what} lists {dup} more than once")
    return out


def _check_dst(dst: str | os.PathLike[str]) -> str:
    path = os.fspath(dst)
    if "://" in path and not path.startswith("file://"):
        raise OptionError(f"DST {path!r} must be a local folder (layout writes with the local filesystem)")
    path = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
    if os.path.islink(path):  # the rename at the end replaces what DST names, not a link to it
        path = os.path.realpath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise OptionError(f"DST {path!r} exists and is a file; layout writes into a new or empty folder")
        entries = os.listdir(path)
        if entries:
            raise OptionError(
                f"DST {path!r} exists and is not empty ({len(entries)} entries, e.g. {sorted(entries)[0]!r}); "
                "layout writes into a new or empty folder and never overwrites: remove it or choose another"
            )
    return path


def _check_not_inside(src: Any, ds: Any, dst: str) -> None:
    """Refuse a DST that a folder or glob SRC would list: the output would become part of its source."""
    import pyarrow.fs as pafs

    if not isinstance(ds.filesystem, pafs.LocalFileSystem) or not isinstance(src, (str, os.PathLike)):
        return
    text = os.fspath(src)
    if not (os.path.isdir(text) or any(ch in text for ch in "*?[")):
        return  # a single file: DST, a new folder, cannot be it
    root = os.path.realpath(ds.root)
    real = os.path.realpath(dst)
    if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
        raise OptionError(f"DST {dst!r} lies inside SRC ({ds.root!r}); the output would become part of its own "
                          "source. Choose a DST outside SRC")


def _source_schema(ds: Any) -> pa.Schema:
    """The Arrow schema DST keeps: the files' own (checked equal in every file with rows), Hive keys last."""
    ref: pa.Schema | None = None
    ref_path = ""
    for f, s in zip(ds.files, ds.file_schemas):
        if not sum(f.row_groups):
            continue
        if ref is None:
            ref, ref_path = s, f.path
            continue
        if s.equals(ref):
            continue
        a = {fl.name: fl.type for fl in ref}
        b = {fl.name: fl.type for fl in s}
        diffs = [f"{n!r} is {a[n]} in {ref_path} but {b[n]} in {f.path}" for n in a if n in b and a[n] != b[n]]
        diffs += [f"{n!r} only in {ref_path}" for n in a if n not in b]
        diffs += [f"{n!r} only in {f.path}" for n in b if n not in a]
        if diffs:
            raise SchemaMismatchError(
                "layout keeps one Arrow schema, but the files of SRC disagree: " + "; ".join(diffs)
                + ". Rewrite the files with one schema first."
            )
    assert ref is not None
    fields = list(ref)
    for k, t in ds.partition_types:
        fields.append(pa.field(k, pa.int64() if t == "int64" else pa.string()))
    return pa.schema(fields, metadata=ref.metadata)


def _source_reader(ds: Any, columns: list[_Column], partition: dict[str, str], file_cols: list[str],
                   bar: Any, *, extra: bool) -> pa.RecordBatchReader:
    """The source rows in canonical order (files as UTF-8 bytes, then rows), as carriers for DuckDB.

    With ``extra``, each row also carries its file's index and its row number, the tie-break that
    makes the sorted order a function of the data alone.
    """
    fields = [pa.field(c.name, c.carrier) for c in columns]
    if extra:
        fields += [pa.field(_FILE_COL, pa.int32()), pa.field(_ROW_COL, pa.int64())]
    schema = pa.schema(fields)
    fs = ds.filesystem

    first = next(i for i, f in enumerate(ds.files) if sum(f.row_groups))

    def batches() -> Iterator[pa.RecordBatch]:
        for fi, f in enumerate(ds.files):
            if not sum(f.row_groups):
                continue
            values = dict(f.partition_values)
            row = 0
            with fs.open_input_file(f.location) as fh:
                pf = pq.ParquetFile(fh)
                for b in pf.iter_batches(batch_size=_BATCH, columns=file_cols, use_threads=True):
                    n = b.num_rows
                    arrays = []
                    for c in columns:
                        if c.name in partition:
                            v = values[c.name]
                            arr = pa.repeat(pa.scalar(int(v) if partition[c.name] == "int64" else v, c.type), n)
                        else:
                            arr = b.column(c.name)
                        arrays.append(c.to_carrier(arr))
                    if extra:
                        arrays.append(pa.repeat(pa.scalar(fi, pa.int32()), n))
                        arrays.append(pa.array(np.arange(row, row + n, dtype=np.int64)))
                    row += n
                    bar.update(n)
                    if extra and row == n and fi == first:
                        _phase("reading")  # inside DuckDB's scan of the source
                    yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def _sort_and_write(con: Any, ds: Any, schema: pa.Schema, columns: list[_Column], sort_keys: list[str],
                    group_by: str | None, blooms: list[str], dst: str, row_group_rows: int, files: int,
                    slack: float, compression: str, progress: bool, written: list[str],
                    ) -> tuple[list[int], list[str], list[str]]:
    from tqdm import tqdm

    partition = dict(ds.partition_types)
    file_cols = [c.name for c in columns if c.name not in partition]
    by_name = {c.name: c for c in columns}
    notes: list[str] = []
    sel = ", ".join(f"s.{_quote(c.name)}" for c in columns)
    tiebreak = f"s.{_quote(_FILE_COL)}, s.{_quote(_ROW_COL)}"
    if group_by is not None and sort_keys:
        # Groups are placed by the smallest value of each sort key within them: a pre-pass over the
        # key columns only, then a join, because a window over all rows would not spill well.
        key_cols = [by_name[k] for k in [group_by, *sort_keys]]
        with tqdm(total=ds.rows, desc="group keys", unit="rows", disable=not progress, file=sys.stderr) as bar:
            con.register("detload_keys", _source_reader(ds, key_cols, partition,
                                                        [c.name for c in key_cols if c.name not in partition],
                                                        bar, extra=False))
            g = _quote(group_by)
            aggs = ", ".join(f"min({_quote(k)}) AS k{i}, (count({_quote(k)}) = 0 OR (count({_quote(k)}) = count(*) "
                             f"AND min({_quote(k)}) = max({_quote(k)}))) AS c{i}" for i, k in enumerate(sort_keys))
            con.execute(f"CREATE TEMP TABLE detload_groups AS SELECT {g} AS g, {aggs} FROM detload_keys GROUP BY {g}")
            con.unregister("detload_keys")
        consts = " AND ".join(f"c{i}" for i in range(len(sort_keys)))
        constant = bool(con.sql(f"SELECT coalesce(bool_and({consts}), true) FROM detload_groups").fetchall()[0][0])
        order = ", ".join(f"gk.k{i} ASC NULLS LAST" for i in range(len(sort_keys)))
        query = (f"SELECT {sel} FROM detload_src s JOIN detload_groups gk ON s.{g} IS NOT DISTINCT FROM gk.g "
                 f"ORDER BY {order}, s.{g} ASC NULLS LAST, {tiebreak}")
        if constant:
            sorting = [*sort_keys, group_by]
        else:
            sorting = []
            notes.append(f"{', '.join(sort_keys)} vary within some {group_by} groups: groups are ordered by their "
                         "smallest value of each, so the files declare no sorting_columns")
    else:
        keys = sort_keys if group_by is None else [group_by]
        order = ", ".join(f"s.{_quote(k)} ASC NULLS LAST" for k in keys)
        query = f"SELECT {sel} FROM detload_src s ORDER BY {order}, {tiebreak}"
        sorting = list(keys)
    lead_key = sort_keys[0] if sort_keys else group_by
    assert lead_key is not None
    lead_seed = column_seed(lead_key)
    group_seed = column_seed(group_by) if group_by is not None else 0

    sorting_columns = pq.SortingColumn.from_ordering(
        pa.schema([pa.field(f.name, f.type) for f in schema]),
        [(k, "ascending") for k in sorting], null_placement="at_end") if sorting else None
    bloom_opts = {k: {"ndv": max(1, min(row_group_rows, ds.rows)), "fpp": 0.05} for k in blooms} or None
    rows_per_file = math.ceil(ds.rows / files)
    sizes: list[int] = []
    writer: pq.ParquetWriter | None = None
    file_rows = 0

    def open_next() -> pq.ParquetWriter:
        path = os.path.join(dst, f"part-{len(written):05d}.parquet")
        written.append(path)
        with _writing(path):
            return pq.ParquetWriter(path, schema, compression=compression, write_statistics=True,
                                    write_page_index=True, sorting_columns=sorting_columns,
                                    bloom_filter_options=bloom_opts, store_schema=True)

    buf: list[pa.RecordBatch] = []
    lead_h = np.zeros(0, np.uint64)
    group_h: np.ndarray | None = np.zeros(0, np.uint64) if group_by is not None else None
    buffered = 0

    def emit(at_end: bool) -> None:
        nonlocal buf, lead_h, group_h, buffered, writer, file_rows
        cut = cut_point(lead_h, group_h, available=buffered, row_group_rows=row_group_rows, slack=slack,
                        at_end=at_end)
        table = pa.Table.from_batches(buf, schema=schema)
        if writer is None:
            writer = open_next()
        with _writing(written[-1]):
            writer.write_table(table.slice(0, cut), row_group_size=cut)
        if not sizes:
            _phase("writing")  # a part file without its footer yet
        sizes.append(cut)
        file_rows += cut
        # A file ends at a row-group end past its share of rows, never inside a group.
        group_ends = group_h is None or cut == buffered or group_h[cut] != group_h[cut - 1]
        buf = table.slice(cut).to_batches()
        lead_h = lead_h[cut:]
        if group_h is not None:
            group_h = group_h[cut:]
        buffered -= cut
        if file_rows >= rows_per_file and group_ends and buffered:
            with _writing(written[-1]):
                writer.close()
            writer = None
            file_rows = 0

    with tqdm(total=ds.rows, desc="reading", unit="rows", disable=not progress, file=sys.stderr) as bar:
        con.register("detload_src", _source_reader(ds, columns, partition, file_cols, bar, extra=True))
        sorted_rows = con.sql(query).to_arrow_reader(_BATCH)
    try:
        with tqdm(total=ds.rows, desc="writing", unit="rows", disable=not progress, file=sys.stderr) as bar:
            for batch in sorted_rows:
                if not batch.num_rows:
                    continue
                arrays = [by_name[name].from_sorter(batch.column(i)) for i, name in enumerate(schema.names)]
                b = pa.RecordBatch.from_arrays(arrays, schema=schema)
                buf.append(b)
                buffered += b.num_rows
                lead_h = np.concatenate([lead_h, hash_values(b.column(lead_key), lead_seed)])
                if group_h is not None:
                    assert group_by is not None
                    group_h = np.concatenate([group_h, hash_values(b.column(group_by), group_seed)])
                while buffered > row_group_rows:
                    emit(at_end=False)
                bar.update(b.num_rows)
            while buffered:
                emit(at_end=True)
    except BaseException:
        if writer is not None:  # closed here, not by the collector later on a file already removed
            with contextlib.suppress(Exception):
                writer.close()
        raise
    if writer is not None:
        with _writing(written[-1]):
            writer.close()
    con.unregister("detload_src")
    return sizes, sorting, notes


def _serves(sort_keys: list[str], group_by: str | None, blooms: list[str], sorting: list[str]) -> tuple[str, ...]:
    out = []
    if sort_keys and (group_by is None or sorting):
        k = sort_keys[0]
        out.append(f"{k} = v, {k} IN (...), and ranges on {k} (<, <=, >, >=, between): the rows of a value or "
                   "range are contiguous row groups, pruned by min/max statistics")
        for i in range(1, len(sort_keys)):
            prefix = " AND ".join(f"{p} = v" for p in sort_keys[:i])
            out.append(f"{prefix} AND a range on {sort_keys[i]}: contiguous within each value of the prefix")
        if len(sort_keys) > 1:
            out.append(f"{', '.join(sort_keys[1:])} alone: only pruned where row groups hold one {k} value")
    if group_by is not None:
        where = f", groups ordered by {', '.join(sort_keys)}" if sort_keys else ""
        out.append(f"{group_by} = v: each group's rows are contiguous and in one file{where}; a group splits "
                   "across row groups only when it is larger than the row-group size")
    for b in blooms:
        out.append(f"{b} = v and {b} IN (...): also a bloom filter per row group, for readers that probe them")
    return tuple(out)
