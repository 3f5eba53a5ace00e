"""`_arrow.numpy_of` and `fill_nulls` give exactly what pyarrow's ``to_numpy`` and ``fill_null``
give (dtype and bytes, NaN/NaT for nulls), for every fixed-width type detload maps, with
nulls, slices and empty arrays. They exist so that workers never import pandas."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detload._arrow import fill_nulls, fill_value, numpy_of

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
         pa.float16(), pa.float32(), pa.float64(), pa.bool_(), pa.timestamp("s"), pa.timestamp("ms"),
         pa.timestamp("us", "UTC"), pa.timestamp("ns"), pa.date32(), pa.date64(), pa.duration("us"),
         pa.duration("ns")]


def _array(t: pa.DataType, n: int, nulls: list[bool], seed: int) -> pa.Array:
    """n random values of ``t`` built from raw buffers; ``nulls[i]`` makes row i null."""
    rng = np.random.default_rng(seed)
    if pa.types.is_boolean(t):
        data = np.packbits(rng.random(n) < 0.5, bitorder="little")
    elif pa.types.is_floating(t):
        data = rng.standard_normal(n).astype(f"f{t.bit_width // 8}")
    elif pa.types.is_integer(t):
        info = np.iinfo(f"{'u' if pa.types.is_unsigned_integer(t) else 'i'}{t.bit_width // 8}")
        data = rng.integers(info.min, info.max, n, dtype=info.dtype, endpoint=True)
    elif pa.types.is_date32(t):
        data = rng.integers(-700_000, 2_900_000, n).astype(np.int32)  # days: years 0054 to 9909
    else:
        data = rng.integers(-(2**40), 2**40, n).astype(np.int64)
    null = np.array([bool(x) for x in nulls[:n]] + [False] * max(0, n - len(nulls)), dtype=bool)
    validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if null.any() else None
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(np.ascontiguousarray(data))],
                                 null_count=int(null.sum()))


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.kind in "fmM":
        assert np.array_equal(np.isnan(a), np.isnan(b))
        ok = ~np.isnan(a)
        assert np.array_equal(a[ok], b[ok])
    else:
        assert np.array_equal(a, b)


@pytest.mark.parametrize("t", TYPES, ids=str)
@given(n=st.integers(0, 70), nulls=st.lists(st.booleans(), max_size=70), cut=st.integers(0, 9), seed=st.integers(0, 3))
def test_numpy_of_is_to_numpy(t, n, nulls, cut, seed):
    arr = _array(t, n, nulls, seed)
    if cut and n:
        arr = arr.slice(min(cut, n), max(0, n - 2 * cut))  # an offset into the buffers
    if arr.null_count and (pa.types.is_integer(t) or pa.types.is_boolean(t)):
        return  # detload refuses these before converting (or fills them first)
    _same(numpy_of(arr), arr.to_numpy(zero_copy_only=False))


@pytest.mark.parametrize("t", [pa.int8(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(), pa.bool_()], ids=str)
@given(n=st.integers(0, 70), nulls=st.lists(st.booleans(), max_size=70), cut=st.integers(0, 9),
       value=st.one_of(st.booleans(), st.integers(-300, 300), st.floats(-1e6, 1e6, allow_nan=False)))
def test_fill_nulls_is_fill_null(t, n, nulls, cut, value):
    arr = _array(t, n, nulls, 0)
    if cut and n:
        arr = arr.slice(min(cut, n), max(0, n - 2 * cut))
    got = fill_nulls(arr, value)
    if got is None:  # left to pyarrow: only where the value is not exactly one of the type's
        assert fill_value(t, value) is None
        return
    _same(got, arr.fill_null(value).to_numpy(zero_copy_only=False))


def test_fill_value_leaves_doubtful_values_to_pyarrow():
    assert fill_value(pa.int8(), 300) is None
    assert fill_value(pa.int8(), True) is None and fill_value(pa.bool_(), 1) is None
    assert fill_value(pa.int64(), 1.0) is None
    assert fill_value(pa.float16(), 1e6) is None and fill_value(pa.float32(), 2**2000) is None
    assert fill_value(pa.string(), "x") is None
    assert fill_value(pa.float32(), float("nan")).dtype == np.float32
