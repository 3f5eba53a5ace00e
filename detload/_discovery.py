"""Dataset discovery: which files and row groups a source holds, their schema, and a fingerprint.

Reads footers only. Works for local paths, globs, lists of files and any
pyarrow (or fsspec, wrapped) filesystem. Everything the planner needs comes out
as plain data in `Dataset`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import os
import posixpath
import re
import sys
import types
import urllib.parse
import warnings
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash

from ._check import check_no_nul
from ._drift import ColumnDrift, column_drift, zone_mix
from ._storage import describe_attempts, display_uri, object_uri, path_on, s3_from_uri
from ._types import INT96_UNIT, ColumnSpec, column_spec
from .errors import (
    DatasetError,
    EmptyDatasetError,
    OptionError,
    SkippedFilesWarning,
    SourceError,
    TimeZoneWarning,
    UnfinishedLayoutWarning,
)

__all__ = ["Dataset", "FileInfo", "SkippedFilesWarning", "UNFINISHED_LAYOUT", "UnfinishedLayoutWarning", "discover",
           "Source"]

#: What ``Loader`` and ``discover`` accept as a source.
Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

_DATA_SUFFIXES = (".parquet", ".parq", ".pq")
#: Name endings (compared in lower case) of the copies and unfinished writes that editors, copy
#: tools and writers leave beside data files: a ``part-0.parquet.bak`` starts with PAR1 but is
#: not data. A listed folder or a glob skips them with SkippedFilesWarning; a file named
#: explicitly is read whatever its name (docs/determinism.md, "Units").
BACKUP_SUFFIXES = (".bak", ".backup", ".old", ".orig", ".tmp", ".temp", ".part", ".partial", ".swp", "~")
_INT_RE = re.compile(r"^-?[0-9]+$")
#: The marker `detload layout` keeps in the folder it is still writing (detload/_layout/rewrite.py).
UNFINISHED_LAYOUT = "_detload_layout_unfinished.json"






def describe_skipped(skipped: Sequence[str]) -> str:
    """``"2 files skipped: 1 .csv, 1 .txt"``: how many, and of which kinds (by suffix)."""
    kinds: dict[str, int] = {}
    for rel in skipped:
        name = posixpath.basename(rel)
        suffix = "~" if name.endswith("~") else posixpath.splitext(name)[1].lower() or "without suffix"
        kinds[suffix] = kinds.get(suffix, 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return f"{len(skipped)} file{'s' if len(skipped) != 1 else ''} skipped: {parts}"


def is_backup(name: str) -> bool:
    """Whether a file name ends in one of BACKUP_SUFFIXES."""
    return name.lower().endswith(BACKUP_SUFFIXES)


def skipped_why(skipped: Sequence[str], detail: bool = False) -> str:
    """Why the files ``skipped`` were skipped: ``"not Parquet"``, ``"backup or temporary copies"`` or both."""
    backups = sum(is_backup(posixpath.basename(rel)) for rel in skipped)
    why = []
    if backups < len(skipped):
        why.append("not Parquet" + (" (no .parquet/.parq/.pq suffix, no Parquet magic)" if detail else ""))
    if backups:
        why.append("backup or temporary copies" + (f" (names ending in {', '.join(BACKUP_SUFFIXES)}; name such a "
                                                    "file in the source to read it)" if detail else ""))
    return ", or ".join(why)


@dataclass(frozen=True)
class FileInfo:
    """One data file: ``path`` relative to the dataset root (POSIX form), ``location`` as the filesystem names it."""

    path: str
    location: str
    size: int
    mtime_ns: int | None
    row_groups: tuple[int, ...]
    partition_values: tuple[tuple[str, str], ...] = ()
    #: The object's ETag where the filesystem reports one (S3); with size and
    #: mtime it identifies this version of the file for the cache.
    etag: str | None = None


@dataclass(frozen=True)
class Dataset:
    """Files in canonical order (relative paths compared as UTF-8 bytes), schema and units."""

    root: str
    files: tuple[FileInfo, ...]
    schema: pa.Schema = field(repr=False)
    partition_types: tuple[tuple[str, str], ...]
    filesystem: pafs.FileSystem = field(repr=False)
    fingerprint: str
    file_schemas: tuple[pa.Schema, ...] = field(default=(), repr=False, compare=False)
    #: Columns stored as Parquet INT96 in some file (Spark's legacy timestamps): their
    #: schema type is timestamp[us], the unit they are read at (_types.INT96_UNIT).
    int96: frozenset[str] = frozenset()
    #: Per file (as ``files``): its columns stored as INT96, which its schema types as
    #: timestamp[us] without a zone whatever the writer meant (UTC or local times).
    file_int96: tuple[tuple[str, ...], ...] = field(default=(), repr=False, compare=False)
    #: Files in a listed folder that are not Parquet (a stray CSV), relative to ``root``;
    #: side files (_SUCCESS, *.crc, _metadata, hidden files) are not counted.
    skipped: tuple[str, ...] = field(default=(), compare=False)

    @property
    def rows(self) -> int:
        return sum(sum(f.row_groups) for f in self.files)

    @property
    def partition_keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.partition_types)

    def units(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file index, row-group index, rows) of every non-empty row group, canonical order."""
        fi, rg, rows = [], [], []
        for i, f in enumerate(self.files):
            for g, n in enumerate(f.row_groups):
                if n > 0:
                    fi.append(i)
                    rg.append(g)
                    rows.append(n)
        return (np.array(fi, dtype=np.int64), np.array(rg, dtype=np.int64), np.array(rows, dtype=np.int64))

    def column_names(self) -> list[str]:
        """Every column a loader can ask for: the schema's, then those only some later files
        hold (schema drift: loaded with a fill), then the Hive partition columns."""
        return [*self.schema.names, *self.later_columns(), *self.partition_keys]

    @functools.cached_property
    def _schema_groups(self) -> tuple[tuple[pa.Schema, tuple[str, ...]], ...]:
        """The distinct schemas (names and types) of the files with rows, first seen first,
        each with its files: drift is decided per schema, not per file (thousands of files
        usually share a few schemas)."""
        groups: dict[tuple[tuple[str, str], ...], tuple[pa.Schema, list[str]]] = {}
        ids: dict[int, list[str]] = {}  # files written alike share one schema object
        for f, s in zip(self.files, self.file_schemas):
            if not sum(f.row_groups):
                continue
            paths = ids.get(id(s))
            if paths is None:
                key = tuple((fld.name, str(fld.type)) for fld in s)
                paths = ids[id(s)] = groups.setdefault(key, (s, []))[1]
            paths.append(f.path)
        return tuple((s, tuple(paths)) for s, paths in groups.values())

    def later_columns(self) -> list[str]:
        """Columns that files with rows hold but the reference file lacks, in file order."""
        known = set(self.schema.names)
        out: list[str] = []
        for s, _ in self._schema_groups:
            for name in s.names:
                if name not in known:
                    known.add(name)
                    out.append(name)
        return out

    def drift(self, name: str) -> ColumnDrift | None:
        """How the files with rows disagree on column ``name`` (None: they agree, the common case)."""
        groups = self._schema_groups
        if len(groups) < 2:
            return None
        return column_drift(name, groups)

    def column_type(self, name: str) -> pa.DataType:
        """The Arrow type column ``name`` is read as: its promoted type where files drift."""
        d = self.drift(name)
        if d is not None and d.promoted is not None:
            return d.promoted
        if name in self.schema.names:
            return self.schema.field(name).type
        assert d is not None, name
        return d.types[0][0]

    def typed_schema(self) -> pa.Schema:
        """Every stored column with the type it is read as (a refused drift keeps the
        reference file's type): what a filter is typed against."""
        return pa.schema([pa.field(n, self.column_type(n)) for n in [*self.schema.names, *self.later_columns()]])

    def specs(self, columns: Sequence[str] | None, cast: Mapping[str, str] | None = None,
              filled: Collection[str] = ()) -> list[ColumnSpec]:
        """How each requested column is delivered; listed order, partition columns last.

        ``cast`` maps a column to a dtype from `normalize_cast` (the Loader's ``cast=``);
        ``filled`` names the columns with a null_fill, which may be missing from some files.
        """
        available = self.column_names()
        if columns is None:
            wanted = [*self.schema.names, *self.partition_keys]
        else:
            if isinstance(columns, str):
                raise OptionError(f"columns must be a list of names, got the string {columns!r}")
            if not isinstance(columns, Sequence) or isinstance(columns, bytes):  # a set has no order
                raise OptionError(f"columns must be a list of names or None, got {type(columns).__name__} {columns!r}")
            wanted = list(columns)
            if not wanted:
                raise OptionError("columns=[] selects nothing; pass None for every column")
            unknown = [c for c in wanted if c not in available]
            if unknown:
                raise DatasetError(
                    f"unknown column(s) {unknown}; the dataset has {available}"
                )
            dup = sorted({c for c in wanted if wanted.count(c) > 1})
            if dup:
                raise OptionError(f"columns lists {dup} more than once")
            keys = set(self.partition_keys)
            wanted = [c for c in wanted if c not in keys] + [c for c in wanted if c in keys]
        cast = dict(cast or {})
        unknown_cast = [k for k in cast if k not in wanted]
        if unknown_cast:
            raise OptionError(f"cast names {unknown_cast}, which are not among the loaded columns {wanted}")
        drifts = self.check_drift([c for c in wanted if c not in self.partition_keys], filled)
        self.warn_zone_mix([c for c in wanted if c not in self.partition_keys])
        ptypes = dict(self.partition_types)
        out = []
        for name in wanted:
            if name in ptypes:
                if name in cast:
                    raise OptionError(
                        f"cast[{name!r}]: {name!r} is a Hive partition column, typed {ptypes[name]} from its "
                        "folder names; cast applies to columns stored in the files (type a partition "
                        "column with storage=detload.Storage(partition_types={...}) instead)"
                    )
                t = pa.int64() if ptypes[name] == "int64" else pa.string()
                out.append(column_spec(name, t, partition=True))
                continue
            d = drifts.get(name)
            if d is None:
                out.append(column_spec(name, self.schema.field(name).type, cast=cast.get(name),
                                       int96=name in self.int96))
                continue
            assert d.promoted is not None
            spec = column_spec(name, d.promoted, cast=cast.get(name), int96=name in self.int96)
            # Each file's values are cast to the promoted type before conversion (the reader).
            out.append(dataclasses.replace(
                spec, promote=d.promoted,
                drift=tuple(str(t) for t, _, _ in d.types) if d.retyped else (), missing=bool(d.missing)))
        return out

    def warn_zone_mix(self, names: Sequence[str]) -> None:
        """A `TimeZoneWarning` for each of ``names`` that is a timestamp with a time zone in some
        files and none in others (`_drift.zone_mix`). A file storing the column as INT96 counts
        as neither: its values are UTC instants from Spark, local times from Impala or Hive."""
        groups = self._schema_groups
        if len(groups) < 2:  # every file types every column alike: no mix
            return
        for name in names:
            int96 = (frozenset(f.path for f, cols in zip(self.files, self.file_int96) if name in cols)
                     if name in self.int96 else frozenset())
            text = zone_mix(name, groups, int96)
            if text is not None:
                warnings.warn(text, TimeZoneWarning, stacklevel=_caller_level())

    def check_drift(self, names: Sequence[str], filled: Collection[str] = ()) -> dict[str, ColumnDrift]:
        """The drift of each of ``names`` that files disagree on (ignoring nullability), promoted
        by the rule of `_drift.promote`; SchemaMismatchError for a drift it refuses, and for a
        column some files lack that ``filled`` does not name."""
        out = {}
        for name in names:
            d = self.drift(name)
            if d is None:
                continue
            if d.promoted is None:
                raise d.refusal()
            if d.missing and name not in filled:
                raise d.missing_error()
            out[name] = d
        return out


def _caller_level() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller point at the first frame
    outside detload (the user's ``Loader(...)`` line), however deep in planning it is raised,
    so that the user's warning filters and Python's once-per-place rule see their own code."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    level = 1
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _reference(files: Sequence[FileInfo]) -> int:
    """Index of the file whose schema is the dataset's: the first one holding rows."""
    return next((i for i, f in enumerate(files) if sum(f.row_groups) > 0), 0)


def _to_filesystem(filesystem: Any) -> pafs.FileSystem | None:
    if filesystem is None or isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:  # an fsspec filesystem
        from fsspec import AbstractFileSystem  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - fsspec absent
        AbstractFileSystem = None
    if AbstractFileSystem is not None and isinstance(filesystem, AbstractFileSystem):
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    raise OptionError(
        f"filesystem must be a pyarrow.fs.FileSystem or an fsspec filesystem, got {type(filesystem).__name__}"
    )


def _resolve(path: str, filesystem: pafs.FileSystem | None,
             stall_timeout: float | None = None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        return filesystem, path_on(filesystem, path)
    if path.startswith(("s3://", "s3a://")):
        try:
            return s3_from_uri(path, stall_timeout)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DatasetError(f"cannot open {path!r}: {exc}") from None
    if "://" in path and not path.startswith("file://"):
        try:
            return pafs.FileSystem.from_uri(path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise DatasetError(f"cannot open {path!r}: {exc}") from None
    if path.startswith("file://"):
        path = path[len("file://") :]
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _hidden(rel: str) -> bool:
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def _is_parquet_magic(fs: pafs.FileSystem, location: str) -> bool:
    try:
        with fs.open_input_file(location) as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def _list_source(source: Any, filesystem: pafs.FileSystem | None, skipped: list[str] | None = None,
                 stall_timeout: float | None = None) -> tuple[pafs.FileSystem, str, list[tuple[str, int, int | None]]]:
    """(filesystem, root, [(location, size, mtime_ns)]) of the data files a source names;
    ``skipped`` collects the locations of non-Parquet files found in listed folders;
    ``stall_timeout`` bounds the requests of an S3 filesystem opened here (see `s3_from_uri`)."""
    if isinstance(source, (str, os.PathLike)):
        items = [os.fspath(source)]
        single = True
    elif isinstance(source, Sequence) and source:
        items = [os.fspath(s) for s in source]
        single = False
    else:
        raise OptionError(f"source must be a path, a glob, a URI or a non-empty list of them, got {source!r}")
    for n, item in enumerate(items):
        if isinstance(item, str):
            check_no_nul("source" if single else f"source[{n}]", item)
    fs: pafs.FileSystem | None = None
    locations: list[str] = []
    for item in items:
        ifs, loc = _resolve(item, filesystem, stall_timeout)
        if fs is None:
            fs = ifs
        elif type(ifs) is not type(fs):
            raise OptionError("all files of a list must live on the same filesystem")
        locations.append(loc)
    assert fs is not None
    try:
        return _list_locations(fs, locations, single, skipped)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        # Network, permissions, endpoint: name what was listed and the retry budget.
        what = ", ".join(object_uri(fs, loc) for loc in locations)
        raise SourceError(f"cannot list {what}{describe_attempts(fs)}: {exc}") from exc


def _list_locations(fs: pafs.FileSystem, locations: list[str], single: bool, skipped: list[str] | None = None,
                    ) -> tuple[pafs.FileSystem, str, list[tuple[str, int, int | None]]]:
    found: list[tuple[str, int, int | None]] = []
    named_by: dict[str, int] = {}  # each file found: the item of the list that reached it first
    root: str | None = None
    unfinished: set[str] = set()  # folders that hold an unfinished layout's marker

    def info_of(fi: pafs.FileInfo) -> tuple[str, int, int | None]:
        mt = fi.mtime_ns if fi.mtime is not None else None
        return fi.path, int(fi.size or 0), mt

    def add(item: int, entries: list[tuple[str, int, int | None]]) -> None:
        # pyarrow reads a file a list names twice twice; reading it once would differ silently.
        for entry in entries:
            first = named_by.setdefault(entry[0], item)
            if first != item:
                raise OptionError(
                    f"source[{first}] and source[{item}] both name the file {display_uri(fs, entry[0])!r}: a list "
                    "source must reach each file once (a folder and a file in it, or two globs, count too); "
                    "remove the duplicate")
        found.extend(entries)

    for item, loc in enumerate(locations):
        if any(ch in loc for ch in "*?["):
            base = loc
            while any(ch in base for ch in "*?["):
                base = posixpath.dirname(base)
            sel = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
            hits = [fi for fi in sel if fi.type == pafs.FileType.File and fnmatch.fnmatchcase(fi.path, loc)]
            if not hits:
                raise FileNotFoundError(f"the glob {display_uri(fs, loc)!r} matches no file")
            if not is_backup(loc):  # a glob that ends in a backup suffix asks for those copies
                backups = [fi.path for fi in hits if is_backup(posixpath.basename(fi.path))]
                if len(backups) == len(hits):
                    raise DatasetError(
                        f"the glob {display_uri(fs, loc)!r} matches only backup or temporary copies (names ending "
                        f"in {', '.join(BACKUP_SUFFIXES)}), e.g. {display_uri(fs, min(backups))!r}; a glob skips "
                        "them: name the files themselves to read them")
                if skipped is not None:
                    skipped.extend(backups)
                hits = [fi for fi in hits if not is_backup(posixpath.basename(fi.path))]
            hit_dirs = {posixpath.dirname(fi.path) for fi in hits}
            unfinished.update(posixpath.dirname(fi.path) for fi in sel
                              if posixpath.basename(fi.path) == UNFINISHED_LAYOUT and posixpath.dirname(fi.path) in hit_dirs)
            if single:
                # The folder above the first wildcard, so key=value folders the
                # glob walks through stay partition columns.
                root = base
            add(item, [info_of(fi) for fi in hits])
            continue
        fi = fs.get_file_info(loc)
        if fi.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"dataset path {display_uri(fs, loc)!r} does not exist")
        if fi.type == pafs.FileType.Directory:
            if single:
                root = fi.path
            sel = fs.get_file_info(pafs.FileSelector(fi.path, recursive=True))
            data = []
            for s in sel:
                if s.type != pafs.FileType.File:
                    continue
                rel = posixpath.relpath(s.path, fi.path)
                if posixpath.basename(rel) == UNFINISHED_LAYOUT and not _hidden(posixpath.dirname(rel)):
                    unfinished.add(posixpath.dirname(s.path))
                if _hidden(rel) or s.path.endswith(".crc"):
                    continue
                if is_backup(posixpath.basename(rel)):
                    if skipped is not None:
                        skipped.append(s.path)
                    continue
                if s.path.endswith(_DATA_SUFFIXES) or _is_parquet_magic(fs, s.path):
                    data.append(info_of(s))
                elif skipped is not None:
                    skipped.append(s.path)
            if not data:
                raise DatasetError(
                    f"no Parquet data files under {display_uri(fs, loc)!r} (looked for *.parquet, *.parq, *.pq "
                    "and files starting with the Parquet magic; hidden and _-prefixed files and backup or "
                    "temporary copies such as *.bak, *.tmp, *~ are skipped)"
                )
            add(item, data)
        else:
            add(item, [info_of(fi)])
            if isinstance(fs, pafs.LocalFileSystem) and os.path.exists(posixpath.join(posixpath.dirname(fi.path),
                                                                                       UNFINISHED_LAYOUT)):
                unfinished.add(posixpath.dirname(fi.path))
    for folder in sorted(unfinished):
        warnings.warn(UnfinishedLayoutWarning(
            f"{display_uri(fs, folder)} holds {UNFINISHED_LAYOUT}: it is the output of a `detload layout` run that "
            "was interrupted, failed or is still running, so its files may be incomplete and were never checked "
            "against their source. Read the finished layout instead (rerunning the layout removes this folder)"),
            stacklevel=2)
    if root is None:
        parents = [posixpath.dirname(p) for p, _, _ in found]
        root = posixpath.commonpath(parents) if parents[0].startswith("/") else _common_prefix_dir(parents)
    return fs, root, found


def _common_prefix_dir(paths: list[str]) -> str:
    split = [p.split("/") for p in paths]
    out = []
    for parts in zip(*split):
        if all(x == parts[0] for x in parts):
            out.append(parts[0])
        else:
            break
    return "/".join(out)


def _partition_values(rel: str) -> tuple[tuple[str, str], ...]:
    vals = []
    for part in rel.split("/")[:-1]:
        if "=" in part:
            k, v = part.split("=", 1)
            vals.append((urllib.parse.unquote(k), urllib.parse.unquote(v)))
    return tuple(vals)


class _Footer(NamedTuple):
    """What discovery keeps of one file's footer."""

    metadata: pq.FileMetaData
    etag: str | None  # where the filesystem reports one (S3 does)
    schema: pa.Schema  # as detload reads the file: INT96 columns as timestamp[us]
    int96: tuple[str, ...]  # the top-level columns holding INT96 values


def _read_footer(fs: pafs.FileSystem, location: str) -> _Footer:
    """The footer of one data file, read as the workers will read the file."""
    try:
        with fs.open_input_file(location) as f:
            pf = pq.ParquetFile(f, coerce_int96_timestamp_unit=INT96_UNIT)
            md = pf.metadata
            return _Footer(md, _etag(f), pf.schema_arrow, _int96_columns(md, pf.schema_arrow))
    except FileNotFoundError:
        raise FileNotFoundError(f"data file {location!r} vanished while the dataset was listed") from None
    except (OSError, pa.ArrowException) as exc:
        if isinstance(exc, OSError) and _is_storage_error(exc):
            raise SourceError(f"cannot read the footer of {object_uri(fs, location)}{describe_attempts(fs)}: "
                              f"{exc}") from exc
        detail = " ".join(str(exc).split()).rstrip(". ")  # one line, without a period of its own
        if _ends_with_magic(fs, location):
            what = f"its footer is damaged ({detail})"
        else:
            what = (f"it does not end with the Parquet magic bytes, so it is truncated (an interrupted "
                    f"write or copy?) or not a Parquet file ({detail})")
        raise DatasetError(
            f"cannot read the Parquet footer of {display_uri(fs, location)!r}: {what}. "
            "Remove or rewrite it, or leave it out of the source."
        ) from None


def _int96_columns(md: pq.FileMetaData, schema: pa.Schema) -> tuple[str, ...]:
    """Top-level columns with an INT96 leaf: those whose type the coercion to INT96_UNIT changed."""
    pschema = md.schema
    if not any(pschema.column(i).physical_type == "INT96" for i in range(len(pschema))):
        return ()
    written = pschema.to_arrow_schema()  # INT96 as pyarrow reads it by default: timestamp[ns]
    return tuple(a.name for a, b in zip(written, schema) if not a.type.equals(b.type))


def leaf_columns(md: pq.FileMetaData, names: Sequence[str]) -> list[int]:
    """The column-chunk indices of the top-level columns ``names``: a nested column has
    several leaves (``a.list.element``); a name matches its own path and those below it."""
    wanted = set(names)
    out = []
    pschema = md.schema
    for j in range(len(pschema)):
        path = pschema.column(j).path
        if path in wanted or any(path.startswith(n + ".") for n in wanted):
            out.append(j)
    return out


def chunk_bytes(md: pq.FileMetaData, rg: int, leaves: Sequence[int]) -> int:
    """The stored (compressed) bytes of row group ``rg``'s column chunks ``leaves``, from the
    footer: what a read of those columns fetches, page headers and dictionaries included."""
    group = md.row_group(rg)
    return sum(group.column(j).total_compressed_size for j in leaves)


def _ends_with_magic(fs: pafs.FileSystem, location: str) -> bool:
    """A complete Parquet file ends with PAR1 (after a footer length): tells truncated from damaged."""
    try:
        with fs.open_input_file(location) as f:
            size = f.size()
            if size < 12:
                return False
            f.seek(size - 4)
            return f.read(4) == b"PAR1"
    except (OSError, pa.ArrowException):
        return False


def _is_storage_error(exc: OSError) -> bool:
    """The storage failed (network, permissions), as opposed to a malformed file, which
    pyarrow also reports as OSError ("Couldn't deserialize thrift")."""
    if isinstance(exc, (ConnectionError, TimeoutError, PermissionError)):
        return True
    text = str(exc)
    return "AWS Error" in text or "curlCode" in text


def _etag(f: Any) -> str | None:
    try:
        meta = f.metadata()
    except (AttributeError, OSError, pa.ArrowException):
        return None
    for key, value in (meta or {}).items():
        if str(key).lower() == "etag":
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            return text.strip('"') or None
    return None


def discover(
    source: Any,
    *,
    filesystem: Any = None,
    partitioning: Mapping[str, str] | None = None,
    footer_threads: int = 16,
    footers: list[pq.FileMetaData] | None = None,
    stall_timeout: float | None = None,
) -> Dataset:
    """List a source's data files and read their footers.

    ``partitioning`` fixes Hive partition column types ({"key": "int64" | "string"});
    without it a key is int64 when every value found is an integer, else string.
    ``footers``, a list, receives each file's footer (in the order of ``files``), so that
    planning a filter need not read them again; the Dataset keeps none (footers of many
    files take much memory). ``stall_timeout``, a loader's, sets the timeouts of an S3
    filesystem opened for an s3:// source, so that a stalled request ends soon after the
    loader gave up on it (None: the default timeouts, 10 s and 60 s).
    """
    skipped: list[str] = []
    fs, root, listed = _list_source(source, _to_filesystem(filesystem), skipped, stall_timeout)
    rels = []
    for loc, size, mt in listed:
        rel = posixpath.relpath(loc, root) if root else loc
        rels.append((rel, loc, size, mt))
    rels.sort(key=lambda r: r[0].encode("utf-8"))
    with ThreadPoolExecutor(max_workers=max(1, min(footer_threads, len(rels)))) as ex:
        metas = list(ex.map(lambda r: _read_footer(fs, r[1]), rels))
    files: list[FileInfo] = []
    schemas: list[pa.Schema] = []
    int96: set[str] = set()
    file_int96: list[tuple[str, ...]] = []
    if footers is not None:
        footers.extend(m.metadata for m in metas)
    for (rel, loc, size, mt), foot in zip(rels, metas):
        md, s = foot.metadata, foot.schema
        # Files written alike share one schema object: drift checks then cost nothing.
        schemas.append(schemas[0] if schemas and s.equals(schemas[0]) else s)
        rg = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
        files.append(FileInfo(rel, loc, size, mt, rg, _partition_values(rel), foot.etag))
        file_int96.append(foot.int96)
        if sum(rg):
            int96.update(foot.int96)
    # The first file with rows defines the schema (an empty file's may be all null types).
    ref = _reference(files)
    schema = _plain(schemas[ref])
    ptypes = _partition_types(files, schema, partitioning)
    if not any(n > 0 for f in files for n in f.row_groups):
        if len(files) == 1 and isinstance(source, (str, os.PathLike)) and _names_file(files[0].location, source):
            raise EmptyDatasetError(f"the file {object_uri(fs, files[0].location)!r} has no rows: "
                                    "it holds no non-empty row group")
        raise EmptyDatasetError(
            f"the dataset at {display_uri(fs, root)!r} has no rows: its {len(files)} file(s) hold no non-empty row group"
        )
    # The fingerprint sees the types as written (INT96 as pyarrow's default timestamp[ns]),
    # so that reading INT96 at another unit changed the type mapping, not the dataset.
    written = _plain(metas[ref].metadata.schema.to_arrow_schema()) if metas[ref].int96 else schema
    fp = _fingerprint(files, written, ptypes)
    rel_skipped = tuple(sorted((posixpath.relpath(p, root) if root else p for p in skipped),
                               key=lambda r: r.encode("utf-8")))
    return Dataset(root, tuple(files), schema, ptypes, fs, fp, tuple(schemas), int96=frozenset(int96),
                   file_int96=tuple(file_int96), skipped=rel_skipped)


def _plain(schema: pa.Schema) -> pa.Schema:
    """Names and types only: no metadata, no nullability."""
    return pa.schema([pa.field(f.name, f.type) for f in schema])


def _names_file(location: str, source: Any) -> bool:
    """Whether the source named this one file itself (not a folder or glob holding only it)."""
    text = os.fspath(source)
    if any(ch in text for ch in "*?["):
        return False
    if text.startswith("file://"):
        text = text[len("file://"):]
    return text == location or os.path.abspath(text) == location or text.endswith("/" + location.lstrip("/"))


def _partition_types(
    files: Sequence[FileInfo], schema: pa.Schema, explicit: Mapping[str, str] | None
) -> tuple[tuple[str, str], ...]:
    keysets = {tuple(k for k, _ in f.partition_values) for f in files}
    if len(keysets) > 1:
        raise DatasetError(
            f"files sit under different Hive partition keys {sorted(keysets)}; every file needs the same key=value folders"
        )
    keys = next(iter(keysets)) if keysets else ()
    explicit = dict(explicit or {})
    for k, t in explicit.items():
        if k not in keys:
            raise OptionError(f"Storage.partition_types names {k!r}, but the partition keys found are {list(keys)}")
        if t not in ("int64", "string"):
            raise OptionError(f"Storage.partition_types[{k!r}] must be 'int64' or 'string', got {t!r}")
    out = []
    for i, k in enumerate(keys):
        if k in schema.names:
            raise DatasetError(f"Hive partition key {k!r} is also a column inside the files")
        values = [f.partition_values[i][1] for f in files]
        t = explicit.get(k) or ("int64" if all(_INT_RE.match(v) for v in values) else "string")
        if t == "int64":
            bad = [v for v in values if not _INT_RE.match(v)]
            if bad:
                raise DatasetError(f"partition key {k!r} is typed int64 but has value {bad[0]!r}")
        out.append((k, t))
    return tuple(out)


def _fingerprint(files: Sequence[FileInfo], schema: pa.Schema, ptypes: Sequence[tuple[str, str]]) -> str:
    payload = {
        "files": [[f.path, f.size, list(f.row_groups)] for f in files],
        "schema": [[fld.name, str(fld.type)] for fld in schema],
        "partitions": [list(p) for p in ptypes],
    }
    return xxhash.xxh3_128_hexdigest(json.dumps(payload, sort_keys=True).encode())
