"""Opening a Parquet file the one way detload reads data: page checksums verified, INT96 at INT96_UNIT.

The workers' reader and the planning passes that read rows (a filter's selection pass, the
group-key and mix-column passes) all open files here, so a page that fails its CRC is refused
everywhere with the same `DataError` (`read_row_group`), instead of deciding a selection or a
group from garbage that the workers would then refuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .._types import INT96_UNIT
from ..errors import DataError

__all__ = ["checksum_error", "open_parquet", "read_row_group"]

#: What pyarrow's OSError says when a page fails its CRC (pyarrow 14 to 26).
_CRC_FAILED = "CRC checksum verification failed"


def open_parquet(source: Any, *, metadata: pq.FileMetaData | None = None, pre_buffer: bool = False,
                 int96_unit: str = INT96_UNIT) -> pq.ParquetFile:
    """A ParquetFile over ``source`` (an open file or a path) with the project's read options.

    Pages written with CRCs are checked: garbage in an uncompressed or zstd page would
    otherwise decode into wrong values without a word. ``int96_unit`` is for the reader's
    second, millisecond view of INT96 columns (the wrap check) only.
    """
    return pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True, pre_buffer=pre_buffer,
                          coerce_int96_timestamp_unit=int96_unit)


def checksum_error(exc: BaseException, pf: pq.ParquetFile, rg: int, columns: Sequence[str] | None,
                   where: str) -> DataError | None:
    """The `DataError` for ``exc`` if it is a page failing its CRC in row group ``rg`` of ``where``, else None.

    pyarrow names only the page's ordinal, so the columns read are tried one at a time to
    name the one(s) whose pages fail (this runs only on the way to the error).
    """
    if not isinstance(exc, OSError) or _CRC_FAILED not in str(exc):
        return None
    names = list(columns) if columns is not None else list(pf.schema_arrow.names)
    bad: list[str] = []
    for name in names:
        try:
            pf.read_row_group(rg, columns=[name], use_threads=False)
        except OSError as e:
            if _CRC_FAILED in str(e):
                bad.append(name)
        except pa.ArrowException:
            pass
    what = (f"column {bad[0]!r}" if len(bad) == 1 else f"columns {bad}" if bad
            else f"one of the columns {names}")
    err = DataError(
        f"{where} row group {rg}: a page of {what} fails its CRC checksum ({exc}): the file's bytes "
        "changed after they were written (a damaged disk, copy or upload). Nothing is read from a page "
        "that fails its checksum; restore or rewrite the file."
    )
    err.__cause__ = exc
    return err


def read_row_group(pf: pq.ParquetFile, rg: int, columns: Sequence[str] | None, where: str) -> pa.Table:
    """``pf.read_row_group(rg, columns)`` on one thread; a page failing its CRC raises `checksum_error`'s DataError."""
    cols = list(columns) if columns is not None else None
    try:
        return pf.read_row_group(rg, columns=cols, use_threads=False)
    except OSError as exc:
        err = checksum_error(exc, pf, rg, cols, where)
        if err is None:
            raise
        raise err from exc
