"""Where a loader's consumer waits: per epoch, the wall time, rows/s over the whole epoch and
after its first N batches, and every wait between two batches longer than a threshold, with
the batch it came before. A consumer that does no work shows every bubble of the pipeline:
the epoch's start (a window read before the first block), a task boundary (a window read
that nothing overlapped). For datasets of several mixed-order windows a partition
(docs/benchmarks.md, "Datasets of several windows a partition"):

    python experiments/bench/datagen.py ctr /tmp/ctr4m --rows 4000000
    PYTHONPATH=. python experiments/bench/batch_gaps.py /tmp/ctr4m --pool thread --order mix

Nothing here imports torch; one loader, batches of 4,096 rows, seed 1234, Pool(prefetch=2).
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> int:
    from detload import Loader, Pool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--pool", choices=["thread", "process"], default="thread")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--order", choices=["mix", "windowed"], default="mix")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--after", type=int, default=300, help="rows/s also over the batches after this many")
    ap.add_argument("--gap-ms", type=float, default=30.0, help="report waits longer than this")
    a = ap.parse_args(argv)
    extra = {"shuffle_window": 4} if a.order == "windowed" else {}
    with Loader(a.data, batch_size=4096, seed=1234, workers=a.workers, pool=Pool(kind=a.pool, prefetch=2),
                order=a.order, **extra) as ld:
        for e in range(a.epochs):
            ld.set_epoch(e)
            t0 = last = time.perf_counter()
            rows = rows_at = 0
            t_at = None
            gaps = []
            for j, b in enumerate(ld):
                now = time.perf_counter()
                if now - last > a.gap_ms / 1e3:
                    gaps.append((j, round((now - last) * 1e3)))
                last = now
                rows += len(b["id"])
                if j == a.after:
                    t_at, rows_at = now, rows
            t1 = time.perf_counter()
            after = f", after batch {a.after} {(rows - rows_at) / (t1 - t_at):,.0f}" if t_at is not None else ""
            print(f"{a.pool} W={a.workers} {a.order} epoch {e}: {t1 - t0:.3f} s, {rows / (t1 - t0):,.0f} rows/s"
                  f"{after}; waits over {a.gap_ms:g} ms (batch, ms): {gaps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
