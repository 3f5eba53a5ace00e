"""An ``isin`` list's value set, built once per filter and shared by every row group.

`ValueSet` holds one canonical ``isin`` node's values as an Arrow array (the value set
pyarrow's ``is_in`` takes), as sorted keys for pruning (`prune.SortedKeys`), and as a
sorted NumPy array or a dict for narrowing the set to the values one row group holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .prune import SortedKeys
from .scalars import compare_keys, family_of, node_literal, parse_type_name, to_scalar

__all__ = ["NARROW_MIN", "ValueSet", "isin_values", "value_array"]

#: A value set with more members than this (and than the rows being filtered) is narrowed to
#: the members a row group holds before pyarrow's ``is_in`` runs: ``is_in`` builds a hash
#: table of the whole set on every call, which made planning cost values x row groups.
NARROW_MIN = 256

_SLOW = object()


def _quick_decoder(t: pa.DataType) -> Callable[[Any], Any] | None:
    """A canonical JSON value → its internal value, for the common types, without `node_literal`'s
    general path; `_SLOW` for anything it does not settle (then `node_literal` decides, errors included)."""
    fam = family_of(t)
    if fam == "int":
        bits = t.bit_width
        lo, hi = (0, (1 << bits) - 1) if pa.types.is_unsigned_integer(t) else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return lambda j: j if type(j) is int and lo <= j <= hi else _SLOW
    if fam == "string":
        return lambda j: j if type(j) is str else _SLOW
    if fam == "float" and pa.types.is_float64(t):
        # float32 values are checked for exactness by the general path.
        return lambda j: j if type(j) is float and j == j else _SLOW
    return None


def isin_values(node: Mapping[str, Any]) -> tuple[pa.DataType, list[Any]]:
    """The scalar type of a canonical ``isin`` node and its values as internal values (None: null),
    each exactly what `node_literal` gives for it."""
    t = parse_type_name(node["type"])
    quick = _quick_decoder(t)
    out: list[Any] = []
    for j in node["values"]:
        if j is None:
            out.append(None)
            continue
        v = quick(j) if quick is not None else _SLOW
        out.append(node_literal(node, j)[1] if v is _SLOW else v)
    return t, out


def value_array(t: pa.DataType, values: list[Any]) -> pa.Array:
    """The Arrow array of internal values (None: null) of scalar type ``t``: the value set of ``is_in``."""
    fam = family_of(t)
    if fam in ("int", "float", "bool", "string", "binary"):
        return pa.array(values, t)  # the internal value is what to_scalar would wrap as is
    return pa.array([None if v is None else to_scalar(t, v) for v in values], t)


def _numeric(arr: pa.Array) -> np.ndarray | None:
    """A null-free array's values as NumPy numbers that are equal when Arrow's are, or None."""
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        out: np.ndarray = arr.to_numpy(zero_copy_only=False)
        return out
    if pa.types.is_date32(t):
        return arr.view(pa.int32()).to_numpy(zero_copy_only=False)
    if pa.types.is_date64(t) or pa.types.is_timestamp(t):
        return arr.view(pa.int64()).to_numpy(zero_copy_only=False)
    return None


class ValueSet:
    """One ``isin`` node's values, in every form filtering needs, built once."""

    def __init__(self, node: Mapping[str, Any]) -> None:
        t, values = isin_values(node)
        self.type = t
        self.has_null = None in values
        members = [v for v in values if v is not None]
        self.size = len(members)
        #: The value set exactly as the canonical tree lists it (the expression's).
        self.array = value_array(t, values)
        self._members = self.array.drop_null() if self.has_null else self.array
        #: Sorted keys in the comparison domain of row-group statistics, for pruning.
        self.keys = SortedKeys(sorted(compare_keys(t, members)))
        self._lock = threading.Lock()
        self._index: tuple[np.ndarray, np.ndarray] | dict[Any, int] | None = None

    def _lookup(self) -> tuple[np.ndarray, np.ndarray] | dict[Any, int]:
        # Built at the first row group that needs narrowing: most sets never do.
        with self._lock:
            if self._index is None:
                keys = _numeric(self._members)
                if keys is not None:
                    order = np.argsort(keys, kind="stable")
                    self._index = (keys[order], order)
                else:
                    # One member per value is enough: ``is_in`` matches a row with any copy of it.
                    members = self._members.to_pylist()
                    self._index = dict(zip(members, range(len(members))))
            return self._index

    def narrowed(self, column: pa.ChunkedArray | pa.Array) -> pa.Array | None:
        """The members some value of ``column`` may equal (and the null, if the set has it), or
        None where the whole set should be used.

        The members are picked by an equality at least as loose as ``is_in``'s (-0.0 and 0.0
        are one number here; the dict path compares Python values), so ``is_in`` on this
        subset keeps exactly the rows ``is_in`` on the whole set keeps.
        """
        n = len(column)
        if self.size <= max(NARROW_MIN, n):
            return None  # is_in's table costs no more than reading the column
        ctype = column.type
        if pa.types.is_dictionary(ctype):
            ctype = ctype.value_type
        if ctype != self.type:
            return None  # is_in casts the set to the column's type: leave that to it
        uniq = pc.unique(column)
        if pa.types.is_dictionary(uniq.type):
            uniq = uniq.dictionary_decode()
        uniq = uniq.drop_null()
        index = self._lookup()
        if isinstance(index, tuple):
            skeys, order = index
            ukeys = _numeric(uniq)
            if ukeys is None:
                return None
            lo = np.searchsorted(skeys, ukeys, side="left")
            hi = np.searchsorted(skeys, ukeys, side="right")
            span = hi - lo
            hit = span > 0
            lo, span = lo[hit], span[hit]
            # Every position in each [lo, hi): a run's start plus its place in the run.
            first = np.repeat(lo - np.concatenate([[0], np.cumsum(span)[:-1]]), span)
            picked = np.unique(order[first + np.arange(int(span.sum()))])
        else:
            got = [index[v] for v in uniq.to_pylist() if v in index]
            picked = np.unique(np.asarray(got, dtype=np.int64))
        subset = self._members.take(pa.array(picked, pa.int64()))
        if self.has_null:
            subset = pa.concat_arrays([pa.nulls(1, self.type), subset])
        return subset
