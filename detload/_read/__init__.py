"""Reading one row group as checked NumPy columns: the layer below planning and the engine.

`reader.py` opens, checks and converts a row group (through the row-group cache)
and applies a filter's selection; `mapping.py` decides which local files are read
through memory maps; `parquet.py` opens a file with the read options every pass that
reads rows uses (page checksums verified). Planning (detload.planning) reads a transform's row groups
here, and the engine's workers every block's; this package imports neither.
"""

from __future__ import annotations

from .reader import FileRef, ReadConfig, ReadSettings, StageTimes, UnitReader, planned_rows, select_rows

__all__ = ["FileRef", "ReadConfig", "ReadSettings", "StageTimes", "UnitReader", "planned_rows", "select_rows"]
