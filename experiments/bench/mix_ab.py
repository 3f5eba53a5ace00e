"""One detload loader on bench.py's CTR or text_list data: rows/s over the epochs after the first two, and
peak PSS (this process and its worker processes, sampled every 20 batches of the first two
epochs and of one more after the timed ones: a sample walks every page table, too slow for
the timed epochs, as bench.py's RssSampler notes). For A/B runs of
two trees, alternately, as the mixed-order engine changes were measured (docs/benchmarks.md):

    PYTHONPATH=TREE_A python experiments/bench/mix_ab.py --pool process --workers 2
    PYTHONPATH=TREE_B python experiments/bench/mix_ab.py --pool process --workers 2

The data is bench.py's (`datagen.make_ctr`, or `make_text_list` with `--shape text_list`: 1M rows
in 16,384-row row groups; `--rows N` for another count, e.g. 4,000,000 for a dataset of several
windows a partition), made if missing (`--data` names the folder: a folder of other data is
written over, so give each count its own);
`--row-group-rows N` makes and reads the same rows in row groups of N (the default window and
block size follow the row groups' rows: compare with `--mix-window 64 --block-rows 4N`).
Nothing here imports torch, so the peak is lower than bench.py's rows (which do).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def pss_mib(proc) -> int:  # type: ignore[no-untyped-def]
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except Exception:  # noqa: BLE001 -- a worker gone between listing and reading
            pass
    return total >> 20


def main(argv: list[str] | None = None) -> int:
    import datagen
    import psutil

    from detload import Loader, Pool

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["ctr", "text_list"], default="ctr")
    ap.add_argument("--data", default=None, help="the dataset's folder (default: bench.py's, data/SHAPE)")
    ap.add_argument("--pool", choices=["thread", "process"], default="thread")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--order", choices=["mix", "windowed"], default="mix")
    ap.add_argument("--mix-window", type=int, default=None)
    ap.add_argument("--block-rows", type=int, default=None)
    ap.add_argument("--row-group-rows", type=int, default=16384,
                    help="the data's row groups (another value writes another dataset, under --data)")
    ap.add_argument("--epochs", type=int, default=5, help="epochs in all; the first two are not timed")
    ap.add_argument("--table", action="store_true", help="print loader.stats() of the timed epochs")
    ap.add_argument("--prefetch", type=int, default=2, help="Pool.prefetch: finished blocks a worker may queue")
    ap.add_argument("--no-spill", action="store_true",
                    help="hold mixed-order windows in memory (Pool(spill=False)), not in a spill file")
    ap.add_argument("--cache", action="store_true",
                    help="read through a cache (a fresh one: the first two epochs fill it, the timed ones are warm)")
    ap.add_argument("--columns", default=None,
                    help="the columns to load, comma-separated (default: all), e.g. query,hist,id: text_list's "
                         "strings and lists with one fixed column, a window of mostly strings")
    ap.add_argument("--rows", type=int, default=1_000_000,
                    help="the data's rows (another count writes another dataset: give its own --data)")
    a = ap.parse_args(argv)
    base = a.data or str(HERE / "data" / a.shape)
    data = base if a.row_group_rows == 16384 else f"{base}-rg{a.row_group_rows}"
    make = datagen.make_ctr if a.shape == "ctr" else datagen.make_text_list
    path = str(make(data, rows=a.rows, row_group_rows=a.row_group_rows))
    kw: dict[str, Any] = {"shuffle_window": 4} if a.order == "windowed" else {
        k: v for k, v in (("mix_window", a.mix_window), ("block_rows", a.block_rows)) if v}
    proc = psutil.Process()
    peak = 0
    tmp = tempfile.TemporaryDirectory(prefix="mix_ab_cache_") if a.cache else None
    if tmp is not None:
        kw["cache"] = tmp.name
    with Loader(path, batch_size=4096, seed=1234, workers=a.workers, pool=Pool(kind=a.pool, prefetch=a.prefetch, spill=not a.no_spill),
                order=a.order, columns=a.columns.split(",") if a.columns else None, **kw) as ld:
        rows = 0
        t0 = time.perf_counter()
        mark = None
        dt = 0.0
        for e in range(a.epochs + 1):
            if e == 2:
                mark, rows, t0 = ld.stats_mark(), 0, time.perf_counter()
            if e == a.epochs:
                dt = time.perf_counter() - t0
            sampled = e < 2 or e == a.epochs
            ld.set_epoch(e)
            for i, b in enumerate(ld):
                if 2 <= e < a.epochs:
                    rows += len(next(iter(b.values())))
                if sampled and i % 20 == 0:
                    peak = max(peak, pss_mib(proc))
        print(f"{a.shape} {a.pool} W={a.workers} {a.order}"
              f"{''.join(f' {k}={v}' for k, v in kw.items() if k in ('mix_window', 'block_rows'))}"
              f"{' cache' if a.cache else ''}{f' prefetch={a.prefetch}' if a.prefetch != 2 else ''}: "
              f"{rows / dt:,.0f} rows/s over epochs 2..{a.epochs - 1}, peak PSS {peak} MiB")
        if a.table:
            print(ld.stats(since=mark).table())  # the timed epochs and the sampled one after them
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
