"""Row groups too short for the mixed order's runs, spilled: peak PSS and seconds an epoch of the
mixed order (one window of the whole dataset, kept between epochs) at a `_SMALL_SEGMENT`
threshold, beside the windowed order. A block takes a few rows of each such piece, part of the
piece's one segment of the spill file; a segment of at most the threshold's bytes is read whole
into a reused buffer (`SpillPack._small_units`), a larger one through a map of the file.

The data: ``--rows`` rows of an int64 id and ``--columns`` float32 columns in row groups of
``--row-group-rows`` (made once under ``--data``). The defaults, 800 bytes a row in row groups
of 256 rows, make segments of 200 KiB: over the old threshold (64 KiB), under the new (4 MiB).

    PYTHONPATH=. python experiments/bench/small_segments.py --threshold 65536
    PYTHONPATH=. python experiments/bench/small_segments.py --threshold 4194304
    PYTHONPATH=. python experiments/bench/small_segments.py --order windowed

Thread workers, W=2 by default, four epochs; PSS sampled every fifth batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def pss_mib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) >> 10
    return 0


def make(path: Path, rows: int, columns: int, rg: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if (path / "_done").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = rows // 4
    for f in range(4):
        cols = {"id": np.arange(f * per, (f + 1) * per)}
        for j in range(columns):
            cols[f"c{j}"] = rng.random(per, dtype=np.float32)
        pq.write_table(pa.table(cols), path / f"p{f}.parquet", row_group_size=rg)
    (path / "_done").write_text("")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "detload-small-segments"))
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--columns", type=int, default=200)
    ap.add_argument("--row-group-rows", type=int, default=256)
    ap.add_argument("--order", choices=["mix", "windowed"], default="mix")
    ap.add_argument("--threshold", type=int, default=None, help="_SMALL_SEGMENT in bytes (default: the engine's)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    a = ap.parse_args(argv)
    data = Path(a.data) / f"r{a.rows}-c{a.columns}-rg{a.row_group_rows}"
    make(data, a.rows, a.columns, a.row_group_rows)

    import detload._engine.spill as spill
    from detload import Loader, Pool

    if a.threshold is not None:
        spill._SMALL_SEGMENT = a.threshold
    kw = {"order": "windowed", "shuffle_window": 4} if a.order == "windowed" else {}
    peak, times = 0, []
    with Loader(str(data), batch_size=4096, seed=1, workers=a.workers, pool=Pool(kind="thread", prefetch=2), **kw) as ld:
        for e in range(a.epochs):
            ld.set_epoch(e)
            t0 = time.perf_counter()
            for i, _ in enumerate(ld):
                if i % 5 == 0:
                    peak = max(peak, pss_mib())
            times.append(time.perf_counter() - t0)
    what = a.order if a.order == "windowed" else f"mix, threshold {spill._SMALL_SEGMENT:,} bytes"
    print(f"{what}: peak PSS {peak} MiB, seconds an epoch {', '.join(f'{t:.2f}' for t in times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
