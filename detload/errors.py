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
    └── ManifestError(DetloadError, ValueError)      an unreadable or inconsistent manifest

A path that does not exist raises the built-in ``FileNotFoundError``.
Messages say what failed and what to change.
"""

from __future__ import annotations

__all__ = [
    "DataError",
    "DatasetError",
    "DetloadError",
    "EmptyDatasetError",
    "ManifestError",
    "OptionError",
    "SchemaMismatchError",
    "SharedMemoryError",
    "SourceError",
    "StateError",
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
