"""Shared re-batching, timing and dataset listing for every baseline, so all are measured alike.

Imports only numpy, pyarrow and the standard library, which both environments have:
petastorm_runner.py loads it inside the separate Petastorm venv, baselines.py in the main one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def parquet_files(path) -> list[Path]:
    """Data files of a dataset folder in sorted order; `_`/`.` names (markers, temp files) are not data."""
    files = sorted(p for p in Path(path).glob("*.parquet") if not p.name.startswith(("_", ".")))
    if not files:
        raise FileNotFoundError(f"no *.parquet files in {path}")
    return files


def dataset_rows(path) -> int:
    return sum(pq.read_metadata(f).num_rows for f in parquet_files(path))


def rebatch(chunks: Iterable[dict], batch_size: int) -> Iterator[dict]:
    """Turns variable-size column chunks into exactly `batch_size`-row batches (last one may be short).

    This is the straightforward approach a user writes: keep pending chunks, concatenate them
    once enough rows are pending, slice full batches off the front, and carry the remainder.
    Yielded arrays are slices (views) of the concatenated buffer.
    """
    pending: list[dict] = []
    n_pending = 0
    for chunk in chunks:
        n = len(next(iter(chunk.values())))
        if n == 0:
            continue
        pending.append(chunk)
        n_pending += n
        if n_pending < batch_size:
            continue
        merged = _concat(pending)
        start = 0
        while n_pending - start >= batch_size:
            yield {k: v[start : start + batch_size] for k, v in merged.items()}
            start += batch_size
        pending = [{k: v[start:] for k, v in merged.items()}] if start < n_pending else []
        n_pending -= start
    if n_pending:
        yield _concat(pending)


def _concat(pieces: list[dict]) -> dict:
    if len(pieces) == 1:
        return pieces[0]
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}


def batch_rows(batch: dict) -> int:
    return len(next(iter(batch.values())))


def measure_epochs(
    loader: str,
    workers: int,
    epochs: int,
    open_loader: Callable[[], object],
    epoch_batches: Callable[[object, int], Iterator[dict]],
    close_loader: Callable[[object], None] = lambda state: None,
    on_batch: Callable[[int, dict], None] | None = None,
    expected_rows: int | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> dict:
    """Runs `epochs` epochs and returns the result dict every baseline reports.

    Timing conventions (identical for all loaders):
    - startup_s: wall time from just before `open_loader()` (reader/worker construction) until the
      first full batch is in the consumer's hands.
    - per epoch, `seconds` runs from the first batch's arrival (epoch 0) or from the start of the
      epoch (later epochs, including any per-epoch setup `epoch_batches` does) to the end of the
      epoch; `timed_rows` are the rows delivered inside that window (epoch 0 therefore excludes
      its first batch) and rows_per_s = timed_rows/seconds. `rows` is every row the epoch
      delivered; compare it with `dataset_rows` (= expected_rows) to spot loaders that drop or duplicate rows.
      `first_batch_s` is the wait for each epoch's first batch (epoch 0: after `open_loader()`).
    - `on_epoch(epoch)`, if given, runs before each epoch, outside its timed window (bench.py
      turns its memory sampler on and off there).
    - consumer CPU per batch: `time.thread_time()` difference across each `next()` on the batch
      iterator. thread_time counts only CPU burnt by the consumer thread, so time spent blocked
      in a queue/lock wait for a worker (which sleeps in the kernel) is excluded by construction,
      while everything the loader does on the consumer thread (polling, Arrow->NumPy conversion,
      collation, unpickling worker results) plus our re-batching is included. Busy-wait loops,
      if a loader has them, would count. The training step itself is not in the window.
    """
    cpu_s: list[float] = []
    epoch_stats = []
    startup_s = None
    t_open = time.perf_counter()
    state = open_loader()
    try:
        for epoch in range(epochs):
            if on_epoch is not None:
                on_epoch(epoch)
            t_start = time.perf_counter()
            first_batch_s = None
            it = epoch_batches(state, epoch)
            rows = timed_rows = n_batches = 0
            while True:
                c0 = time.thread_time()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                cpu_s.append(time.thread_time() - c0)
                n = batch_rows(batch)
                rows += n
                n_batches += 1
                if on_batch is not None:
                    on_batch(epoch, batch)
                if first_batch_s is None:
                    first_batch_s = time.perf_counter() - t_start
                if startup_s is None:
                    startup_s = time.perf_counter() - t_open
                    t_start = time.perf_counter()
                    continue
                timed_rows += n
            seconds = time.perf_counter() - t_start
            epoch_stats.append(
                {
                    "rows": rows,
                    "batches": n_batches,
                    "timed_rows": timed_rows,
                    "seconds": seconds,
                    "rows_per_s": timed_rows / seconds if seconds > 0 else None,
                    "first_batch_s": first_batch_s,
                }
            )
    finally:
        close_loader(state)
    return {
        "loader": loader,
        "workers": workers,
        "dataset_rows": expected_rows,
        "startup_s": startup_s,
        "epochs": epoch_stats,
        "consumer_cpu_us_per_batch_median": statistics.median(cpu_s) * 1e6 if cpu_s else None,
        # Loaders that hand over big chunks do their conversion on one next() in several and
        # near nothing on the rest; the median then hides that cost, the mean does not.
        "consumer_cpu_us_per_batch_mean": statistics.fmean(cpu_s) * 1e6 if cpu_s else None,
    }
