"""Arrow → NumPy type mapping, decided per column from the Arrow type alone.

`column_spec` maps an Arrow type (and the user's ``cast``, if any) to a
`ColumnSpec` once, at planning; `convert_column` turns one row group's Arrow
columns into NumPy following those specs, so a batch's dtype never depends on
its contents (nulls, chunking, dictionary use). Casts are checked: a value the
asked-for dtype cannot hold is a `DataError`, never a wrapped value.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np
import pyarrow as pa

from ._arrow import fill_nulls, int64_array, numpy_of
from .errors import DataError, OptionError, UnsupportedTypeError

__all__ = [
    "INT96_UNIT",
    "SCALED",
    "TYPE_MAPPING_VERSION",
    "Column",
    "ColumnSpec",
    "Ragged",
    "allowed_casts",
    "column_spec",
    "convert_column",
    "normalize_cast",
    "split_cast",
    "type_mapping_version",
]

#: Bumped whenever a mapping below changes what bytes a column yields. Version 2
#: reads Parquet INT96 timestamps as datetime64[us] (version 1 read them as
#: datetime64[ns], which wraps dates outside 1677-2262). Every other type yields
#: what it did in version 1, so a loader without INT96 columns still reports 1
#: (see `type_mapping_version`) and its manifests and states stay valid.
TYPE_MAPPING_VERSION = 2

#: The unit INT96 timestamps are read at: it holds every date from 0001 to 9999.
INT96_UNIT = "us"

#: The cast that delivers a decimal's unscaled integer as int64 (value = x / 10**scale).
SCALED = "int64-scaled"


def type_mapping_version(specs: Sequence[ColumnSpec]) -> int:
    """The type-mapping version that decides these columns' bytes (the order option)."""
    return TYPE_MAPPING_VERSION if any(s.int96 for s in specs) else 1


Kind = Literal["fixed", "ragged"]
RaggedKind = Literal["utf8", "binary", "list"]
#: The kind of the items of a list of strings or binary (a nested `Ragged`).
ItemKind = Literal["utf8", "binary"]


@dataclass(frozen=True)
class Ragged:
    """A variable-length column: ``values[offsets[i]:offsets[i+1]]`` is row ``i``.

    Arrow's own layout with int64 offsets that start at 0; strings and binary
    hold their bytes as uint8 values. Never an object array, so it can live in
    shared memory and in the cache.

    A list of strings (or of binary) nests: its ``values`` are themselves a
    `Ragged` of kind ``"utf8"`` (or ``"binary"``) holding every string of the
    column, and ``offsets`` index those strings, as Arrow's list layout does
    (row offsets over string offsets over bytes). Row ``i`` is then a list of
    ``str`` (or ``bytes``).
    """

    values: np.ndarray | Ragged
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
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        if isinstance(self.values, Ragged):
            return [self.values[j] for j in range(a, b)]
        piece = self.values[a:b]
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
        if self.kind != other.kind or not np.array_equal(self.offsets, other.offsets):
            return False
        a, b = self.values, other.values
        if isinstance(a, Ragged) or isinstance(b, Ragged):
            return isinstance(a, Ragged) and isinstance(b, Ragged) and a == b
        return a.dtype == b.dtype and np.array_equal(a, b)

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

    __slots__ = ("at", "check", "runs")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.runs: dict[str, tuple[np.ndarray, int, tuple[str, ...]]] = {}
        #: A cache entry's checksum still to verify (_cache.PendingCheck), or None.
        self.check: Any = None
        #: A piece of a mixed-order window held in a `_engine.block.WindowPack`: (the pack, the
        #: pack row where this unit's row 0 lies), or None.
        self.at: Any = None


@dataclass(frozen=True)
class ColumnSpec:
    """How one column is delivered: its NumPy dtype and, for 2-D columns, width.

    ``kind="fixed"``: an ndarray of ``dtype`` and shape ``(rows, *inner)``.
    ``kind="ragged"``: a `Ragged` whose values have ``dtype``.
    ``null`` says what a null becomes: "nan"/"nat" (float/time), or "error".
    ``cast`` is the dtype the user asked for with ``cast=`` (normalised, e.g.
    "float64", "int64-scaled", "datetime64[ns]"), None for the type's own mapping;
    ``scale`` the decimal scale of an "int64-scaled" column (value = x / 10**scale);
    ``int96`` marks a Parquet INT96 timestamp, read at `INT96_UNIT`;
    ``item_kind`` is set for a list of strings ("utf8") or binary ("binary"): a
    `Ragged` of kind "list" whose values are a `Ragged` of that kind, of ``dtype`` bytes;
    ``promote`` is the Arrow type files that disagree on the column are read as (schema
    drift, _drift.promote), with ``drift`` the types seen; ``missing``: some files lack
    the column, and their rows get its null_fill.
    """

    name: str
    arrow_type: str
    kind: Kind
    dtype: str
    inner: tuple[int, ...] = ()
    ragged_kind: RaggedKind = "list"
    null: Literal["nan", "nat", "error"] = "error"
    partition: bool = False
    cast: str | None = None
    scale: int | None = None
    int96: bool = False
    item_kind: ItemKind | None = None
    promote: Any = None  # pa.DataType | None
    drift: tuple[str, ...] = ()
    missing: bool = False

    def describe(self) -> str:
        if self.item_kind is not None:
            text = (f"Ragged[list] of Ragged[{self.item_kind}]: values {self.dtype}, "
                    f"{'string' if self.item_kind == 'utf8' else 'item'} offsets int64, row offsets int64")
        elif self.kind == "ragged":
            text = f"Ragged[{self.ragged_kind}] values {self.dtype}, offsets int64"
        else:
            shape = ", ".join(["rows", *map(str, self.inner)])
            text = f"ndarray {self.dtype} ({shape})"
        if self.scale is not None:
            text += f", unscaled decimal: value = x / 10**{self.scale} (scale {self.scale})"
        if self.int96:
            text += f", from Parquet INT96 (read at {INT96_UNIT})"
        if self.drift:
            text += f", promoted to {self.arrow_type} from {' and '.join(self.drift)}"
        if self.missing:
            text += ", null_fill in files that lack it"
        if self.cast is not None:
            text += f", cast to {self.cast}"
        return text


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


def column_spec(name: str, t: pa.DataType, *, partition: bool = False, cast: str | None = None,
                int96: bool = False) -> ColumnSpec:
    """Decide how column ``name`` of Arrow type ``t`` is delivered (nullability ignored).

    ``cast`` is a dtype from `normalize_cast` (the user's ``cast=``); OptionError if it
    does not apply to ``t``. ``int96``: the column is stored as Parquet INT96.
    """
    if pa.types.is_dictionary(t):
        inner = column_spec(name, t.value_type, partition=partition, cast=cast, int96=int96)
        return dataclasses.replace(inner, arrow_type=str(t))
    spec = _cast_spec(name, t, cast, partition) if cast is not None else _spec(name, t, partition)
    return dataclasses.replace(spec, int96=True) if int96 else spec


def _spec(name: str, t: pa.DataType, partition: bool) -> ColumnSpec:
    arrow_type = str(t)
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
        if _is_text(t.value_type):
            v = t.value_type
            item: ItemKind = ("utf8" if pa.types.is_string(v) or pa.types.is_large_string(v) or _is_view(v, "string")
                              else "binary")
            return ColumnSpec(name, arrow_type, "ragged", "|u1", ragged_kind="list", partition=partition,
                              item_kind=item)
    hint = ""
    if pa.types.is_decimal(t):
        scaled = (f", or cast={{{name!r}: {SCALED!r}}} for the unscaled integers (scale {t.scale})"
                  if t.precision <= 18 else "")
        hint = (f" Decimals are delivered only when asked, as floats would round them: pass "
                f"cast={{{name!r}: 'float64'}} (on the command line: --cast {name}=float64){scaled}; "
                "or leave the column out with columns=[...].")
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
        hint = (" Fixed-size lists of strings are not mapped (variable-length lists of strings are): "
                "write the column as a list<string>, or leave it out with columns=[...] listing the "
                "columns to load.")
    else:
        hint = " Leave it out with columns=[...] listing the columns to load."
    raise UnsupportedTypeError(
        f"column {name!r} has Arrow type {t}, which detload does not map to NumPy.{hint} "
        "Supported: booleans, integers, floats, timestamps, dates, durations, strings, "
        "binary, fixed-size lists and lists of those primitives, lists of strings or binary, "
        "dictionaries of them."
    )


_INT_CASTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOAT_CASTS = ("float16", "float32", "float64")
_TIME_CASTS = ("datetime64[s]", "datetime64[ms]", "datetime64[us]", "datetime64[ns]")


def _element_casts(t: pa.DataType) -> tuple[str, ...]:
    if pa.types.is_timestamp(t):
        return _TIME_CASTS
    if pa.types.is_integer(t):
        return _INT_CASTS
    if pa.types.is_floating(t):
        return _FLOAT_CASTS
    return ()


def allowed_casts(t: pa.DataType) -> tuple[str, ...]:
    """The ``cast=`` dtypes a column of Arrow type ``t`` can be delivered as (none: empty).

    Integers to any integer type, floats to any float type, timestamps to any unit,
    each checked value by value; decimals to floats, or (precision <= 18) to their
    unscaled int64. A list or fixed-size list of integers, floats or timestamps
    casts its elements.
    """
    if pa.types.is_dictionary(t):
        return allowed_casts(t.value_type)
    if pa.types.is_decimal(t):
        return ("float64", "float32", SCALED) if t.precision <= 18 else ("float64", "float32")
    if pa.types.is_fixed_size_list(t):
        v = t.value_type
        while pa.types.is_fixed_size_list(v):
            v = v.value_type
        return _element_casts(v)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or _is_view(t, "list"):
        return _element_casts(t.value_type)
    return _element_casts(t)


def normalize_cast(name: str, value: Any) -> str:
    """``cast[name]`` in one canonical spelling ("f8" and np.float64 are "float64"), or OptionError.

    A shape after an integer or float dtype ("float32[16]", "f4[4,4]", or NumPy's subarray
    dtype ``np.dtype((np.float32, 16))``) asks for a list column as a dense array of that
    shape per row; it normalises to "float32[16]", "float32[4,4]".
    """
    if isinstance(value, str) and value == SCALED:
        return SCALED
    shaped = _normalize_shaped(name, value)
    if shaped is not None:
        return shaped
    dt: np.dtype[Any] | None = None
    if isinstance(value, (str, np.dtype, type)):
        try:
            dt = np.dtype(value)
        except (TypeError, ValueError, SyntaxError):  # NumPy parses "(x,)f4" as Python: SyntaxError
            dt = None
    if dt is not None and dt.kind in "iuf":
        return dt.name
    if dt is not None and dt.kind == "M":
        unit, count = np.datetime_data(dt)  # type: ignore[arg-type]
        if count == 1 and unit in ("s", "ms", "us", "ns"):
            return f"datetime64[{unit}]"
    raise OptionError(
        f"cast[{name!r}] = {value!r} is not a dtype detload casts to; use an integer or float dtype "
        f"name (e.g. 'int32', 'float32'), {SCALED!r} (a decimal's unscaled integer) or a timestamp "
        "unit such as 'datetime64[ms]', or an integer or float dtype with a shape such as 'float32[16]' "
        "(a list column as a dense (rows, 16) array)"
    )


#: "DTYPE[SHAPE]": the last bracket of a cast, e.g. "float32[16]" -> ("float32", "16").
_SHAPED = re.compile(r"^(.*)\[([^\[\]]*)\]$", re.DOTALL)


def _normalize_shaped(name: str, value: Any) -> str | None:
    """A shaped cast's canonical spelling, None for a value without a shape, or OptionError."""
    how = ("write an integer or float dtype followed by the number of values of each row, "
           "e.g. 'float32[16]' (or 'float32[4,4]' for rows of 4x4 values)")
    if isinstance(value, np.dtype) and value.subdtype is not None:
        base_dt, shape = value.subdtype
        dims = [str(d) for d in shape]
    elif isinstance(value, str):
        m = _SHAPED.match(value.strip())
        if m is None:
            return None
        base, text = m.group(1).strip(), m.group(2)
        if not base:
            raise OptionError(f"cast[{name!r}] = {value!r} gives a shape but no dtype; {how}")
        try:
            base_dt = np.dtype(base)
        except TypeError:
            return None  # not a dtype before the bracket: the plain path words the refusal
        if base_dt.kind not in "iuf":
            if base_dt.kind == "M" and base.endswith("]"):  # "datetime64[ms][16]"
                raise OptionError(f"cast[{name!r}] = {value!r}: a shape applies to integer and float "
                                  f"elements only, not {base_dt.name}; {how}")
            return None  # "datetime64[ms]": a unit, not a shape
        dims = [d.strip() for d in text.split(",")]
    else:
        return None
    if base_dt.kind not in "iuf":
        raise OptionError(f"cast[{name!r}] = {value!r}: a shape applies to integer and float "
                          f"elements only, not {base_dt}; {how}")
    if not dims or not all(re.fullmatch(r"[0-9]+", d) and int(d) > 0 for d in dims):
        raise OptionError(f"cast[{name!r}] = {value!r} has the shape [{','.join(dims)}], which is not one or "
                          f"more positive whole numbers; {how}")
    return f"{np.dtype(base_dt).name}[{','.join(str(int(d)) for d in dims)}]"


def split_cast(cast: str) -> tuple[str, tuple[int, ...]]:
    """A normalised cast as (element dtype, shape): "float32[16]" -> ("float32", (16,)); no shape: ()."""
    m = _SHAPED.match(cast)
    if m is None or m.group(1).startswith("datetime64"):
        return cast, ()
    return m.group(1), tuple(int(d) for d in m.group(2).split(","))


def _shaped_spec(name: str, t: pa.DataType, cast: str, elem: str, shape: tuple[int, ...],
                 partition: bool) -> ColumnSpec:
    """The spec of a list column delivered dense, as ``(rows, *shape)`` of ``elem``."""
    dims: list[int] = []
    v = t
    while pa.types.is_fixed_size_list(v):
        dims.append(v.list_size)
        v = v.value_type
    if not dims and (pa.types.is_list(t) or pa.types.is_large_list(t) or _is_view(t, "list")):
        v = t.value_type
    numeric = pa.types.is_integer(v) or pa.types.is_floating(v)
    if v is t or not numeric:
        raise OptionError(
            f"cast[{name!r}] = {cast!r} gives a shape, which applies to a list, large_list or fixed_size_list "
            f"of integers or floats; column {name!r} has Arrow type {t}. "
            + (f"The casts allowed for it: {', '.join(allowed_casts(t))}" if allowed_casts(t)
               else "No cast applies to that type")
        )
    allowed = _element_casts(v)
    if elem not in allowed:
        text = ",".join(map(str, shape))
        raise OptionError(
            f"cast[{name!r}] = {cast!r} does not apply to column {name!r} of Arrow type {t}; "
            f"the casts allowed for it: {', '.join(f'{a}[{text}]' for a in allowed)}"
        )
    if dims and tuple(dims) != shape:
        want = f"{elem}[{','.join(map(str, dims))}]"
        raise OptionError(
            f"cast[{name!r}] = {cast!r} does not fit column {name!r} of Arrow type {t}, whose rows "
            f"hold {' x '.join(map(str, dims))} values each; use {want!r} (or {elem!r}, which keeps that shape)"
        )
    null: Literal["nan", "error"] = "nan" if pa.types.is_floating(v) else "error"
    return ColumnSpec(name, str(t), "fixed", np.dtype(elem).str, inner=shape, null=null, cast=cast,
                      partition=partition)


def _cast_spec(name: str, t: pa.DataType, cast: str, partition: bool) -> ColumnSpec:
    elem, shape = split_cast(cast)
    if shape:
        return _shaped_spec(name, t, cast, elem, shape, partition)
    allowed = allowed_casts(t)
    if cast not in allowed:
        raise OptionError(
            f"cast[{name!r}] = {cast!r} does not apply to column {name!r} of Arrow type {t}; "
            + (f"the casts allowed for it: {', '.join(allowed)}" if allowed else "no cast applies to that type")
        )
    if pa.types.is_decimal(t):
        if cast == SCALED:
            return ColumnSpec(name, str(t), "fixed", "<i8", cast=cast, scale=t.scale, partition=partition)
        return ColumnSpec(name, str(t), "fixed", np.dtype(cast).str, null="nan", cast=cast, partition=partition)
    return dataclasses.replace(_spec(name, t, partition), dtype=np.dtype(cast).str, cast=cast)


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
    if (spec.kind == "fixed" and not spec.inner and spec.cast is None and type(arr) is pa.ChunkedArray
            and arr.num_chunks == 1):
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
            what = (f"its type {arr.type}" if spec.cast is None
                    else f"{spec.cast} (its type {arr.type}, cast as asked)")
            at, value = "", "value"
            if spec.cast is not None and split_cast(spec.cast)[1]:  # a shaped cast names the row
                at = f" (the first at row {int(np.flatnonzero(numpy_of(arr.is_null()))[0])})"
                value = f"[{int(np.prod(spec.inner, dtype=np.int64))} values]"
            raise DataError(
                f"{_where(spec.name, where)} holds {arr.null_count} null(s){at}, but {what} "
                f"has no null value in NumPy. Pass null_fill={{{spec.name!r}: {value}}} "
                f"(on the command line: --null-fill {spec.name}=VALUE) to replace them."
            )
    if spec.kind == "fixed":
        if pa.types.is_fixed_size_binary(arr.type):
            return _primitive(spec, arr, where)
        if spec.inner and not pa.types.is_fixed_size_list(arr.type):
            return _dense(spec, arr, where)
        if spec.inner:
            values = arr
            for _ in spec.inner:
                values = values.flatten()
            out = _primitive(spec, values, where)
            return out.reshape((len(arr), *spec.inner))
        return _primitive(spec, arr, where)
    return _ragged(spec, arr, where)


def _dense(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> np.ndarray:
    """A variable-length list column (nulls already refused or filled) as ``(rows, *spec.inner)``.

    Every row must hold exactly the shape's number of values: the lengths are checked
    from the offsets before any value is converted, and the first row of another length
    is a DataError naming it. The values are then one contiguous run of the child array.
    """
    if _is_view(arr.type, "list"):
        arr = _large_list(arr, arr.type.value_type)
    n = len(arr)
    width = int(np.prod(spec.inner, dtype=np.int64))
    offsets = numpy_of(arr.offsets)
    lengths = np.diff(offsets)
    bad = np.flatnonzero(lengths != width)
    if bad.size:
        i = int(bad[0])
        more = f" ({bad.size} rows of another length)" if bad.size > 1 else ""
        raise DataError(
            f"{_where(spec.name, where)} cannot be delivered as {spec.cast}, which cast={{{spec.name!r}: "
            f"{spec.cast!r}}} asks for: row {i} holds {int(lengths[i])} value(s), not {width}{more}. "
            f"Write the column with {width} values in every row, or cast it without the shape "
            f"({split_cast(spec.cast or '')[0]!r}) to load it as variable-length lists."
        )
    lo = int(offsets[0]) if n else 0
    values = _primitive(spec, arr.values.slice(lo, n * width), where)
    return values.reshape((n, *spec.inner))


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
    if spec.cast is not None:
        return _cast(spec, arr, where)
    out = numpy_of(arr)
    want = np.dtype(spec.dtype)
    if out.dtype != want:
        out = out.astype(want)
    return out


def _cast(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> np.ndarray:
    """Values (nulls already filled or NaN/NaT-able) as ``spec.cast`` asks; DataError for one it cannot hold."""
    t = arr.type
    want = _np_dtype(spec.dtype)
    if pa.types.is_decimal(t):
        if spec.cast == SCALED:
            return _unscaled(spec, arr, where)
        out = _decimal_float64(arr)
        if want.itemsize < 8:
            with np.errstate(over="ignore"):
                out32 = out.astype(want)
            _check_finite(spec, out, out32, where)  # a decimal256 can exceed float32's range
            return out32
        return out
    if pa.types.is_floating(t):
        src = numpy_of(arr)
        if src.dtype == want:
            return src
        with np.errstate(over="ignore"):
            out = src.astype(want)
        if want.itemsize < src.itemsize:
            _check_finite(spec, src, out, where)
        return out
    target = pa.timestamp(np.datetime_data(want)[0], tz=t.tz) if pa.types.is_timestamp(t) else pa.from_numpy_dtype(want)
    if not target.equals(t):
        try:
            arr = arr.cast(target, safe=True)  # checked: out of range or losing digits raises
        except pa.ArrowInvalid as exc:
            raise _misfit(spec, arr, where, exc) from None
    return numpy_of(arr)


def _words(arr: pa.Array) -> np.ndarray:
    """A decimal array's values as (rows, 2 or 4) little-endian int64 words, low word first."""
    n = len(arr)
    k = arr.type.byte_width // 8
    return np.frombuffer(arr.buffers()[1], dtype="<i8")[arr.offset * k : (arr.offset + n) * k].reshape(n, k)


def _decimal_float64(arr: pa.Array) -> np.ndarray:
    """Each decimal rounded to the nearest float64 (what ``float(Decimal)`` gives); NaN for null.

    Not Arrow's decimal-to-double cast: that one is off by an ulp for about one value in
    eight (decimal128(10, 2)), and its results could change between pyarrow releases.
    A value whose unscaled integer and power of ten are both exact doubles needs one
    IEEE division, which rounds correctly; the rest go through the decimal text, which
    Arrow parses with correct rounding.
    """
    words = _words(arr)
    lo = words[:, 0]
    scale = arr.type.scale
    exact = (lo >= -(2**53)) & (lo <= 2**53)
    if words.shape[1] > 1:
        exact &= (words[:, 1:] == (lo >> 63)[:, None]).all(axis=1)
    if abs(scale) <= 22:  # 10**22 is the largest power of ten a double holds exactly
        out = lo / float(10**scale) if scale >= 0 else lo * float(10**-scale)
    else:
        out = np.empty(len(arr), dtype=np.float64)
        exact[:] = False
    if not exact.all():
        idx = np.flatnonzero(~exact)
        rest = arr.take(int64_array(idx)).cast(pa.string()).cast(pa.float64())
        out[idx] = numpy_of(rest)
    if arr.null_count:
        out[numpy_of(arr.is_null())] = np.nan
    return out


def _unscaled(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> np.ndarray:
    """A decimal's unscaled integers: the low 64-bit word of each little-endian value."""
    words = _words(arr)
    lo = words[:, 0]
    # Precision <= 18 keeps every value inside int64, but a file may hold values beyond
    # its declared precision: the higher words must be the low word's sign extension.
    high = words[:, 1:]
    if high.size and not np.array_equal(high, np.broadcast_to((lo >> 63)[:, None], high.shape)):
        i = int(np.flatnonzero((high != (lo >> 63)[:, None]).any(axis=1))[0])
        raise _misfit(spec, arr, where, None, i, "beyond int64")
    return lo.copy()


def _check_finite(spec: ColumnSpec, src: Any, out: np.ndarray, where: tuple[str, int]) -> None:
    """Raise if narrowing made a finite value infinite (``src``: NumPy or decimal Arrow values)."""
    if np.isfinite(out).all():
        return
    finite = np.isfinite(src) if isinstance(src, np.ndarray) else np.ones(len(out), dtype=bool)
    bad = np.flatnonzero(np.isinf(out) & finite)
    if bad.size:
        raise _misfit(spec, src, where, None, int(bad[0]), f"beyond {spec.cast}'s range")


def _misfit(spec: ColumnSpec, src: Any, where: tuple[str, int], exc: Exception | None,
            i: int | None = None, why: str = "") -> DataError:
    """The DataError for a value that ``spec.cast`` cannot hold, naming the first such value."""
    if i is None:
        i, why = _first_misfit(spec, src)
    if i is None:  # not found again: pyarrow's own words
        detail = f": {exc}"
    else:
        v = src[i]
        shown = v.as_py() if isinstance(v, pa.Scalar) and not pa.types.is_timestamp(v.type) else v
        if isinstance(v, pa.Scalar) and pa.types.is_timestamp(v.type):
            shown = np.datetime64(v.value, v.type.unit)
        at = f" at row {i}" if spec.kind == "fixed" and not spec.inner else ""
        if spec.inner and spec.cast is not None and split_cast(spec.cast)[1]:  # flat index -> row
            width = int(np.prod(spec.inner, dtype=np.int64))
            at = f" at row {i // width} (value {i % width} of the row)"
        detail = f": the value {shown}{at} is {why}"
    return DataError(
        f"{_where(spec.name, where)} cannot be delivered as {spec.cast}, which cast={{{spec.name!r}: "
        f"{spec.cast!r}}} asks for{detail}. Pick a dtype that holds every value of the column "
        f"(its type is {spec.arrow_type}), or leave the cast out."
    )


def _first_misfit(spec: ColumnSpec, arr: pa.Array) -> tuple[int | None, str]:
    """The first value a checked integer or timestamp cast refused, and why."""
    want = _np_dtype(spec.dtype)
    src = numpy_of(arr)
    if want.kind in "iu":
        info = np.iinfo(want)
        bad = np.flatnonzero((src < info.min) | (src > info.max))
        return (int(bad[0]), f"outside {spec.cast}'s range {info.min} to {info.max}") if bad.size else (None, "")
    if want.kind == "M":
        have_unit, to_unit = np.datetime_data(src.dtype)[0], np.datetime_data(want)[0]
        ticks = src.view(np.int64)
        valid = ticks != np.iinfo(np.int64).min  # NaT
        per = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
        if per[to_unit] > per[have_unit]:
            f = per[to_unit] // per[have_unit]
            limit = np.iinfo(np.int64).max // f
            bad = np.flatnonzero(valid & ((ticks > limit) | (ticks < -limit)))
            why = f"outside the dates {spec.cast} can hold"
        else:
            f = per[have_unit] // per[to_unit]
            bad = np.flatnonzero(valid & (ticks % f != 0))
            why = f"not a whole number of {to_unit}: {spec.cast} would drop digits"
        return (int(bad[0]), why) if bad.size else (None, "")
    return None, ""


def _ragged(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> Ragged:
    t = arr.type
    if spec.item_kind is not None:
        return _string_lists(spec, arr, where)
    if spec.ragged_kind == "utf8":
        arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(t) else arr
    elif spec.ragged_kind == "binary":
        arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(t) else arr
    else:
        if not pa.types.is_large_list(t):
            arr = _large_list(arr, t.value_type)
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


def _string_lists(spec: ColumnSpec, arr: pa.Array, where: tuple[str, int]) -> Ragged:
    """A list of strings (or binary) as a `Ragged` of rows over a `Ragged` of its strings:
    Arrow's large_list<large_string> layout, offsets rebased to 0 at both levels."""
    text = pa.large_string() if spec.item_kind == "utf8" else pa.large_binary()
    t = arr.type
    if not (pa.types.is_large_list(t) and t.value_type.equals(text)):
        arr = _large_list(arr, text)
    n = len(arr)
    offsets = numpy_of(arr.offsets)
    lo, hi = (int(offsets[0]), int(offsets[-1])) if n else (0, 0)
    items = arr.values.slice(lo, hi - lo)
    if items.null_count:
        what = "string" if spec.item_kind == "utf8" else "binary value"
        raise DataError(
            f"{_where(spec.name, where)} holds {items.null_count} null {what}(s) inside its lists, which "
            f"a list of {spec.item_kind} values cannot represent and null_fill (which replaces whole-row "
            f"nulls) cannot reach. Rewrite the column without null items (an empty {what} instead, "
            "or leave the item out of its list)."
        )
    item_kind: RaggedKind = "utf8" if spec.item_kind == "utf8" else "binary"
    inner = _ragged(dataclasses.replace(spec, ragged_kind=item_kind, item_kind=None), items, where)
    if n == 0:
        offsets = np.zeros(1, dtype=np.int64)
    elif lo:
        offsets = offsets - lo
    return Ragged(inner, offsets.astype(np.int64, copy=False), "list")


def _large_list(arr: pa.Array, value_type: pa.DataType) -> pa.Array:
    """``arr`` (a list-like array without nulls) as a large_list of ``value_type``.

    A list view goes through its lengths and flattened values: pyarrow's cast of a sliced
    list_view to a list loses the slice's offsets (26.0.1: ``[[], [], ['z']]`` becomes
    ``[[], [], []]``). Parquet never yields views, so only a caller's arrays take that path.
    """
    if not _is_view(arr.type, "list"):
        return arr.cast(pa.large_list(value_type))
    import pyarrow.compute as pc

    lengths = numpy_of(pc.list_value_length(arr).fill_null(0).cast(pa.int64()))
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(int64_array(offsets), pc.list_flatten(arr).cast(value_type))
