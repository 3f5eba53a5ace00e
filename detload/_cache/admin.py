"""The backend of ``detload cache info`` and ``detload cache clear``: what a cache directory
holds (optionally verifying every entry), and deleting every entry of every format."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from typing import Any

from ..errors import OptionError
from .entry import _load
from .format import _MARKER, CACHE_FORMAT, _Corrupt
from .store import _Store, _walk_entries


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
