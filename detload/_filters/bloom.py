"""Parquet split-block bloom filters, read and probed without pyarrow's help.

pyarrow writes bloom filters (``bloom_filter_options``) and records where they
lie (``ColumnChunkMetaData.bloom_filter_offset/length``) but cannot read them.
This module parses the Thrift ``BloomFilterHeader`` (compact protocol, only the
fields the format needs) and probes the bitset as the Parquet specification
defines it, so an equality or ``isin`` filter can skip a row group whose
filter rules the values out. Anything unexpected reads as "may contain".
"""

from __future__ import annotations

import os
import re
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import xxhash

from ..errors import OptionError
from .prune import SortedKeys

__all__ = ["BloomReader", "check_bloom_type", "parse_bloom_header", "split_block_contains"]

# The specification's salts: bit i of a block's word i is set from (key * SALT[i]) >> 27.
SALT = np.array(
    [0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31],
    dtype=np.uint64,
)
_BLOCK_BYTES = 32
_MAX_BYTES = 128 * 1024 * 1024  # the specification's upper limit for one filter
_HEADER_GUESS = 64  # a header is ~15 bytes; read this much when its length is not recorded


# -- Thrift compact protocol: just enough to read and skip a header ------------------

class _Compact:
    """A reader over Thrift compact-protocol bytes (fields, varints, nested structs)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ValueError("truncated")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, ftype: int) -> None:
        if ftype in (1, 2):  # booleans live in the type nibble
            return
        if ftype == 3:
            self.byte()
        elif ftype in (4, 5, 6):
            self.varint()
        elif ftype == 7:
            self.take(8)
        elif ftype == 8:
            self.take(self.varint())
        elif ftype in (9, 10):
            head = self.byte()
            size, etype = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                if etype in (1, 2):
                    self.byte()
                else:
                    self.skip(etype)
        elif ftype == 11:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4)
                    self.skip(kv & 0x0F)
        elif ftype == 12:
            self.struct(lambda fid, t: False)
        else:
            raise ValueError(f"unknown compact type {ftype}")

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def struct(self, field: Callable[[int, int], bool]) -> None:
        """Read a struct; ``field(id, type)`` consumes a field it knows and returns True."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, ftype = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            last = fid
            if not field(fid, ftype):
                self.skip(ftype)


def parse_bloom_header(data: bytes) -> tuple[int, int]:
    """``(numBytes, header length)`` of a ``BloomFilterHeader`` at the start of ``data``.

    Raises ValueError unless the filter is the only kind the specification
    defines so far: split blocks (BLOCK), XXHASH, UNCOMPRESSED.
    """
    r = _Compact(data)
    seen: dict[int, Any] = {}

    def union_member(fid: int) -> Callable[[int, int], bool]:
        def read(inner: int, t: int) -> bool:
            if t == 12:
                seen.setdefault(fid, set()).add(inner)
                r.skip(12)
                return True
            return False
        return read

    def top(fid: int, t: int) -> bool:
        if fid == 1 and t == 5:
            seen[1] = r.zigzag()
            return True
        if fid in (2, 3, 4) and t == 12:
            r.struct(union_member(fid))
            return True
        return False

    r.struct(top)
    num_bytes = seen.get(1)
    if not isinstance(num_bytes, int) or num_bytes <= 0 or num_bytes % _BLOCK_BYTES or num_bytes > _MAX_BYTES:
        raise ValueError(f"numBytes {num_bytes!r} is not a positive multiple of {_BLOCK_BYTES} up to 128 MiB")
    for fid, name in ((2, "algorithm BLOCK"), (3, "hash XXHASH"), (4, "compression UNCOMPRESSED")):
        if seen.get(fid) != {1}:
            raise ValueError(f"the filter is not {name}")
    return num_bytes, r.pos


def split_block_contains(bitset: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Which 64-bit ``hashes`` the split-block ``bitset`` (uint32, shape (blocks, 8)) may hold."""
    h = hashes.astype(np.uint64, copy=False)
    blocks = np.uint64(bitset.shape[0])
    index = ((h >> np.uint64(32)) * blocks) >> np.uint64(32)
    key = h & np.uint64(0xFFFFFFFF)
    bit = ((key[:, None] * SALT[None, :]) & np.uint64(0xFFFFFFFF)) >> np.uint64(27)
    mask = (np.uint64(1) << bit).astype(np.uint32)
    words = bitset[index.astype(np.intp)]
    result: np.ndarray = np.all((words & mask) != 0, axis=1)
    return result


# -- values → their PLAIN encoding, the bytes the writer hashed ------------------------

_UNIT_RE = re.compile(r"timeUnit=(milliseconds|microseconds|nanoseconds)")
_UNIT_NS = {"milliseconds": 1_000_000, "microseconds": 1_000, "nanoseconds": 1}

# A key (see `detload._filters.canonical.ColumnStats` for the domain) → every PLAIN encoding an
# equal stored value may have, or None when it cannot be told ("may contain").
Encoder = Callable[[Any], "tuple[bytes, ...] | None"]


def _int_encoder(width: int, step: int = 1) -> Encoder:
    lo, hi = -(1 << (width * 8 - 1)), (1 << (width * 8)) - 1
    mask = (1 << (width * 8)) - 1

    def enc(k: Any) -> tuple[bytes, ...] | None:
        if isinstance(k, bool) or not isinstance(k, int) or k % step:
            return None
        k //= step
        if not lo <= k <= hi:
            return None
        return ((k & mask).to_bytes(width, "little"),)

    return enc


def _float_encoder(fmt: str) -> Encoder:
    def enc(k: Any) -> tuple[bytes, ...] | None:
        if not isinstance(k, (int, float)) or isinstance(k, bool) or k != k:
            return None
        f = float(k)
        b = struct.pack(fmt, f)
        if struct.unpack(fmt, b)[0] != f:
            return None  # not a value of this width
        if f == 0.0:
            return (struct.pack(fmt, 0.0), struct.pack(fmt, -0.0))  # equal, hashed apart
        return (b,)

    return enc


def _bytes_encoder(width: int | None) -> Encoder:
    def enc(k: Any) -> tuple[bytes, ...] | None:
        if isinstance(k, str):
            k = k.encode("utf-8")  # a caller's str: the bytes a string column stores
        if not isinstance(k, bytes) or (width is not None and len(k) != width):
            return None
        return (k,)

    return enc


def _decimal_flba_encoder(width: int) -> Encoder:
    def enc(k: Any) -> tuple[bytes, ...] | None:
        if isinstance(k, bool) or not isinstance(k, int):
            return None
        try:
            return (k.to_bytes(width, "big", signed=True),)
        except OverflowError:
            return None

    return enc


def _supported(t: pa.DataType) -> bool:
    t = t.value_type if pa.types.is_dictionary(t) else t
    return bool(
        pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t)
        or pa.types.is_string(t) or pa.types.is_large_string(t)
        or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
        or pa.types.is_date32(t) or pa.types.is_date64(t) or pa.types.is_timestamp(t)
        or pa.types.is_decimal128(t) or pa.types.is_decimal256(t)
    )


def check_bloom_type(arrow_type: pa.DataType, *, column: str | None = None) -> None:
    """Raise OptionError unless detload can probe a bloom filter on a column of ``arrow_type``."""
    if not _supported(arrow_type):
        what = f"column {column!r} of type {arrow_type}" if column is not None else f"type {arrow_type}"
        raise OptionError(
            f"a bloom filter was requested on {what}; detload probes bloom filters on integer, "
            "float32, float64, string, binary, fixed_size_binary, date, timestamp and decimal columns "
            "(and dictionaries of them): drop the column from the bloom filter list"
        )


def _encoder(col: Any, arrow_type: pa.DataType) -> tuple[Encoder, tuple[Any, ...]] | None:
    """The PLAIN encoder of one Parquet leaf column and what it depends on (equal for equal
    encoders, so that hashes of an ``isin`` list are kept across files), or None when unsupported."""
    if not _supported(arrow_type):
        return None
    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    phys = col.physical_type
    logical = str(col.logical_type)
    if pa.types.is_timestamp(t):
        m = _UNIT_RE.search(logical)
        return (_int_encoder(8, _UNIT_NS[m.group(1)]), ("int", 8, _UNIT_NS[m.group(1)])) if phys == "INT64" and m else None
    if pa.types.is_decimal(t):
        if phys == "INT32":
            return _int_encoder(4), ("int", 4, 1)
        if phys == "INT64":
            return _int_encoder(8), ("int", 8, 1)
        if phys == "FIXED_LEN_BYTE_ARRAY":
            return _decimal_flba_encoder(col.length), ("decimal", col.length)
        return None  # BYTE_ARRAY decimals: the writer picks the byte length
    if phys == "INT32" and (pa.types.is_integer(t) or pa.types.is_date(t)):
        return _int_encoder(4), ("int", 4, 1)
    if phys == "INT64" and pa.types.is_integer(t):
        return _int_encoder(8), ("int", 8, 1)
    if phys == "FLOAT" and pa.types.is_floating(t):
        return _float_encoder("<f"), ("float", "<f")
    if phys == "DOUBLE" and pa.types.is_floating(t):
        return _float_encoder("<d"), ("float", "<d")
    if phys == "BYTE_ARRAY" and not pa.types.is_fixed_size_binary(t) and not pa.types.is_integer(t):
        return _bytes_encoder(None), ("bytes", None)
    if phys == "FIXED_LEN_BYTE_ARRAY" and pa.types.is_fixed_size_binary(t):
        return _bytes_encoder(col.length), ("bytes", col.length)
    return None


_P1, _P2, _P3, _P4, _P5 = (np.uint64(p) for p in (
    0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    out: np.ndarray = (x << np.uint64(r)) | (x >> np.uint64(64 - r))
    return out


def xxh64_words(words: np.ndarray, width: int) -> np.ndarray:
    """XXH64 (seed 0) of each value's ``width`` (4 or 8) little-endian bytes, as `xxhash.xxh64_intdigest`
    gives it, for a whole array at once (the specification's steps for an input under 32 bytes)."""
    x = words.astype(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(x.shape, _P5 + np.uint64(width), dtype=np.uint64)
        if width == 8:
            k = _rotl(x * _P2, 31) * _P1
            h = _rotl(h ^ k, 27) * _P1 + _P4
        else:
            h = _rotl(h ^ (x * _P1), 23) * _P2 + _P3
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return h


def _int_key_hashes(keys: Sequence[Any], width: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`_key_hashes` for `_int_encoder(width, step)`, in NumPy; None when a key is beyond int64."""
    try:
        a = np.array(keys, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return None
    if a.ndim != 1:
        return None
    q = a // step
    ok = a % step == 0
    if width == 4:
        ok &= (q >= -(1 << 31)) & (q <= (1 << 32) - 1)
        words = (q[ok] & 0xFFFFFFFF).astype(np.uint64)
    else:  # every int64 fits 8 bytes; its two's complement is the uint64 view
        words = q[ok].view(np.uint64)
    zero = np.zeros(1, dtype=np.int64)
    return (xxh64_words(words, width), np.concatenate([zero, np.cumsum(ok)]),
            np.concatenate([zero, np.cumsum(~ok)]))


def _key_hashes(encoder: Encoder, keys: Sequence[Any], signature: tuple[Any, ...] = ()
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hashes of every key's encodings, where key ``i``'s lie (``hashes[starts[i]:starts[i + 1]]``)
    and how many keys before ``i`` have no encoding (``unencodable[i]``; such a key may be stored)."""
    if signature[:1] == ("int",) and all(type(k) is int for k in keys):
        got = _int_key_hashes(keys, signature[1], signature[2])
        if got is not None:
            return got
    hashes: list[int] = []
    starts = np.zeros(len(keys) + 1, dtype=np.int64)
    unencodable = np.zeros(len(keys) + 1, dtype=np.int64)
    bad = 0
    for i, k in enumerate(keys):
        encoded = encoder(k)
        if encoded is None:
            bad += 1
        else:
            hashes.extend(xxhash.xxh64_intdigest(b) for b in encoded)
        starts[i + 1] = len(hashes)
        unencodable[i + 1] = bad
    return np.array(hashes, dtype=np.uint64), starts, unencodable


class _RowGroupProbe:
    """`BloomReader.probe`'s answer: ``probe(column, keys)``, and ``sorted_range`` for an ``isin`` list."""

    __slots__ = ("_reader", "_row_group")

    def __init__(self, reader: BloomReader, row_group: int) -> None:
        self._reader = reader
        self._row_group = row_group

    def __call__(self, column: str, values: Sequence[Any]) -> bool:
        return self._reader.might_contain(self._row_group, column, values)

    def sorted_range(self, column: str, keys: SortedKeys, i: int, j: int) -> bool:
        """``probe(column, keys.items[i:j])``, from hashes of the whole list made once per encoding."""
        return self._reader.might_contain_range(self._row_group, column, keys, i, j)


# -- the reader ------------------------------------------------------------------------

class BloomReader:
    """Probe the bloom filters of one Parquet file.

    ``file`` is a path (opened with ``filesystem``, or locally) or an open
    binary file (seek/read, left open); ``metadata`` is its footer. Each
    column chunk's filter is read at most once and kept. Safe to share
    between threads.
    """

    def __init__(
        self,
        file: str | os.PathLike[str] | BinaryIO | Any,
        metadata: pq.FileMetaData,
        *,
        filesystem: pafs.FileSystem | None = None,
    ) -> None:
        self._source = file
        self._filesystem = filesystem
        self._handle: Any = None
        self._owns = False
        self._metadata = metadata
        self._lock = threading.Lock()
        self._filters: dict[tuple[int, int], np.ndarray | None] = {}
        self._hashes: dict[tuple[int, tuple[Any, ...]], np.ndarray | None] = {}
        #: (row group, column) → why its filter was not used, for diagnostics.
        self.skipped: dict[tuple[int, str], str] = {}
        arrow = metadata.schema.to_arrow_schema()
        self._columns: dict[str, tuple[int, Encoder | None, tuple[Any, ...]]] = {}
        for i in range(metadata.num_columns):
            col = metadata.schema.column(i)
            if col.path in arrow.names:
                enc = _encoder(col, arrow.field(col.path).type)
                self._columns[col.path] = (i, None, ()) if enc is None else (i, *enc)

    def __enter__(self) -> BloomReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._owns and self._handle is not None:
                self._handle.close()
            self._handle = None

    def probe(self, row_group: int) -> Callable[[str, Sequence[Any]], bool]:
        """The ``bloom`` callable `Filter.prune` takes, for one row group."""
        return _RowGroupProbe(self, row_group)

    def has_filter(self, row_group: int, column: str) -> bool:
        """Whether the column chunk has a bloom filter detload can probe."""
        return self._probed(row_group, column) is not None

    def might_contain(self, row_group: int, column: str, values: Sequence[Any]) -> bool:
        """False only if the column chunk's bloom filter rules out every one of ``values``.

        ``values`` are in `ColumnStats`' comparison domain (UTF-8 bytes for
        strings, days for dates, nanoseconds for timestamps, unscaled ints for
        decimals). A chunk without a usable filter may contain anything.
        """
        if not len(values):
            return False
        probed = self._probed(row_group, column)
        if probed is None:
            return True
        bitset, index, encoder, _ = probed
        hashes = self._hash(index, encoder, values)
        if hashes is None:
            return True
        return bool(split_block_contains(bitset, hashes).any())

    def might_contain_range(self, row_group: int, column: str, keys: SortedKeys, i: int, j: int) -> bool:
        """`might_contain` of ``keys.items[i:j]``; the list's hashes are made once and kept with it."""
        if i >= j:
            return False
        probed = self._probed(row_group, column)
        if probed is None:
            return True
        bitset, _, encoder, signature = probed
        hashes, starts, unencodable = keys.memo(("bloom", signature),
                                                lambda items: _key_hashes(encoder, items, signature))
        if unencodable[j] != unencodable[i]:
            return True
        # In growing chunks, stopping at the first hit: a long list nearly always has one early
        # (a true member or a false positive), and probing all of it per row group would cost
        # values x row groups again.
        lo, hi, step = int(starts[i]), int(starts[j]), 256
        while lo < hi:
            if split_block_contains(bitset, hashes[lo:min(hi, lo + step)]).any():
                return True
            lo += step
            step = min(step * 2, 65536)
        return False

    def _probed(self, row_group: int, column: str) -> tuple[np.ndarray, int, Encoder, tuple[Any, ...]] | None:
        """(bitset, column index, encoder, signature) of a column chunk whose bloom filter can be
        probed; None where it cannot (no such column, no encoder for its type, no usable filter),
        so the chunk may contain anything."""
        entry = self._columns.get(column)
        if entry is None:
            return None
        index, encoder, signature = entry
        if encoder is None:
            return None
        bitset = self._bitset(row_group, index, column)
        if bitset is None:
            return None
        return bitset, index, encoder, signature

    def _hash(self, index: int, encoder: Encoder, values: Sequence[Any]) -> np.ndarray | None:
        key = (index, tuple(values))
        if key in self._hashes:
            return self._hashes[key]
        out: list[int] = []
        result: np.ndarray | None
        for v in values:
            encoded = encoder(v)
            if encoded is None:
                result = None
                break
            out.extend(xxhash.xxh64_intdigest(b) for b in encoded)
        else:
            result = np.array(out, dtype=np.uint64)
        if len(self._hashes) > 1024:
            self._hashes.clear()
        self._hashes[key] = result
        return result

    def _bitset(self, row_group: int, index: int, column: str) -> np.ndarray | None:
        key = (row_group, index)
        if key in self._filters:
            return self._filters[key]
        with self._lock:
            if key not in self._filters:
                self._filters[key] = self._read(row_group, index, column)
            return self._filters[key]

    def _read(self, row_group: int, index: int, column: str) -> np.ndarray | None:
        cc = self._metadata.row_group(row_group).column(index)
        offset = cc.bloom_filter_offset
        if offset is None or offset <= 0:
            return None
        length = cc.bloom_filter_length
        try:
            head = self._read_at(offset, length if length and length > 0 else _HEADER_GUESS)
            num_bytes, hlen = parse_bloom_header(head)
            if length and length > 0:
                if hlen + num_bytes != length:
                    raise ValueError(f"header and bitset take {hlen + num_bytes} bytes, the footer says {length}")
                bits = head[hlen:]
            else:
                bits = self._read_at(offset + hlen, num_bytes)
            if len(bits) != num_bytes:
                raise ValueError("the file ends inside the bitset")
        except (ValueError, OSError) as e:
            self.skipped[(row_group, column)] = f"bloom filter at offset {offset} unreadable: {e}"
            return None
        return np.frombuffer(bits, dtype="<u4").reshape(-1, 8)

    def _read_at(self, offset: int, n: int) -> bytes:
        if self._handle is None:
            src = self._source
            if isinstance(src, (str, os.PathLike)):
                path = os.fspath(src)
                self._handle = self._filesystem.open_input_file(path) if self._filesystem else open(path, "rb")  # noqa: SIM115
                self._owns = True
            else:
                self._handle = src
        self._handle.seek(offset)
        data = self._handle.read(n)
        return bytes(data)
