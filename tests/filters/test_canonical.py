"""Filters: the canonical form, its error messages, three-valued pruning and the exact selection.

The property tests check pruning against pyarrow's own evaluation of the
user's expression on each row group: "none" must mean pyarrow keeps no row of
it, "all" that pyarrow keeps every row, and `Filter.select` must return
exactly the rows pyarrow keeps.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import pickle
import tempfile
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import xxhash
from _filterdata import (
    PARTITION_TYPES,
    SCHEMA,
    filter_specs,
    hive_tables,
    spec_expression,
    with_partitions,
    write_hive,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from detload._filters.canonical import (
    ISIN_HASH_THRESHOLD,
    ColumnStats,
    Filter,
    parse_filter,
    row_group_stats,
)
from detload.errors import OptionError

f = pc.field

# The pure-logic tests run many more examples than the profile's default,
# which is sized for tests that start workers.
MANY = settings(max_examples=settings().max_examples * 10)

WIDE = pa.schema([
    ("market", pa.string()), ("day", pa.int64()), ("i8", pa.int8()), ("u64", pa.uint64()),
    ("x", pa.float64()), ("x32", pa.float32()), ("flag", pa.bool_()), ("blob", pa.binary()),
    ("code", pa.binary(2)), ("date", pa.date32()), ("date64", pa.date64()),
    ("ts", pa.timestamp("ms", "UTC")), ("naive", pa.timestamp("us")), ("price", pa.decimal128(9, 2)),
    ("cat", pa.dictionary(pa.int32(), pa.string())), ("tags", pa.list_(pa.string())), ("big", pa.large_string()),
])
PARTS = {"region": "string", "year": "int64"}


def canon(x, schema=WIDE, parts=PARTS) -> str:
    return parse_filter(x, schema, parts).canonical_json


# -- canonical form ------------------------------------------------------------------

def test_golden_canonical_form():
    # The canonical text is hashed into fingerprints: changing it changes every filtered plan.
    flt = parse_filter([[("market", "==", "US"), ("day", ">=", 20260101)], [("i8", "in", [3, 1])]], WIDE)
    assert flt.canonical_json == (
        '{"args":[{"args":[{"field":"market","op":"==","type":"string","value":"US"},'
        '{"field":"day","op":">=","type":"int64","value":20260101}],"op":"and"},'
        '{"field":"i8","op":"isin","type":"int8","values":[1,3]}],"op":"or"}'
    )
    assert flt.digest() == "6f34b2b515cdd994f73474cc85825888"
    assert flt.digest() == xxhash.xxh3_128_hexdigest(flt.canonical_json.encode())


EQUAL_FORMS = [
    (f("market") == "US", [("market", "=", "US")], '[["market", "==", "US"]]'),
    ((f("day") >= 20260101) & (f("day") < 20260201), [("day", ">=", 20260101), ("day", "<", 20260201)], None),
    (
        ((f("market") == "US") & (f("day") > 5)) | (f("market") == "DE"),
        [[("market", "==", "US"), ("day", ">", 5)], [("market", "==", "DE")]],
        '[[["market", "==", "US"], ["day", ">", 5]], [["market", "==", "DE"]]]',
    ),
    (f("market").isin(["US", "DE", "US"]), [("market", "in", {"DE", "US"})], '[["market", "in", ["US", "DE"]]]'),
    (~f("day").isin([3, 1, 2]), [("day", "not in", (1, 2, 3))], '[["day", "not in", [2, 3, 1]]]'),
    (f("i8") == pa.scalar(3, pa.int8()), [("i8", "==", 3)], '[["i8", "==", 3.0]]'),
    (f("i8") == np.int64(3), [("i8", "==", 3.0)], None),
    (pc.less(pc.scalar(3), f("day")), [("day", ">", 3)], None),
    (pc.greater_equal(pc.scalar("m"), f("market")), [("market", "<=", "m")], None),
    (
        f("ts") == pa.scalar(dt.datetime(2026, 1, 1, 19, tzinfo=ZoneInfo("America/New_York")), pa.timestamp("ns", "America/New_York")),
        [("ts", "==", dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc))],
        '[["ts", "==", "2026-01-02T00:00:00Z"]]',
    ),
    (f("naive") < np.datetime64("2026-01-02T03:04:05.123456"), [("naive", "<", dt.datetime(2026, 1, 2, 3, 4, 5, 123456))],
     '[["naive", "<", "2026-01-02T03:04:05.123456"]]'),
    (f("date") >= dt.date(2026, 3, 1), [("date", ">=", np.datetime64("2026-03-01"))], '[["date", ">=", "2026-03-01"]]'),
    (f("date64") == pa.scalar(dt.date(2026, 3, 1), pa.date64()), [("date64", "==", dt.date(2026, 3, 1))], '[["date64", "==", "2026-03-01"]]'),
    (f("price") == pa.scalar(decimal.Decimal("1.5"), pa.decimal128(5, 1)), [("price", "==", decimal.Decimal("1.50"))], '[["price", "==", "1.5"]]'),
    (f("price") > 2, [("price", ">", decimal.Decimal(2))], '[["price", ">", 2]]'),
    (f("x32") == 0.5, [("x32", "==", np.float32(0.5))], '[["x32", "==", 0.5]]'),
    (f("x") == 2, [("x", "==", 2.0)], '[["x", "==", 2]]'),
    (f("x") == -0.0, [("x", "==", 0.0)], None),
    (f("blob") == b"\x00\xff", [("blob", "==", b"\x00\xff")], '[["blob", "==", "00ff"]]'),
    (f("flag") == True, [("flag", "==", True)], '[["flag", "==", true]]'),  # noqa: E712
    (f("year") == 2026, [("year", "==", 2026)], '[["year", "==", 2026]]'),
    (f("region") == "eu", [("region", "==", "eu")], None),
    (f("cat") == "a", [("cat", "==", "a")], None),
    (f("big").isin(["b", "a"]), [("big", "in", ["a", "b"])], None),
    (
        pc.is_in(f("day"), value_set=pa.array([1, None]), skip_nulls=True),
        [("day", "in", [1])],
        None,
    ),
    (
        (f("day") == 1) & ((f("day") == 2) & (f("day") == 3)),
        [("day", "==", 1), ("day", "==", 2), ("day", "==", 3)],
        None,
    ),
]


@pytest.mark.parametrize(("expr", "dnf", "text"), EQUAL_FORMS)
def test_equal_forms_share_one_canonical_form(expr, dnf, text):
    want = canon(expr)
    assert canon(dnf) == want
    if text is not None:
        assert canon(text) == want
    flt = parse_filter(expr, WIDE, PARTS)
    assert canon(flt.canonical_json) == want
    assert canon(flt.canonical) == want
    assert canon(flt.expression()) == want
    assert canon(flt) == want


def test_different_filters_differ():
    forms = [
        f("day") == 1, f("day") != 1, ~(f("day") == 1), f("day").isin([1]), ~f("day").isin([1]),
        f("day").isin(pa.array([1, None])), f("day") <= 1, f("i8") == 1, f("x").isin([0.0]),
        f("x").isin([-0.0]), f("x32") > 0.1, f("x32") > np.float32(0.1), (f("day") == 1) & (f("i8") == 1),
        (f("i8") == 1) & (f("day") == 1), f("day").is_null(), f("day").is_valid(),
    ]
    texts = [canon(x) for x in forms]
    assert len(set(texts)) == len(texts)
    assert len({parse_filter(x, WIDE).digest() for x in forms}) == len(forms)


def test_isin_keeps_nulls_only_when_they_match():
    assert json.loads(canon(f("day").isin(pa.array([2, None, 1]))))["values"] == [None, 1, 2]
    assert json.loads(canon(pc.is_in(f("day"), value_set=pa.array([2, None]), skip_nulls=True)))["values"] == [2]
    # -0.0 and 0.0 are distinct members of a value set (pyarrow's hash lookup tells them apart)
    assert json.loads(canon(f("x").isin([0.0, -0.0, 0.0])))["values"] == [-0.0, 0.0]


def test_float32_literal_that_float32_cannot_hold_stays_float64():
    # pyarrow compares float32 column values with a float64 0.1 in float64; so does the canonical form.
    assert json.loads(canon(f("x32") > 0.1))["type"] == "float64"
    assert json.loads(canon(f("x32") > 0.5))["type"] == "float32"
    assert json.loads(canon(f("x32").isin([0.5, 0.1])))["type"] == "float64"


def test_timestamps_keep_their_unit_and_zone():
    tree = json.loads(canon(f("ts") >= dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.timezone.utc)))
    assert tree == {"field": "ts", "op": ">=", "type": "timestamp[ms, tz=UTC]", "value": "2026-01-02T03:04:05.006Z"}
    ns = pa.schema([("t", pa.timestamp("ns"))])
    v = np.datetime64("2026-01-02T03:04:05.123456789", "ns")
    assert json.loads(canon(f("t") == v, ns, {}))["value"] == "2026-01-02T03:04:05.123456789"


@st.composite
def typed_filters(draw):
    spec = draw(filter_specs)
    return spec, spec_expression(spec)


@MANY
@given(typed_filters())
def test_canonical_form_is_a_fixed_point(case):
    """Reading a filter back from its canonical JSON, dict or rebuilt expression changes nothing."""
    schema = SCHEMA
    _, expr = case
    flt = parse_filter(expr, schema, PARTITION_TYPES)
    for again in (flt.canonical_json, flt.canonical, flt.expression(), flt, pickle.loads(pickle.dumps(flt))):
        assert parse_filter(again, schema, PARTITION_TYPES) == flt


DNF_CASES = [
    [("a", "==", 1)],
    [("a", "=", 1), ("b", "!=", "x"), ("c", "<", 2.5)],
    [[("a", ">=", 1), ("a", "<=", 4)], [("b", "in", ["x", "y"])], [("c", "not in", [1.5, 2.5])]],
    [("b", ">", "é"), ("a", "in", [1, 2, 3])],
]


@pytest.mark.parametrize("dnf", DNF_CASES)
def test_dnf_rebuilds_pyarrows_own_expression(dnf):
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
    assert parse_filter(dnf, schema).expression().equals(pq.filters_to_expression(dnf))


def test_order_value_hashes_a_long_isin_list():
    short = parse_filter(f("day").isin(range(ISIN_HASH_THRESHOLD)), WIDE)
    assert short.order_value() == short.canonical
    values = list(range(1000, 0, -1))
    flt = parse_filter((f("market") == "US") & f("day").isin(values), WIDE)
    order = flt.order_value()
    long = order["args"][1]["values"]
    assert long == {
        "isin_sha": xxhash.xxh3_128_hexdigest(json.dumps(sorted(values), separators=(",", ":")).encode()),
        "n": 1000,
    }
    assert flt.header_value()["args"][1]["values"] == sorted(values)
    assert len(json.dumps(order)) < 400
    assert parse_filter(f("day").isin(values[:-1]), WIDE).order_value()["values"]["isin_sha"] != long["isin_sha"]


def test_filter_is_frozen_picklable_and_hashable():
    flt = parse_filter((f("year") == 2026) & (f("market") == "US") & f("day").is_valid(), WIDE, PARTS)
    assert isinstance(flt, Filter)
    with pytest.raises(AttributeError):
        flt._text = "{}"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(flt)) == flt
    assert {flt: 1}[parse_filter(flt.canonical_json, WIDE, PARTS)] == 1
    assert flt.columns == ("day", "market", "year")
    assert flt.stored_columns == ("day", "market")
    assert flt.partition_columns == ("year",)
    assert "market" in repr(flt)


def test_json_object_is_canonical_and_array_is_dnf():
    dnf = '[["market","==","US"]]'
    obj = '{"op": "==", "field": "market", "type": "string", "value": "US"}'
    assert canon(dnf) == canon(obj) == canon(json.loads(obj))


# -- errors ---------------------------------------------------------------------------

ERRORS = [
    (f("nope") == 1, r"filter column 'nope' does not exist; the available columns are \['market', 'day'.*'region', 'year'\]"),
    ([("nope", "==", 1)], r"filter column 'nope' does not exist"),
    (f("day") == "2026", r"filter value string scalar '2026' does not fit column 'day' of type int64: an integer column is compared with integers only"),
    ([("day", "==", "2026")], r"filter value str '2026' does not fit column 'day' of type int64"),
    ([("market", "==", 1)], r"filter value int 1 does not fit column 'market' of type string: a string column is compared with str values only"),
    (f("i8") == 300, r"filter value int64 scalar 300 does not fit column 'i8' of type int8: the value is outside the type's range \[-128, 127\]"),
    ([("u64", "==", -1)], r"column 'u64' of type uint64: the value is outside the type's range \[0, 18446744073709551615\]"),
    ([("day", "<", 1.5)], r"float 1.5 does not fit column 'day' of type int64"),
    ([("x", "==", 2**53 + 1)], r"not exactly representable as a float"),
    ([("flag", "==", 1)], r"a bool column is compared with True or False only"),
    ([("code", "==", b"abc")], r"the value has 3 bytes, the column 2"),
    ([("date", "==", dt.datetime(2026, 1, 1))], r"a date column is compared with datetime.date values only"),
    ([("ts", "==", dt.datetime(2026, 1, 1))], r"column 'ts' of type timestamp\[ms, tz=UTC\]: the column has time zone 'UTC' and the value none"),
    ([("naive", "==", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))], r"the column has no time zone and the value has one"),
    ([("naive", "==", np.datetime64("2026-01-01T00:00:00.000000001"))], r"finer than the column's unit 'us'"),
    ([("price", "==", decimal.Decimal("1.005"))], r"more than 2 digits after the point"),
    ([("price", "==", 10**8)], r"more than 9 digits"),
    ([("price", "==", 1.5)], r"a decimal column is compared with int or decimal.Decimal values only"),
    (f("x") == float("nan"), r"NaN compares false with every value"),
    (f("day") == pa.scalar(None, pa.int64()), r"a comparison with null is never true and selects no row; use pc.field\(name\).is_null\(\)"),
    ([("day", "==", None)], r"a comparison with null is never true"),
    (f("tags") == "a", r"filter column 'tags' has type list<item: string>, which filters cannot compare"),
    ([("year", "==", "2026")], r"column 'year' of type int64"),
    ([("region", "==", 1)], r"column 'region' of type string"),
    (lambda row: row["day"] > 3, r"is a Python callable: it cannot be fingerprinted or pruned — use a pyarrow.compute expression or a DNF list"),
    ([], r"an empty DNF filter \[\] is refused .*pass filter=None to read every row"),
    ([[]], r"got the conjunction \[\]"),
    ([("day", "~", 1)], r"has the operator '~'; DNF operators are \['=', '==', '!=', '<', '<=', '>', '>=', 'in', 'not in'\]"),
    ([("day", "in", 3)], r"'in' takes a list of values"),
    ([("day", "==")], r"got the predicate \('day', '=='\)"),
    (42, r"filter must be a pyarrow.compute expression, a DNF list .*got int 42"),
    ('[["market", "==", "US"]', r"filter text .* starts with '\[', so it is read as JSON, but is not JSON .*'\[\[\"market\", \"==\", \"US\"\]\]'"),
    ("3", r"filter text '3', at column 1 \('3'\): a literal alone is not a predicate; the filter syntax is: COLUMN OP LITERAL"),
    ('{"op": "==", "field": "day"}', r"must have exactly the keys \['field', 'op', 'type', 'value'\]"),
    ('{"op": "like", "field": "day"}', r"canonical filter node .* is not one of"),
    ('{"op": "==", "field": "day", "type": "int128", "value": 1}', r"unknown filter scalar type 'int128'"),
    ('{"op": "and", "args": []}', r"'args' must be a non-empty list"),
    ('[["date", "==", "2026-13-01"]]', r"filter value '2026-13-01' for column 'date' cannot be read as date32"),
    (f("day") + 1 == 2, r"uses equal on something other than a field and a scalar; detload reads this subset: pc.field\(name\) compared"),
    (f("day") == f("i8"), r"uses equal on something other than a field and a scalar"),
    (pc.and_(f("day") == 1, f("i8") == 1), r"uses and_, whose null handling differs from & and \|"),
    (f("x").is_null(nan_is_null=True), r"uses is_null\(nan_is_null=True\)"),
    (pc.starts_with(f("market"), "U"), r"uses starts_with"),
    (f("day"), r"is a bare field or scalar, not a predicate"),
    (f(("tags", "a")) == 1, r"uses nested field ref"),
]


@pytest.mark.parametrize(("bad", "message"), ERRORS)
def test_bad_filters_are_refused_with_a_message(bad, message):
    with pytest.raises(OptionError, match=message):
        parse_filter(bad, WIDE, PARTS)


def test_bad_partition_type_is_refused():
    with pytest.raises(OptionError, match=r"partition_types\['year'\] must be 'int64' or 'string', got 'int32'"):
        parse_filter([("year", "==", 1)], WIDE, {"year": "int32"})


# -- pruning: explicit three-valued cases ------------------------------------------------

INT = pa.schema([("a", pa.int64()), ("x", pa.float64()), ("s", pa.string())])


def prune(x, stats, n=10, pv=None, parts=None):
    return parse_filter(x, INT, parts or {}).prune(stats, pv or {}, n)


@pytest.mark.parametrize(
    ("expr", "stats", "want"),
    [
        # values 1 or null: ~(a == 1) is false or null on every row
        (~(f("a") == 1), ColumnStats(1, 1, 3), "none"),
        # isin gives false (not null) on a null row, so its negation keeps the nulls
        (~f("a").isin([1]), ColumnStats(1, 1, 3), "some"),
        (~f("a").isin([1]), ColumnStats(1, 1, 0), "none"),
        (f("a") != 1, ColumnStats(2, 2, 0), "all"),
        (f("a") != 1, ColumnStats(2, 2, None), "some"),
        (f("a") != 1, ColumnStats(2, 2, 1), "some"),
        (f("a") == 1, ColumnStats(None, None, 10), "none"),
        (~(f("a") == 1), ColumnStats(None, None, 10), "none"),
        (f("a").is_null(), ColumnStats(None, None, 10), "all"),
        (~f("a").isin([1]), ColumnStats(None, None, 10), "all"),
        (f("a").isin(pa.array([1, None])), ColumnStats(None, None, 10), "all"),
        (f("a").is_valid(), ColumnStats(1, 5, 0), "all"),
        (f("a").is_valid(), ColumnStats(1, 5, None), "some"),
        (f("a") > 5, ColumnStats(1, 5, 0), "none"),
        (f("a") >= 5, ColumnStats(1, 5, 0), "some"),
        (f("a") >= 1, ColumnStats(1, 5, 0), "all"),
        (f("a") < 1, ColumnStats(1, 5, 0), "none"),
        (f("a").isin([0, 6, 9]), ColumnStats(1, 5, 0), "none"),
        (f("a").isin([0, 5]), ColumnStats(5, 5, 0), "all"),
        ((f("a") > 0) & (f("a") < 6), ColumnStats(1, 5, 0), "all"),
        ((f("a") > 3) | (f("a") < 2), ColumnStats(1, 5, 0), "some"),
        # float statistics ignore NaN: a float column can never be "all" for a comparison
        (f("x") > 0.0, ColumnStats(1.0, 2.0, 0), "some"),
        (f("x") < 0.0, ColumnStats(1.0, 2.0, 0), "none"),
        (f("x") != 5.0, ColumnStats(5.0, 5.0, 0), "some"),
        (~(f("x") > 0.0), ColumnStats(1.0, 2.0, 0), "some"),  # NaN rows are kept by the negation
        (f("x").isin([1.0]), ColumnStats(1.0, 1.0, 0), "some"),
        # a truncated maximum is not an upper bound
        (f("s") > "c", ColumnStats(b"a", b"b", 0, max_exact=False), "some"),
        (f("s") > "c", ColumnStats(b"a", b"b", 0), "none"),
        (f("s") < "b", ColumnStats(b"a", b"a", 0, max_exact=False), "some"),
        (f("s") < "b", ColumnStats(b"a", b"a", 0), "all"),
        (f("s") < "a", ColumnStats(b"a", b"a", 0, min_exact=False), "none"),
        (f("a") == 1, None, "some"),
        (f("a") == 1, ColumnStats(), "some"),
    ],
)
def test_prune_is_three_valued(expr, stats, want):
    assert prune(expr, {"a": stats, "x": stats, "s": stats}) == want


def test_prune_partitions_and_empty_row_groups():
    parts = {"p": "int64", "q": "string"}
    assert prune(f("p") == 3, {}, pv={"p": "3"}, parts=parts) == "all"
    assert prune(f("p") == 3, {}, pv={"p": 3}, parts=parts) == "all"
    assert prune(f("p") == 3, {}, pv={"p": "4"}, parts=parts) == "none"
    assert prune(f("p") == 3, {}, pv={"p": None}, parts=parts) == "none"
    assert prune(~(f("p") == 3), {}, pv={"p": None}, parts=parts) == "none"
    assert prune(f("p").is_null(), {}, pv={"p": None}, parts=parts) == "all"
    assert prune(f("p") == 3, {}, pv={}, parts=parts) == "some"
    assert prune(f("q").isin(["x", "é"]), {}, pv={"q": "é"}, parts=parts) == "all"
    assert prune(f("q") > "x", {}, pv={"q": "é"}, parts=parts) == "all"  # UTF-8 byte order
    assert prune(f("a") == 1, {"a": ColumnStats(1, 1, 0)}, n=0) == "none"


def test_prune_source_names_the_evidence():
    parts = {"p": "int64"}
    flt = parse_filter((f("p") == 1) & (f("a") == 7), INT, parts)
    stats = {"a": ColumnStats(1, 9, 0)}
    assert flt.prune_source(stats, {"p": "2"}, 10) == ("none", "partition")
    assert flt.prune_source({"a": ColumnStats(8, 9, 0)}, {"p": "1"}, 10) == ("none", "statistics")
    assert flt.prune_source(stats, {"p": "1"}, 10, bloom=lambda col, keys: False) == ("none", "bloom")
    assert flt.prune_source(stats, {"p": "1"}, 10, bloom=lambda col, keys: True) == ("some", "selection")
    assert flt.prune_source({"a": ColumnStats(7, 7, 0)}, {"p": "1"}, 10) == ("all", "statistics")


def test_bloom_is_asked_only_for_equality_and_isin_values_in_range():
    asked = []

    def bloom(col, keys):
        asked.append((col, tuple(keys)))
        return False

    flt = parse_filter(f("a").isin([1, 5, 20]) | (f("s") == "k") | (f("a") > 3), INT)
    flt.prune({"a": ColumnStats(2, 10, 0), "s": ColumnStats(b"a", b"z", 0)}, {}, 10, bloom=bloom)
    assert asked == [("a", (5,)), ("s", (b"k",))]


# -- pruning and selection against pyarrow ---------------------------------------------------

def _check_dataset(tables, specs):
    with tempfile.TemporaryDirectory() as root:
        files = write_hive(root, tables)
        part = ds.partitioning(pa.schema([("p", pa.int64()), ("q", pa.string())]), flavor="hive")
        dataset = ds.dataset(root, partitioning=part)
        for spec in specs:
            expr = spec_expression(spec)
            flt = parse_filter(expr, SCHEMA, PARTITION_TYPES)
            scanned = set(dataset.to_table(filter=expr, columns=["rid"]).column("rid").to_pylist())
            for file in files:
                pf = pq.ParquetFile(file.path)
                for g in range(pf.metadata.num_row_groups):
                    rows = pf.read_row_group(g)
                    kept = with_partitions(rows, file.partition_values).filter(expr).column("rid").to_pylist()
                    verdict = flt.prune(row_group_stats(pf.metadata.row_group(g), pf.schema_arrow), file.partition_values, rows.num_rows)
                    if verdict == "none":
                        assert kept == [], (spec, flt, rows.to_pylist())
                    if verdict == "all":
                        assert len(kept) == rows.num_rows, (spec, flt, rows.to_pylist())
                    rids = rows.column("rid").to_pylist()
                    assert [rids[k] for k in flt.select(rows, file.partition_values)] == kept
                    x = rows.column("f")
                    if not pc.any(pc.or_(pc.is_nan(x), pc.equal(x, 0.0))).as_py():
                        # pyarrow's scan prunes by statistics that ignore NaN (and by a
                        # signed zero's bounds), so it may drop such rows its own
                        # in-memory filter keeps; elsewhere it agrees.
                        assert {r for r in rids if r in scanned} == set(kept)


@MANY
@given(hive_tables(), st.lists(filter_specs, min_size=1, max_size=8))
def test_prune_and_select_agree_with_pyarrow(tables, specs):
    _check_dataset(tables, specs)


def test_pyarrow_dataset_scan_drops_nan_rows_that_detload_keeps(tmp_path):
    # Why the reference is pyarrow's in-memory filter: the scan prunes the row
    # group by min/max that leave NaN out, so the row it keeps depends on layout.
    t = pa.table({"x": [1.0, float("nan")]})
    pq.write_table(t, tmp_path / "a.parquet")
    expr = f("x") != 1.0
    flt = parse_filter(expr, t.schema)
    md = pq.read_metadata(tmp_path / "a.parquet")
    assert flt.prune(row_group_stats(md.row_group(0), t.schema), {}, 2) == "some"
    assert flt.select(t).tolist() == [1]
    assert t.filter(expr).column("x").to_pylist()[0] != t.filter(expr).column("x").to_pylist()[0]  # the NaN row


# -- statistics of every supported type -----------------------------------------------------

def _typed_table():
    return pa.table({
        "i8": pa.array([-5, None, 7, -128], pa.int8()),
        "u32": pa.array([1, 2**32 - 1, None, 3], pa.uint32()),
        "u64": pa.array([1, 2**64 - 1, None, 3], pa.uint64()),
        "x": pa.array([1.5, float("nan"), None, -0.0]),
        "x32": pa.array([0.5, 2.0, None, -1.25], pa.float32()),
        "allnan": pa.array([float("nan")] * 4),
        "flag": [True, None, True, True],
        "s": ["b", "é", None, "a"],
        "big": pa.array(["b", "é", None, "a"], pa.large_string()),
        "cat": pa.array(["b", "é", None, "a"]).dictionary_encode(),
        "blob": [b"\x00", b"\xff\x01", None, b""],
        "code": pa.array([b"ab", b"zz", None, b"\x00\x01"], pa.binary(2)),
        "date": pa.array([dt.date(2026, 1, 1), None, dt.date(1969, 12, 31), dt.date(2026, 3, 1)]),
        "date64": pa.array([dt.date(2026, 1, 1), None, dt.date(1969, 12, 31), dt.date(2026, 3, 1)], pa.date64()),
        "ts_s": pa.array([0, 10**9, None, -5], pa.timestamp("s")),
        "ts_ms": pa.array([0, 10**12, None, -5], pa.timestamp("ms", "UTC")),
        "ts_us": pa.array([0, 10**15, None, -5], pa.timestamp("us", "Asia/Tokyo")),
        "ts_ns": pa.array([0, 10**18, None, -5], pa.timestamp("ns")),
        "price": pa.array([decimal.Decimal("1.25"), decimal.Decimal("-3.50"), None, decimal.Decimal("0")], pa.decimal128(9, 2)),
        "wide": pa.array([decimal.Decimal("1.25"), decimal.Decimal("-3.50"), None, decimal.Decimal("0")], pa.decimal256(40, 2)),
        "long": ["x" * 5000, "y" * 5000, None, "z"],
    })


@pytest.mark.parametrize("store_decimal_as_integer", [False, True])
def test_row_group_stats_reads_every_supported_type(tmp_path, store_decimal_as_integer):
    t = _typed_table()
    path = tmp_path / "t.parquet"
    pq.write_table(t, path, store_decimal_as_integer=store_decimal_as_integer)
    pf = pq.ParquetFile(path)
    stats = row_group_stats(pf.metadata.row_group(0), pf.schema_arrow)
    day = (dt.date(2026, 3, 1) - dt.date(1970, 1, 1)).days
    assert stats["i8"] == ColumnStats(-128, 7, 1)
    assert stats["u32"] == ColumnStats(1, 2**32 - 1, 1)
    assert stats["u64"] == ColumnStats(1, 2**64 - 1, 1)
    assert (stats["x"].min, stats["x"].max, stats["x"].null_count) == (-0.0, 1.5, 1)
    assert stats["x32"] == ColumnStats(-1.25, 2.0, 1)
    assert stats["allnan"].min is None and stats["allnan"].null_count == 0
    assert stats["flag"] == ColumnStats(True, True, 1)
    for name in ("s", "big", "cat"):
        assert stats[name] == ColumnStats(b"a", "é".encode(), 1), name
    assert stats["blob"] == ColumnStats(b"", b"\xff\x01", 1)
    assert stats["code"] == ColumnStats(b"\x00\x01", b"zz", 1)
    assert stats["date"] == ColumnStats(-1, day, 1)
    assert stats["date64"] == ColumnStats(-1, day, 1)
    assert stats["ts_s"] == ColumnStats(-5 * 10**9, 10**18, 1)
    assert stats["ts_ms"] == ColumnStats(-5 * 10**6, 10**18, 1)
    assert stats["ts_us"] == ColumnStats(-5000, 10**18, 1)
    assert stats["ts_ns"] == ColumnStats(-5, 10**18, 1)
    assert stats["price"] == ColumnStats(-350, 125, 1)
    assert stats["wide"] == ColumnStats(-350, 125, 1)
    assert stats["long"].min is None  # statistics above pyarrow's size limit are not written
    assert row_group_stats(pf.metadata.row_group(0), pf.schema_arrow, columns=["s", "nope"]).keys() == {"s"}


def test_row_group_stats_without_statistics_or_for_nested_columns(tmp_path):
    t = pa.table({"a": [1, 2], "l": [[1], [2, 3]], "h": pa.array([1, 2], pa.float16()), "b": [3, 4]})
    pq.write_table(t, tmp_path / "n.parquet", write_statistics=False)
    pq.write_table(t, tmp_path / "s.parquet")
    md = pq.read_metadata(tmp_path / "n.parquet")
    assert row_group_stats(md.row_group(0), t.schema) == {"a": None, "h": None, "b": None}
    md = pq.read_metadata(tmp_path / "s.parquet")
    got = row_group_stats(md.row_group(0), t.schema)
    assert "l" not in got and got["h"].min is None and got["b"] == ColumnStats(3, 4, 0)


VALUE_PROBES = {
    "i8": [-128, -5, 0, 7, 8, 127], "u32": [0, 1, 2, 2**32 - 1], "u64": [0, 1, 3, 2**64 - 1],
    "x": [-1.0, -0.0, 0.0, 1.5, 2.0, float("inf")], "x32": [-1.25, 0.5, 0.1, 2.0, 3.0],
    "flag": [True, False], "s": ["", "a", "b", "c", "é", "ê"], "big": ["a", "b", "é"], "cat": ["a", "é", "f"],
    "blob": [b"", b"\x00", b"\xff\x01", b"\xff"], "code": [b"ab", b"zz", b"\x00\x01", b"aa"],
    "date": [dt.date(1969, 12, 31), dt.date(2026, 1, 1), dt.date(2026, 3, 2)],
    "ts_ns": [np.datetime64(-5, "ns"), np.datetime64(0, "ns"), np.datetime64(10**18, "ns"), np.datetime64(10**18 + 1, "ns")],
    "ts_ms": [dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2001, 9, 9, 1, 46, 40, tzinfo=dt.timezone.utc)],
    "price": [decimal.Decimal("-3.5"), decimal.Decimal("0"), decimal.Decimal("1.25"), decimal.Decimal("1.26")],
    "wide": [decimal.Decimal("-3.5"), decimal.Decimal("1.25"), decimal.Decimal("2")],
}


@pytest.mark.parametrize("column", sorted(VALUE_PROBES))
def test_prune_is_sound_for_every_type(tmp_path, column):
    t = _typed_table()
    path = tmp_path / "t.parquet"
    pq.write_table(t, path, row_group_size=2)
    pf = pq.ParquetFile(path)
    for v in VALUE_PROBES[column]:
        if column == "u64":
            v = pa.scalar(v, pa.uint64())  # a Python int above 2**63 makes no int64 literal
        ops = [f(column) == v, f(column) != v, f(column) < v, f(column) <= v, f(column) > v, f(column) >= v, f(column).isin([v]), ~f(column).isin([v])]
        if column == "flag":
            ops = ops[:2] + ops[6:]
        for expr in ops:
            flt = parse_filter(expr, t.schema)
            for g in range(pf.metadata.num_row_groups):
                rows = pf.read_row_group(g)
                want = rows.filter(expr).num_rows
                verdict = flt.prune(row_group_stats(pf.metadata.row_group(g), pf.schema_arrow), {}, rows.num_rows)
                assert verdict != "none" or want == 0, (expr, g)
                assert verdict != "all" or want == rows.num_rows, (expr, g)
                assert flt.select(rows).tolist() == np.flatnonzero(
                    pa.chunked_array(ds.dataset(rows).to_table(columns={"m": expr}).column("m")).fill_null(False).to_numpy(zero_copy_only=False)
                ).tolist()


def test_sorted_data_prunes_most_row_groups(tmp_path):
    t = pa.table({"segment": [f"s{i // 1000:02d}" for i in range(100_000)], "v": np.arange(100_000)})
    pq.write_table(t, tmp_path / "sorted.parquet", row_group_size=1000)
    md = pq.read_metadata(tmp_path / "sorted.parquet")
    flt = parse_filter([("segment", "==", "s42")], t.schema)
    verdicts = [flt.prune(row_group_stats(md.row_group(g), t.schema), {}, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
    assert verdicts.count("all") == 1 and verdicts.count("none") == 99


# -- selection ------------------------------------------------------------------------------

def test_select_adds_partition_constants_and_reads_dictionaries():
    t = pa.table({"cat": pa.array(["a", "b", None, "a"]).dictionary_encode(), "v": [1, 2, 3, 4]})
    flt = parse_filter((f("cat") == "a") & (f("year") == 2026) | f("region").is_null(), t.schema, PARTS)
    assert flt.select(t, {"year": "2026", "region": "eu"}).tolist() == [0, 3]
    assert flt.select(t, {"year": 2025, "region": "eu"}).tolist() == []
    assert flt.select(t, {"year": 2025, "region": None}).tolist() == [0, 1, 2, 3]
    got = flt.select(t, {"year": "2026", "region": "eu"})
    assert got.dtype == np.int64
    with pytest.raises(OptionError, match=r"the table lacks the filter's column\(s\) \['cat'\]"):
        flt.select(t.select(["v"]), {})
