"""detload: deterministic, fast Parquet loading for ML training, with a per-batch audit trail.

Public API; the implementation lives in private modules. The names are loaded on
first use (PEP 562): ``import detload`` imports neither NumPy nor pyarrow, so the
command line starts fast and a Ctrl-C while it starts is handled by its own code.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Where each public name lives. `from detload import Loader` imports detload.loader then.
_EXPORTS = {
    "BlockMemoryWarning": "loader",
    "Cache": "options",
    "CacheWarning": "_cache",
    "ColumnSpec": "_types",
    "DataError": "errors",
    "DatasetError": "errors",
    "DetloadError": "errors",
    "Digest": "_layout.digest",
    "DigestMismatchError": "_layout.rewrite",
    "Distributed": "options",
    "EmptyDatasetError": "errors",
    "LayoutCheck": "_layout.check",
    "LayoutError": "_layout.rewrite",
    "LayoutReport": "_layout.rewrite",
    "Loader": "loader",
    "ManifestError": "errors",
    "OptionError": "errors",
    "Packed": "packed",
    "OrderOptions": "plan",
    "Plan": "plan",
    "Pool": "options",
    "Ragged": "_types",
    "SchemaMismatchError": "errors",
    "SharedMemoryError": "errors",
    "SkippedFilesWarning": "_discovery",
    "SourceError": "errors",
    "StageStats": "stats",
    "StarvationReport": "starvation",
    "StateError": "errors",
    "Stats": "stats",
    "Storage": "options",
    "Transform": "transform",
    "TransformContext": "transform",
    "UnfinishedLayoutWarning": "_discovery",
    "UnitList": "plan",
    "UnsupportedTypeError": "errors",
    "WorkerError": "errors",
    "WorkerStalledError": "errors",
    "check_layout": "_layout.check",
    "digest": "_layout.digest",
    "hash_batch": "audit",
    "layout": "_layout.rewrite",
    "make_plan": "planning.order",
    "read_manifest": "audit",
    "starvation_check": "starvation",
}

__all__ = [
    "BlockMemoryWarning",
    "Cache",
    "CacheWarning",
    "ColumnSpec",
    "DataError",
    "DatasetError",
    "DetloadError",
    "Digest",
    "DigestMismatchError",
    "Distributed",
    "EmptyDatasetError",
    "LayoutCheck",
    "LayoutError",
    "LayoutReport",
    "Loader",
    "ManifestError",
    "OptionError",
    "OrderOptions",
    "Packed",
    "Plan",
    "Pool",
    "Ragged",
    "SchemaMismatchError",
    "SharedMemoryError",
    "SkippedFilesWarning",
    "SourceError",
    "StageStats",
    "StarvationReport",
    "StateError",
    "Stats",
    "Storage",
    "Transform",
    "TransformContext",
    "UnfinishedLayoutWarning",
    "UnitList",
    "UnsupportedTypeError",
    "WorkerError",
    "WorkerStalledError",
    "__version__",
    "check_layout",
    "digest",
    "hash_batch",
    "layout",
    "make_plan",
    "read_manifest",
    "starvation_check",
]

TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from ._cache import CacheWarning
    from ._discovery import SkippedFilesWarning, UnfinishedLayoutWarning
    from ._layout.check import LayoutCheck, check_layout
    from ._layout.digest import Digest, digest
    from ._layout.rewrite import DigestMismatchError, LayoutError, LayoutReport, layout
    from ._types import ColumnSpec, Ragged
    from .audit import hash_batch, read_manifest
    from .errors import (
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
    from .loader import BlockMemoryWarning, Loader
    from .options import Cache, Distributed, Pool, Storage
    from .packed import Packed
    from .plan import OrderOptions, Plan, UnitList
    from .planning.order import make_plan
    from .starvation import StarvationReport, starvation_check
    from .stats import StageStats, Stats
    from .transform import Transform, TransformContext


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'detload' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
