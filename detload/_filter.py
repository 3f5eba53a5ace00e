"""Row filters: detload's canonical form, row-group pruning and the exact selection.

`parse_filter` reads a pyarrow.compute expression, a pyarrow DNF list or JSON
into one canonical JSON tree typed against the dataset's schema, so that equal
filters get equal fingerprints whichever form they were written in. A `Filter`
prunes row groups three-valued from Hive partition values, statistics and
(optionally) bloom filters, and selects the exact rows pyarrow's own filter keeps.
"""

from __future__ import annotations

import bisect
import datetime as dt
import decimal
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import xxhash

from .errors import OptionError

__all__ = [
    "ColumnStats",
    "Filter",
    "FilterInput",
    "ISIN_HASH_THRESHOLD",
    "PruneResult",
    "PruneSource",
    "SUPPORTED_SUBSET",
    "parse_filter",
    "row_group_stats",
]

#: What `parse_filter` accepts: an expression, a DNF list, JSON text or a canonical dict.
FilterInput = Union[pc.Expression, Sequence[Any], str, Mapping[str, Any], "Filter"]
#: "none": no row of the row group can match; "all": every row matches; "some": check the rows.
PruneResult = Literal["none", "some", "all"]
#: Which evidence settled a row group, for `detload plan` ("selection" when none did).
PruneSource = Literal["partition", "statistics", "bloom", "selection"]
#: ``(column, keys) -> may any of these values be stored in this row group's column``.
BloomProbe = Callable[[str, Sequence[Any]], bool]

#: An ``isin`` list longer than this enters the order options as a hash (`Filter.order_value`).
ISIN_HASH_THRESHOLD = 64

SUPPORTED_SUBSET = (
    "pc.field(name) compared (==, !=, <, <=, >, >=) with a scalar of type "
    "int, float, bool, str, bytes, date, datetime or Decimal; field.isin(values); "
    "field.is_null(); field.is_valid(); combined with &, | and ~"
)

_CMP_OPS = ("==", "!=", "<", "<=", ">", ">=")
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_DNF_OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")
_ARROW_CMP = {
    "equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=",
    "greater": ">", "greater_equal": ">=",
}
_CMP_FUNC = {v: getattr(pc, k) for k, v in _ARROW_CMP.items()}
_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_MS_PER_DAY = 86_400_000
_DEC = decimal.Context(prec=100)

Family = Literal["int", "float", "bool", "string", "binary", "date", "timestamp", "decimal"]


# -- types ---------------------------------------------------------------------

def _value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _family(t: pa.DataType) -> Family | None:
    t = _value_type(t)
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
    t = _value_type(t)
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
    f = _family(t)
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


def _coerce(value: Any, column: str, t: pa.DataType, *, one_zero: bool = True) -> tuple[pa.DataType, Any]:
    """Fit a literal to column type ``t``: (the canonical scalar type, its internal value).

    Internal values: int, float, bool, str, bytes, days (date), count of the
    type's unit since the epoch (timestamp), unscaled int (decimal).
    ``one_zero`` maps -0.0 to 0.0, right for comparisons (where they are equal)
    but not for isin, whose hash lookup tells them apart.
    """
    t = _value_type(t)
    fam = _family(t)
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


def _encode(t: pa.DataType, v: Any) -> Any:
    """Internal value → canonical JSON value."""
    fam = _family(t)
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


def _decode(t: pa.DataType, j: Any, column: str) -> Any:
    """Canonical JSON value → a Python literal `_coerce` accepts for ``t``."""
    fam = _family(t)
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


def _key(t: pa.DataType, v: Any) -> Any:
    """Internal value → the comparison domain of `ColumnStats` (see there)."""
    fam = _family(t)
    if fam == "string":
        return v.encode("utf-8")
    if fam == "timestamp":
        return v * _NS[t.unit]
    return v


def _scalar(t: pa.DataType, v: Any) -> pa.Scalar:
    fam = _family(t)
    if fam == "date" and pa.types.is_date64(t):
        return pa.scalar(v * _MS_PER_DAY, t)
    if fam == "decimal":
        return pa.scalar(decimal.Decimal(v).scaleb(-t.scale, _DEC), t)
    return pa.scalar(v, t)


# -- raw trees ------------------------------------------------------------------
#
# A raw tree mirrors what the user wrote (binary &/|, literal side, original
# scalar types), so rebuilding it must give back an equal expression. Nodes:
#   ("cmp", op, field, literal, literal_left)   ("isin", field, values, skip_nulls)
#   ("is_null", field)  ("is_valid", field)  ("and", a, b)  ("or", a, b)  ("not", a)

Raw = tuple


def _refuse(expr: pc.Expression, what: str) -> OptionError:
    return OptionError(f"filter expression {expr} {what}; detload reads this subset: {SUPPORTED_SUBSET}")


def _read_expression(expr: pc.Expression) -> Raw:
    """Read an expression's tree from the serialisation pyarrow pickles it with.

    ``str(expr)`` drops the literals' types (an int8 3 prints as ``3``, a zone
    prints as ``Z``), so the tree is read from the IPC form: its schema
    metadata lists the nodes in prefix order and its columns hold the typed
    literals and function options. The result is checked by rebuilding.
    """
    try:
        _, args = expr.__reduce__()
        batch = pa.ipc.open_file(args[0]).read_all()
        text = batch.schema.to_string(show_field_metadata=False, show_schema_metadata=True, truncate_metadata=False)
    except Exception as e:  # an internal format: refuse rather than guess
        raise _refuse(expr, f"could not be read ({type(e).__name__}: {e})") from None
    _, sep, meta = text.partition("\n-- schema metadata --\n")
    tokens: list[tuple[str, str]] = []
    for line in meta.split("\n") if sep else ():
        key, sep2, rest = line.partition(": '")
        if not sep2 or not rest.endswith("'"):
            raise _refuse(expr, "has a name this reader cannot split")
        tokens.append((key, rest[:-1]))
    pos = 0

    def node() -> Any:
        nonlocal pos
        if pos >= len(tokens):
            raise _refuse(expr, "ended early")
        key, val = tokens[pos]
        pos += 1
        if key == "field_ref":
            return ("field", val)
        if key == "literal":
            return ("lit", batch.column(int(val))[0])
        if key != "call":
            raise _refuse(expr, f"uses {key.replace('_', ' ')} {val!r}")
        children: list[Any] = []
        options = None
        while True:
            if pos >= len(tokens):
                raise _refuse(expr, "ended early")
            k, v = tokens[pos]
            if k == "end":
                pos += 1
                break
            if k == "options":
                pos += 1
                options = batch.column(int(v))[0]
                continue
            children.append(node())
        return ("call", val, children, options)

    raw = _to_raw(expr, node())
    if pos != len(tokens):
        raise _refuse(expr, "has trailing parts")
    return raw


def _option(options: pa.StructScalar | None, name: str) -> pa.Scalar | None:
    if options is None or options.type.get_field_index(name) < 0:
        return None
    return options[name]


def _to_raw(expr: pc.Expression, n: Any) -> Raw:
    if n[0] != "call":
        raise _refuse(expr, "is a bare field or scalar, not a predicate")
    _, name, args, options = n
    if name in _ARROW_CMP:
        if len(args) == 2 and args[0][0] == "field" and args[1][0] == "lit":
            return ("cmp", _ARROW_CMP[name], args[0][1], args[1][1], False)
        if len(args) == 2 and args[0][0] == "lit" and args[1][0] == "field":
            return ("cmp", _ARROW_CMP[name], args[1][1], args[0][1], True)
        raise _refuse(expr, f"uses {name} on something other than a field and a scalar")
    if name in ("and_kleene", "or_kleene") and len(args) == 2:
        return (name[:-7], _to_raw(expr, args[0]), _to_raw(expr, args[1]))
    if name == "invert" and len(args) == 1:
        return ("not", _to_raw(expr, args[0]))
    if name in ("is_null", "is_valid", "is_in") and len(args) == 1 and args[0][0] == "field":
        field = args[0][1]
        if name == "is_valid":
            return ("is_valid", field)
        if name == "is_null":
            nan = _option(options, "nan_is_null")
            if nan is not None and nan.as_py():
                raise _refuse(expr, "uses is_null(nan_is_null=True)")
            return ("is_null", field)
        value_set = _option(options, "value_set")
        if value_set is None or not value_set.is_valid:
            raise _refuse(expr, "has an is_in without a value set")
        behaviour = _option(options, "null_matching_behavior")
        skip = _option(options, "skip_nulls")
        if behaviour is not None:
            if behaviour.as_py() not in (0, 1):  # MATCH, SKIP
                raise _refuse(expr, "uses is_in with a null matching behaviour other than MATCH or SKIP")
            skip_nulls = behaviour.as_py() == 1
        else:
            skip_nulls = bool(skip is not None and skip.as_py())
        return ("isin", field, value_set.values, skip_nulls)
    if name in ("and", "or", "and_", "or_"):
        raise _refuse(expr, f"uses {name}, whose null handling differs from & and |")
    raise _refuse(expr, f"uses {name}")


def _raw_expression(raw: Raw) -> pc.Expression:
    """Rebuild exactly what a raw tree mirrors."""
    tag = raw[0]
    if tag == "cmp":
        _, op, field, lit, left = raw
        f, s = pc.field(field), pc.scalar(lit)
        return _CMP_FUNC[op](s, f) if left else _CMP_FUNC[op](f, s)
    if tag == "isin":
        _, field, values, skip = raw
        return pc.is_in(pc.field(field), value_set=values, skip_nulls=skip)
    if tag == "is_null":
        return pc.field(raw[1]).is_null()
    if tag == "is_valid":
        return pc.field(raw[1]).is_valid()
    if tag == "and":
        return _raw_expression(raw[1]) & _raw_expression(raw[2])
    if tag == "or":
        return _raw_expression(raw[1]) | _raw_expression(raw[2])
    if tag == "not":
        return ~_raw_expression(raw[1])
    raise AssertionError(tag)


class _Json:
    """A literal read from JSON: strings still need decoding by the column's type."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _read_dnf(filters: Any, *, from_json: bool) -> Raw:
    """pyarrow's DNF: ``[(col, op, value), ...]`` (one AND) or ``[[...], [...]]`` (OR of ANDs)."""
    shape = (
        "a DNF filter is a list of (column, op, value) predicates, or a list of such lists (OR of ANDs), "
        "e.g. [('market', '==', 'US'), ('day', '>=', 20260101)]"
    )
    if not isinstance(filters, (list, tuple)):
        raise OptionError(f"{shape}; got {type(filters).__name__} {filters!r}")
    if not filters:
        raise OptionError(f"an empty DNF filter [] is refused (pyarrow calls it malformed); pass filter=None to read every row ({shape})")
    first = filters[0]
    if isinstance(first, (list, tuple)) and first and isinstance(first[0], str):
        filters = [filters]  # one conjunction, as pyarrow reads it
    ors: Raw | None = None
    for conj in filters:
        if not isinstance(conj, (list, tuple)) or not conj:
            raise OptionError(f"{shape}; got the conjunction {conj!r}")
        ands: Raw | None = None
        for pred in conj:
            leaf = _read_predicate(pred, shape, from_json=from_json)
            ands = leaf if ands is None else ("and", ands, leaf)
        assert ands is not None
        ors = ands if ors is None else ("or", ors, ands)
    assert ors is not None
    return ors


def _read_predicate(pred: Any, shape: str, *, from_json: bool) -> Raw:
    if not isinstance(pred, (list, tuple)) or len(pred) != 3 or not isinstance(pred[0], str):
        raise OptionError(f"{shape}; got the predicate {pred!r}")
    col, op, value = pred
    if op not in _DNF_OPS:
        raise OptionError(f"filter predicate {pred!r} has the operator {op!r}; DNF operators are {list(_DNF_OPS)}")
    wrap = _Json if from_json else (lambda v: v)
    if op in ("in", "not in"):
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise OptionError(f"filter predicate {pred!r}: {op!r} takes a list of values")
        isin: Raw = ("isin", col, [wrap(v) for v in value], False)
        return ("not", isin) if op == "not in" else isin
    return ("cmp", "==" if op == "=" else op, col, wrap(value), False)


_NODE_KEYS = {
    **{op: {"op", "field", "type", "value"} for op in _CMP_OPS},
    "isin": {"op", "field", "type", "values"},
    "is_null": {"op", "field"},
    "is_valid": {"op", "field"},
    "and": {"op", "args"},
    "or": {"op", "args"},
    "not": {"op", "arg"},
}


def _read_canonical(node: Any) -> Raw:
    """A canonical tree (or a hand-written one) → raw, scalars typed as the tree says."""
    if not isinstance(node, Mapping) or node.get("op") not in _NODE_KEYS:
        raise OptionError(
            f"canonical filter node {node!r} is not one of: "
            + "; ".join(f"{{{', '.join(sorted(k))}}} with op {op!r}" for op, k in _NODE_KEYS.items())
        )
    op = node["op"]
    if set(node) != _NODE_KEYS[op]:
        raise OptionError(f"canonical filter node {dict(node)!r} must have exactly the keys {sorted(_NODE_KEYS[op])}")
    if op in ("and", "or"):
        args = node["args"]
        if not isinstance(args, list) or not args:
            raise OptionError(f"canonical filter node {dict(node)!r}: 'args' must be a non-empty list")
        out = _read_canonical(args[0])
        for a in args[1:]:
            out = (op, out, _read_canonical(a))
        return out
    if op == "not":
        return ("not", _read_canonical(node["arg"]))
    field = node["field"]
    if not isinstance(field, str):
        raise OptionError(f"canonical filter node {dict(node)!r}: 'field' must be a column name")
    if op in ("is_null", "is_valid"):
        return (op, field)
    t = parse_type_name(node["type"])

    def typed(j: Any) -> Any:
        return None if j is None else _scalar(*_coerce(_decode(t, j, field), field, t, one_zero=op != "isin"))

    if op == "isin":
        if not isinstance(node["values"], list):
            raise OptionError(f"canonical filter node {dict(node)!r}: 'values' must be a list")
        return ("isin", field, [typed(j) for j in node["values"]], False)
    if node["value"] is None:
        raise OptionError(f"canonical filter node {dict(node)!r}: a comparison with null selects no row; use is_null")
    return ("cmp", op, field, typed(node["value"]), False)


# -- canonical form ---------------------------------------------------------------

def _is_null_literal(x: Any) -> bool:
    if isinstance(x, _Json):
        x = x.value
    return x is None or (isinstance(x, pa.Scalar) and not x.is_valid) or (isinstance(x, np.datetime64) and bool(np.isnat(x)))


class _Canonicalizer:
    def __init__(self, schema: pa.Schema, partition_types: Mapping[str, str]) -> None:
        self.types: dict[str, pa.DataType] = {f.name: f.type for f in schema}
        for k, v in partition_types.items():
            if v not in ("int64", "string"):
                raise OptionError(f"partition_types[{k!r}] must be 'int64' or 'string', got {v!r}")
            self.types[k] = pa.int64() if v == "int64" else pa.string()
        self.available = [*schema.names, *partition_types]

    def column(self, field: str, *, typed: bool) -> pa.DataType:
        t = self.types.get(field)
        if t is None:
            raise OptionError(f"filter column {field!r} does not exist; the available columns are {self.available}")
        if typed and _family(t) is None:
            raise OptionError(
                f"filter column {field!r} has type {t}, which filters cannot compare; comparisons and isin "
                "take integer, float32/float64, bool, string, binary, date, timestamp and decimal columns"
                " (is_null and is_valid take any column)"
            )
        return t

    def literal(self, x: Any, field: str, t: pa.DataType, *, one_zero: bool = True) -> tuple[pa.DataType, Any]:
        if isinstance(x, _Json):
            x = _decode(_value_type(t), x.value, field)
        return _coerce(x, field, t, one_zero=one_zero)

    def node(self, raw: Raw) -> dict[str, Any]:
        tag = raw[0]
        if tag in ("and", "or"):
            args: list[dict[str, Any]] = []
            for child in raw[1:]:
                c = self.node(child)
                args.extend(c["args"] if c["op"] == tag else [c])
            return {"op": tag, "args": args}
        if tag == "not":
            return {"op": "not", "arg": self.node(raw[1])}
        if tag in ("is_null", "is_valid"):
            self.column(raw[1], typed=False)
            return {"op": tag, "field": raw[1]}
        if tag == "cmp":
            _, op, field, lit, left = raw
            t = self.column(field, typed=True)
            ct, v = self.literal(lit, field, t)
            return {"op": _FLIP[op] if left else op, "field": field, "type": type_name(ct), "value": _encode(ct, v)}
        if tag == "isin":
            _, field, values, skip_nulls = raw
            t = self.column(field, typed=True)
            items = [values[i] for i in range(len(values))] if isinstance(values, pa.Array) else list(values)
            null = any(_is_null_literal(x) for x in items)
            fitted = [self.literal(x, field, t, one_zero=False) for x in items if not _is_null_literal(x)]
            if len({ct for ct, _ in fitted}) > 1:  # a float32 column with some inexact literals
                fitted = [self.literal(x, field, pa.float64(), one_zero=False) for x in items if not _is_null_literal(x)]
            ct = fitted[0][0] if fitted else _value_type(t)
            vals: list[Any] = [None] if null and not skip_nulls else []
            vals += [_encode(ct, v) for v in _sorted_unique(fitted)]
            return {"op": "isin", "field": field, "type": type_name(ct), "values": vals}
        raise AssertionError(tag)


def _sorted_unique(fitted: list[tuple[pa.DataType, Any]]) -> list[Any]:
    # -0.0 and 0.0 are distinct isin members (-0.0 first); other values compare as usual.
    def order(v: Any) -> Any:
        return (v, math.copysign(1.0, v)) if isinstance(v, float) else v

    return sorted({order(v): v for _, v in fitted}.values(), key=order)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_filter(
    filter: FilterInput,  # noqa: A002 - the option's public name
    schema: pa.Schema,
    partition_types: Mapping[str, str] | None = None,
) -> Filter:
    """Read a filter in any accepted form into its canonical `Filter`, typed against ``schema``.

    ``filter`` is a pyarrow.compute expression, a pyarrow DNF list, a JSON
    string (a JSON array is a DNF list, a JSON object a canonical tree), a
    canonical tree as a dict, or a `Filter`. ``partition_types`` types the Hive
    partition columns ({"key": "int64" | "string"}). Raises `OptionError` for
    anything outside `SUPPORTED_SUBSET`, unknown columns and ill-typed values.
    """
    ptypes = dict(partition_types or {})
    canon = _Canonicalizer(schema, ptypes)
    if isinstance(filter, Filter):
        raw = _read_canonical(filter.canonical)
    elif isinstance(filter, pc.Expression):
        raw = _read_expression(filter)
        try:
            same = _raw_expression(raw).equals(filter)
        except Exception:
            same = False
        if not same:
            raise _refuse(filter, "could not be read back exactly")
    elif isinstance(filter, str):
        try:
            data = json.loads(filter)
        except json.JSONDecodeError as e:
            raise OptionError(
                f"filter text {filter!r} is not JSON ({e}); write a JSON DNF list such as "
                "'[[\"market\", \"==\", \"US\"]]' or a canonical filter object"
            ) from None
        if isinstance(data, list):
            raw = _read_dnf(data, from_json=True)
        elif isinstance(data, dict):
            raw = _read_canonical(data)
        else:
            raise OptionError(f"filter JSON {filter!r} is neither a DNF list (a JSON array) nor a canonical filter (a JSON object)")
    elif isinstance(filter, Mapping):
        raw = _read_canonical(filter)
    elif isinstance(filter, (list, tuple)):
        raw = _read_dnf(filter, from_json=False)
    elif callable(filter):
        raise OptionError(
            f"filter={filter!r} is a Python callable: it cannot be fingerprinted or pruned — "
            "use a pyarrow.compute expression or a DNF list"
        )
    else:
        raise OptionError(
            f"filter must be a pyarrow.compute expression, a DNF list of (column, op, value) tuples, "
            f"a JSON string or a canonical dict; got {type(filter).__name__} {filter!r}"
        )
    tree = canon.node(raw)
    used = _fields(tree)
    parts = tuple(sorted((k, v) for k, v in ptypes.items() if k in used))
    return Filter(_dumps(tree), parts)


def _fields(node: Mapping[str, Any]) -> set[str]:
    if "args" in node:
        return set().union(*(_fields(a) for a in node["args"]))
    if "arg" in node:
        return _fields(node["arg"])
    return {node["field"]}


# -- the Filter ---------------------------------------------------------------------

_T, _F, _N = 1, 2, 4
_TFN = _T | _F | _N


def _kleene(op: str, a: int, b: int) -> int:
    if op == "and":
        return _F if _F in (a, b) else _N if _N in (a, b) else _T
    return _T if _T in (a, b) else _N if _N in (a, b) else _F


def _table(op: str) -> tuple[tuple[int, ...], ...]:
    # Outcome sets of x op y, where each side is a set of possible outcomes (bit mask).
    rows = []
    for x in range(8):
        row = []
        for y in range(8):
            m = 0
            for a in (_T, _F, _N):
                for b in (_T, _F, _N):
                    if x & a and y & b:
                        m |= _kleene(op, a, b)
            row.append(m)
        rows.append(tuple(row))
    return tuple(rows)


_AND, _OR = _table("and"), _table("or")
_NOT = tuple((m & _N) | (_F if m & _T else 0) | (_T if m & _F else 0) for m in range(8))

Leaf = Callable[[Mapping[str, Any], Mapping[str, Any], int, Any], int]


@dataclass(frozen=True, slots=True)
class ColumnStats:
    """What a row group's statistics say about one column.

    ``min``/``max`` are in the comparison domain of the column's family: int
    for integers (unsigned as their value), float, bool, UTF-8 ``bytes`` for
    strings, ``bytes`` for binary, days since 1970-01-01 for dates, nanoseconds
    since the epoch for timestamps (UTC for zoned ones), the unscaled int for
    decimals (at the column's scale). ``None``: unknown. ``min`` is always a
    lower bound; ``max`` is an upper bound only when ``max_exact`` (a truncated
    maximum is not one). ``min_exact`` is recorded for completeness.
    Float statistics ignore NaN: a float column may always hold NaN.
    """

    min: Any = None
    max: Any = None
    null_count: int | None = None
    min_exact: bool = True
    max_exact: bool = True


class Filter:
    """A parsed filter in canonical form: frozen, picklable and cheap to copy.

    Build one with `parse_filter`. Equal filters compare equal and share a `digest`.
    """

    __slots__ = ("_text", "_partitions", "_compiled")
    _text: str
    _partitions: tuple[tuple[str, str], ...]
    _compiled: Leaf | None

    def __init__(self, canonical_text: str, partitions: Sequence[tuple[str, str]] = ()) -> None:
        object.__setattr__(self, "_text", canonical_text)
        object.__setattr__(self, "_partitions", tuple((str(k), str(v)) for k, v in partitions))
        object.__setattr__(self, "_compiled", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Filter is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Filter, (self._text, self._partitions))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Filter) and (self._text, self._partitions) == (other._text, other._partitions)

    def __hash__(self) -> int:
        return hash((self._text, self._partitions))

    def __repr__(self) -> str:
        text = self._text if len(self._text) <= 200 else self._text[:197] + "..."
        return f"Filter({text})"

    # -- identity -------------------------------------------------------------

    @property
    def canonical(self) -> dict[str, Any]:
        """The canonical JSON tree (a fresh copy)."""
        out: dict[str, Any] = json.loads(self._text)
        return out

    @property
    def canonical_json(self) -> str:
        """The canonical tree as compact JSON with sorted keys (what `digest` hashes)."""
        return self._text

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the filter reads, sorted, Hive partition columns included."""
        return tuple(sorted(_fields(self.canonical)))

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self._partitions)

    @property
    def stored_columns(self) -> tuple[str, ...]:
        """The columns a selection pass reads from the files (not the partition ones)."""
        parts = set(self.partition_columns)
        return tuple(c for c in self.columns if c not in parts)

    def digest(self) -> str:
        """xxh3-128 (hex) of `canonical_json`, for cache keys."""
        return xxhash.xxh3_128_hexdigest(self._text.encode("utf-8"))

    def header_value(self) -> dict[str, Any]:
        """The whole canonical tree, for the manifest header."""
        return self.canonical

    def order_value(self) -> dict[str, Any]:
        """The canonical tree for the order options, a long isin list replaced by its hash."""

        def shrink(node: dict[str, Any]) -> dict[str, Any]:
            if "args" in node:
                return {**node, "args": [shrink(a) for a in node["args"]]}
            if "arg" in node:
                return {**node, "arg": shrink(node["arg"])}
            if node["op"] == "isin" and len(node["values"]) > ISIN_HASH_THRESHOLD:
                sha = xxhash.xxh3_128_hexdigest(_dumps(node["values"]).encode("utf-8"))
                return {**node, "values": {"isin_sha": sha, "n": len(node["values"])}}
            return node

        return shrink(self.canonical)

    def expression(self) -> pc.Expression:
        """The canonical tree as a pyarrow.compute expression, scalars in their canonical types."""
        return _build(self.canonical)

    # -- pruning ----------------------------------------------------------------

    def prune(
        self,
        stats: Mapping[str, ColumnStats | None],
        partition_values: Mapping[str, Any],
        num_rows: int,
        *,
        bloom: BloomProbe | None = None,
    ) -> PruneResult:
        """Whether no row ("none"), every row ("all") or some rows ("some") of a row group can match.

        ``stats`` maps a column to its `ColumnStats` (missing or None: unknown);
        ``partition_values`` maps each Hive partition column to its value (a
        string as found in the path, or the typed value; None for null);
        ``bloom(column, keys)`` says whether any of ``keys`` may be stored in
        the column chunk, and can turn an equality or isin into "none". Sound
        under SQL's three-valued logic: "none" and "all" are only claimed when
        they hold for every row, nulls and NaN included.
        """
        if num_rows <= 0:
            return "none"
        root = self._compiled
        if root is None:
            root = _compile(self.canonical, dict(self._partitions))
            object.__setattr__(self, "_compiled", root)
        m = root(stats, partition_values, num_rows, bloom)
        return "none" if not m & _T else "all" if m == _T else "some"

    def prune_source(
        self,
        stats: Mapping[str, ColumnStats | None],
        partition_values: Mapping[str, Any],
        num_rows: int,
        *,
        bloom: BloomProbe | None = None,
    ) -> tuple[PruneResult, PruneSource]:
        """`prune`, and the first evidence that settles it: partition values, then statistics, then bloom filters."""
        r = self.prune({}, partition_values, num_rows)
        if r != "some":
            return r, "partition"
        r = self.prune(stats, partition_values, num_rows)
        if r != "some":
            return r, "statistics"
        if bloom is not None:
            r = self.prune(stats, partition_values, num_rows, bloom=bloom)
            if r != "some":
                return r, "bloom"
        return "some", "selection"

    # -- selection -----------------------------------------------------------------

    def select(self, table: pa.Table, partition_values: Mapping[str, Any] | None = None) -> np.ndarray:
        """Sorted int64 indices of the rows of ``table`` that pyarrow's filter keeps (null → not kept).

        ``table`` needs the `stored_columns`; a partition column it lacks is added
        as a constant from ``partition_values``.
        """
        missing = [c for c in self.stored_columns if c not in table.column_names]
        if missing:
            raise OptionError(f"the table lacks the filter's column(s) {missing}; it has {table.column_names}")
        n = table.num_rows
        names = [c for c in self.columns if c in table.column_names]
        t = table.select(names)
        for name, ptype in self._partitions:
            if name in table.column_names:
                continue
            typ = pa.int64() if ptype == "int64" else pa.string()
            v = (partition_values or {}).get(name)
            if v is None:
                col = pa.nulls(n, typ)
            else:
                col = pa.array([int(v) if ptype == "int64" else str(v)], typ).take(np.zeros(n, dtype=np.int64))
            t = t.append_column(name, col)
        mask = ds.dataset(t).to_table(columns={"m": self.expression()}, use_threads=False).column("m")
        keep = mask.fill_null(False).to_numpy(zero_copy_only=False)
        return np.flatnonzero(keep).astype(np.int64, copy=False)


# -- rebuilding and compiling the canonical tree ---------------------------------------

def _literal(node: Mapping[str, Any], j: Any) -> tuple[pa.DataType, Any]:
    t = parse_type_name(node["type"])
    return _coerce(_decode(t, j, node["field"]), node["field"], t, one_zero=node["op"] != "isin")


def _array(t: pa.DataType, values: list[Any]) -> pa.Array:
    return pa.array([None if v is None else _scalar(t, v) for v in values], t)


def _build(node: Mapping[str, Any]) -> pc.Expression:
    op = node["op"]
    if op in ("and", "or"):
        out = _build(node["args"][0])
        for a in node["args"][1:]:
            out = (out & _build(a)) if op == "and" else (out | _build(a))
        return out
    if op == "not":
        return ~_build(node["arg"])
    f = pc.field(node["field"])
    if op == "is_null":
        return f.is_null()
    if op == "is_valid":
        return f.is_valid()
    if op == "isin":
        t = parse_type_name(node["type"])
        vals = [None if j is None else _literal(node, j)[1] for j in node["values"]]
        return f.isin(_array(t, vals))
    t, v = _literal(node, node["value"])
    return _CMP_FUNC[op](f, pc.scalar(_scalar(t, v)))


def _partition_key(ptype: str, value: Any) -> Any:
    if ptype == "int64":
        return int(value)
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


_MISSING = object()


def _compile(node: Mapping[str, Any], partitions: Mapping[str, str]) -> Leaf:
    op = node["op"]
    if op in ("and", "or"):
        kids = [_compile(a, partitions) for a in node["args"]]
        table = _AND if op == "and" else _OR
        stop = _F if op == "and" else _T

        def combine(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
            m = kids[0](stats, pv, n, bloom)
            for k in kids[1:]:
                if m == stop:
                    return m
                m = table[m][k(stats, pv, n, bloom)]
            return m

        return combine
    if op == "not":
        kid = _compile(node["arg"], partitions)
        return lambda stats, pv, n, bloom: _NOT[kid(stats, pv, n, bloom)]
    field = node["field"]
    if op in ("is_null", "is_valid"):
        want = op == "is_null"
        if field in partitions:
            def part_null(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
                v = pv.get(field, _MISSING)
                if v is _MISSING:
                    return _T | _F
                return _T if (v is None) == want else _F
            return part_null

        def null_leaf(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
            s = stats.get(field)
            nc = None if s is None else s.null_count
            if nc is None:
                return _T | _F
            some_null = _T if want else _F
            some_valid = _F if want else _T
            return (some_null if nc > 0 else 0) | (some_valid if nc < n else 0)
        return null_leaf
    t = parse_type_name(node["type"])
    is_float = _family(t) == "float"
    if op == "isin":
        keys = sorted(_key(t, _literal(node, j)[1]) for j in node["values"] if j is not None)
        null_hit = _T if None in node["values"] else _F
        if field in partitions:
            ptype = partitions[field]
            keyset = set(keys)

            def part_isin(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
                v = pv.get(field, _MISSING)
                if v is _MISSING:
                    return _TFN
                if v is None:
                    return null_hit
                return _T if _partition_key(ptype, v) in keyset else _F
            return part_isin
        return _isin_leaf(field, keys, null_hit, is_float)
    key = _key(t, _literal(node, node["value"])[1])
    if field in partitions:
        ptype = partitions[field]
        test = _CMP_FUNC_PY[op]

        def part_cmp(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
            v = pv.get(field, _MISSING)
            if v is _MISSING:
                return _TFN
            if v is None:
                return _N
            return _T if test(_partition_key(ptype, v), key) else _F
        return part_cmp
    return _cmp_leaf(field, op, key, is_float)


_UNKNOWN = ColumnStats()

_CMP_FUNC_PY: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def _cmp_leaf(field: str, op: str, v: Any, is_float: bool) -> Leaf:
    # NaN (never in float statistics) is false for every comparison but !=.
    nan = (_T if op == "!=" else _F) if is_float else 0

    def leaf(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
        s = stats.get(field) or _UNKNOWN  # a bloom filter may still rule the value out
        nc = s.null_count
        if nc is not None and nc >= n:
            return _N
        out = _N if nc is None or nc > 0 else 0
        lo = s.min
        hi = s.max if s.max_exact else None
        if op == "==":
            t = (lo is None or lo <= v) and (hi is None or v <= hi)
            f = lo is None or hi is None or not (lo == hi == v)
            if t and bloom is not None and not bloom(field, (v,)):
                t = False
        elif op == "!=":
            t = lo is None or hi is None or not (lo == hi == v)
            f = (lo is None or lo <= v) and (hi is None or v <= hi)
        elif op == "<":
            t = lo is None or lo < v
            f = hi is None or hi >= v
        elif op == "<=":
            t = lo is None or lo <= v
            f = hi is None or hi > v
        elif op == ">":
            t = hi is None or hi > v
            f = lo is None or lo <= v
        else:  # ">="
            t = hi is None or hi >= v
            f = lo is None or lo < v
        return out | nan | (_T if t else 0) | (_F if f else 0)

    return leaf


def _isin_leaf(field: str, keys: list[Any], null_hit: int, is_float: bool) -> Leaf:
    nan = _F if is_float else 0

    def leaf(stats: Mapping[str, Any], pv: Mapping[str, Any], n: int, bloom: Any) -> int:
        s = stats.get(field) or _UNKNOWN
        nc = s.null_count
        if nc is not None and nc >= n:
            return null_hit
        out = null_hit if nc is None or nc > 0 else 0
        lo = s.min
        hi = s.max if s.max_exact else None
        i = 0 if lo is None else bisect.bisect_left(keys, lo)
        j = len(keys) if hi is None else bisect.bisect_right(keys, hi)
        t = i < j
        if t and bloom is not None and not bloom(field, keys[i:j]):
            t = False
        f = lo is None or hi is None or lo != hi or j - i != 1
        return out | nan | (_T if t else 0) | (_F if f else 0)

    return leaf


# -- statistics -------------------------------------------------------------------------

_UNIT_RE = re.compile(r"timeUnit=(milliseconds|microseconds|nanoseconds)")
_UNIT_NS = {"milliseconds": 1_000_000, "microseconds": 1_000, "nanoseconds": 1}


def row_group_stats(
    row_group: pq.RowGroupMetaData,
    schema: pa.Schema,
    *,
    columns: Iterable[str] | None = None,
) -> dict[str, ColumnStats | None]:
    """`ColumnStats` of every top-level primitive column of a row group (or of ``columns``).

    ``schema`` is the file's Arrow schema. A column without statistics, or of a
    type whose statistics detload cannot read (INT96 timestamps, float16,
    nested types), maps to None or has no min/max: "may match".
    """
    index, types = _leaf_index(schema)
    names = list(index) if columns is None else [c for c in columns if c in index]
    out: dict[str, ColumnStats | None] = {}
    n = row_group.num_columns
    for name in names:
        i = index.get(name)
        if i is None or i >= n:
            continue
        cc = row_group.column(i)
        if cc.path_in_schema != name:  # a layout this index does not know: look the column up
            found = [j for j in range(n) if row_group.column(j).path_in_schema == name]
            if not found:
                continue
            cc = row_group.column(found[0])
        out[name] = _column_stats(cc, types[name])
    return out


def _leaves(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _leaves(t.value_type)
    return 1


# Keyed by identity: hashing a pa.Schema costs ~100 µs, more than reading the statistics.
_INDEX_CACHE: dict[int, tuple[pa.Schema, dict[str, int], dict[str, pa.DataType]]] = {}


def _leaf_index(schema: pa.Schema) -> tuple[dict[str, int], dict[str, pa.DataType]]:
    """Top-level primitive column → its Parquet leaf index (pyarrow writes leaves in schema order), and its type."""
    got = _INDEX_CACHE.get(id(schema))
    if got is None or got[0] is not schema:
        index, types, i = {}, {}, 0
        for f in schema:
            k = _leaves(f.type)
            if k == 1 and not pa.types.is_nested(f.type):
                index[f.name] = i
                types[f.name] = f.type
            i += k
        if len(_INDEX_CACHE) > 256:
            _INDEX_CACHE.clear()
        got = _INDEX_CACHE[id(schema)] = (schema, index, types)
    return got[1], got[2]


def _column_stats(cc: pq.ColumnChunkMetaData, t: pa.DataType) -> ColumnStats | None:
    s = cc.statistics
    if s is None:
        return None
    nc = s.null_count if s.has_null_count else None
    lo = hi = None
    if s.has_min_max:
        conv = _converter(_value_type(t), s)
        if conv is not None:
            try:
                lo, hi = conv(s.min_raw), conv(s.max_raw)
            except (TypeError, ValueError, OverflowError):
                lo = hi = None
            if isinstance(lo, float) and isinstance(hi, float) and (math.isnan(lo) or math.isnan(hi)):
                lo = hi = None  # an old writer's NaN bound orders nothing
    return ColumnStats(
        lo, hi, nc,
        bool(getattr(s, "is_min_value_exact", True)),
        bool(getattr(s, "is_max_value_exact", True)),
    )


def _converter(t: pa.DataType, s: Any) -> Callable[[Any], Any] | None:
    fam = _family(t)
    phys = s.physical_type
    if fam == "int" and phys in ("INT32", "INT64"):
        if pa.types.is_unsigned_integer(t):
            mask = (1 << (32 if phys == "INT32" else 64)) - 1
            return lambda r: int(r) & mask
        return int
    if fam == "float" and phys in ("FLOAT", "DOUBLE"):
        return float
    if fam == "bool" and phys == "BOOLEAN":
        return bool
    if fam in ("string", "binary") and phys in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"):
        return lambda r: r if isinstance(r, bytes) else str(r).encode("utf-8")
    if fam == "date" and phys == "INT32":
        return int
    if fam == "timestamp" and phys == "INT64":
        m = _UNIT_RE.search(str(s.logical_type))
        if m is None:
            return None
        step = _UNIT_NS[m.group(1)]
        return lambda r: int(r) * step
    if fam == "decimal":
        if phys in ("INT32", "INT64"):
            return int
        if phys in ("FIXED_LEN_BYTE_ARRAY", "BYTE_ARRAY"):
            return lambda r: int.from_bytes(r, "big", signed=True)
    return None
