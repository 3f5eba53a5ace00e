"""The public filter entry point, detload.filters: its names, that it reads a filter exactly as
``Loader(filter=...)`` does, and the messages of what it refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import detload
import detload.filters
from detload import Loader, OptionError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = pa.schema([("market", pa.string()), ("day", pa.int32()), ("score", pa.float32())])


def test_the_names_of_the_submodule():
    assert detload.filters.__all__ == ["FILTER_HELP", "ISIN_HASH_THRESHOLD", "TEXT_SYNTAX", "Filter", "parse",
                                       "row_group_stats"]
    for name in detload.filters.__all__:
        assert getattr(detload.filters, name) is not None
    # A submodule reached as an attribute, like detload.layout: not one of the top-level names.
    assert "filters" in dir(detload) and "filters" not in detload.__all__


def test_reached_as_an_attribute_in_a_fresh_interpreter():
    code = ("import sys, detload; assert 'pyarrow' not in sys.modules; "
            "f = detload.filters.parse('day >= 3', __import__('pyarrow').schema([('day', 'int32')])); "
            "print(type(f).__name__, f.canonical_json)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'Filter {"field":"day","op":">=","type":"int32","value":3}'


@pytest.mark.parametrize("form", [
    (pc.field("market") == "US") & (pc.field("day") >= 20260101),
    [("market", "=", "US"), ("day", ">=", 20260101)],
    '[["market", "==", "US"], ["day", ">=", 20260101]]',
    'market == "US" and day >= 20260101',
])
def test_every_form_reads_into_the_filter_the_loader_records(tmp_path, form):
    n = 100
    pq.write_table(pa.table({"market": pa.array(["US", "DE"] * (n // 2)),
                             "day": pa.array(20260100 + np.arange(n) % 5, pa.int32()),
                             "score": pa.array(np.linspace(0, 1, n), pa.float32())}), tmp_path / "t.parquet")
    flt = detload.filters.parse(form, SCHEMA)
    assert isinstance(flt, detload.filters.Filter)
    with Loader(str(tmp_path), batch_size=10, seed=0, filter=form) as loader:
        assert loader.order["filter"] == flt.canonical_json
    assert flt.canonical_json == ('{"args":[{"field":"market","op":"==","type":"string","value":"US"},'
                                  '{"field":"day","op":">=","type":"int32","value":20260101}],"op":"and"}')
    # A Filter, its canonical dict and its JSON read back into the same filter.
    assert detload.filters.parse(flt, SCHEMA) == flt
    assert detload.filters.parse(flt.canonical, SCHEMA) == flt
    assert detload.filters.parse(flt.canonical_json, SCHEMA) == flt


def test_partition_columns_are_typed_by_partition_types():
    flt = detload.filters.parse("year == 2026 and market == 'US'", SCHEMA, {"year": "int64"})
    assert flt.partition_columns == ("year",)
    assert flt.stored_columns == ("market",)


def test_row_group_stats_feed_prune(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"day": pa.array(np.arange(200), pa.int32())}), path, row_group_size=100)
    md = pq.read_metadata(path)
    flt = detload.filters.parse("day >= 150", pa.schema([("day", pa.int32())]))
    got = [flt.prune(detload.filters.row_group_stats(md.row_group(g), md.schema.to_arrow_schema()), {}, 100)
           for g in range(md.num_row_groups)]
    assert got == ["none", "some"]


@pytest.mark.parametrize(("args", "message"), [
    (("day >= 1", "data/part-0.parquet"),
     "detload.filters.parse needs the dataset's pyarrow.Schema to type the filter's values, got str "
     "'data/part-0.parquet'; for a Parquet file use pyarrow.parquet.read_schema(path)"),
    (("day >= 1", SCHEMA, ["year"]),
     "partition_types must map each Hive partition column to 'int64' or 'string', e.g. {'year': 'int64'}; "
     "got list ['year']"),
    (("day >= 1", SCHEMA, {"year": "int32"}),
     "partition_types['year'] must be 'int64' or 'string' (how detload types Hive partition values), got 'int32'"),
    (("day >= 1", SCHEMA, {"day": "int64"}),
     "partition_types names 'day', which is also a column of the schema: a Hive partition column is not stored "
     "in the files; leave it out of one of the two"),
    # The filter's own refusals come through unchanged.
    (("nope == 1", SCHEMA),
     "filter column 'nope' does not exist; the available columns are ['market', 'day', 'score']"),
    (("day = 1", SCHEMA),
     "filter text 'day = 1': not valid syntax (invalid syntax at column 5); comparisons are written ==; "
     f"the filter syntax is: {detload.filters.TEXT_SYNTAX}"),
])
def test_refusals_name_what_to_write(args, message):
    with pytest.raises(OptionError) as ei:
        detload.filters.parse(*args)
    assert str(ei.value) == message


def test_a_callable_is_refused():
    def keep(t):
        return t

    with pytest.raises(OptionError) as ei:
        detload.filters.parse(keep, SCHEMA)
    assert str(ei.value) == (f"filter={keep!r} is a Python callable: it cannot be fingerprinted or pruned — "
                             "use a pyarrow.compute expression or a DNF list")
