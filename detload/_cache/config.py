"""The cache options checked and turned into a `CacheConfig` (`open_cache`), and the
cache's warnings, given once per loader across its worker processes."""

from __future__ import annotations

import os
import socket
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._check import check_cache_dir
from ..errors import CacheWarning
from .format import CACHE_FORMAT
from .sizes import memory_available, parse_size
from .store import _evict_replaced, _prepare, _safe_host, _Store


@dataclass(frozen=True)
class CacheConfig:
    """What a worker needs to use the cache; plain picklable data."""

    root: str  # <Cache.dir>/v<CACHE_FORMAT>
    limit: int | None
    session: str  # one loader: warnings are given once per session
    #: Bytes of entries kept memory-mapped from one pass to the next by a loader's
    #: thread workers together, or by each worker process (``Cache.map_limit``; see KeptMappings).
    map_budget: int = 0
    #: Test hook: act as if the disk were full once this many bytes were written by one worker.
    fail_after_bytes: int | None = None
    #: Entries carry and are checked against an xxh3-128 checksum. Off only for a worker pool's
    #: own scratch cache (the mixed order's shared windows in /dev/shm, gone with the pool),
    #: which no disk or other process writes: hashing every window once per writer and once per
    #: reader was a tenth of a cold epoch's work there.
    checksums: bool = True


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def map_limit(value: int | str | None) -> int:
    """``Cache.map_limit`` in bytes: "auto" is a quarter of `memory_available`; 0 turns it
    off; None sets no byte limit (the cap on the number of mappings remains)."""
    if _is_auto(value):
        return memory_available() // 4
    if value is None:
        return 2**63 - 1
    n = parse_size(value, "Cache.map_limit", zero=True, also="; 'auto' (the default) is also accepted")
    assert n is not None
    return n


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


def open_cache(cache_dir: str | os.PathLike[str], cache_limit: int | str | None,
               objects: Sequence[str], *, cache_map_limit: int | str | None = "auto",
               fail_after_bytes: int | None = None, checksums: bool = True) -> CacheConfig | None:
    """Create the folders of a `detload.Cache`'s ``dir``, evict entries of replaced files, recount usage.

    The arguments are the group's ``dir``, ``limit`` and ``map_limit`` (checked again here,
    under those names); ``objects`` are the `object_key` of every file of the dataset.
    Returns None (after one warning) when the directory cannot be used; loading goes on uncached.
    """
    limit = parse_size(cache_limit, "Cache.limit")
    mapped = map_limit(cache_map_limit)
    base = os.path.abspath(os.path.expanduser(check_cache_dir("Cache.dir", cache_dir)))
    root = os.path.join(base, f"v{CACHE_FORMAT}")
    session = f"{_safe_host(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    cfg = CacheConfig(root, limit, session, map_budget=mapped, fail_after_bytes=fail_after_bytes,
                      checksums=checksums)
    store = _Store(root)
    try:
        _prepare(store)
        with store.locked():
            _evict_replaced(store, objects)
            store.rescan()
    except OSError as exc:
        _warn_once(cfg, "unusable", f"Cache.dir {base!r} cannot be used ({exc}); loading without a cache")
        return None
    return cfg
