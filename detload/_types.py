"""Arrow → NumPy type mapping, decided per column from the Arrow type alone.

`column_spec` maps an Arrow type to a `ColumnSpec` once, at planning; `convert`
turns one row group's Arrow columns into NumPy following those specs, so a
batch's dtype never depends on its contents (nulls, chunking, dictionary use).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np
import pyarrow as pa

from ._arrow import fill_nulls, numpy_of
from .errors import DataError, UnsupportedTypeError

__all__ = [
    "TYPE_MAPPING_VERSION",
    "Column",
    "ColumnSpec",
    "Ragged",
    "column_spec",
    "convert_column",
]

#: Bumped whenever a mapping below changes what bytes a column yields.
TYPE_MAPPING_VERSION = 1

Kind = Literal["fixed", "ragged"]
RaggedKind = Literal["utf8", "binary", "list"]


@dataclass(frozen=True)
class Ragged:
    """A variable-length column: ``values[offsets[i]:offsets[i+1]]`` is row ``i``.

    Arrow's own layout with int64 offsets that start at 0; strings and binary
    hold their bytes as uint8 values. Never an object array, so it can live in
    shared memory and in the cache.
    """

    values: np.ndarray
    offsets: np.ndarray
    kind: RaggedKind = "list"

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        piece = self.values[self.offsets[i] : self.offsets[i + 1]]
        if self.kind == "utf8":
            return piece.tobytes().decode("utf-8")
        if self.kind == "binary":
            return piece.tobytes()
        return piece

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def to_list(self) -> list[Any]:
        return [self[i] for i in range(len(self))]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ragged):
            return NotImplemented
        return (
            self.kind == other.kind
            and np.array_equal(self.offsets, other.offsets)
            and self.values.dtype == other.values.dtype
            and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]


#: One delivered column: a fixed-width ndarray or a variable-length `Ragged`.
Column = Union[np.ndarray, Ragged]


class UnitColumns(dict[str, Column]):
    """One unit's columns by name, plus where runs of them lie at one stride in memory.

    ``runs`` maps a column name to ``(run, i, names)``: ``run`` is a 2-D view
    whose row ``i`` is that column and whose rows are the columns ``names``.
    Cache entries store same-typed columns back to back, so a block can copy a
    whole run per unit in one call instead of one call per column (each call
    releases and retakes the GIL). Plain dicts work too, column by column.
    """

    __slots__ = ("check", "runs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: dict[str, tuple[np.ndarray, int, tuple[str, ...]]] = {}
        #: A cache entry's checksum still to verify (_cache.PendingCheck), or None.
        self.check: Any = None


@dataclass(frozen=True)
class ColumnSpec:
    """How one column is delivered: its NumPy dtype and, for 2-D columns, width.

    ``kind="fixed"``: an ndarray of ``dtype`` and shape ``(rows, *inner)``.
    ``kind="ragged"``: a `Ragged` whose values have ``dtype``.
    ``null`` says what a null becomes: "nan"/"nat" (float/time), or "error".
    """

    name: str
    arrow_type: str
    kind: Kind
    dtype: str
    inner: tuple[int, ...] = ()
    ragged_kind: RaggedKind = "list"
    null: Literal["nan", "nat", "error"] = "error"
    partition: bool = False

    def describe(self) -> str:
        if self.kind == "ragged":
            return f"Ragged[{self.ragged_kind}] values {self.dtype}, offsets int64"
        shape = ", ".join(["rows", *map(str, self.inner)])
        return f"ndarray {self.dtype} ({shape})"


def _fixed_dtype(t: pa.DataType) -> tuple[str, Literal["nan", "nat", "error"]] | None:
    """The NumPy dtype of a primitive Arrow type, or None if it is not primitive."""
    if pa.types.is_boolean(t):
        return "bool", "error"
    # From bit widths, not to_pandas_dtype(): some pyarrow versions import pandas for that.
    if pa.types.is_integer(t):
        kind = "i" if pa.types.is_signed_integer(t) else "u"
        return np.dtype(f"{kind}{t.bit_width // 8}").str, "error"
    if pa.types.is_floating(t):
        return np.dtype(f"f{t.bit_width // 8}").str, "nan"
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]").str, "nat"
    if pa.types.is_date32(t):
        return np.dtype("datetime64[D]").str, "nat"
    if pa.types.is_date64(t):
        return np.dtype("datetime64[ms]").str, "nat"
    if pa.types.is_duration(t):
        return np.dtype(f"timedelta64[{t.unit}]").str, "nat"
    return None


def column_spec(name: str, t: pa.DataType, *, partition: bool = False) -> ColumnSpec:
    """Decide how column ``name`` of Arrow type ``t`` is delivered (nullability ignored)."""
    arrow_type = str(t)
    if pa.types.is_dictionary(t):
        inner = column_spec(name, t.value_type, partition=partition)
        return ColumnSpec(**{**inner.__dict__, "arrow_type": arrow_type})
    prim = _fixed_dtype(t)
    if prim is not None:
        return ColumnSpec(name, arrow_type, "fixed", prim[0], null=prim[1], partition=partition)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is_view(t, "string"):
        return ColumnSpec(name, arrow_type, "ragged", "|u1", ragged_kind="utf8", partition=partition)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or _is_view(t, "binary"):
        return ColumnSpec(name, arrow_type, "ragged", "|u1", ragged_kind="binary", partition=partition)
    if pa.types.is_fixed_size_binary(t):
        return ColumnSpec(name, arrow_type, "fixed", "|u1", inner=(t.byte_width,))
    if pa.types.is_fixed_size_list(t):
        dims = [t.list_size]
        v = t.value_type
        while pa.types.is_fixed_size_list(v):
            dims.append(v.list_size)
            v = v.value_type
        prim = _fixed_dtype(v)
        if prim is not None:
            return ColumnSpec(name, arrow_type, "fixed", prim[0], inner=tuple(dims), null=prim[1])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or _is_view(t, "list"):
        prim = _fixed_dtype(t.value_type)
        if prim is not None:
            return ColumnSpec(name, arrow_type, "ragged", prim[0], ragged_kind="list", null=prim[1])
    hint = ""
    if pa.types.is_decimal(t):
        hint = " Cast it to float64 when writing, or leave it out with columns=[...]."
    elif pa.types.is_struct(t):
        hint = (" Write one column per field (flatten the struct), or leave it out with "
                "columns=[...] listing the columns to load.")
    elif pa.types.is_map(t):
        hint = (" Write its keys and values as two list columns, or leave it out with "
                "columns=[...] listing the columns to load.")
    elif _is_list_like(t) and _is_list_like(t.value_type):
        hint = (" Variable-length lists of lists have no flat NumPy layout: flatten them when "
                "writing (fixed-size lists of fixed-size lists are supported, as 3-D arrays), or "
                "leave the column out with columns=[...] listing the columns to load.")
    elif _is_list_like(t) and _is_text(t.value_type):
        hint = (" Lists of strings are not mapped: join each list into one string or encode the "
                "strings as integer ids when writing; or leave the column out with columns=[...] "
                "listing the columns to load.")
    else:
        hint = " Leave it out with columns=[...] listing the columns to load."
    raise UnsupportedTypeError(
        f"column {name!r} has Arrow type {t}, which detload does not map to NumPy.{hint} "
        "Supported: booleans, integers, floats, timestamps, dates, durations, strings, "
        "binary, fixed-size lists and lists of those primitives, dictionaries of them."
    )


def _is_list_like(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or _is_view(t, "list"))


def _is_text(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or _is_view(t, "string") or _is_view(t, "binary"))


def _is_view(t: pa.DataType, what: str) -> bool:
    fn = {
        "string": "is_string_view",
        "binary": "is_binary_view",
        "list": "is_list_view",
    }[what]
    check = getattr(pa.types, fn, None)
    if check is not None and check(t):
        return True
    return what == "list" and bool(getattr(pa.types, "is_large_list_view", lambda _t: False)(t))


def _where(name: str, where: tuple[str, int]) -> str:
    return f"column {name!r} in {where[0]} row group {where[1]}"


def convert_column(
    spec: ColumnSpec,
    arr: pa.ChunkedArray | pa.Array,
    where: tuple[str, int],
    null_fill: Any = None,
) -> np.ndarray | Ragged:
    """Convert one Arrow column of one row group as ``spec`` says.

    ``where`` is (file, row group) for error messages. Copies only where Arrow's
    layout differs from the NumPy one (booleans, nulls, dictionaries, slices).
    """
    # The common case first, with as few pyarrow calls as possible: a worker
    # converts every column of every row group while holding the GIL.
    if spec.kind == "fixed" and not spec.inner and type(arr) is pa.ChunkedArray and arr.num_chunks == 1:
        a = arr.chunk(0)
        if a.null_count == 0 and a.type.id not in _NOT_PLAIN:
            out = numpy_of(a)
            want = _np_dtype(spec.dtype)
            return out if out.dtype == want else out.astype(want)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count:
        if null_fill is not None:
            if spec.kind == "fixed" and not spec.inner:
                filled = fill_nulls(arr, null_fill)
                if filled is not None:
                    want = _np_dtype(spec.dtype)
                    return filled if filled.dtype == want else filled.astype(want)
            try:
                arr = arr.fill_null(null_fill)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise DataError(
                    f"null_fill={null_fill!r} does not fit {_where(spec.name, where)} "
                    f"of type {arr.type}: {exc}"
                ) from None
        elif spec.null == "error" or spec.kind == "ragged" or spec.inner:
            raise DataError(
                f"{_where(spec.name, where)} holds {arr.null_count} null(s), but its type "
                f"{arr.type} has no null value in NumPy. Pass null_fill={{{spec.name!r}: value}} "
                f"(on the command line: --null-fill {spec.name}=VALUE) to replace them."
            )
    if spec.kind == "fixed":
        if pa.types.is_fixed_size_binary(arr.type):
            return _primitive(spec, arr, where)
        if spec.inner:
            values = arr
            for _ in spec.inner:
                values = values.flatten()
            out = _primitive(spec, values, where)
            return out.reshape((len(arr), *spec.inner))
        return _primitive(spec, arr, where)
    return _ragged(spec, arr, where)


# Type ids that need more than reading the values buffer (see convert_column's general path).
_NOT_PLAIN = frozenset({pa.dictionary(pa.int32(), pa.string()).id, pa.binary(1).id})


@functools.lru_cache(maxsize=256)
def _np_dtype(s: str) -> np.dtype[Any]:
    return np.dtype(s)


def _primitive(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> np.ndarray:
    if pa.types.is_fixed_size_binary(arr.type):
        buf = arr.buffers()[1]
        w = arr.type.byte_width
        raw = np.frombuffer(buf, dtype=np.uint8)[arr.offset * w : (arr.offset + len(arr)) * w]
        return raw.reshape(len(arr), w)
    if arr.null_count and spec.null == "error":
        raise DataError(
            f"{_where(spec.name, where)} holds {arr.null_count} null(s) inside its list "
            f"elements, which {spec.dtype} cannot represent and null_fill (which replaces "
            "whole-row nulls) cannot reach. Rewrite the column without null elements, or "
            "as a float list (nulls become NaN)."
        )
    out = numpy_of(arr)
    want = np.dtype(spec.dtype)
    if out.dtype != want:
        out = out.astype(want)
    return out


def _ragged(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> Ragged:
    t = arr.type
    if spec.ragged_kind == "utf8":
        arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(t) else arr
    elif spec.ragged_kind == "binary":
        arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(t) else arr
    else:
        if not pa.types.is_large_list(t):
            arr = arr.cast(pa.large_list(t.value_type))
    n = len(arr)
    if spec.ragged_kind in ("utf8", "binary"):
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
        data = bufs[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
        values = raw[offsets[0] : offsets[-1]] if n else raw[:0]
    else:
        offsets = numpy_of(arr.offsets)
        child = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])) if n else arr.values.slice(0, 0)
        values = _primitive(spec, child, where)
    if n == 0:
        offsets = np.zeros(1, dtype=np.int64)
    elif offsets[0] != 0:
        offsets = offsets - offsets[0]
    return Ragged(values, offsets.astype(np.int64, copy=False), spec.ragged_kind)
