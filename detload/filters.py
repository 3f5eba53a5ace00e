"""Row filters, as a library: read a filter in any form ``Loader(filter=...)`` takes into its
canonical `Filter` (`parse`), to see the canonical JSON and digest the loader records, the
columns it reads, which rows of a table it keeps, and what a row group's statistics settle.

The loader parses ``filter=`` exactly this way, against the dataset's schema and Hive
partition types. See docs/filters.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ._filters.canonical import ISIN_HASH_THRESHOLD, Filter, FilterInput, parse_filter
from ._filters.prune import row_group_stats
from ._filters.text import FILTER_HELP, TEXT_SYNTAX
from .errors import OptionError

__all__ = ["FILTER_HELP", "ISIN_HASH_THRESHOLD", "TEXT_SYNTAX", "Filter", "parse", "row_group_stats"]

_PARTITION_TYPES = ("int64", "string")


def parse(filter: FilterInput, schema: pa.Schema,  # noqa: A002 - the Loader option's name
          partition_types: Mapping[str, str] | None = None) -> Filter:
    """Read ``filter`` into its canonical `Filter`, typed against ``schema``, as ``Loader(filter=...)`` does.

    ``filter`` is a pyarrow.compute expression, a pyarrow DNF list, a string (JSON when it
    starts with ``[`` or ``{``, else the filter text syntax, `TEXT_SYNTAX`), a canonical tree
    as a dict, or a `Filter`. ``schema`` is the dataset's ``pyarrow.Schema`` (for one file,
    ``pyarrow.parquet.read_schema(path)``); ``partition_types`` types its Hive partition
    columns, ``{"year": "int64", "market": "string"}``. Raises `OptionError` naming the
    column, type and value (or the part of the expression) and what to write instead.
    """
    if not isinstance(schema, pa.Schema):
        raise OptionError(
            f"detload.filters.parse needs the dataset's pyarrow.Schema to type the filter's values, got "
            f"{type(schema).__name__} {schema!r}; for a Parquet file use pyarrow.parquet.read_schema(path)"
        )
    ptypes = _partition_types(partition_types, schema)
    return parse_filter(filter, schema, ptypes)


def _partition_types(given: Any, schema: pa.Schema) -> dict[str, str]:
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise OptionError(f"partition_types must map each Hive partition column to 'int64' or 'string', "
                          f"e.g. {{'year': 'int64'}}; got {type(given).__name__} {given!r}")
    out: dict[str, str] = {}
    for name, typ in given.items():
        if not isinstance(name, str) or typ not in _PARTITION_TYPES:
            raise OptionError(f"partition_types[{name!r}] must be 'int64' or 'string' (how detload types "
                              f"Hive partition values), got {typ!r}")
        if name in schema.names:
            raise OptionError(f"partition_types names {name!r}, which is also a column of the schema: a Hive "
                              "partition column is not stored in the files; leave it out of one of the two")
        out[name] = typ
    return out
