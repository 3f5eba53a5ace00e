"""Arrow arrays to NumPy without ``Array.to_numpy``, which imports pandas in every worker.

pyarrow's ``to_numpy`` runs its pandas conversion layer (``ConvertArrayToPandas``),
whose first call imports pandas when pandas is installed: 0.2-0.6 s and ~30 MiB
more in every worker process, landing in its first block's ``convert``. So
does any Python-to-Arrow conversion (``pa.array``, ``pa.scalar``). The fixed-width
types detload delivers are read straight from their Arrow buffers here instead.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["fill_nulls", "fill_value", "int64_array", "numpy_of"]


# Cached by type: it runs for every column of every row group, and the type tests and
# dtype construction cost a worker ~2 us a column (a tenth of a CTR block's convert).
@functools.cache
def _dtype_of(t: pa.DataType) -> tuple[np.dtype[Any], np.dtype[Any]] | None:
    """(dtype of the Arrow buffer, dtype delivered) of a fixed-width type, or None."""
    if pa.types.is_integer(t):
        d = np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
        return d, d
    if pa.types.is_floating(t):
        d = np.dtype(f"f{t.bit_width // 8}")
        return d, d
    if pa.types.is_timestamp(t):
        return np.dtype(np.int64), np.dtype(f"datetime64[{t.unit}]")
    if pa.types.is_duration(t):
        return np.dtype(np.int64), np.dtype(f"timedelta64[{t.unit}]")
    if pa.types.is_date32(t):
        return np.dtype(np.int32), np.dtype("datetime64[D]")
    if pa.types.is_date64(t):
        return np.dtype(np.int64), np.dtype("datetime64[ms]")
    return None


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """A bitmap (validity or boolean values) as n bools."""
    raw = np.frombuffer(buf, dtype=np.uint8)
    return np.unpackbits(raw, count=offset + n, bitorder="little")[offset:].view(np.bool_)


def numpy_of(arr: pa.Array) -> np.ndarray:
    """``arr.to_numpy(zero_copy_only=False)``, without pandas, for the types detload maps.

    Numbers, timestamps, dates and durations without nulls are zero-copy views (dates
    and booleans are copied, as to_numpy copies them); nulls become NaN in floats and
    NaT in times. Other types, and nulls elsewhere (which the callers refuse before
    converting), fall back to ``to_numpy``.
    """
    t = arr.type
    n = len(arr)
    off = arr.offset
    bufs = arr.buffers()
    if pa.types.is_boolean(t) and not arr.null_count:
        return _bits(bufs[1], off, n) if n else np.empty(0, np.bool_)
    kinds = _dtype_of(t)
    if kinds is None or len(bufs) != 2:
        return arr.to_numpy(zero_copy_only=False)
    raw, out_dtype = kinds
    if n == 0:
        return np.empty(0, out_dtype)
    values = np.frombuffer(bufs[1], dtype=raw, count=n, offset=off * raw.itemsize)
    if raw.itemsize != out_dtype.itemsize:  # date32: days as int32, datetime64[D] is 8 bytes
        values = values.astype(np.int64)
    if arr.null_count:
        if out_dtype.kind not in "fmM":
            return arr.to_numpy(zero_copy_only=False)
        valid = _bits(bufs[0], off, n)
        values = values.copy()
        if out_dtype.kind == "f":
            values[~valid] = np.nan
        else:
            values[~valid] = np.iinfo(np.int64).min  # NaT
    return values.view(out_dtype) if values.dtype != out_dtype else values


def fill_value(t: pa.DataType, value: Any) -> np.ndarray | None:
    """``value`` as a 0-d array of ``t``'s NumPy dtype when it is exactly that value (a bool
    for booleans, an int in range for integers, a number that does not overflow for floats);
    None otherwise, and for other types (pyarrow decides those, through ``pa.scalar``)."""
    if pa.types.is_boolean(t):
        return np.asarray(value, dtype=np.bool_) if isinstance(value, bool) else None
    kinds = _dtype_of(t)
    if kinds is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    dtype = kinds[1]
    if pa.types.is_integer(t):
        if not isinstance(value, int):
            return None
        info = np.iinfo(dtype)  # type: ignore[type-var]  # an integer dtype here
        return np.asarray(value, dtype=dtype) if info.min <= value <= info.max else None
    if pa.types.is_floating(t):
        if isinstance(value, int) and abs(value) > 2**53:
            return None  # not exact as a double: how it rounds is pyarrow's to say
        f = float(value)
        if math.isfinite(f) and abs(f) > float(np.finfo(dtype).max):
            return None  # would overflow to inf: pyarrow's answer is the one to give
        return np.asarray(f, dtype=dtype)
    return None


def fill_nulls(arr: pa.Array, value: Any) -> np.ndarray | None:
    """``arr.fill_null(value)`` as NumPy for booleans, integers and floats, without pandas;
    None where `fill_value` leaves the decision to pyarrow."""
    t = arr.type
    fill = fill_value(t, value)
    if fill is None:
        return None
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    if pa.types.is_boolean(t):
        values = _bits(bufs[1], off, n).copy()
    else:
        values = np.frombuffer(bufs[1], dtype=fill.dtype, count=n, offset=off * fill.dtype.itemsize).copy()
    if bufs[0] is not None:
        values[~_bits(bufs[0], off, n)] = fill
    return values


def int64_array(values: np.ndarray) -> pa.Array:
    """An int64 Arrow array over ``values`` (an index for ``take``), made from its buffer:
    ``pa.array(values)`` goes through the Python conversion, which imports pandas."""
    index = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(index), [None, pa.py_buffer(index)])
