"""Small tables holding every Arrow type Parquet can store, nulls at every level, for the digest and layout tests.

``all_types_table`` is built in memory; ``parquet_types_table`` is what pyarrow reads back after
writing it (Parquet turns date64 into date32, seconds into milliseconds and renames list items).
"""

from __future__ import annotations

import decimal
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 12


def _cycle(values: list, n: int) -> list:
    return [values[i % len(values)] for i in range(n)]


def all_types_table(n: int = ROWS) -> pa.Table:
    """n rows; the key columns ``k`` (int64, distinct) and ``g`` (string, a few values) come first."""
    rng = np.random.default_rng(7)
    nan_payload = np.array([np.nan]).view(np.uint64)
    nan_payload[0] |= 0x123  # a quiet NaN with a payload
    f64 = [1.5, -0.0, 0.0, float(nan_payload.view(np.float64)[0]), float("nan"), None, 1e300, -2.25]
    d = decimal.Decimal
    cols: dict[str, pa.Array] = {
        "k": pa.array(rng.permutation(n).astype(np.int64)),
        "g": pa.array(_cycle(["b", "a", "c", None, "a"], n)),
        "u8": pa.array(_cycle([0, 255, 1, None, 7], n), pa.uint8()),
        "u64": pa.array(_cycle([2**64 - 1, 0, 5, None, 2**63], n), pa.uint64()),
        "i8": pa.array(_cycle([-128, 127, None, 0], n), pa.int8()),
        "i16": pa.array(_cycle([-3, 4, None, 5], n), pa.int16()),
        "i32": pa.array(_cycle([-(2**31), 2**31 - 1, None, 0, 42], n), pa.int32()),
        "i64": pa.array(_cycle([-(2**63), 2**63 - 1, None, 0, -1], n), pa.int64()),
        "f16": pa.array(np.array(_cycle([1.5, -0.0, np.nan, 2.0, 65504.0], n), np.float16)),
        "f32": pa.array(_cycle([1.5, -0.0, float("nan"), None, 3.25], n), pa.float32()),
        "f64": pa.array(_cycle(f64, n), pa.float64()),
        "b": pa.array(_cycle([True, False, None], n)),
        "s": pa.array(_cycle(["a", "bb", None, "", "é", "exactly8", "longer than eight bytes", "\x00"], n)),
        "ls": pa.array(_cycle(["x", None, "", "twelve bytes"], n), pa.large_string()),
        "dict": pa.array(_cycle(["x", "y", "x", None, "z"], n)).dictionary_encode(),
        "dict_int": pa.array(_cycle([10, 20, None, 10], n)).dictionary_encode(),
        "bin": pa.array(_cycle([b"\x00", b"", None, b"ab" * 9], n), pa.binary()),
        "lbin": pa.array(_cycle([b"\xff" * 3, None, b""], n), pa.large_binary()),
        "fsb": pa.array(_cycle([b"abcd", b"\x00\x00\x00\x00", None], n), pa.binary(4)),
        "d32": pa.array(_cycle([0, 1, None, -5, 20000], n), pa.date32()),
        "t32": pa.array(_cycle([1, 2, None, 86_399_999], n), pa.time32("ms")),
        "t64": pa.array(_cycle([1, 2, None, 86_399_999_999_999], n), pa.time64("ns")),
        "ts_ns_tz": pa.array(_cycle([1, None, 1_700_000_000_000_000_001, -5], n), pa.timestamp("ns", "Europe/Paris")),
        "ts_us": pa.array(_cycle([0, None, 253_402_300_799_000_000], n), pa.timestamp("us")),
        "ts_ms_utc": pa.array(_cycle([1, 2, None], n), pa.timestamp("ms", "UTC")),
        "dur": pa.array(_cycle([1, None, -3], n), pa.duration("us")),
        "dec": pa.array(_cycle([d("1.23"), None, d("-9.99"), d("0.00")], n), pa.decimal128(5, 2)),
        "dec38": pa.array(_cycle([d("1" * 38), None, d("-" + "9" * 38)], n), pa.decimal128(38, 0)),
        "dec256": pa.array(_cycle([d("1" * 50 + ".25"), None, d("-0.01")], n), pa.decimal256(60, 2)),
        "fsl": pa.array(_cycle([[1.0, 2.0], None, [3.0, None], [0.0, -0.0]], n), pa.list_(pa.float32(), 2)),
        "li": pa.array(_cycle([[1], [], None, [None, 2], [3, 4, 5]], n), pa.list_(pa.int64())),
        "lli": pa.array(_cycle([[1], [], None, [None, 2]], n), pa.large_list(pa.int16())),
        "nested": pa.array(_cycle([[[1, 2], None], [], None, [[]], [[3]]], n), pa.list_(pa.list_(pa.int32()))),
        "lstr": pa.array(_cycle([["a", None, ""], None, [], ["a longer string", "b"]], n), pa.list_(pa.string())),
        "st": pa.array(_cycle([{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}, {"a": None, "b": None}], n),
                       pa.struct([("a", pa.int64()), ("b", pa.string())])),
        "st_nested": pa.array(_cycle([{"p": [1, 2], "q": {"r": 1.5}}, {"p": None, "q": None}, None], n),
                              pa.struct([("p", pa.list_(pa.int8())), ("q", pa.struct([("r", pa.float64())]))])),
        "mp": pa.array(_cycle([[("k", 1)], None, [], [("a", 2), ("b", None)]], n), pa.map_(pa.string(), pa.int32())),
        "nul": pa.nulls(n),
        "uuid": pa.ExtensionArray.from_storage(pa.uuid(), pa.array(_cycle([bytes(range(16)), None, bytes(16)], n),
                                                                  pa.binary(16))),
        "lts": pa.array(_cycle([[1, None], None, [], [2]], n), pa.list_(pa.timestamp("ns", "UTC"))),
    }
    return pa.table(cols)


def parquet_types_table(n: int = ROWS) -> pa.Table:
    """``all_types_table`` as pyarrow reads it back from Parquet."""
    buf = io.BytesIO()
    pq.write_table(all_types_table(n), buf)
    buf.seek(0)
    return pq.read_table(buf)
