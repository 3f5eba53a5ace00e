"""Row filters: detload's canonical form of a filter, and the `Filter` object.

`parse_filter` reads a pyarrow.compute expression, a pyarrow DNF list, JSON
or filter text (`detload._filters.text`) into one canonical JSON tree typed against the dataset's schema, so that equal
filters get equal fingerprints whichever form they were written in. A `Filter`
prunes row groups (`detload._filters.prune`) and selects the exact rows pyarrow's own
filter keeps.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import xxhash

from ..errors import OptionError
from .isin import NARROW_MIN, ValueSet
from .prune import (
    BloomProbe,
    ColumnStats,
    Leaf,
    PruneResult,
    PruneSource,
    compile_prune,
    row_group_stats,
    verdict,
)
from .scalars import (
    SUPPORTED_SUBSET,
    coerce,
    decode_value,
    encode_value,
    family_of,
    node_literal,
    parse_type_name,
    to_scalar,
    type_name,
    value_type,
)
from .text import TEXT_SYNTAX, TextLiteral, check_text, read_filter_text, text_literal_hint

__all__ = [
    "BloomProbe",
    "ColumnStats",
    "Filter",
    "FilterInput",
    "ISIN_HASH_THRESHOLD",
    "PruneResult",
    "PruneSource",
    "SUPPORTED_SUBSET",
    "TEXT_SYNTAX",
    "parse_filter",
    "row_group_stats",
]

#: What `parse_filter` accepts: an expression, a DNF list, JSON or filter text, or a canonical dict.
FilterInput = Union[pc.Expression, Sequence[Any], str, Mapping[str, Any], "Filter"]

#: An ``isin`` list longer than this enters the order options as a hash (`Filter.order_value`).
ISIN_HASH_THRESHOLD = 64

_CMP_OPS = ("==", "!=", "<", "<=", ">", ">=")
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_DNF_OPS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")
_ARROW_CMP = {
    "equal": "==", "not_equal": "!=", "less": "<", "less_equal": "<=",
    "greater": ">", "greater_equal": ">=",
}
_CMP_FUNC = {v: getattr(pc, k) for k, v in _ARROW_CMP.items()}


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


def _refuse_nan_raw(raw: Raw) -> None:
    if raw[0] in ("and", "or"):
        _refuse_nan_raw(raw[1])
        _refuse_nan_raw(raw[2])
    elif raw[0] == "not":
        _refuse_nan_raw(raw[1])
    elif raw[0] == "isin":
        _refuse_nan_isin(raw[1], raw[2])


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
        return None if j is None else to_scalar(*coerce(decode_value(t, j, field), field, t, one_zero=op != "isin"))

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
        if typed and family_of(t) is None:
            raise OptionError(
                f"filter column {field!r} has type {t}, which filters cannot compare; comparisons and isin "
                "take integer, float32/float64, bool, string, binary, date, timestamp and decimal columns"
                " (is_null and is_valid take any column)"
            )
        return t

    def literal(self, x: Any, field: str, t: pa.DataType, *, one_zero: bool = True) -> tuple[pa.DataType, Any]:
        if isinstance(x, _Json):
            x = decode_value(value_type(t), x.value, field)
        elif isinstance(x, TextLiteral):
            try:
                return coerce(x.value, field, t, one_zero=one_zero)
            except OptionError as e:
                raise OptionError(f"{e}{text_literal_hint(t)}") from None
        return coerce(x, field, t, one_zero=one_zero)

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
            return {"op": _FLIP[op] if left else op, "field": field, "type": type_name(ct), "value": encode_value(ct, v)}
        if tag == "isin":
            _, field, values, skip_nulls = raw
            t = self.column(field, typed=True)
            quick = _quick_isin(values, t)  # a list it takes holds no NaN
            if quick is None:
                _refuse_nan_isin(field, values)
            vals: list[Any]
            if quick is not None:  # plain ints or strs: what the general path gives, in one pass
                null, members = quick
                vals = [None] if null and not skip_nulls else []
                vals += members
                return {"op": "isin", "field": field, "type": type_name(value_type(t)), "values": vals}
            items = [values[i] for i in range(len(values))] if isinstance(values, pa.Array) else list(values)
            null = any(_is_null_literal(x) for x in items)
            fitted = [self.literal(x, field, t, one_zero=False) for x in items if not _is_null_literal(x)]
            if len({ct for ct, _ in fitted}) > 1:  # a float32 column with some inexact literals
                fitted = [self.literal(x, field, pa.float64(), one_zero=False) for x in items if not _is_null_literal(x)]
            ct = fitted[0][0] if fitted else value_type(t)
            vals = [None] if null and not skip_nulls else []
            vals += [encode_value(ct, v) for v in _sorted_unique(fitted)]
            return {"op": "isin", "field": field, "type": type_name(ct), "values": vals}
        raise AssertionError(tag)


def _is_nan(x: Any) -> bool:
    if isinstance(x, (_Json, TextLiteral)):
        x = x.value
    if isinstance(x, pa.Scalar):
        x = x.as_py() if x.is_valid and pa.types.is_floating(x.type) else None
    return isinstance(x, (float, np.floating)) and math.isnan(x)


def _refuse_nan_isin(field: str, values: Any) -> None:
    """NaN in an isin list: pyarrow's isin matches NaN rows with it while == never does and
    engines disagree on NaN = NaN, so filters take no NaN at all; said plainly, by name."""
    if isinstance(values, pa.Array):
        nan = pa.types.is_floating(values.type) and bool(pc.any(pc.is_nan(values)).as_py())
    else:
        nan = any(_is_nan(x) for x in values)
    if nan:
        raise OptionError(
            f"filter isin on column {field!r} lists NaN: NaN is not allowed in isin values (filters take no "
            "NaN: pyarrow's isin would match NaN rows with it, == never does, and other engines disagree); "
            "remove NaN from the list"
        )


def _quick_isin(values: Any, t: pa.DataType) -> tuple[bool, list[Any]] | None:
    """(whether a null is listed, the sorted distinct members) of an isin list of plain ints for an
    integer column or of plain strs for a string column, all in range and valid, exactly as
    fitting each value would give them; None for any other list (it is fitted value by value)."""
    fam = family_of(t)
    if fam not in ("int", "string"):
        return None
    if isinstance(values, pa.Array):
        vt = values.type
        if not (pa.types.is_integer(vt) if fam == "int" else (pa.types.is_string(vt) or pa.types.is_large_string(vt))):
            return None
        items = values.to_pylist()
    else:
        items = [x.value if isinstance(x, (_Json, TextLiteral)) else x for x in values]
    kind = int if fam == "int" else str
    members = [x for x in items if x is not None]
    if members and set(map(type, members)) != {kind}:  # exact types: no bool, no subclass
        return None
    if members and fam == "int":
        bits = value_type(t).bit_width
        unsigned = pa.types.is_unsigned_integer(value_type(t))
        lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        if min(members) < lo or max(members) > hi:
            return None
    if members and fam == "string":
        try:
            "".join(members).encode("utf-8")
        except UnicodeEncodeError:
            return None  # a lone surrogate: refused by name, value by value
    # sorted(set(members)), done by Arrow: integers sort by value and UTF-8 bytes in code point
    # order, which is Python's order of ints and strs.
    arr = pa.array(members, value_type(t) if fam == "int" else pa.string())
    uniq = pc.unique(arr)
    return len(members) < len(items), uniq.take(pc.sort_indices(uniq)).to_pylist()


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

    ``filter`` is a pyarrow.compute expression, a pyarrow DNF list, a string,
    a canonical tree as a dict, or a `Filter`. A string whose first non-blank
    character is ``[`` or ``{`` is JSON (an array is a DNF list, an object a
    canonical tree); any other string is the filter text syntax
    (`TEXT_SYNTAX`, e.g. ``market == "US" and day >= 20260101``). ``partition_types`` types the Hive
    partition columns ({"key": "int64" | "string"}). Raises `OptionError` for
    anything outside `SUPPORTED_SUBSET`, unknown columns and ill-typed values.
    """
    ptypes = dict(partition_types or {})
    canon = _Canonicalizer(schema, ptypes)
    if isinstance(filter, str):
        check_text(filter, "filter text")
    if isinstance(filter, Filter):
        raw = _read_canonical(filter.canonical)
    elif isinstance(filter, pc.Expression):
        raw = _read_expression(filter)
        _refuse_nan_raw(raw)  # NaN != NaN would fail the check below with a vaguer message
        try:
            same = _raw_expression(raw).equals(filter)
        except Exception:
            same = False
        if not same:
            raise _refuse(filter, "could not be read back exactly")
    elif isinstance(filter, str) and filter.lstrip()[:1] in ("[", "{"):
        try:
            data = json.loads(filter)
        except json.JSONDecodeError as e:
            raise OptionError(
                f"filter text {filter!r} starts with {filter.lstrip()[0]!r}, so it is read as JSON, but is not JSON ({e}); "
                "write a JSON DNF list such as '[[\"market\", \"==\", \"US\"]]', a canonical filter object, "
                "or an expression such as 'market == \"US\"'"
            ) from None
        raw = _read_dnf(data, from_json=True) if isinstance(data, list) else _read_canonical(data)
    elif isinstance(filter, str):
        raw = read_filter_text(filter)
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


class Filter:
    """A parsed filter in canonical form: frozen, picklable and cheap to copy.

    Build one with `parse_filter` (public: ``detload.filters.parse``). Equal filters compare
    equal and share a `digest`.
    """

    __slots__ = ("_text", "_partitions", "_prepared")
    _text: str
    _partitions: tuple[tuple[str, str], ...]
    _prepared: _Prepared | None

    def __init__(self, canonical_text: str, partitions: Sequence[tuple[str, str]] = ()) -> None:
        object.__setattr__(self, "_text", canonical_text)
        object.__setattr__(self, "_partitions", tuple((str(k), str(v)) for k, v in partitions))
        object.__setattr__(self, "_prepared", None)

    def prepare(self) -> _Prepared:
        """The parsed tree, pruning closures, expression and ``isin`` value sets, built once.

        Planning calls this before its threads start; every later call returns the same object.
        """
        got = self._prepared
        if got is None:
            with _PREPARE_LOCK:
                got = self._prepared
                if got is None:
                    got = _Prepared(self._text, self._partitions)
                    object.__setattr__(self, "_prepared", got)
        return got

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
        return self.prepare().columns

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
        return self.prepare().expression

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
        return verdict(self.prepare().prune(stats, partition_values, num_rows, bloom))

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
        expr = self.prepare().select_expression(t)
        mask = ds.dataset(t).to_table(columns={"m": expr}, use_threads=False).column("m")
        keep = mask.fill_null(False).to_numpy(zero_copy_only=False)
        return np.flatnonzero(keep).astype(np.int64, copy=False)


# -- rebuilding and compiling the canonical tree ---------------------------------------

_PREPARE_LOCK = threading.Lock()

#: ``table -> expression``: the filter's expression for one table (its isin sets narrowed to it).
Selector = Callable[[pa.Table], pc.Expression]


class _Prepared:
    """What a `Filter` computes from its canonical text once: the tree, its columns, the pruning
    closure, the expression and the selection's per-table expression. Each ``isin`` list becomes
    one `ValueSet` that all of them share, so no row group rebuilds or converts a list."""

    __slots__ = ("tree", "columns", "prune", "expression", "select_expression", "value_sets")

    def __init__(self, text: str, partitions: Sequence[tuple[str, str]]) -> None:
        tree = json.loads(text)
        sets: dict[int, ValueSet] = {}

        def walk(node: Mapping[str, Any]) -> None:
            if "args" in node:
                for a in node["args"]:
                    walk(a)
            elif "arg" in node:
                walk(node["arg"])
            elif node["op"] == "isin":
                sets[id(node)] = ValueSet(node)

        walk(tree)
        self.tree: dict[str, Any] = tree
        self.value_sets = list(sets.values())
        self.columns = tuple(sorted(_fields(tree)))
        self.prune: Leaf = compile_prune(tree, dict(partitions), lambda n: sets[id(n)].keys)
        self.expression = _build(tree, sets)
        self.select_expression: Selector = _selector(tree, sets, self.expression)


def _build(node: Mapping[str, Any], sets: Mapping[int, ValueSet]) -> pc.Expression:
    op = node["op"]
    if op in ("and", "or"):
        out = _build(node["args"][0], sets)
        for a in node["args"][1:]:
            out = (out & _build(a, sets)) if op == "and" else (out | _build(a, sets))
        return out
    if op == "not":
        return ~_build(node["arg"], sets)
    f = pc.field(node["field"])
    if op == "is_null":
        return f.is_null()
    if op == "is_valid":
        return f.is_valid()
    if op == "isin":
        return f.isin(sets[id(node)].array)
    t, v = node_literal(node, node["value"])
    return _CMP_FUNC[op](f, pc.scalar(to_scalar(t, v)))


def _selector(tree: Mapping[str, Any], sets: Mapping[int, ValueSet], whole: pc.Expression) -> Selector:
    """The expression `Filter.select` evaluates on a table: the filter's, except that a long isin
    list is narrowed to the members the table's column may hold (`ValueSet.narrowed`), which
    keeps the same rows and spares ``is_in`` a hash table of the whole list per row group."""
    if all(vs.size <= NARROW_MIN for vs in sets.values()):
        return lambda table: whole

    def compile_node(node: Mapping[str, Any]) -> Selector:
        op = node["op"]
        if op in ("and", "or"):
            kids = [compile_node(a) for a in node["args"]]
            if op == "and":
                def conj(table: pa.Table) -> pc.Expression:
                    out = kids[0](table)
                    for k in kids[1:]:
                        out = out & k(table)
                    return out
                return conj

            def disj(table: pa.Table) -> pc.Expression:
                out = kids[0](table)
                for k in kids[1:]:
                    out = out | k(table)
                return out
            return disj
        if op == "not":
            kid = compile_node(node["arg"])
            return lambda table: ~kid(table)
        vs = sets.get(id(node))
        fixed = _build(node, sets)
        if vs is None or vs.size <= NARROW_MIN:
            return lambda table: fixed
        field = node["field"]

        def isin(table: pa.Table) -> pc.Expression:
            subset = vs.narrowed(table.column(field))
            return fixed if subset is None else pc.field(field).isin(subset)
        return isin

    return compile_node(tree)

