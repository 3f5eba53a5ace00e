"""The filter text syntax: equal spellings share the canonical form of the equivalent expression, the rest is refused.

The property test renders random filters of the supported subset as text in
randomly chosen spellings (and/&, not/~, literal first, quotes, in-lists with
None) and checks each parses to the same `Filter` as the pyarrow expression.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _filterdata import PARTITION_TYPES, SCHEMA, filter_specs, spec_expression
from hypothesis import given, settings
from hypothesis import strategies as st

from detload._filters.canonical import TEXT_SYNTAX, parse_filter
from detload._filters.text import FILTER_HELP
from detload.errors import OptionError

f = pc.field

SCHEMA_T = pa.schema([
    ("market", pa.string()), ("day", pa.int64()), ("i8", pa.int8()), ("segment", pa.int32()),
    ("x", pa.float64()), ("x32", pa.float32()), ("flag", pa.bool_()), ("blob", pa.binary()),
    ("date", pa.date32()), ("ts", pa.timestamp("ms", "UTC")), ("naive", pa.timestamp("us")),
    ("price", pa.decimal128(9, 2)), ("cat", pa.dictionary(pa.int32(), pa.string())),
    ("my col", pa.int64()), ("class", pa.string()), ("y", pa.int64()),
])
PARTS = {"year": "int64", "region": "string"}


def canon(x: Any) -> str:
    return parse_filter(x, SCHEMA_T, PARTS).canonical_json


UTC = dt.timezone.utc

# (text, equivalent forms: expressions or DNF lists)
EQUAL = [
    ('market == "US"', [f("market") == "US", [("market", "=", "US")]]),
    ("market == 'US'", [f("market") == "US"]),
    ('"US" == market', [f("market") == "US"]),
    (' \n  market == "US"\n', [f("market") == "US"]),
    ('((market == "US"))', [f("market") == "US"]),
    ('col("market") == "US"', [f("market") == "US"]),
    ('market == "é"', [f("market") == "é"]),
    ('market > "m"', [f("market") > "m", pc.less(pc.scalar("m"), f("market"))]),
    ('market == "US" and day >= 20260101',
     [(f("market") == "US") & (f("day") >= 20260101), [("market", "==", "US"), ("day", ">=", 20260101)]]),
    ('(market == "US") & (day >= 20260101)', [(f("market") == "US") & (f("day") >= 20260101)]),
    ('market == "US" or market == "DE"', [(f("market") == "US") | (f("market") == "DE")]),
    ('(market == "US") | (market == "DE")', [[[("market", "==", "US")], [("market", "==", "DE")]]]),
    ('market == "US" and day > 5 or market == "DE"',
     [((f("market") == "US") & (f("day") > 5)) | (f("market") == "DE"),
      [[("market", "==", "US"), ("day", ">", 5)], [("market", "==", "DE")]]]),
    ("segment in (3, 4)", [f("segment").isin([3, 4]), [("segment", "in", [4, 3])]]),
    ("segment in [4, 3, 3]", [f("segment").isin([3, 4])]),
    ("segment in {4, 3}", [f("segment").isin([3, 4])]),
    ("segment in (3,)", [f("segment").isin([3])]),
    ("segment in ()", [f("segment").isin(pa.array([], pa.int32()))]),
    ("segment in (1, None)", [f("segment").isin(pa.array([1, None], pa.int32()))]),
    ("i8 not in (1, 2)", [~f("i8").isin([1, 2]), [("i8", "not in", (2, 1))]]),
    ("not i8 in (1, 2)", [~f("i8").isin([1, 2])]),
    ("not (x < 0) or y is None", [~(f("x") < 0) | f("y").is_null()]),
    ("~(x < 0) | (y is None)", [~(f("x") < 0) | f("y").is_null()]),
    ("y is not None", [f("y").is_valid()]),
    ("not y is None", [~f("y").is_null()]),
    ("~(y is None)", [~f("y").is_null()]),
    ("None is y", [f("y").is_null()]),
    ("20260101 <= day < 20260201",
     [(f("day") >= 20260101) & (f("day") < 20260201), [("day", ">=", 20260101), ("day", "<", 20260201)]]),
    ("0 < x <= 1 < y", [(f("x") > 0) & (f("x") <= 1) & (f("y") > 1)]),
    ("3 < day", [f("day") > 3, pc.less(pc.scalar(3), f("day"))]),
    ("i8 == +3", [f("i8") == pa.scalar(3, pa.int8())]),
    ("i8 == -(-3)", [f("i8") == 3]),
    ("i8 == 3.0", [f("i8") == 3]),
    ("x == 2", [f("x") == 2.0]),
    ("x == -0.0", [f("x") == 0.0]),
    ("x > -1.5", [f("x") > -1.5]),
    ("x in (-0.0, 0.0)", [f("x").isin([0.0, -0.0])]),
    ('x < float("inf")', [f("x") < float("inf")]),
    ('x > -float("inf")', [f("x") > float("-inf")]),
    ("x < 1e999", [f("x") < float("inf")]),
    ("x32 == 0.5", [f("x32") == np.float32(0.5)]),
    ("x32 > 0.1", [f("x32") > 0.1]),
    ("flag == True", [f("flag") == True]),  # noqa: E712
    ("flag != False", [f("flag") != False]),  # noqa: E712
    ('blob == b"\\x00\\xff"', [f("blob") == b"\x00\xff", [("blob", "==", b"\x00\xff")]]),
    ('date >= date("2026-03-01")', [f("date") >= dt.date(2026, 3, 1), [("date", ">=", np.datetime64("2026-03-01"))]]),
    ('ts == timestamp("2026-01-02T00:00:00Z")', [f("ts") == dt.datetime(2026, 1, 2, tzinfo=UTC)]),
    ('ts == timestamp("2026-01-01T19:00:00-05:00")', [f("ts") == dt.datetime(2026, 1, 2, tzinfo=UTC)]),
    ('ts < timestamp("2026-01-02Z")', [f("ts") < dt.datetime(2026, 1, 2, tzinfo=UTC)]),
    ('ts == timestamp("2026-01-02 03:04:05.006Z")', [f("ts") == dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)]),
    ('naive < timestamp("2026-01-02T03:04:05.123456")', [f("naive") < np.datetime64("2026-01-02T03:04:05.123456")]),
    ('price == decimal("1.5")', [f("price") == decimal.Decimal("1.50")]),
    ("price > 2", [f("price") > decimal.Decimal(2)]),
    ("year == 2026", [f("year") == 2026]),
    ('region == "eu"', [f("region") == "eu"]),
    ('cat == "a"', [f("cat") == "a"]),
    ('col("my col") == 1', [f("my col") == 1]),
    ('col("class") in ("a", "b")', [f("class").isin(["a", "b"])]),
    ("day == 1 and day == 2 and day == 3",
     [(f("day") == 1) & ((f("day") == 2) & (f("day") == 3)), ((f("day") == 1) & (f("day") == 2)) & (f("day") == 3)]),
    ("(day == 1) & (day == 2) & (day == 3)", [(f("day") == 1) & ((f("day") == 2) & (f("day") == 3))]),
    ("day == 1 and (day == 2) & (day == 3)", [[("day", "==", 1), ("day", "==", 2), ("day", "==", 3)]]),
    ("(day == 1 or day == 2) and not y is None",
     [((f("day") == 1) | (f("day") == 2)) & ~f("y").is_null()]),
]


@pytest.mark.parametrize(("text", "forms"), EQUAL, ids=[t for t, _ in EQUAL])
def test_text_has_the_canonical_form_of_the_equivalent_filter(text, forms):
    want = canon(text)
    for other in forms:
        assert canon(other) == want
    flt = parse_filter(text, SCHEMA_T, PARTS)
    assert parse_filter(flt.expression(), SCHEMA_T, PARTS) == flt


def test_equal_texts_share_a_digest_and_different_texts_differ():
    same = ['market == "US"', "market == 'US'", '"US" == market', 'col("market") == "US"']
    assert len({parse_filter(t, SCHEMA_T).digest() for t in same}) == 1
    # Nothing else is rewritten, as for expressions: these select the same rows as their
    # neighbours in some cases, but are different filters.
    different = ["day != 1", "not day == 1", "day in (1,)", "day == 1", "y is not None", "not y is None",
                 "day == 1 and i8 == 1", "i8 == 1 and day == 1", "x32 > 0.1", "x32 > 0.5", "day <= 1"]
    assert len({canon(t) for t in different}) == len(different)


def test_json_and_text_are_told_apart_by_the_first_character():
    dnf = '[["market", "==", "US"]]'
    obj = '{"op": "==", "field": "market", "type": "string", "value": "US"}'
    text = 'market == "US"'
    assert canon(dnf) == canon(" \n" + dnf) == canon(obj) == canon(text)
    with pytest.raises(OptionError, match=r"starts with '\[', so it is read as JSON, but is not JSON"):
        canon('[["market", "==", "US"]')


# -- random filters, rendered as text ---------------------------------------------------------

_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _literal(draw: Any, v: Any) -> str:
    if isinstance(v, dt.date):
        return f'date("{v.isoformat()}")'
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        sign = "-" if v < 0 else ""
        return draw(st.sampled_from([f'{sign}float("inf")', f"{sign}1e999", f'float("{sign}inf")']))
    if isinstance(v, str):
        return draw(st.sampled_from([repr(v), json.dumps(v, ensure_ascii=False)]))
    return repr(v)


def _text(draw: Any, spec: tuple[Any, ...]) -> str:
    tag = spec[0]
    if tag == "cmp":
        _, op, col, v = spec
        lit = _literal(draw, v)
        return f"{lit} {_FLIP[op]} {col}" if draw(st.booleans()) else f"{col} {op} {lit}"
    if tag == "isin":
        _, col, values, with_null = spec
        items = [_literal(draw, v) for v in values] + (["None"] if with_null else [])
        open_, close = draw(st.sampled_from(["()", "[]"]))
        trail = "," if len(items) == 1 and open_ == "(" else ""
        return f"{col} in {open_}{', '.join(items)}{trail}{close}"
    if tag == "is_null":
        return f"{spec[1]} is None"
    if tag == "is_valid":
        return f"{spec[1]} is not None"
    if tag == "not":
        return draw(st.sampled_from(["not ({})", "~({})"])).format(_text(draw, spec[1]))
    word = draw(st.sampled_from([tag, "&" if tag == "and" else "|"]))
    return f"({_text(draw, spec[1])}) {word} ({_text(draw, spec[2])})"


@st.composite
def text_filters(draw: Any) -> tuple[Any, str]:
    spec = draw(filter_specs)
    return spec, _text(draw, spec)


@settings(max_examples=settings().max_examples * 20)
@given(text_filters())
def test_random_filters_written_as_text_match_their_expression(case):
    spec, text = case
    expr = spec_expression(spec)
    assert parse_filter(text, SCHEMA, PARTITION_TYPES) == parse_filter(expr, SCHEMA, PARTITION_TYPES), text


# -- refusals ------------------------------------------------------------------------------------

ERRORS = [
    ("f(x) == 1", r"at column 1 \('f\(x\)'\): a function call f\(\.\.\.\) \(only the helpers col\(\), date\(\)"),
    ('pc.field("x") == 1', r"a function call pc.field\(\.\.\.\)"),
    ("x.real == 1", r"\('x.real'\): attribute access is not supported"),
    ("x + 1 > 2", r"\('x \+ 1'\): the operator \+ is not supported \(no arithmetic in filters\)"),
    ("x == 2 ** 3", r"the operator \*\* is not supported"),
    ("(x > 1) ^ (y > 1)", r"the operator \^ is not supported"),
    ("y[0] == 1", r"a subscript is not supported"),
    ("lambda: x > 1", r"a lambda is not supported"),
    ("(y := 3)", r"an assignment expression \(:=\) is not supported"),
    ("x > 1 if y else x < 1", r"a conditional expression"),
    ("(v for v in x)", r"a generator expression is not supported"),
    ('f"{x}" == "a"', r"an f-string is not supported"),
    ("x in [v for v in y]", r"in takes a parenthesised list of literals, e.g. segment in \(3, 4\)"),
    ("x in y", r"in takes a parenthesised list of literals"),
    ("x in (1, y)", r"\('y'\): expected a literal, found a column"),
    ("x in (1, 2) in (3,)", r"in, not in, is and is not cannot be chained"),
    ("x < 1 is None", r"cannot be chained"),
    ("day == 1 & i8 == 2", r"& binds tighter than a comparison .*put each comparison in parentheses, \(a == 1\) & \(b == 2\), or use and"),
    ("day == 1 | i8 == 2", r"\| binds tighter than a comparison .* or use or"),
    ("~day == 1", r"~ binds tighter than a comparison: write ~\(a == 1\)"),
    ("x == None", r"a comparison with None is never true; write x is None or x is not None"),
    ("None != x", r"write x is None"),
    ("x is 1", r"is and is not compare with None only"),
    ("None is None", r"\('None'\): the other side of is must be a column"),
    ("flag", r"a bare column is not a predicate; compare it, e.g. flag == True"),
    ('col("flag")', r"a bare column is not a predicate"),
    ("3", r"a literal alone is not a predicate"),
    ("True", r"a literal alone is not a predicate"),
    ("x == y", r"compares two columns; a comparison takes a column and a literal"),
    ("1 < 2", r"compares no column"),
    ("x == (1, 2)", r"a list of values goes with in"),
    ("x == 1j", r"a complex literal is not supported"),
    ("x == ...", r"literal is not supported"),
    ('market == -"a"', r"a sign applies to numbers only"),
    ("flag == -True", r"a sign applies to numbers only"),
    ('date == date("2026-13-01")', r"date\('2026-13-01'\) is not a valid date"),
    ('date == date("20260101")', r"is not a valid date: write YYYY-MM-DD"),
    ("date == date(2026)", r'date\(\) takes one string literal, e.g. date\("\.\.\."\)'),
    ('ts == timestamp("yesterday")', r"timestamp\('yesterday'\) is not a valid timestamp"),
    ('price == decimal("abc")', r"decimal\('abc'\) is not a valid decimal"),
    ('price == decimal("inf")', r"a decimal must be finite"),
    ('x == float("one")', r"float\('one'\) is not a valid float"),
    ('col(1) == 1', r"col\(\) takes one string literal"),
    ("ﬁ == 1", r"the name 'ﬁ' reads as 'fi' in Python; write col\('ﬁ'\)"),
    ("x = 1", r"not valid syntax \(.*\); comparisons are written =="),
    ("x == 1 and", r"not valid syntax"),
    ("class == 1", r"not valid syntax"),
    ("", r"filter text '' is empty; pass no filter to read every row"),
    ("   ", r"is empty"),
    ("not " * 3000 + "x == 1", r"nests too deeply"),
    # typed against the schema, with a hint for the text spelling
    ('date == "2026-01-01"', r"a date column is compared with datetime.date values only; in filter text write a date as date\(\"2026-01-01\"\)"),
    ('ts >= "2026-01-01"', r'write a timestamp as timestamp\("2026-01-01T00:00:00Z"\)'),
    ('naive >= "2026-01-01"', r'write a timestamp as timestamp\("2026-01-01T00:00:00"\)'),
    ("price == 1.5", r'write a decimal as decimal\("1.50"\) or an int'),
    ('blob == "ab"', r'write bytes as b"'),
    ('ts == timestamp("2026-01-01T00:00:00")', r"the column has time zone 'UTC' and the value none"),
    ('naive == timestamp("2026-01-01T00:00:00Z")', r"the column has no time zone and the value has one"),
    ('ts == timestamp("2026-01-01T00:00:00.0001Z")', r"finer than the column's unit 'ms'"),
    ("nope == 1", r"filter column 'nope' does not exist; the available columns are \['market', 'day'"),
    ('day == "2026"', r"filter value str '2026' does not fit column 'day' of type int64: an integer column is compared with integers only$"),
    ("i8 == 300", r"outside the type's range \[-128, 127\]"),
    ('x == float("nan")', r"NaN compares false with every value"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[t[:40] for t, _ in ERRORS])
def test_bad_text_is_refused_with_a_message(text, message):
    with pytest.raises(OptionError, match=message) as info:
        parse_filter(text, SCHEMA_T, PARTS)
    msg = str(info.value)
    if msg.startswith("filter text"):
        assert msg.endswith(f"the filter syntax is: {TEXT_SYNTAX}") or "is empty" in msg


def test_a_long_text_is_shortened_in_messages_but_a_long_in_list_is_read():
    values = list(range(5000))
    text = f"day in ({', '.join(map(str, values))})"
    assert json.loads(canon(text))["values"] == values
    with pytest.raises(OptionError, match=r"filter text 'day in \(0, 1, .{150,}\.\.\.', at column \d+ \(") as info:
        canon(text + " + 1")
    assert len(str(info.value)) < 200 + 60 + 150 + len(TEXT_SYNTAX)


def test_the_help_line_shows_both_forms():
    assert '[["market", "==", "US"]]' in FILTER_HELP and 'market == "US"' in FILTER_HELP


def test_messages_point_at_the_line_and_character_column():
    schema = pa.schema([("é", pa.int64()), ("x", pa.int64())])
    with pytest.raises(OptionError, match=r", at line 3, column 2 \('é.y'\): attribute access is not supported"):
        parse_filter("é == 1 and (\n  x == 1 or\n é.y == 1)", schema)
    with pytest.raises(OptionError, match=r", at column 12 \('é.y'\): attribute access"):
        parse_filter("é == 1 and é.y == 2", schema)


def test_a_long_disjunction_with_non_ascii_names_is_read():
    # Locating names must not re-read the whole text per name (that took minutes at this size).
    schema = pa.schema([("é", pa.int64())])
    text = " or ".join(f"é == {i}" for i in range(5000))
    assert len(parse_filter(text, schema).canonical["args"]) == 5000
