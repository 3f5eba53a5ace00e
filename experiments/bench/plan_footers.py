"""Filter planning with and without discovery's footers, on a dataset of many small files.

Writes FILES files of 4 row groups (sorted ids) under --data, then times `filter_units` for
a range filter that statistics settle everywhere but one row group: reading every footer
again (``footers=None``, what planning did before) against reusing discovery's. Prints the
median of --repeats runs of each and their ratio. A second line times (footers reused) a
bloom-filter reader made for every file, as planning did before, against one made only where
a footer places a filter in a filtered column (none here), the two alternating in one process.
Not a test: a script that prints two lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's detload

from detload._discovery import discover  # noqa: E402
from detload._filters import planning  # noqa: E402
from detload._filters.canonical import parse_filter  # noqa: E402
from detload._filters.planning import filter_units  # noqa: E402

ROWS = 4000  # per file, in row groups of 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/detload-plan-footers"))
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    for i in range(args.files):
        path = args.data / f"part-{i:05d}.parquet"
        if not path.exists():
            ids = np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64)
            pq.write_table(pa.table({"id": ids, "x": ids * 0.5, "c": (ids % 7).astype(np.int32)}), path,
                           row_group_size=1000)
    footers: list[pq.FileMetaData] = []
    ds = discover(str(args.data), footers=footers)
    flt = parse_filter((pc.field("id") >= 100_500) & (pc.field("id") < ROWS * args.files), ds.schema, {})
    times: dict[str, list[float]] = {"reopen": [], "reuse": []}
    for _ in range(args.repeats):
        for name, given in (("reopen", None), ("reuse", footers)):
            t = time.perf_counter()
            filter_units(ds, flt, footers=given)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{len(ds.files)} files, {sum(len(f.row_groups) for f in ds.files)} row groups: filter_units median of "
          f"{args.repeats}: reading footers again {med['reopen'] * 1e3:.0f} ms, reusing discovery's "
          f"{med['reuse'] * 1e3:.0f} ms ({med['reopen'] / med['reuse']:.1f}x)")
    found = planning._has_bloom
    bloom: dict[str, list[float]] = {"every": [], "found": []}
    for _ in range(args.repeats):
        for name, has in (("every", lambda rg, leaves: bool(leaves)), ("found", found)):
            planning._has_bloom = has  # type: ignore[assignment]
            t = time.perf_counter()
            filter_units(ds, flt, footers=footers)
            bloom[name].append(time.perf_counter() - t)
    planning._has_bloom = found
    bm = {k: statistics.median(v) for k, v in bloom.items()}
    print(f"bloom reader for every file {bm['every'] * 1e3:.0f} ms, only where a footer has a filter "
          f"{bm['found'] * 1e3:.0f} ms (only/every {bm['found'] / bm['every']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
