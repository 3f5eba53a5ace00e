"""The exceptions detload raises, and nothing else.

Hierarchy (every class also derives from the built-in a caller would expect)::

    DetloadError(Exception)
    ├── OptionError(DetloadError, ValueError)        bad option value or combination
    ├── DatasetError(DetloadError, ValueError)       unusable dataset, found at planning
    │   ├── EmptyDatasetError                         no rows at all
    │   ├── SchemaMismatchError                       files disagree on a column's type
    │   └── UnsupportedTypeError(…, TypeError)        an Arrow type with no NumPy mapping
    ├── DataError(DetloadError, ValueError)          bad values met while reading (nulls in ints)
    ├── WorkerError(DetloadError, RuntimeError)      a worker failed, died or stalled
    │   └── WorkerStalledError(…, TimeoutError)
    ├── SharedMemoryError(DetloadError, OSError)     /dev/shm too small for a block
    ├── SourceError(DetloadError, OSError)           storage failed to list or read at planning
    ├── StateError(DetloadError, ValueError)         a resume state that does not fit this loader
    ├── ManifestError(DetloadError, ValueError)      an unreadable or inconsistent manifest
    ├── LayoutError(DetloadError, RuntimeError)      `detload layout` could not finish (DST not created)
    └── DigestMismatchError(…, RuntimeError)         a layout's output digest differs from its source's

Warnings (loading goes on; each names what to change to silence it)::

    UserWarning
    ├── BlockMemoryWarning       the largest block is over the block memory budget
    ├── CacheWarning             the cache could not be used as asked (corrupt entry, disk full)
    ├── SkippedFilesWarning      a dataset folder holds files that are not Parquet
    ├── TimeZoneWarning          a timestamp column has a time zone in some files and none in others
    └── UnfinishedLayoutWarning  a folder holds the marker of a `detload layout` run that never finished

A path that does not exist raises the built-in ``FileNotFoundError``.
Messages say what failed and what to change.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BlockMemoryWarning",
    "CacheWarning",
    "DataError",
    "DatasetError",
    "DetloadError",
    "DigestMismatchError",
    "EmptyDatasetError",
    "LayoutError",
    "ManifestError",
    "OptionError",
    "SchemaMismatchError",
    "SharedMemoryError",
    "SkippedFilesWarning",
    "SourceError",
    "StateError",
    "TimeZoneWarning",
    "UnfinishedLayoutWarning",
    "UnsupportedTypeError",
    "WorkerError",
    "WorkerStalledError",
]


class DetloadError(Exception):
    """Base class of every error detload raises on purpose."""


class OptionError(DetloadError, ValueError):
    """An option has a bad value, or options contradict each other."""


class DatasetError(DetloadError, ValueError):
    """The dataset cannot be planned: no data files, unreadable footer, bad column."""


class EmptyDatasetError(DatasetError):
    """The dataset (or the selected partition of it) holds no rows."""


class SchemaMismatchError(DatasetError):
    """Two data files give a requested column different Arrow types."""


class UnsupportedTypeError(DatasetError, TypeError):
    """A column's Arrow type has no NumPy mapping in detload."""


class DataError(DetloadError, ValueError):
    """Values that cannot be delivered as typed, e.g. a null in an integer column."""


class WorkerError(DetloadError, RuntimeError):
    """A worker raised, died, or could not hand over its block.

    ``worker`` is the worker index, ``unit`` the (file, row group) it was on when
    known, and ``__cause__`` the original exception when it could be carried back.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: int | None = None,
        unit: tuple[str, int] | None = None,
        traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.unit = unit
        self.worker_traceback = traceback


class WorkerStalledError(WorkerError, TimeoutError):
    """A worker produced nothing for longer than ``stall_timeout`` seconds."""


class SharedMemoryError(DetloadError, OSError):
    """Not enough shared memory (/dev/shm) for a process worker's block."""


class SourceError(DetloadError, OSError):
    """The storage could not list the source or read a footer (network, permissions),
    after the filesystem's retries. The message names the object and the last response."""


class StateError(DetloadError, ValueError):
    """A resume state that belongs to another dataset, plan or option set."""


class ManifestError(DetloadError, ValueError):
    """A manifest that cannot be read, or that disagrees with the run writing to it."""


class LayoutError(DetloadError, RuntimeError):
    """A layout could not finish: DuckDB ran out of memory, a disk filled up, or another run is
    writing the same DST. The message names the option or the path; DST was not created."""


class DigestMismatchError(DetloadError, RuntimeError):
    """The digest of a layout's output differs from its source's: rows were lost or changed.

    ``report`` is the `detload.layout.LayoutReport`, with both digests.
    """

    def __init__(self, message: str, *, report: Any) -> None:
        super().__init__(message)
        self.report = report


class BlockMemoryWarning(UserWarning):
    """The plan's largest block would hold more than the block memory budget (``block_memory``)."""


class CacheWarning(UserWarning):
    """The cache could not be used as asked (corrupt entry, disk full); loading went on."""


class SkippedFilesWarning(UserWarning):
    """A dataset folder holds files that are neither Parquet nor a known side file; they were skipped."""


class TimeZoneWarning(UserWarning):
    """A loaded timestamp column has a time zone in some files and none in others: both are
    delivered as stored (UTC instants, and wall-clock values), which agree only if the
    zone-less files hold UTC times."""


class UnfinishedLayoutWarning(UserWarning):
    """A folder being read holds the marker of a `detload layout` run that never finished: its files
    may be incomplete and were never checked against their source."""
