"""Names in the cache: the folder of one version of one file (`object_key`), and the names
of the entries in it (a row group's, by the hash of what decides its bytes; a derived one's,
by the hash of what derived it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs
import xxhash

from .._storage import object_uri
from .._types import ColumnSpec, type_mapping_version
from .format import _SUFFIX, CACHE_FORMAT, CONVERTER_VERSION


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


def _derived_name(rg: int, ident: bytes) -> str:
    """A derived entry's name: "d" and 16 hex digits never name a row-group entry (16 hex digits)."""
    return f"rg{rg:06d}-d{xxhash.xxh3_64_hexdigest(ident)}{_SUFFIX}"


def specs_key(specs: Sequence[ColumnSpec], null_fill: Mapping[str, Any]) -> str:
    """Hash of what decides the converted bytes besides the file: columns, casts, fills, versions.

    A cast (and the scale or INT96 unit it implies), and a schema drift's promotion, are
    added to their column only where there is one, so that other columns' entries keep
    their keys.
    """
    cols = [s for s in specs if not s.partition]

    def column(s: ColumnSpec) -> list[Any]:
        out: list[Any] = [s.name, s.arrow_type, s.kind, s.dtype, list(s.inner), s.ragged_kind, s.null]
        # A drifted column's entries hold its promoted form (or, in a file that lacks it, its
        # fill): named apart from the entries of the same file read without the drift rule.
        promoted = str(s.promote) if s.promote is not None else None
        extra = {k: v for k, v in (("cast", s.cast), ("scale", s.scale), ("int96", s.int96 or None),
                                   ("item_kind", s.item_kind), ("promoted", promoted),
                                   ("drift", list(s.drift) or None), ("missing", s.missing or None))
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
