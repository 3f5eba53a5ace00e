"""An order-independent content digest of a dataset: its row count and a 128-bit value.

Every value is hashed to 64 bits, seeded by its column's name; the columns' hashes are mixed into one
hash per row, and the row hashes are summed in two lanes, so any permutation of rows, row groups or
files gives the same digest while a changed, lost or duplicated row changes it. docs/layout.md gives
the definition exactly, with a NumPy + xxhash recomputation; this module is its vectorised form.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from .._discovery import discover
from .._storage import display_uri
from ..errors import DatasetError, OptionError, UnsupportedTypeError

__all__ = ["Digest", "digest", "hash_values"]

_U64 = np.uint64
_M1 = _U64(0xBF58476D1CE4E5B9)  # splitmix64's finaliser (Stafford's "mix13")
_M2 = _U64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15
_LANE2 = _U64(0xD6E8FEB86659FD93)
_MASK = (1 << 64) - 1
#: The label whose xxh3 (seeded by a list's or string's seed) seeds its items.
_ITEMS = b"[]"
_NULL = b"null"
#: Rows hashed per step: the arrays of one column stay in the CPU's cache between passes.
_CHUNK = 65_536
#: _KEEP[k] keeps the low k bytes of a little-endian word.
_KEEP = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [_MASK], _U64)


@dataclass(frozen=True)
class Digest:
    """The row count and the 128-bit digest (32 hex digits: lane 1, then lane 2)."""

    rows: int
    value: str

    def __str__(self) -> str:
        return f"{self.rows} rows, digest {self.value}"

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "digest": self.value}


# -- the mixer ----------------------------------------------------------------------------------------

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array (a bijection of 64-bit words)."""
    t = x >> _U64(30)
    x ^= t
    x *= _M1
    np.right_shift(x, _U64(27), out=t)
    x ^= t
    x *= _M2
    np.right_shift(x, _U64(31), out=t)
    x ^= t
    return x


def mix64(v: int) -> int:
    """The same finaliser on one Python int (for seeds and constants)."""
    v &= _MASK
    v ^= v >> 30
    v = (v * 0xBF58476D1CE4E5B9) & _MASK
    v ^= v >> 27
    v = (v * 0x94D049BB133111EB) & _MASK
    return v ^ (v >> 31)


def column_seed(name: str) -> int:
    """The seed of a top-level column: xxh3-64 of its UTF-8 name."""
    return xxhash.xxh3_64_intdigest(name.encode("utf-8"))


def _child_seed(label: bytes, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(label, seed=seed)


def _null_hash(seed: int) -> int:
    return xxhash.xxh3_64_intdigest(_NULL, seed=seed)


# -- per-value hashes ------------------------------------------------------------------------------------

def hash_values(arr: pa.Array | pa.ChunkedArray, seed: int) -> np.ndarray:
    """The 64-bit hash of every value of ``arr`` (uint64, one per row), under ``seed``.

    A column's seed is ``column_seed(name)``. Nulls hash to ``xxh3_64(b"null", seed)`` at every level.
    """
    if isinstance(arr, pa.ChunkedArray):
        parts = [_hash(c, seed) for c in arr.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, _U64)
    return _hash(arr, seed)


def _valid_mask(arr: pa.Array) -> np.ndarray | None:
    """True where a value is null, or None when there is no null."""
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _with_nulls(h: np.ndarray, arr: pa.Array, seed: int) -> np.ndarray:
    null = _valid_mask(arr)
    if null is not None:
        h[null] = _U64(_null_hash(seed))
    return h


def _words_fixed(arr: pa.Array) -> np.ndarray:
    """One 64-bit word per value of a fixed-width type of at most 8 bytes (a fresh array).

    Signed integers and the temporal types are sign-extended, unsigned ones zero-extended, floats
    give their bit pattern (so -0.0 differs from 0.0 and NaN payloads count), booleans 0 or 1.
    """
    t = arr.type
    n = len(arr)
    buf = arr.buffers()[1]
    if pa.types.is_boolean(t):
        first, last = arr.offset // 8, (arr.offset + n + 7) // 8  # only the bytes of this slice
        bits = np.unpackbits(np.frombuffer(buf, np.uint8, count=last)[first:], bitorder="little")
        skip = arr.offset % 8
        return bits[skip : skip + n].astype(_U64)
    width = t.bit_width // 8
    if pa.types.is_floating(t) or pa.types.is_unsigned_integer(t):
        dt = np.dtype(f"<u{width}")
    else:
        dt = np.dtype(f"<i{width}")
    vals = np.frombuffer(buf, dt, count=arr.offset + n)[arr.offset :]
    if dt.kind == "i":
        return vals.astype(np.int64).view(_U64)
    return vals.astype(_U64)


def _is_word_type(t: pa.DataType) -> bool:
    """Types hashed as one 64-bit word per value: booleans, integers, floats, dates, times, timestamps, durations."""
    return (pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
            or (pa.types.is_temporal(t) and not pa.types.is_interval(t)))


def _byte_width_type(t: pa.DataType) -> bool:
    """Fixed-width types hashed as byte strings of their width (decimals, fixed_size_binary, intervals)."""
    return pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t) or pa.types.is_interval(t)


def _hash(arr: pa.Array, seed: int) -> np.ndarray:
    t = arr.type
    n = len(arr)
    if isinstance(t, pa.BaseExtensionType):
        return _hash(arr.storage, seed)
    if pa.types.is_dictionary(t):
        # The decoded value's hash, computed once per dictionary entry.
        dict_h = _hash(arr.dictionary, seed)
        idx = _words_fixed(arr.indices) if n else np.zeros(0, _U64)
        h = dict_h[idx.view(np.int64)] if len(dict_h) else np.zeros(n, _U64)
        return _with_nulls(h, arr, seed)
    if pa.types.is_null(t):
        return np.full(n, _null_hash(seed), _U64)
    if _is_word_type(t):
        h = _words_fixed(arr)
        h ^= _U64(seed)
        return _with_nulls(_mix(h), arr, seed)
    if _byte_width_type(t):
        w = t.byte_width
        data = np.frombuffer(arr.buffers()[1], np.uint8, count=(arr.offset + n) * w)[arr.offset * w :]
        offsets = np.arange(n + 1, dtype=np.int64) * w
        return _with_nulls(_hash_bytes(data, offsets, seed), arr, seed)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _hash(arr.cast(pa.large_binary()), seed)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        odt = np.int64 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], odt, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
        data_buf = arr.buffers()[2]
        start = int(offsets[0]) if n else 0
        end = int(offsets[-1]) if n else 0
        data = (np.frombuffer(data_buf, np.uint8, count=end)[start:] if data_buf is not None and end > start
                else np.zeros(0, np.uint8))
        return _with_nulls(_hash_bytes(data, offsets - start, seed), arr, seed)
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return _hash(arr.cast(pa.large_list(t.value_field)), seed)
    if pa.types.is_map(t):
        # A map is hashed as a list of struct<key, value>, whatever its fields are called.
        offs = np.asarray(arr.offsets, dtype=np.int64)
        entries = arr.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
        s_items = _child_seed(_ITEMS, seed)
        kh = _hash(entries.field(0), _child_seed(b"key", s_items))
        kh += _hash(entries.field(1), _child_seed(b"value", s_items))
        return _with_nulls(_sequence(_mix(kh), offs - offs[0], seed), arr, seed)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        child = arr.values.slice(arr.offset * size, n * size)
        ch = _hash(child, _child_seed(_ITEMS, seed))
        if size == 0:
            s = np.zeros(n, _U64)
        else:
            s = (ch.reshape(n, size) * _weights(seed, size)).sum(axis=1, dtype=_U64)
        return _with_nulls(_finish_sequence(s, np.full(n, size, np.int64), seed), arr, seed)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offs = np.asarray(arr.offsets, dtype=np.int64)
        child = arr.values.slice(int(offs[0]), int(offs[-1] - offs[0]))
        ch = _hash(child, _child_seed(_ITEMS, seed))
        return _with_nulls(_sequence(ch, offs - offs[0], seed), arr, seed)
    if pa.types.is_struct(t):
        acc = np.zeros(n, _U64)
        for i in range(t.num_fields):
            acc += _hash(arr.field(i), _child_seed(t.field(i).name.encode("utf-8"), seed))
        return _with_nulls(_mix(acc), arr, seed)
    if pa.types.is_run_end_encoded(t):
        import pyarrow.compute as pc

        return _hash(pc.run_end_decode(arr), seed)
    raise UnsupportedTypeError(
        f"the digest has no rule for the Arrow type {t} (unions cannot be stored in Parquet); "
        "leave that column out or convert it"
    )


def _weights(seed: int, count: int) -> np.ndarray:
    """Position weights P_j = mix(seed + golden * (j + 1)) | 1, j = 0 .. count-1 (odd, so invertible)."""
    j = np.arange(1, count + 1, dtype=_U64)
    j *= _U64(_GOLDEN)
    j += _U64(seed)
    return _mix(j) | _U64(1)


def _finish_sequence(s: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
    """A sequence's hash from its weighted item sum S and its length L: mix(S ^ mix(L ^ seed))."""
    lh = lengths.astype(_U64)
    lh ^= _U64(seed)
    s ^= _mix(lh)
    return _mix(s)


def _few_words(n: int, longest: int, words: int) -> bool:
    """Whether to hash strings a word position at a time (one pass per position over all strings).

    Short strings are the common case; a pass per position then avoids per-word index arrays.
    Measured on 7-19 byte strings: about 1.6x faster than per word. (For lists, whose items are
    hashed already, the per-item sum stays faster even for short lists.)
    """
    return longest <= 8 and n * longest <= 2 * (words + n)


def _sequence(items: np.ndarray, offsets: np.ndarray, seed: int, length: np.ndarray | None = None) -> np.ndarray:
    """Hash of each segment [offsets[i], offsets[i+1]) of ``items``: sum of item * P_position, then length.

    ``items`` is consumed; ``length`` is what the hash counts as each segment's length (default:
    its item count).
    """
    lengths = np.diff(offsets)
    counted = lengths if length is None else length
    n = len(lengths)
    m = len(items)
    if not m:
        return _finish_sequence(np.zeros(n, _U64), counted, seed)
    weights = _weights(seed, int(lengths.max()))
    positions = np.arange(m, dtype=np.int64)
    positions -= np.repeat(offsets[:-1], lengths)
    items *= weights[positions]
    cs = np.empty(m + 1, _U64)
    cs[0] = 0
    np.cumsum(items, out=cs[1:])
    s = cs[offsets[1:]]
    s -= cs[offsets[:-1]]
    return _finish_sequence(s, counted, seed)


def _hash_bytes(data: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    """Hash of each byte string data[offsets[i]:offsets[i+1]] (``offsets`` start at 0).

    The string is cut into 8-byte little-endian words (the last one zero-padded); word j hashes as
    mix(w_j ^ items_seed), then the words combine as a sequence whose length is the byte count.
    """
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    nwords = lengths + 7
    nwords >>= 3
    longest = int(nwords.max()) if n else 0
    if longest == 0:
        return _finish_sequence(np.zeros(n, _U64), lengths, seed)
    padded = np.zeros(len(data) + 8, np.uint8)
    padded[: len(data)] = data
    # An unaligned view in which element k is the 8 bytes starting at byte k.
    every = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    item_seed = _U64(_child_seed(_ITEMS, seed))
    total = int(nwords.sum())
    if _few_words(n, longest, total):
        # Word j of every string at once: its 8 bytes, cut to the string's own, hashed, weighted.
        weights = _weights(seed, longest)
        s = np.zeros(n, _U64)
        starts = offsets[:-1].copy()
        shortest = int(lengths.min())
        for j in range(longest):
            if j:
                starts += 8
                np.minimum(starts, len(data), out=starts)
            w = every[starts].view(_U64)
            if 8 * (j + 1) > shortest:  # some strings end inside (or before) word j
                keep = lengths - 8 * j
                np.clip(keep, 0, 8, out=keep)
                w &= _KEEP[keep]
            w ^= item_seed
            _mix(w)
            w *= weights[j]
            if 8 * j >= shortest:
                w *= keep != 0  # zero where the string has no word j
            s += w
        return _finish_sequence(s, lengths, seed)
    word_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(nwords, out=word_offsets[1:])
    # Word j of a string starts at byte offset + 8 j.
    starts = np.arange(total, dtype=np.int64)
    starts -= np.repeat(word_offsets[:-1], nwords)
    starts <<= 3
    starts += np.repeat(offsets[:-1], nwords)
    words = every[starts].view(_U64)
    # The last word of a string keeps only the string's own bytes (1 to 8 of them).
    nonempty = np.flatnonzero(nwords)
    last = word_offsets[1:].take(nonempty) - 1
    words[last] &= _KEEP[lengths.take(nonempty) - ((nwords.take(nonempty) - 1) << 3)]
    words ^= item_seed
    return _sequence(_mix(words), word_offsets, seed, lengths)


# -- rows and lanes ---------------------------------------------------------------------------------------

class _Lanes:
    """Running sums of the row hashes (lane 1) and of their second mix (lane 2), mod 2^64."""

    __slots__ = ("rows", "lane1", "lane2")

    def __init__(self) -> None:
        self.rows = 0
        self.lane1 = 0
        self.lane2 = 0

    def add_rows(self, acc: np.ndarray) -> None:
        """``acc`` holds, per row, the sum of its columns' hashes; consumed in place."""
        r = _mix(acc)
        self.lane1 = (self.lane1 + int(r.sum(dtype=_U64))) & _MASK
        r ^= _LANE2
        self.lane2 = (self.lane2 + int(_mix(r).sum(dtype=_U64))) & _MASK
        self.rows += len(acc)

    def merge(self, other: _Lanes) -> None:
        self.rows += other.rows
        self.lane1 = (self.lane1 + other.lane1) & _MASK
        self.lane2 = (self.lane2 + other.lane2) & _MASK

    def result(self) -> Digest:
        return Digest(self.rows, f"{self.lane1:016x}{self.lane2:016x}")


def _digest_batches(batches: Iterable[pa.RecordBatch], constants: dict[str, pa.Scalar]) -> _Lanes:
    """Lanes over ``batches``, with ``constants`` (Hive partition values) added as columns of every row."""
    lanes = _Lanes()
    base = 0
    for name, value in constants.items():
        base = (base + int(_hash(pa.array([value.as_py()], value.type), column_seed(name))[0])) & _MASK
    for batch in batches:
        seeds = [column_seed(name) for name in batch.schema.names]
        for start in range(0, batch.num_rows, _CHUNK):
            part = batch.slice(start, _CHUNK)
            acc = np.full(part.num_rows, base, _U64)
            for col, s in zip(part.columns, seeds):
                acc += _hash(col, s)
            lanes.add_rows(acc)
    return lanes


def digest(source: Any, *, filesystem: Any = None, columns: Sequence[str] | None = None,
           threads: int | None = None) -> Digest:
    """The order-independent content digest of a dataset, or of an in-memory Arrow table.

    ``source`` is anything ``detload.Loader`` accepts (a file, folder, glob, list of files or URI;
    Hive partition columns are included, typed as detload types them), or a ``pyarrow.Table`` /
    ``RecordBatch``. Every Arrow type is hashed, including those the loader refuses. ``columns``
    limits the digest to those columns (default: all). Row groups are read and hashed in
    ``threads`` threads (default: one per CPU); the result does not depend on it.
    """
    if isinstance(columns, str):
        raise OptionError(f"columns must be a list of names, got the string {columns!r}")
    if isinstance(source, pa.RecordBatch):
        source = pa.Table.from_batches([source])
    if isinstance(source, pa.Table):
        if columns is not None:
            _check_columns(columns, source.column_names, "the table")
            source = source.select(list(columns))
        return _digest_batches(source.to_batches(), {}).result()
    ds = discover(source, filesystem=filesystem)
    if columns is not None:
        _check_columns(columns, ds.column_names(), repr(display_uri(ds.filesystem, ds.root)))
    wanted = set(columns) if columns is not None else None
    ptypes = dict(ds.partition_types)
    file_cols = None if wanted is None else [c for c in ds.schema.names if c in wanted]
    tasks: list[tuple[str, int, dict[str, pa.Scalar]]] = []
    for f in ds.files:
        consts = {k: pa.scalar(int(v) if ptypes[k] == "int64" else v, pa.int64() if ptypes[k] == "int64" else pa.string())
                  for k, v in f.partition_values if wanted is None or k in wanted}
        tasks.extend((f.location, g, consts) for g, n in enumerate(f.row_groups) if n > 0)
    fs = ds.filesystem

    def one(task: tuple[str, int, dict[str, pa.Scalar]]) -> _Lanes:
        location, rg, consts = task
        with fs.open_input_file(location) as fh:
            md = pq.read_metadata(fh)
            if file_cols == []:  # only partition columns: the row count is in the footer
                n = md.row_group(rg).num_rows
                return _digest_batches([pa.record_batch([pa.nulls(n)], names=["_"]).drop_columns(["_"])], consts)
            pf = pq.ParquetFile(fh, metadata=md, read_dictionary=_dictionary_columns(md, rg, file_cols))
            batches = pf.iter_batches(batch_size=_CHUNK, row_groups=[rg], columns=file_cols, use_threads=False)
            return _digest_batches(batches, consts)

    total = _Lanes()
    workers = max(1, min(threads or os.cpu_count() or 1, len(tasks)))
    ex = ThreadPoolExecutor(max_workers=workers)
    try:
        for lanes in ex.map(one, tasks):
            total.merge(lanes)  # sums commute: the completion order cannot change the result
    finally:
        # On Ctrl-C or an error, the row groups not yet begun are dropped instead of waited for.
        ex.shutdown(wait=True, cancel_futures=True)
    return total.result()


def _dictionary_columns(md: pq.FileMetaData, rg: int, wanted: Sequence[str] | None) -> list[str]:
    """Top-level string and binary columns whose chunk in row group ``rg`` is dictionary-encoded.

    Read as dictionaries, they hash each distinct value once (a dictionary's hash is its decoded
    values' hash, so the digest is the same either way). Parquet writers fall back to plain pages
    when a dictionary grows large; a plain value takes at least 4 bytes (its length), a dictionary
    index at most 4, so a chunk under 4 bytes a value past its dictionary page is dictionary pages.
    """
    schema = md.schema.to_arrow_schema()
    group = md.row_group(rg)
    out = []
    for j in range(group.num_columns):
        col = group.column(j)
        name = col.path_in_schema
        if col.physical_type != "BYTE_ARRAY" or not col.has_dictionary_page or name not in schema.names:
            continue
        if wanted is not None and name not in wanted:
            continue
        t = schema.field(name).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            continue
        dict_page = (col.data_page_offset or 0) - (col.dictionary_page_offset or 0)
        if col.total_uncompressed_size - max(dict_page, 0) < 4 * max(col.num_values, 1):
            out.append(name)
    return out


def _check_columns(columns: Sequence[str], available: Sequence[str], where: str) -> None:
    unknown = [c for c in columns if c not in available]
    if unknown:
        raise DatasetError(f"unknown column(s) {unknown} for the digest; {where} has {list(available)}")
    if not columns:
        raise OptionError("columns=[] selects nothing; pass None for every column")
