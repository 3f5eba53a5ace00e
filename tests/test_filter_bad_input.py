"""The filter's bad input, each in every form a filter takes (expression, DNF, text), with the
whole message asserted: an unknown column names the available ones, a value of the wrong type
names the column and its type, a filter that selects nothing is an EmptyDatasetError naming
it, and a Python callable is refused with what to use instead.

(The layout tool's bad input — a non-empty DST, a missing sort key, a bloom filter on an
unsupported type, a digest mismatch — is asserted in tests/layout/test_rewrite.py and
tests/layout/test_layout_cli.py.)
"""

from __future__ import annotations

import functools
import re

import pyarrow.compute as pc
import pytest
from strategies import write_dataset

from detload import Loader
from detload.errors import EmptyDatasetError, OptionError

f = pc.field
COLUMNS = "['id', 'f32', 's', 'lf', 'nf', 'ni', 'p']"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return write_dataset(str(tmp_path_factory.mktemp("bad") / "ds"),
                         {"p=0/a.parquet": [40, 30], "p=1/b.parquet": [50]}, seed=1).root


@pytest.mark.parametrize("flt", [f("nope") == 1, [("nope", "==", 1)], [[("id", ">", 0)], [("nope", "<", 2)]],
                                 "nope == 1", '[["nope", "==", 1]]', f("id").isin([1]) & f("nope").is_null()])
def test_an_unknown_column_names_the_available_ones(root, flt):
    with pytest.raises(OptionError) as e:
        Loader(root, batch_size=8, seed=0, filter=flt)
    assert str(e.value) == f"filter column 'nope' does not exist; the available columns are {COLUMNS}"


@pytest.mark.parametrize("flt, message", [
    (f("id") == "x", "filter value string scalar 'x' does not fit column 'id' of type int64: an integer column is "
                     "compared with integers only"),
    ([("id", ">=", "12")], "filter value str '12' does not fit column 'id' of type int64: an integer column is "
                           "compared with integers only"),
    ('id == "x"', "filter value str 'x' does not fit column 'id' of type int64: an integer column is "
                  "compared with integers only"),
    ([("s", "in", [1, 2])], "filter value int 1 does not fit column 's' of type string: a string column is "
                            "compared with str values only"),
    (f("s") == 1, "filter value int64 scalar 1 does not fit column 's' of type string: a string column is "
                  "compared with str values only"),
])
def test_a_value_of_the_wrong_type_names_the_column_and_its_type(root, flt, message):
    with pytest.raises(OptionError) as e:
        Loader(root, batch_size=8, seed=0, filter=flt)
    assert str(e.value) == message


@pytest.mark.parametrize("flt, canonical", [
    (f("id") > 10**9, '{"field":"id","op":">","type":"int64","value":1000000000}'),
    ([("s", "==", "nobody")], '{"field":"s","op":"==","type":"string","value":"nobody"}'),
    ('s == "nobody"', '{"field":"s","op":"==","type":"string","value":"nobody"}'),
])
def test_a_filter_that_selects_no_row_is_an_empty_dataset_error_naming_it(root, flt, canonical):
    with pytest.raises(EmptyDatasetError) as e:
        Loader(root, batch_size=8, seed=0, filter=flt)
    assert re.fullmatch(
        re.escape(f"filter {canonical} selects no row of the dataset at {root!r}: of its 3 row group(s) "
                  "(120 rows), ") + r"\d+ were pruned without reading and \d+ had no matching row", str(e.value)), e.value


@pytest.mark.parametrize("flt", [lambda row: row["id"] > 3, functools.partial(max, 0), print])
def test_a_python_callable_is_refused_saying_to_use_an_expression(root, flt):
    with pytest.raises(OptionError) as e:
        Loader(root, batch_size=8, seed=0, filter=flt)
    assert str(e.value) == (f"filter={flt!r} is a Python callable: it cannot be fingerprinted or pruned — use a "
                            "pyarrow.compute expression or a DNF list")


_SURROGATE_TEXT = ("holds the lone surrogate '\\ud800' at column {col}, which is not a character and cannot be "
                   "encoded as UTF-8 (on a command line it comes from bytes that are not UTF-8); write the filter "
                   "in valid UTF-8")
_SURROGATE_VALUE = ("filter value str '\\ud800' does not fit column 's' of type string: it holds the lone surrogate "
                    "'\\ud800', which is not a character and cannot be stored in a string column (UTF-8 cannot "
                    "encode it)")


@pytest.mark.parametrize("flt, message", [
    ('s == "\ud800"', "filter text 's == \"\\ud800\"' " + _SURROGATE_TEXT.format(col=7)),
    ('s\ud800 == "a"', "filter text 's\\ud800 == \"a\"' " + _SURROGATE_TEXT.format(col=2)),
    ('[["s", "==", "\ud800"]]', "filter text '[[\"s\", \"==\", \"\\ud800\"]]' " + _SURROGATE_TEXT.format(col=15)),
    ('[["s", "==", "\\ud800"]]', _SURROGATE_VALUE),  # escaped in the JSON: the value is the surrogate
    ([("s", "==", "\ud800")], _SURROGATE_VALUE),
    ([("s", "in", ["a", "\ud800"])], _SURROGATE_VALUE),
    ({"op": "isin", "field": "s", "type": "string", "values": ["\ud800"]}, _SURROGATE_VALUE),
])
def test_a_lone_surrogate_is_refused_by_name_not_by_the_codec(root, flt, message):
    with pytest.raises(OptionError) as e:
        Loader(root, batch_size=8, seed=0, filter=flt)
    assert str(e.value) == message


_NAN_ISIN = ("filter isin on column 'nf' lists NaN: NaN is not allowed in isin values (filters take no NaN: "
             "pyarrow's isin would match NaN rows with it, == never does, and other engines disagree); "
             "remove NaN from the list")


@pytest.mark.parametrize("flt", [
    f("nf").isin([1.0, float("nan")]),
    f("id").is_valid() & ~f("nf").isin([float("nan")]),
    [("nf", "in", [1.0, float("nan")])],
    [("nf", "not in", [float("nan")])],
    'nf in (1.0, float("nan"))',
    '[["nf", "in", [1.0, NaN]]]',
])
def test_nan_in_an_isin_list_is_named(root, flt):
    with pytest.raises(OptionError) as e:
        Loader(root, batch_size=8, seed=0, filter=flt)
    assert str(e.value) == _NAN_ISIN
