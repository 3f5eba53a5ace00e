"""detload: deterministic, fast Parquet loading for ML training, with a per-batch audit trail.

Public API; the implementation lives in private modules. The names are loaded on
first use (PEP 562): ``import detload`` imports neither NumPy nor pyarrow, so the
command line starts fast and a Ctrl-C while it starts is handled by its own code.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Where each public name lives. `from detload import Loader` imports detload.loader then.
# The loader and its option groups, the plan, transforms, the audit and every exception and
# warning (all defined in errors.py); the layout tool is the submodule detload.layout, and
# parsing a filter outside a Loader (its canonical form) the submodule detload.filters.
_EXPORTS = {
    "BlockMemoryWarning": "errors",
    "Cache": "options",
    "CacheWarning": "errors",
    "ColumnSpec": "_types",
    "DataError": "errors",
    "DatasetError": "errors",
    "DetloadError": "errors",
    "Distributed": "options",
    "EmptyDatasetError": "errors",
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
    "SkippedFilesWarning": "errors",
    "SourceError": "errors",
    "StateError": "errors",
    "TimeZoneWarning": "errors",
    "Stats": "stats",
    "Storage": "options",
    "Transform": "transform",
    "TransformContext": "transform",
    "UnitList": "plan",
    "UnsupportedTypeError": "errors",
    "WorkerError": "errors",
    "WorkerStalledError": "errors",
    "hash_batch": "audit",
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
    "Distributed",
    "EmptyDatasetError",
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
    "StateError",
    "Stats",
    "Storage",
    "TimeZoneWarning",
    "Transform",
    "TransformContext",
    "UnitList",
    "UnsupportedTypeError",
    "WorkerError",
    "WorkerStalledError",
    "__version__",
    "hash_batch",
    "make_plan",
    "read_manifest",
    "starvation_check",
]

TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from . import errors as errors
    from . import features as features
    from . import filters as filters
    from . import layout as layout
    from ._types import ColumnSpec, Ragged
    from .audit import hash_batch, read_manifest
    from .errors import (
        BlockMemoryWarning,
        CacheWarning,
        DataError,
        DatasetError,
        DetloadError,
        EmptyDatasetError,
        ManifestError,
        OptionError,
        SchemaMismatchError,
        SharedMemoryError,
        SkippedFilesWarning,
        SourceError,
        StateError,
        TimeZoneWarning,
        UnsupportedTypeError,
        WorkerError,
        WorkerStalledError,
    )
    from .loader import Loader
    from .options import Cache, Distributed, Pool, Storage
    from .packed import Packed
    from .plan import OrderOptions, Plan, UnitList
    from .planning.order import make_plan
    from .starvation import starvation_check
    from .stats import Stats
    from .transform import Transform, TransformContext

#: Public submodules reached as attributes (``detload.layout.rewrite(...)``, ``detload.filters.parse(...)``),
#: imported on first use.
#: ``detload.torch`` (the PyTorch adapter) is imported by name only: ``import detload.torch``.
_SUBMODULES = frozenset({"errors", "features", "filters", "layout"})


def __getattr__(name: str) -> object:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")  # the import sets the attribute
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'detload' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups do not come here again
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
