"""The row-group cache: converted NumPy arrays of one row group per file, memory-mapped on read.

One cache serves both purposes: a local copy of remote data and a cache of the
Arrow→NumPy conversion, so a warm epoch neither fetches nor decodes. Entries
are stored before the block permutation, so warm and cold runs yield the same
bytes. Layout, policy and the entry format are described in docs/remote.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import math
import mmap
import os
import shutil
import socket
import struct
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow.fs as pafs
import xxhash

from .._engine.shm import pid_alive
from .._storage import object_uri
from .._types import Column, ColumnSpec, Ragged, UnitColumns, type_mapping_version
from ..errors import OptionError

__all__ = [
    "CACHE_FORMAT",
    "CONVERTER_VERSION",
    "CacheConfig",
    "KeptMappings",
    "CacheWarning",
    "RowGroupCache",
    "cache_info",
    "clear_cache",
    "object_key",
    "open_cache",
    "parse_size",
]

#: Bumped when the entry file format changes; entries live under ``v{CACHE_FORMAT}/``.
CACHE_FORMAT = 1
#: Bumped when convert_column's output changes without a TYPE_MAPPING_VERSION bump.
CONVERTER_VERSION = 1

_MAGIC = b"DLCACHE1"
_PREFIX = struct.Struct("<8sQ16s")  # magic, header length, xxh3-128 of everything after the prefix
_ALIGN = 64
_MARKER = "DETLOAD_CACHE"
_SUFFIX = ".dlc"


class CacheWarning(UserWarning):
    """The cache could not be used as asked (corrupt entry, disk full); loading went on."""


@dataclass(frozen=True)
class CacheConfig:
    """What a worker needs to use the cache; plain picklable data."""

    root: str  # <cache_dir>/v<CACHE_FORMAT>
    limit: int | None
    session: str  # one loader: warnings are given once per session
    #: Bytes of entries kept memory-mapped from one pass to the next by a loader's
    #: thread workers together, or by each worker process (``cache_map_limit``; see KeptMappings).
    map_budget: int = 0
    #: Test hook: act as if the disk were full once this many bytes were written by one worker.
    fail_after_bytes: int | None = None


def parse_size(value: int | str | None, name: str = "cache_limit", *, zero: bool = False,
               also: str = "") -> int | None:
    """A size option: bytes as an int, or a string such as "500MB", "20GiB", "1.5T".

    ``zero``: 0 is allowed (it turns the feature off) instead of refused. ``also``:
    appended to the messages that say what a size looks like (other accepted values).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(f"{name} must be a byte count or a size such as '20GiB', got {value!r}{also}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    elif isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        units = {"": 1, "B": 1}
        for i, p in enumerate("KMGT", start=1):
            units[p] = units[p + "B"] = 1000**i
            units[p + "I"] = units[p + "IB"] = 1024**i
        num = text.rstrip("KMGTIB")
        unit = text[len(num):]
        try:
            n = int(float(num) * units[unit])  # "inf" overflows, "nan" is a ValueError
        except (ValueError, KeyError, OverflowError):
            raise OptionError(f"{name} {value!r} is not a size; use bytes or e.g. '500MB', '20GiB'{also}") from None
    else:
        raise OptionError(f"{name} must be a byte count or a size such as '20GiB', got {value!r}{also}")
    if n < 0 or (n == 0 and not zero):
        raise OptionError(f"{name} must be {'0 or more' if zero else 'positive'}, got {value!r}")
    return n


def _cgroup_limits() -> Iterator[str]:
    """Memory limit files of this process's cgroup and of the groups above it (v2, then v1)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            root, name = "/sys/fs/cgroup", "memory.max"
        elif "memory" in controllers.split(","):
            root, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in rel.split("/") if p]
        for i in range(len(parts), -1, -1):
            yield os.path.join(root, *parts[:i], name)


def memory_available() -> int:
    """Physical memory this process may use: the machine's, or a cgroup's limit if lower."""
    total = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for path in _cgroup_limits():
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue  # a group above ours that this namespace does not show
        if text.isdigit():
            total = min(total, int(text))
    return total


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def map_limit(value: int | str | None) -> int:
    """``cache_map_limit`` in bytes: "auto" is a quarter of `memory_available`; 0 turns it
    off; None sets no byte limit (the cap on the number of mappings remains)."""
    if _is_auto(value):
        return memory_available() // 4
    if value is None:
        return 2**63 - 1
    n = parse_size(value, "cache_map_limit", zero=True, also="; 'auto' (the default) is also accepted")
    assert n is not None
    return n


def _h64(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8"))


def object_key(fs: pafs.FileSystem, location: str, size: int, mtime_ns: int | None, etag: str | None) -> str:
    """``<uri hash>/<version hash>``: the folder holding the entries of one version of one file.

    A file's version is its size and ETag (S3) or mtime in nanoseconds; when it
    changes, the entries of the old version are evicted (see `open_cache`).
    """
    uri = object_uri(fs, location)
    version = json.dumps([uri, size, etag if etag is not None else mtime_ns])
    return f"{_h64(uri)}/{_h64(version)}"


def _entry_name(rg: int, specs_key: str) -> str:
    return f"rg{rg:06d}-{specs_key}{_SUFFIX}"


def specs_key(specs: Sequence[ColumnSpec], null_fill: Mapping[str, Any]) -> str:
    """Hash of what decides the converted bytes besides the file: columns, casts, fills, versions.

    A cast (and the scale or INT96 unit it implies) is added to its column only where
    there is one, so that the entries of uncast columns keep their keys.
    """
    cols = [s for s in specs if not s.partition]

    def column(s: ColumnSpec) -> list[Any]:
        out: list[Any] = [s.name, s.arrow_type, s.kind, s.dtype, list(s.inner), s.ragged_kind, s.null]
        extra = {k: v for k, v in (("cast", s.cast), ("scale", s.scale), ("int96", s.int96 or None))
                 if v is not None}
        return [*out, extra] if extra else out

    payload = {
        "columns": [column(s) for s in cols],
        "null_fill": {s.name: repr(null_fill[s.name]) for s in cols if s.name in null_fill},
        "type_mapping": type_mapping_version(cols),
        "converter": CONVERTER_VERSION,
        "format": CACHE_FORMAT,
    }
    return _h64(json.dumps(payload, sort_keys=True))


# -- shared bookkeeping: an fcntl-locked byte counter, no index of entries ------


class _Store:
    """Paths and the locked usage counter of one cache directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.objects = os.path.join(root, "objects")
        self.tmp = os.path.join(root, "tmp")
        self._lock_path = os.path.join(root, "lock")
        self._usage_path = os.path.join(root, "usage")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def usage(self) -> int:
        try:
            with open(self._usage_path, "rb") as f:
                return int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def set_usage(self, n: int) -> None:
        # Written in place under the lock: a few bytes, never torn in practice,
        # and a bad value only mis-sizes the limit until the next rescan.
        fd = os.open(self._usage_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(max(0, n)).encode(), 0)
        finally:
            os.close(fd)

    def release(self, n: int) -> None:
        with self.locked():
            self.set_usage(self.usage() - n)

    def rescan(self) -> int:
        """Recount the bytes on disk (call under the lock); removes temp files of dead writers.

        Files are counted once per inode: a writer links its temp file to the entry's
        name before removing the temp name (without the lock), so for a moment, or
        across the two folders of one scan, the same bytes have both names.
        """
        seen: dict[tuple[int, int], int] = {}
        host = socket.gethostname()
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(self.tmp):
                if _dead_writer(e.name, host):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    seen[(st.st_dev, st.st_ino)] = st.st_size
        for _, _, st in _walk_entries(self.objects):
            seen[(st.st_dev, st.st_ino)] = st.st_size
        total = sum(seen.values())
        self.set_usage(total)
        return total


def _walk_entries(objects: str) -> Iterator[tuple[str, str, os.stat_result]]:
    """(object key, entry path, stat) of every entry file."""
    with contextlib.suppress(FileNotFoundError):
        for a in os.scandir(objects):
            if not a.is_dir():
                continue
            with contextlib.suppress(FileNotFoundError):
                for b in os.scandir(a.path):
                    if not b.is_dir():
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        for e in os.scandir(b.path):
                            if e.name.endswith(_SUFFIX):
                                with contextlib.suppress(FileNotFoundError):
                                    yield f"{a.name}/{b.name}", e.path, e.stat()


def _dead_writer(name: str, host: str) -> bool:
    """Temp and marker names carry ``<host>-<pid>-``; a writer of this host that is gone left them.

    Gone by the rule `_shm.pid_alive` applies to segments: a killed writer stays a zombie
    until its parent reaps it (a second or two for a pool's worker), and its file must not
    outlive it that long, nor count towards the usage of the run that starts meanwhile.
    """
    parts = name.split("-")
    if len(parts) < 3 or parts[0] != _safe_host(host) or not parts[1].isdigit():
        return False
    return not pid_alive(int(parts[1]))


def _safe_host(host: str) -> str:
    return "".join(c for c in host if c.isalnum()) or "host"


# -- warnings: once per loader, across its worker processes ---------------------

_warned: set[tuple[str, str]] = set()


def _warn_once(cfg: CacheConfig, kind: str, message: str) -> None:
    """Warn once per loader session and kind; a marker file in tmp/ tells the other worker processes."""
    key = (cfg.session, kind)
    if key in _warned:
        return
    _warned.add(key)
    marker = os.path.join(cfg.root, "tmp", f"{cfg.session}-warned-{kind}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return
    except OSError:
        pass  # no marker (disk full?): warning in each worker process is the lesser evil
    warnings.warn(message, CacheWarning, stacklevel=3)


# -- the loader-side set-up ------------------------------------------------------


def open_cache(cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None,
               objects: Sequence[str], *, cache_map_limit: int | str | None = "auto",
               fail_after_bytes: int | None = None) -> CacheConfig | None:
    """Validate the options, create the folders, evict entries of replaced files, recount usage.

    ``objects`` are the `object_key` of every file of the dataset. Returns None
    (after one warning) when the directory cannot be used; loading goes on uncached.
    """
    limit = parse_size(cache_limit)
    mapped = map_limit(cache_map_limit)
    if cache_dir is None:
        if cache_limit is not None:
            raise OptionError("cache_limit needs cache_dir")
        if not _is_auto(cache_map_limit):
            raise OptionError("cache_map_limit needs cache_dir")  # None included: it was set
        return None
    if isinstance(cache_dir, bytes) or not isinstance(cache_dir, (str, os.PathLike)):
        raise OptionError(f"cache_dir must be a path (str or os.PathLike), got {cache_dir!r}")
    text = os.fspath(cache_dir)
    if not isinstance(text, str) or not text.strip():
        # "" would make the current directory the cache (an unset $CACHE_DIR in a script).
        raise OptionError(f"cache_dir must name a folder, got {cache_dir!r}")
    base = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(base) and not os.path.isdir(base):
        raise OptionError(f"cache_dir {base!r} exists and is not a directory")
    root = os.path.join(base, f"v{CACHE_FORMAT}")
    session = f"{_safe_host(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    cfg = CacheConfig(root, limit, session, map_budget=mapped, fail_after_bytes=fail_after_bytes)
    store = _Store(root)
    try:
        _prepare(store)
        with store.locked():
            _evict_replaced(store, objects)
            store.rescan()
    except OSError as exc:
        _warn_once(cfg, "unusable", f"cache_dir {base!r} cannot be used ({exc}); loading without a cache")
        return None
    return cfg


def _prepare(store: _Store) -> None:
    """Create the cache's folders and marker (again, if someone deleted them)."""
    os.makedirs(store.objects, exist_ok=True)
    os.makedirs(store.tmp, exist_ok=True)
    marker = os.path.join(os.path.dirname(store.root), _MARKER)
    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(json.dumps({"what": "detload row-group cache", "format": CACHE_FORMAT}) + "\n")


def _evict_replaced(store: _Store, objects: Sequence[str]) -> None:
    """Remove the entries of other versions of the dataset's files (a replaced file)."""
    current: dict[str, set[str]] = {}
    for key in objects:
        uri_h, ver_h = key.split("/")
        current.setdefault(uri_h, set()).add(ver_h)
    for uri_h, keep in current.items():
        folder = os.path.join(store.objects, uri_h)
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(folder):
                if e.name not in keep and e.is_dir():
                    shutil.rmtree(e.path, ignore_errors=True)


def cache_info(cache_dir: str | os.PathLike[str], *, verify: bool = False,
               progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """What a cache directory holds (and, with ``verify``, which entries fail their checksum).
    ``progress(nbytes)`` is called after each entry (the command line's progress display)."""
    base = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    _check_is_cache(base)
    root = os.path.join(base, f"v{CACHE_FORMAT}")
    store = _Store(root)
    objects: set[str] = set()
    entries = 0
    size = 0
    bad: list[str] = []
    for key, path, st in _walk_entries(store.objects):
        objects.add(key.split("/")[0])
        entries += 1
        size += st.st_size
        if verify:
            try:
                _load(path, None)
            except (_Corrupt, OSError):
                bad.append(path)
        if progress is not None:
            progress(st.st_size)
    tmp = 0
    with contextlib.suppress(FileNotFoundError):
        tmp = sum(1 for e in os.scandir(store.tmp) if e.name.endswith(".tmp"))
    formats = sorted(e.name for e in os.scandir(base) if e.is_dir() and e.name.startswith("v"))
    out: dict[str, Any] = {"dir": base, "format": CACHE_FORMAT, "formats_present": formats, "objects": len(objects),
                           "entries": entries, "bytes": size, "usage_counter": store.usage(), "temp_files": tmp}
    if verify:
        out["corrupt"] = bad
    return out


def clear_cache(cache_dir: str | os.PathLike[str]) -> int:
    """Delete every entry (all formats); returns the bytes freed. Safe while no loader writes."""
    base = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    _check_is_cache(base)
    freed = 0
    for e in os.scandir(base):
        if e.is_dir() and e.name.startswith("v") and e.name[1:].isdigit():
            store = _Store(e.path)
            with store.locked():
                freed += sum(st.st_size for _, _, st in _walk_entries(store.objects))
                shutil.rmtree(store.objects, ignore_errors=True)
                os.makedirs(store.objects, exist_ok=True)
                store.rescan()
    return freed


def _check_is_cache(base: str) -> None:
    if not os.path.exists(base):
        raise FileNotFoundError(f"cache directory {base!r} does not exist")
    if not os.path.isdir(base):
        raise OptionError(f"{base!r} is a file, not a cache directory")
    if not os.path.exists(os.path.join(base, _MARKER)):
        raise OptionError(f"{base!r} is not a detload cache directory (no {_MARKER} file); refusing to touch it")


# -- entries -----------------------------------------------------------------------


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


# Parsed "columns" lists of entry headers, by their JSON text. Entries of the same
# columns and row count share that text, so a warm epoch parses only the small
# rest of each header; reading the whole header and making a view per column
# with np.frombuffer was most of the time a worker held the GIL on a cache hit.
# Bounded: cleared when full (ragged columns make the text differ per entry).
_Compiled = list[tuple[str, Any, Any, Any]]  # name, data slot, offsets slot or None, ragged kind
# Runs of same-typed 1-D columns at one stride: names, first offset, dtype, rows, stride.
_Runs = list[tuple[tuple[str, ...], int, np.dtype[Any], int, int]]
_COLUMNS_MEMO: dict[bytes, tuple[_Compiled, _Runs, dict[str, int]]] = {}
_COLUMNS_MEMO_MAX = 256
_COLUMNS_AT = b'"columns": ['
_COLUMNS_END = b'], "size": '


def _slot(slot: list[Any]) -> tuple[int, np.dtype[Any], tuple[int, ...], int]:
    offset, dtype, shape = slot
    dt = np.dtype(dtype)
    shape = tuple(int(x) for x in shape)
    return int(offset), dt, shape, math.prod(shape) * dt.itemsize


def _compile_columns(columns: list[dict[str, Any]]) -> _Compiled:
    out: _Compiled = []
    for c in columns:
        if c["kind"] == "fixed":
            out.append((c["name"], _slot(c["data"]), None, ""))
        else:
            out.append((c["name"], _slot(c["values"]), _slot(c["offsets"]), c["ragged_kind"]))
    return out


def _find_runs(cols: _Compiled) -> _Runs:
    """Consecutive 1-D fixed columns of one dtype and row count spaced at one stride."""
    runs: _Runs = []
    names: list[str] = []
    first: tuple[int, np.dtype[Any], tuple[int, ...], int] | None = None  # slot of the run's first column
    stride = 0

    def close() -> None:
        if first is not None and len(names) > 1 and first[2][0] > 0:
            runs.append((tuple(names), first[0], first[1], first[2][0], stride))

    for name, data, offsets, _ in cols:
        one_d = offsets is None and len(data[2]) == 1
        if first is not None and one_d and data[1] == first[1] and data[2] == first[2]:
            step = data[0] - first[0]
            if len(names) == 1 and step >= first[3]:
                stride = step  # the second column sets the stride
            if stride and data[0] == first[0] + len(names) * stride:
                names.append(name)
                continue
        close()
        names, first, stride = ([name], data, 0) if one_d else ([], None, 0)
    close()
    return runs


def _ends(cols: _Compiled) -> dict[str, int]:
    """Where each column's bytes end in the entry (for PendingCheck)."""
    out = {}
    for name, data, offsets, _ in cols:
        end = data[0] + data[3]
        out[name] = max(end, offsets[0] + offsets[3]) if offsets is not None else end
    return out


def _compile(columns: list[dict[str, Any]]) -> tuple[_Compiled, _Runs, dict[str, int]]:
    compiled = _compile_columns(columns)
    return compiled, _find_runs(compiled), _ends(compiled)


def _parse_header(hb: bytes) -> tuple[dict[str, Any], tuple[_Compiled, _Runs, dict[str, int]]]:
    i = hb.find(_COLUMNS_AT)
    j = hb.rfind(_COLUMNS_END)
    if i < 0 or j < i:  # not the layout our writer makes: parse it all
        header = json.loads(hb)
        return header, _compile(header["columns"])
    text = hb[i + len(_COLUMNS_AT) - 1 : j + 1]
    hit = _COLUMNS_MEMO.get(text)
    if hit is None:
        hit = _compile(json.loads(text))
        if len(_COLUMNS_MEMO) >= _COLUMNS_MEMO_MAX:
            _COLUMNS_MEMO.clear()
        _COLUMNS_MEMO[text] = hit
    return json.loads(hb[:i] + b'"columns": null' + hb[j + 1 :]), hit


class PendingCheck:
    """An entry's checksum, verified in file order as the block reads its columns.

    Reading a warm entry's 3 MB twice from memory (once to hash it, once to copy
    it into the block) cost a sixth of a warm block's time. With a pending check
    the block hashes each group of columns just before it copies them, so the copy
    reads them from the CPU cache, and `finish` must pass before the block is handed over;
    if it fails the block is rebuilt from the source (see _worker._produce).
    """

    def __init__(self, buf: np.ndarray, digest: bytes, size: int, ends: dict[str, int], path: str) -> None:
        self._buf = buf
        self._digest = digest
        self._size = size
        self._pos = _PREFIX.size
        self._h = xxhash.xxh3_128()
        self.ends = ends  # column name -> where its bytes end in the entry
        self.path = path

    def upto(self, end: int) -> None:
        """Hash the entry's bytes up to ``end`` (no-op for what was hashed already)."""
        if end > self._pos:
            self._h.update(self._buf[self._pos : end].data)
            self._pos = end

    def finish(self) -> bool:
        self.upto(self._size)
        return self._h.digest() == self._digest


class _Mapping(NamedTuple):
    """An entry file's mapping, and which file it maps (to tell when the name moved on)."""

    buf: np.ndarray  # the whole file, read-only uint8
    ident: tuple[int, int]  # st_dev, st_ino

    @property
    def size(self) -> int:
        return int(self.buf.shape[0])


class _Entry(NamedTuple):
    """A mapped entry with its parsed header and column views (what KeptMappings keeps)."""

    mapping: _Mapping
    hlen: int
    digest: bytes
    cols: UnitColumns
    ends: dict[str, int]


# Entries are mapped with libc's mmap rather than Python's: mmap.mmap keeps a
# duplicate of the file descriptor open for as long as the mapping lives (until
# Python 3.13's trackfd=False), so keeping thousands of entries mapped ran a
# process out of descriptors ("Too many open files"). A mapping made here holds
# none; it is unmapped when the last array viewing it is gone.
_libc: Any = None
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux


def _libc_mmap() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_long]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = lib
    return _libc


class _Unmap:
    """Unmaps a region when collected; referenced by the region's ctypes buffer."""

    __slots__ = ("addr", "lib", "size")

    def __init__(self, lib: Any, addr: int, size: int) -> None:
        self.lib, self.addr, self.size = lib, addr, size

    def __del__(self) -> None:
        self.lib.munmap(self.addr, self.size)


def _mmap_read(fd: int, size: int) -> np.ndarray:
    """The first ``size`` bytes of ``fd`` mapped read-only (shared) as a uint8 array; keeps no descriptor."""
    lib = _libc_mmap()
    # Populated at once: the checksum reads every page right after, and setting up all
    # page-table entries in one call is a little cheaper than a fault per 64 KiB.
    addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_POPULATE, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    raw = _char_array(size).from_address(addr)
    raw._unmap = _Unmap(lib, addr, size)  # type: ignore[attr-defined]  # lives as long as the buffer
    # A read-only buffer: NumPy then refuses to make any view of it writable (PROT_READ
    # memory would crash the process on a write instead of raising).
    return np.frombuffer(memoryview(raw).toreadonly().cast("B"), dtype=np.uint8)


_ARRAY_TYPES: dict[int, Any] = {}


def _char_array(size: int) -> Any:
    """``ctypes.c_char * size``, made once per size (a new ctypes type costs ~12 us)."""
    t = _ARRAY_TYPES.get(size)
    if t is None:
        if len(_ARRAY_TYPES) >= 1024:
            _ARRAY_TYPES.clear()
        t = _ARRAY_TYPES[size] = ctypes.c_char * size
    return t


def _map(path: str) -> _Mapping | None:
    """Map an entry file read-only; None if it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size < _PREFIX.size:
            raise _Corrupt(f"{st.st_size} bytes, shorter than the entry prefix")
        buf = _mmap_read(fd, st.st_size)
    finally:
        os.close(fd)
    return _Mapping(buf, (st.st_dev, st.st_ino))


def _prefix(mapping: _Mapping) -> tuple[int, bytes]:
    """Check an entry's prefix; its header length and checksum."""
    magic, hlen, digest = _PREFIX.unpack_from(mapping.buf.data, 0)
    if magic != _MAGIC:
        raise _Corrupt("bad magic")
    if _PREFIX.size + hlen > mapping.size:
        raise _Corrupt("header runs past the end")
    return hlen, digest


def _verify(mapping: _Mapping, digest: bytes) -> None:
    if xxhash.xxh3_128_digest(mapping.buf[_PREFIX.size:].data) != digest:
        raise _Corrupt("checksum mismatch")


def _parse(mapping: _Mapping, hlen: int, expect: str | None,
           rows: int | None = None) -> tuple[UnitColumns, dict[str, int]]:
    """The entry's columns as views of its mapping (no checksum), and where each ends.

    ``rows``: the row count the plan expects; an entry whose columns hold another
    (written by a version that did not check decoded rows, or damaged) is _Corrupt.
    """
    base, size = mapping.buf, mapping.size
    try:
        header, (columns, runs, ends) = _parse_header(base[_PREFIX.size:_PREFIX.size + hlen].tobytes())
        if expect is not None and header["key"] != expect:
            raise _Corrupt("entry holds another key")
        if header["size"] != size:
            raise _Corrupt("size differs from the header")
        out = UnitColumns()
        in_runs = out.runs
        for names, off0, dt, rows, stride in runs:
            # Raises TypeError (a damaged header) if the run would reach past the end.
            run = np.ndarray((len(names), rows), dtype=dt, buffer=base, offset=off0, strides=(stride, dt.itemsize))
            for i, name in enumerate(names):
                in_runs[name] = (run, i, names)
        for name, data, offsets, ragged_kind in columns:
            r = in_runs.get(name)
            if r is not None:
                out[name] = r[0][r[1]]  # a row of the run: the same bytes, a cheaper view
            elif offsets is None:
                out[name] = _view(base, data)
            else:
                out[name] = Ragged(_view(base, data), _view(base, offsets), ragged_kind)
    except (KeyError, TypeError, ValueError) as exc:
        raise _Corrupt(f"bad header ({exc})") from None
    if rows is not None:
        for name, col in out.items():
            if len(col) != rows:
                raise _Corrupt(f"its column {name!r} holds {len(col):,} rows, the row group {rows:,}")
    return out, ends


def _entry(mapping: _Mapping, expect: str | None, defer: bool, kept: _Entry | None = None,
           rows: int | None = None) -> _Entry:
    """Check the prefix (re-read on every use: the checksum does not cover it) and, unless
    ``defer``, the checksum; then parse the header, or reuse ``kept`` (an earlier parse of
    this mapping, whose row count was checked then) if the prefix is still the one it was
    parsed from."""
    hlen, digest = _prefix(mapping)
    if not defer:
        _verify(mapping, digest)
    if kept is not None and hlen == kept.hlen and digest == kept.digest:
        return kept
    # First mapped, or another entry written into the same file: parse it.
    return _Entry(mapping, hlen, digest, *_parse(mapping, hlen, expect, rows))


def _checked(entry: _Entry, path: str, defer: bool) -> UnitColumns:
    """The entry's columns for one read: verified already, or (``defer``) carrying a `PendingCheck`."""
    cols = entry.cols
    out = UnitColumns(cols)
    out.runs = cols.runs
    if defer:
        m = entry.mapping
        out.check = PendingCheck(m.buf, entry.digest, m.size, entry.ends, path)
    return out


def _load(path: str, expect: str | None, *, defer: bool = False) -> dict[str, Column] | None:
    """The columns of an entry, memory-mapped; None if missing; raises _Corrupt if damaged.

    With ``defer`` the checksum is not computed here: the result carries a
    `PendingCheck` as ``.check``, which the caller must finish before using
    anything built from the columns.
    """
    mapping = _map(path)
    if mapping is None:
        return None
    return _checked(_entry(mapping, expect, defer), path, defer)


def _view(base: np.ndarray, slot: tuple[int, np.dtype[Any], tuple[int, ...], int]) -> np.ndarray:
    offset, dt, shape, nbytes = slot
    if nbytes == 0:
        return np.empty(shape, dtype=dt)
    if offset < 0 or offset + nbytes > base.shape[0]:
        raise ValueError(f"an array at {offset}+{nbytes} runs past the end")
    a = base[offset : offset + nbytes].view(dt)
    return a if len(shape) == 1 else a.reshape(shape)


_ZEROS = bytes(_ALIGN)
try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))  # buffers one call takes (1024 on Linux)
except (AttributeError, ValueError, OSError):  # pragma: no cover
    _IOV_MAX = 16  # the least POSIX allows
_HAS_PWRITEV = hasattr(os, "pwritev")


def _pwritev_all(fd: int, buffers: list[Any], at: int) -> None:
    """Write ``buffers`` back to back from offset ``at``, in as few calls as the system allows."""
    views = [v for v in (memoryview(b).cast("B") for b in buffers) if v.nbytes]
    i = 0
    while i < len(views):
        n = (os.pwritev(fd, views[i:i + _IOV_MAX], at) if _HAS_PWRITEV
             else os.pwrite(fd, views[i], at))  # pragma: no cover - platforms without pwritev
        if n <= 0:  # never for a regular file; a loop that never ends if it were
            raise OSError(errno.EIO, "a write to a cache entry made no progress")
        at += n
        while i < len(views) and n >= views[i].nbytes:  # skip what was written whole
            n -= views[i].nbytes
            i += 1
        if n:  # a short write ended inside this buffer
            views[i] = views[i][n:]


class _Corrupt(Exception):
    pass


class _DiskFull(Exception):
    pass


def _max_map_count() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530  # Linux's default


# Kept mappings of every table in this process: each is one memory area, and
# vm.max_map_count caps those per process, whatever the loaders.
_KEPT_COUNT = [0]
_KEPT_COUNT_LOCK = threading.Lock()


class KeptMappings:
    """The cache entries one process keeps mapped from one pass to the next.

    Mapping an entry anew each epoch cost page-table work for every 4 KiB page
    -- the faults during the first read and the unmapping after it -- which was
    about a quarter of a warm CTR block's CPU time. Up to ``budget`` bytes are
    kept; the first ones mapped stay (like the entries under ``cache_limit``).
    Each mapping is one of the process's memory areas, which Linux caps
    (``vm.max_map_count``, 65,530 by default), so the tables of one process keep
    at most a quarter of that many together. Thread workers share their loader's
    table, so each entry is mapped once per loader. A kept mapping is used only
    while its path still names the same file, and its checksum is verified on
    every read as before, so a deleted, replaced or damaged entry is treated
    exactly as without it.
    """

    def __init__(self, budget: int, max_count: int | None = None) -> None:
        self.budget = budget
        self.max_count = _max_map_count() // 4 if max_count is None else max_count
        self.nbytes = 0
        self._kept: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, path: str) -> _Entry | None:
        """The kept entry of ``path`` if the name still holds that file (a stat, ~2 us)."""
        k = self._kept.get(path)
        if k is None or not self._still_there(path, k):
            return None
        return k

    def _still_there(self, path: str, k: _Entry) -> bool:
        m = k.mapping
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != m.ident or st.st_size != m.size:
            self.forget(path)  # deleted (evicted, cleared, found damaged) or written anew
            return False
        return True

    def revalidate(self) -> None:
        """Drop the entries whose file is gone or replaced, so that their disk space is freed
        now rather than when this process next reads them (process workers: a few epochs on)."""
        for path, k in list(self._kept.items()):
            self._still_there(path, k)

    def offer(self, path: str, kept: _Entry) -> None:
        """Keep ``kept`` (in place of an older mapping of ``path``) if it fits."""
        size = kept.mapping.size
        with self._lock:
            self._drop(path)
            if self._closed or self.nbytes + size > self.budget:
                return
            with _KEPT_COUNT_LOCK:
                if _KEPT_COUNT[0] >= self.max_count:
                    return
                _KEPT_COUNT[0] += 1
            self._kept[path] = kept
            self.nbytes += size

    def _drop(self, path: str) -> None:  # under self._lock
        k = self._kept.pop(path, None)
        if k is not None:
            self.nbytes -= k.mapping.size
            with _KEPT_COUNT_LOCK:
                _KEPT_COUNT[0] -= 1

    def forget(self, path: str) -> None:
        with self._lock:
            self._drop(path)

    def close(self) -> None:
        """Drop every kept mapping (each goes when the last view of it does); keep no more."""
        with self._lock:
            self._closed = True
            for path in list(self._kept):
                self._drop(path)


class RowGroupCache:
    """One worker's handle on the cache: `get` a row group's columns or `put` them.

    ``kept``: the process's `KeptMappings` when workers share one (threads); by
    default the cache keeps its own, dropped by `close`.
    """

    def __init__(self, cfg: CacheConfig, specs: Sequence[ColumnSpec], null_fill: Mapping[str, Any],
                 kept: KeptMappings | None = None) -> None:
        self.cfg = cfg
        self.store = _Store(cfg.root)
        self.specs = [s for s in specs if not s.partition]
        self._ragged = any(s.kind == "ragged" for s in self.specs)
        self.specs_key = specs_key(specs, null_fill)
        self.writes_on = True
        self._written = 0
        self.hits = 0
        self.misses = 0
        self._own_kept = kept is None
        self.kept = KeptMappings(cfg.map_budget) if kept is None else kept

    def close(self) -> None:
        if self._own_kept:
            self.kept.close()

    def new_pass(self) -> None:
        """A process worker's own table: let go of entries deleted since (their disk space)."""
        if self._own_kept:
            self.kept.revalidate()

    def _path(self, obj: str, rg: int) -> str:
        return os.path.join(self.store.objects, obj, _entry_name(rg, self.specs_key))

    def _key(self, obj: str, rg: int) -> str:
        return f"{obj}/{_entry_name(rg, self.specs_key)}"

    def get(self, obj: str, rg: int, uri: str, *, defer: bool = False,
            rows: int | None = None) -> dict[str, Column] | None:
        """The row group's columns, or None. With ``defer``, a hit carries a `PendingCheck`
        that `settle` must pass before anything built from it is used. An entry whose
        columns do not hold ``rows`` rows (the plan's count) is discarded as damaged: the
        row group is read from the source again, whose own check then says what is wrong."""
        path = self._path(obj, rg)
        # Offsets of variable-length columns steer copies and sizes: those entries are
        # verified before use. A damaged fixed-width value only changes data, which the
        # deferred check catches before the block is handed over.
        defer = defer and not self._ragged
        try:
            kept = self.kept.get(path)
            mapping = kept.mapping if kept is not None else _map(path)
            if mapping is None:
                self.misses += 1
                return None
            entry = _entry(mapping, self._key(obj, rg), defer, kept, rows)
            if entry is not kept:
                self.kept.offer(path, entry)
        except _Corrupt as exc:
            self._damaged(path, rg, uri, str(exc))
            self.misses += 1
            return None
        except OSError:
            self.kept.forget(path)
            self.misses += 1
            return None  # unreadable (EIO, permissions): read the source instead
        self.hits += 1
        return _checked(entry, path, defer)

    def settle(self, cols: Mapping[str, Column], rg: int, uri: str) -> bool:
        """Finish a deferred check; a damaged entry is discarded (and reported once)."""
        check: PendingCheck | None = getattr(cols, "check", None)
        if check is None or check.finish():
            return True
        self.hits -= 1
        self._damaged(check.path, rg, uri, "checksum mismatch")
        return False

    def _damaged(self, path: str, rg: int, uri: str, why: str) -> None:
        self.kept.forget(path)
        self._discard(path)
        _warn_once(self.cfg, "corrupt",
                   f"cache entry {path} (row group {rg} of {uri}) is damaged ({why}); it was "
                   "discarded and the row group read again. Further damaged entries are handled "
                   "the same way without another warning.")

    def _discard(self, path: str) -> None:
        try:
            with self.store.locked():
                size = os.stat(path).st_size
                os.unlink(path)
                self.store.set_usage(self.store.usage() - size)
        except OSError:
            pass

    def put(self, obj: str, rg: int, cols: Mapping[str, Column], uri: str) -> None:
        if not self.writes_on:
            return
        try:
            try:
                self._write(obj, rg, cols)
            except FileNotFoundError:
                # The cache folder was deleted while the loader ran (rm -rf): make it again
                # (once; another worker may be at it too) rather than load uncached for the
                # rest of the loader's life.
                _prepare(self.store)
                self._write(obj, rg, cols)
        except _DiskFull as exc:
            self.writes_on = False
            _warn_once(self.cfg, "full",
                       f"the cache directory {os.path.dirname(self.cfg.root)} is full ({exc}); "
                       "loading goes on without writing to the cache (entries already there are still used)")
        except OSError as exc:
            self.writes_on = False
            _warn_once(self.cfg, "write",
                       f"cannot write to the cache directory {os.path.dirname(self.cfg.root)} ({exc}); "
                       "loading goes on without writing to the cache")

    def _write(self, obj: str, rg: int, cols: Mapping[str, Column]) -> None:
        final = self._path(obj, rg)
        if os.path.exists(final):
            return
        # Lay out: prefix, header (padded), then each array at a 64-byte boundary.
        pieces: list[np.ndarray] = []
        columns: list[dict[str, Any]] = []
        pos = 0  # relative to the payload start, fixed below

        def slot(a: np.ndarray) -> list[Any]:
            nonlocal pos
            start = pos
            pieces.append(_flat_bytes(a))
            pos = _aligned(pos + a.nbytes)
            return [start, np.dtype(a.dtype).str, list(a.shape)]

        for s in self.specs:
            c = cols[s.name]
            if isinstance(c, Ragged):
                columns.append({"name": s.name, "kind": "ragged", "ragged_kind": c.kind,
                                "offsets": slot(c.offsets), "values": slot(c.values)})
            else:
                columns.append({"name": s.name, "kind": "fixed", "data": slot(c)})
        header: dict[str, Any] = {"format": CACHE_FORMAT, "key": self._key(obj, rg), "columns": columns, "size": 0}
        # The payload offset depends on the header length, which depends on the offsets:
        # fix the header's size with generous padding, then fill in the real numbers.
        draft = json.dumps(header).encode()
        payload_start = _aligned(_PREFIX.size + len(draft) + 32 + 24 * 3 * len(pieces))
        for entry in columns:
            for k in ("data", "offsets", "values"):
                if k in entry:
                    entry[k][0] += payload_start
        total = payload_start + pos
        header["size"] = total
        hbytes = json.dumps(header).encode()
        if _PREFIX.size + len(hbytes) > payload_start:  # pragma: no cover - padding too small
            return
        hbytes = hbytes.ljust(payload_start - _PREFIX.size, b" ")
        if self.cfg.fail_after_bytes is not None and self._written + total > self.cfg.fail_after_bytes:
            raise _DiskFull("[test hook] " + os.strerror(errno.ENOSPC))
        tmp = self._reserve(total)
        if tmp is None:
            return  # over cache_limit: what is cached stays, this row group is not added
        try:
            h = xxhash.xxh3_128()
            h.update(hbytes)
            body: list[Any] = [hbytes]
            at = payload_start
            for piece in pieces:
                body.append(piece)
                h.update(piece)  # type: ignore[arg-type]
                end = at + piece.nbytes
                pad = _aligned(end - payload_start) + payload_start - end
                if pad and end < total:
                    body.append(_ZEROS[:pad])
                    h.update(_ZEROS[:pad])
                at = end + pad
            fd = os.open(tmp, os.O_WRONLY)
            try:
                # One vectored write of the whole entry: the page cache then holds it in
                # large folios, which a later mapping sets up in a few page-table entries
                # (2 MiB ones where the kernel can) instead of one per 4 KiB page.
                _pwritev_all(fd, [_PREFIX.pack(_MAGIC, len(hbytes), h.digest()), *body], 0)
            finally:
                os.close(fd)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            try:
                os.link(tmp, final)  # atomic, and never replaces an entry another writer made
            except FileExistsError:
                self.store.release(total)
            except FileNotFoundError:
                self.store.release(total)  # the folder was evicted meanwhile
        except OSError as exc:
            self.store.release(total)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _DiskFull(os.strerror(exc.errno)) from None
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._written += total

    def _reserve(self, n: int) -> str | None:
        """Under the lock: check the limit, create a temp file holding ``n`` bytes of disk, count them."""
        if self.cfg.limit is not None and n > self.cfg.limit:
            # Not a full cache: this entry could never fit, which would otherwise go unseen.
            _warn_once(self.cfg, "small",
                       f"cache_limit ({self.cfg.limit:,} bytes) is smaller than a row group's cache entry "
                       f"({n:,} bytes): such row groups are never cached")
            return None
        with self.store.locked():
            used = self.store.usage()
            if self.cfg.limit is not None and used + n > self.cfg.limit:
                return None
            host = _safe_host(socket.gethostname())
            tmp = os.path.join(self.store.tmp, f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                try:
                    os.posix_fallocate(fd, 0, n)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        os.close(fd)
                        fd = -1
                        os.unlink(tmp)
                        raise _DiskFull(os.strerror(exc.errno)) from None
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.ftruncate(fd, n)
            finally:
                if fd >= 0:
                    os.close(fd)
            self.store.set_usage(used + n)
        return tmp
