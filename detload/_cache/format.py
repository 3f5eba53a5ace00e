"""The entry file format: a checksummed prefix, a JSON header, then 64-byte-aligned C-order arrays.

Writing lays columns out (`_serialize`, `_buffers`); reading checks the prefix and the checksum and turns the
header into views of the file's bytes (`_parse`). Nothing here touches the filesystem; docs/remote.md
("Entry format") describes the bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from .._types import Column, Ragged, UnitColumns

#: Bumped when the entry file format changes; entries live under ``v{CACHE_FORMAT}/``.
CACHE_FORMAT = 1
#: Bumped when convert_column's output changes without a TYPE_MAPPING_VERSION bump.
CONVERTER_VERSION = 1

_MAGIC = b"DLCACHE1"
_PREFIX = struct.Struct("<8sQ16s")  # magic, header length, xxh3-128 of everything after the prefix
_ALIGN = 64
_MARKER = "DETLOAD_CACHE"
_SUFFIX = ".dlc"
_ZEROS = bytes(_ALIGN)


class _Corrupt(Exception):
    pass


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


# -- writing ---------------------------------------------------------------------


class _Laid(NamedTuple):
    """An entry laid out but not yet checksummed (that waits until its room is reserved)."""

    header: bytes  # padded so that the payload starts at a multiple of 64
    pieces: list[np.ndarray]  # the arrays' bytes, in file order
    payload_start: int
    total: int  # the file's size


def _serialize(key: str, cols: Sequence[tuple[str, Column]],
               extra: Mapping[str, Any] | None = None) -> _Laid | None:
    """Lay out an entry of ``cols``; `_buffers` then gives the bytes to write.

    ``extra``: header fields written between ``key`` and ``columns`` (a derived entry's
    identity); a row-group entry has none, so its bytes are those of every earlier version.
    None if the header outgrew the room left for it (never seen).
    """
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

    for name, c in cols:
        if isinstance(c, Ragged) and isinstance(c.values, Ragged):
            # A list of strings: row offsets, string offsets, bytes. Only this detload writes
            # these keys, and only under specs no earlier version has, so the format holds.
            items = c.values
            assert isinstance(items.values, np.ndarray)
            columns.append({"name": name, "kind": "ragged", "ragged_kind": c.kind,
                            "offsets": slot(c.offsets), "item_kind": items.kind,
                            "item_offsets": slot(items.offsets), "values": slot(items.values)})
        elif isinstance(c, Ragged):
            assert isinstance(c.values, np.ndarray)
            columns.append({"name": name, "kind": "ragged", "ragged_kind": c.kind,
                            "offsets": slot(c.offsets), "values": slot(c.values)})
        else:
            columns.append({"name": name, "kind": "fixed", "data": slot(c)})
    header: dict[str, Any] = {"format": CACHE_FORMAT, "key": key, **(extra or {}), "columns": columns, "size": 0}
    # The payload offset depends on the header length, which depends on the offsets:
    # fix the header's size with generous padding, then fill in the real numbers.
    draft = json.dumps(header).encode()
    payload_start = _aligned(_PREFIX.size + len(draft) + 32 + 24 * 3 * len(pieces))
    for entry in columns:
        for k in ("data", "offsets", "item_offsets", "values"):
            if k in entry:
                entry[k][0] += payload_start
    total = payload_start + pos
    header["size"] = total
    hbytes = json.dumps(header).encode()
    if _PREFIX.size + len(hbytes) > payload_start:  # pragma: no cover - padding too small
        return None
    return _Laid(hbytes.ljust(payload_start - _PREFIX.size, b" "), pieces, payload_start, total)


def _buffers(laid: _Laid, checksum: bool = True) -> list[Any]:
    """The bytes of a laid-out entry, prefix (with the checksum, zero without) first, to be
    written back to back."""
    h: Any = xxhash.xxh3_128() if checksum else _NoHash()
    h.update(laid.header)
    body: list[Any] = [laid.header]
    at = laid.payload_start
    for piece in laid.pieces:
        body.append(piece)
        h.update(piece)  # type: ignore[arg-type]
        end = at + piece.nbytes
        pad = _aligned(end - laid.payload_start) + laid.payload_start - end
        if pad and end < laid.total:
            body.append(_ZEROS[:pad])
            h.update(_ZEROS[:pad])
        at = end + pad
    return [_PREFIX.pack(_MAGIC, len(laid.header), h.digest()), *body]


class _NoHash:
    """Stands in for the hash of an entry written without a checksum."""

    def update(self, data: Any) -> None:
        pass

    def digest(self) -> bytes:
        return bytes(16)


# -- reading ---------------------------------------------------------------------

# Parsed "columns" lists of entry headers, by their JSON text. Entries of the same
# columns and row count share that text, so a warm epoch parses only the small
# rest of each header; reading the whole header and making a view per column
# with np.frombuffer was most of the time a worker held the GIL on a cache hit.
# Bounded: cleared when full (ragged columns make the text differ per entry).
# name, data slot, offsets slot or None, ragged kind, and for a list of strings (string offsets slot, their kind)
_Compiled = list[tuple[str, Any, Any, Any, Any]]
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
            out.append((c["name"], _slot(c["data"]), None, "", None))
        else:
            items = (_slot(c["item_offsets"]), c["item_kind"]) if "item_offsets" in c else None
            out.append((c["name"], _slot(c["values"]), _slot(c["offsets"]), c["ragged_kind"], items))
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

    for name, data, offsets, _, _ in cols:
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
    for name, data, offsets, _, items in cols:
        end = data[0] + data[3]
        if items is not None:
            end = max(end, items[0][0] + items[0][3])
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


def _prefix(buf: np.ndarray) -> tuple[int, bytes]:
    """Check an entry's prefix (``buf``: the whole file as uint8); its header length and checksum."""
    magic, hlen, digest = _PREFIX.unpack_from(buf.data, 0)
    if magic != _MAGIC:
        raise _Corrupt("bad magic")
    if _PREFIX.size + hlen > buf.shape[0]:
        raise _Corrupt("header runs past the end")
    return hlen, digest


def _verify(buf: np.ndarray, digest: bytes) -> None:
    if xxhash.xxh3_128_digest(buf[_PREFIX.size:].data) != digest:
        raise _Corrupt("checksum mismatch")


def _parse(buf: np.ndarray, hlen: int, expect: str | None,
           rows: int | None = None) -> tuple[dict[str, Any], UnitColumns, dict[str, int]]:
    """The entry's header (its "columns" may be None), its columns as views of ``buf``
    (no checksum), and where each column ends.

    ``rows``: the row count the plan expects; an entry whose columns hold another
    (written by a version that did not check decoded rows, or damaged) is _Corrupt.
    """
    size = buf.shape[0]
    try:
        header, (columns, runs, ends) = _parse_header(buf[_PREFIX.size:_PREFIX.size + hlen].tobytes())
        if expect is not None and header["key"] != expect:
            raise _Corrupt("entry holds another key")
        if header["size"] != size:
            raise _Corrupt("size differs from the header")
        out = UnitColumns()
        in_runs = out.runs
        for names, off0, dt, n, stride in runs:  # not ``rows``: that is the plan's count
            # Raises TypeError (a damaged header) if the run would reach past the end.
            run = np.ndarray((len(names), n), dtype=dt, buffer=buf, offset=off0, strides=(stride, dt.itemsize))
            for i, name in enumerate(names):
                in_runs[name] = (run, i, names)
        for name, data, offsets, ragged_kind, items in columns:
            r = in_runs.get(name)
            if r is not None:
                out[name] = r[0][r[1]]  # a row of the run: the same bytes, a cheaper view
            elif offsets is None:
                out[name] = _view(buf, data)
            elif items is not None:
                strings = Ragged(_view(buf, data), _view(buf, items[0]), items[1])
                out[name] = Ragged(strings, _view(buf, offsets), ragged_kind)
            else:
                out[name] = Ragged(_view(buf, data), _view(buf, offsets), ragged_kind)
    except (KeyError, TypeError, ValueError) as exc:
        raise _Corrupt(f"bad header ({exc})") from None
    if rows is not None:
        for name, col in out.items():
            if len(col) != rows:
                raise _Corrupt(f"its column {name!r} holds {len(col):,} rows, the row group {rows:,}")
    return header, out, ends


def _view(base: np.ndarray, slot: tuple[int, np.dtype[Any], tuple[int, ...], int]) -> np.ndarray:
    offset, dt, shape, nbytes = slot
    if nbytes == 0:
        return np.empty(shape, dtype=dt)
    if offset < 0 or offset + nbytes > base.shape[0]:
        raise ValueError(f"an array at {offset}+{nbytes} runs past the end")
    a = base[offset : offset + nbytes].view(dt)
    return a if len(shape) == 1 else a.reshape(shape)
