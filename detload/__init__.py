"""detload: deterministic, fast Parquet loading for ML training, with a per-batch audit trail.

Public API; the implementation lives in private modules.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._cache import CacheWarning  # noqa: E402
from ._types import ColumnSpec, Ragged  # noqa: E402
from .audit import hash_batch, read_manifest  # noqa: E402
from .errors import (  # noqa: E402
    DataError,
    DatasetError,
    DetloadError,
    EmptyDatasetError,
    ManifestError,
    OptionError,
    SchemaMismatchError,
    SharedMemoryError,
    SourceError,
    StateError,
    UnsupportedTypeError,
    WorkerError,
    WorkerStalledError,
)
from .loader import Loader  # noqa: E402
from .plan import OrderOptions, Plan, make_plan  # noqa: E402
from .starvation import StarvationReport, starvation_check  # noqa: E402
from .stats import StageStats, Stats  # noqa: E402

__all__ = [
    "CacheWarning",
    "ColumnSpec",
    "DataError",
    "DatasetError",
    "DetloadError",
    "EmptyDatasetError",
    "Loader",
    "ManifestError",
    "OptionError",
    "OrderOptions",
    "Plan",
    "Ragged",
    "SchemaMismatchError",
    "SharedMemoryError",
    "SourceError",
    "StageStats",
    "StarvationReport",
    "StateError",
    "Stats",
    "UnsupportedTypeError",
    "WorkerError",
    "WorkerStalledError",
    "__version__",
    "hash_batch",
    "make_plan",
    "read_manifest",
    "starvation_check",
]
