"""Filter scalars: the column types filters compare, and how a literal is fitted to one.

A literal (a Python value or a pyarrow scalar) is fitted exactly to its
column's type (`coerce`), spelled in the canonical JSON (`encode_value`,
`decode_value`) and mapped to the domain row-group statistics are compared in
(`compare_key`). Type names are detload's own, not pyarrow's ``str()``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ..errors import OptionError

__all__ = [
    "Family",
    "SUPPORTED_SUBSET",
    "coerce",
    "compare_key",
    "compare_keys",
    "decode_value",
    "encode_value",
    "family_of",
    "node_literal",
    "parse_type_name",
    "to_scalar",
    "type_name",
    "value_type",
]

SUPPORTED_SUBSET = (
    "pc.field(name) compared (==, !=, <, <=, >, >=) with a scalar of type "
    "int, float, bool, str, bytes, date, datetime or Decimal; field.isin(values); "
    "field.is_null(); field.is_valid(); combined with &, | and ~"
)

_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_MS_PER_DAY = 86_400_000
_DEC = decimal.Context(prec=100)

Family = Literal["int", "float", "bool", "string", "binary", "date", "timestamp", "decimal"]


# -- types ---------------------------------------------------------------------

def value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def family_of(t: pa.DataType) -> Family | None:
    t = value_type(t)
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_date32(t) or pa.types.is_date64(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_decimal128(t) or pa.types.is_decimal256(t):
        return "decimal"
    return None


_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float32": pa.float32(), "float64": pa.float64(), "bool": pa.bool_(),
    "string": pa.string(), "large_string": pa.large_string(),
    "binary": pa.binary(), "large_binary": pa.large_binary(),
    "date32": pa.date32(), "date64": pa.date64(),
}
_SIMPLE_NAMES = {v: k for k, v in _SIMPLE_TYPES.items()}
_FSB_RE = re.compile(r"^fixed_size_binary\[([0-9]+)\]$")
_TS_RE = re.compile(r"^timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]$")
_DECIMAL_RE = re.compile(r"^decimal(128|256)\(([0-9]+), (-?[0-9]+)\)$")


def type_name(t: pa.DataType) -> str:
    """detload's own spelling of a filter scalar's type (independent of pyarrow's ``str``)."""
    t = value_type(t)
    if t in _SIMPLE_NAMES:
        return _SIMPLE_NAMES[t]
    if pa.types.is_fixed_size_binary(t):
        return f"fixed_size_binary[{t.byte_width}]"
    if pa.types.is_timestamp(t):
        return f"timestamp[{t.unit}]" if t.tz is None else f"timestamp[{t.unit}, tz={t.tz}]"
    if pa.types.is_decimal128(t):
        return f"decimal128({t.precision}, {t.scale})"
    if pa.types.is_decimal256(t):
        return f"decimal256({t.precision}, {t.scale})"
    raise OptionError(f"type {t} cannot appear in a filter; {SUPPORTED_SUBSET}")


def parse_type_name(name: str) -> pa.DataType:
    """The inverse of `type_name`."""
    if name in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[name]
    if m := _FSB_RE.match(name):
        return pa.binary(int(m.group(1)))
    if m := _TS_RE.match(name):
        return pa.timestamp(m.group(1), m.group(2))
    if m := _DECIMAL_RE.match(name):
        make = pa.decimal128 if m.group(1) == "128" else pa.decimal256
        return make(int(m.group(2)), int(m.group(3)))
    raise OptionError(
        f"unknown filter scalar type {name!r}; expected one of {sorted(_SIMPLE_TYPES)}, "
        "fixed_size_binary[N], timestamp[UNIT] or timestamp[UNIT, tz=ZONE], decimal128(P, S), decimal256(P, S)"
    )


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    if pa.types.is_unsigned_integer(t):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


# -- scalar coercion -------------------------------------------------------------
#
# A literal is first reduced to an abstract value (kind, payload), then fitted to
# the column's type exactly; only a float literal that float32 cannot hold keeps
# float64, which is how pyarrow compares it anyway.

def _abstract(value: Any) -> tuple[str, Any]:
    if isinstance(value, pa.Scalar):
        return _abstract_scalar(value)
    if isinstance(value, (bool, np.bool_)):
        return "bool", bool(value)
    if isinstance(value, (int, np.integer)):
        return "int", int(value)
    if isinstance(value, (float, np.floating)):
        return "float", float(value)
    if isinstance(value, str):
        return "str", str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    if isinstance(value, decimal.Decimal):
        return "decimal", value
    if isinstance(value, dt.datetime):
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc if value.tzinfo else None)
        d = value - epoch
        ns = ((d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds) * 1000
        ns += int(getattr(value, "nanosecond", 0))  # pandas.Timestamp
        return "ts", (ns, value.tzinfo is not None)
    if isinstance(value, dt.date):
        return "date", (value - dt.date(1970, 1, 1)).days
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            return "null", None
        unit, _ = np.datetime_data(value.dtype)
        if unit == "D":
            return "date", int(value.astype(np.int64))
        if unit in _NS:
            return "ts", (int(value.astype(np.int64)) * _NS[unit], False)
        return "other", value
    if value is None:
        return "null", None
    return "other", value


def _abstract_scalar(s: pa.Scalar) -> tuple[str, Any]:
    if not s.is_valid:
        return "null", None
    t = s.type
    if pa.types.is_dictionary(t):
        return _abstract_scalar(s.value)
    f = family_of(t)
    if f == "timestamp":
        return "ts", (int(s.value) * _NS[t.unit], t.tz is not None)
    if f == "date":
        if pa.types.is_date64(t):
            ms = int(s.cast(pa.int64()).as_py())
            return ("date", ms // _MS_PER_DAY) if ms % _MS_PER_DAY == 0 else ("other", s)
        return "date", int(s.cast(pa.int32()).as_py())
    if f in ("int", "float", "bool", "decimal"):
        return _abstract(s.as_py())
    if f == "string":
        return "str", s.as_py()
    if f == "binary":
        return "bytes", s.as_py()
    return "other", s


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, pa.Scalar):
        return f"{value.type} scalar {value.as_py()!r}" if value.is_valid else f"null {value.type} scalar"
    return f"{type(value).__name__} {value!r}"


def coerce(value: Any, column: str, t: pa.DataType, *, one_zero: bool = True) -> tuple[pa.DataType, Any]:
    """Fit a literal to column type ``t``: (the canonical scalar type, its internal value).

    Internal values: int, float, bool, str, bytes, days (date), count of the
    type's unit since the epoch (timestamp), unscaled int (decimal).
    ``one_zero`` maps -0.0 to 0.0, right for comparisons (where they are equal)
    but not for isin, whose hash lookup tells them apart.
    """
    t = value_type(t)
    fam = family_of(t)
    kind, v = _abstract(value)

    def bad(reason: str) -> OptionError:
        return OptionError(
            f"filter value {_describe(value)} does not fit column {column!r} of type {t}: {reason}"
        )

    if kind == "null":
        raise bad("a comparison with null is never true and selects no row; use pc.field(name).is_null()")
    if kind == "float" and math.isnan(v):
        raise bad("NaN compares false with every value; filters do not accept NaN")
    if fam == "int":
        if kind == "float" and v.is_integer():
            kind, v = "int", int(v)
        if kind == "decimal" and v == v.to_integral_value():
            kind, v = "int", int(v)
        if kind != "int":
            raise bad("an integer column is compared with integers only")
        lo, hi = _int_range(t)
        if not lo <= v <= hi:
            raise bad(f"the value is outside the type's range [{lo}, {hi}]")
        return t, v
    if fam == "float":
        if kind == "int":
            f = float(v)
            if f != v:
                raise bad("the integer is not exactly representable as a float")
            kind, v = "float", f
        if kind != "float":
            raise bad("a float column is compared with numbers only")
        if v == 0.0 and one_zero:
            v = 0.0
        if pa.types.is_float32(t) and float(np.float32(v)) != v and not math.isinf(v):
            return pa.float64(), v  # pyarrow compares such a literal in float64
        return t, v
    if fam == "bool":
        if kind != "bool":
            raise bad("a bool column is compared with True or False only")
        return t, v
    if fam == "string":
        if kind != "str":
            raise bad("a string column is compared with str values only")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise bad(f"it holds the lone surrogate {v[e.start]!r}, which is not a character and cannot be "
                      "stored in a string column (UTF-8 cannot encode it)") from None
        return t, v
    if fam == "binary":
        if kind != "bytes":
            raise bad("a binary column is compared with bytes values only")
        if pa.types.is_fixed_size_binary(t) and len(v) != t.byte_width:
            raise bad(f"the value has {len(v)} bytes, the column {t.byte_width}")
        return t, v
    if fam == "date":
        if kind != "date":
            raise bad("a date column is compared with datetime.date values only")
        return t, v
    if fam == "timestamp":
        if kind != "ts":
            raise bad("a timestamp column is compared with datetime (or numpy.datetime64) values only")
        ns, aware = v
        if aware != (t.tz is not None):
            raise bad(
                "the column has time zone " + repr(t.tz) + " and the value none" if t.tz is not None
                else "the column has no time zone and the value has one"
            )
        step = _NS[t.unit]
        if ns % step:
            raise bad(f"the value is finer than the column's unit {t.unit!r}")
        return t, ns // step
    if fam == "decimal":
        if kind == "int":
            kind, v = "decimal", decimal.Decimal(v)
        if kind != "decimal" or not v.is_finite():
            raise bad("a decimal column is compared with int or decimal.Decimal values only")
        unscaled = v.scaleb(t.scale, _DEC)
        if unscaled != unscaled.to_integral_value():
            raise bad(f"the value has more than {t.scale} digits after the point")
        u = int(unscaled)
        if abs(u) >= 10 ** t.precision:
            raise bad(f"the value has more than {t.precision} digits")
        return t, u
    raise OptionError(f"column {column!r} has type {t}, which filters do not support; {SUPPORTED_SUBSET}")


def encode_value(t: pa.DataType, v: Any) -> Any:
    """Internal value → canonical JSON value."""
    fam = family_of(t)
    if fam == "float":
        return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    if fam == "binary":
        return v.hex()
    if fam == "date":
        return str(np.datetime64(v, "D"))
    if fam == "timestamp":
        text = str(np.datetime64(v, t.unit))
        return text + "Z" if t.tz is not None else text
    if fam == "decimal":
        return str(decimal.Decimal(v).scaleb(-t.scale, _DEC))
    return v


def decode_value(t: pa.DataType, j: Any, column: str) -> Any:
    """Canonical JSON value → a Python literal `coerce` accepts for ``t``."""
    fam = family_of(t)
    try:
        if fam == "float" and isinstance(j, str):
            return float(j)  # "inf", "-inf"
        if fam == "binary" and isinstance(j, str):
            return bytes.fromhex(j)
        if fam == "date" and isinstance(j, str):
            day = np.datetime64(j)
            if np.datetime_data(day.dtype)[0] != "D":
                raise ValueError("a date is written YYYY-MM-DD")
            return day
        if fam == "timestamp" and isinstance(j, str):
            aware = j.endswith("Z")
            raw = np.datetime64(j[:-1] if aware else j)  # the unit follows the digits written
            if np.isnat(raw):
                raise ValueError("NaT")
            unit = np.datetime_data(raw.dtype)[0]
            if unit not in _NS:
                raw, unit = raw.astype("datetime64[s]"), "s"
            return pa.scalar(int(raw.astype(np.int64)), pa.timestamp(unit, "UTC" if aware else None))
        if fam == "decimal" and isinstance(j, (str, int)):
            return decimal.Decimal(j)
    except (ValueError, decimal.InvalidOperation) as e:
        raise OptionError(f"filter value {j!r} for column {column!r} cannot be read as {type_name(t)}: {e}") from None
    return j


def compare_key(t: pa.DataType, v: Any) -> Any:
    """Internal value → the comparison domain of `ColumnStats` (see there)."""
    fam = family_of(t)
    if fam == "string":
        return v.encode("utf-8")
    if fam == "timestamp":
        return v * _NS[t.unit]
    return v


def compare_keys(t: pa.DataType, values: list[Any]) -> list[Any]:
    """`compare_key` of each of ``values`` (internal values of type ``t``), in one pass."""
    fam = family_of(t)
    if fam == "string":
        return [v.encode("utf-8") for v in values]
    if fam == "timestamp":
        step = _NS[t.unit]
        return [v * step for v in values]
    return list(values)


def to_scalar(t: pa.DataType, v: Any) -> pa.Scalar:
    fam = family_of(t)
    if fam == "date" and pa.types.is_date64(t):
        return pa.scalar(v * _MS_PER_DAY, t)
    if fam == "decimal":
        return pa.scalar(decimal.Decimal(v).scaleb(-t.scale, _DEC), t)
    return pa.scalar(v, t)


def node_literal(node: Mapping[str, Any], j: Any) -> tuple[pa.DataType, Any]:
    t = parse_type_name(node["type"])
    return coerce(decode_value(t, j, node["field"]), node["field"], t, one_zero=node["op"] != "isin")
