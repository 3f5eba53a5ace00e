"""Petastorm baseline, run as a subprocess with the interpreter of make_petastorm_env.sh's venv.

`bench` prints one JSON object with start-up time, per-epoch rows/s and consumer CPU per batch;
`order` writes the exact row-id order Petastorm delivered, so another environment can replay it.
Imports only petastorm, pyarrow, numpy and the standard library (plus the sibling measure.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings

import numpy as np
from measure import batch_rows, dataset_rows, measure_epochs, rebatch
from petastorm import make_batch_reader

DEFAULT_SEED = 1234

# Petastorm 0.13.1 behaviour these choices rest on (read in its source, confirmed by runs):
# - seed None or 0 means "shuffle with the global NumPy RNG": not reproducible, hence refused.
# - With a seed, the row-group permutation is default_rng(seed).permutation(...) in the
#   ventilator, and item i goes to worker i % W. Results are collected round-robin per worker,
#   but the collector skips a worker that looks idle, which (e.g. at start-up, nothing ventilated
#   yet) shifts where the round-robin begins. So with workers > 1 the delivered order is a
#   timing-dependent rotation of blocks of W row groups: same seed, different runs, different
#   orders. Only workers=1 reproduces. That is why `order` records what was delivered.
# - num_epochs=N permutes once and repeats that order N times, with no marker between epochs.
# - End of epoch is racy: ThreadPool.get_results() checks "all ventilated items processed"
#   before "ventilator finished", so if the ventilator pushes its last items between the two
#   checks the epoch stops early. With a fresh reader the missing row groups are simply never
#   delivered; after reset() they come out at the start of the next epoch. The `rows` per epoch
#   against `dataset_rows` in the output shows when it happened.
# - Each chunk is one whole row group as a namedtuple of NumPy arrays, converted from Arrow on
#   the consumer thread (convert_early_to_numpy=False, the default); strings become fixed-width
#   numpy unicode arrays and list columns must all have equal length (they are vstacked).


def _make_reader(path: str, workers: int, seed: int, columns: list[str] | None,
                 convert_early: bool = False, cache_dir: str | None = None):
    kwargs: dict = {}
    if convert_early:
        # 0.13.1's make_batch_reader takes it (reader.py): each worker thread turns its row
        # group into a dict of NumPy arrays, instead of the consumer thread doing it.
        kwargs["convert_early_to_numpy"] = True
    if cache_dir:
        # The local-disk cache (diskcache FanoutCache) keyed by file and row group: a first epoch
        # fills it, later readers on the same directory read the cached row groups from it.
        kwargs.update(cache_type="local-disk", cache_location=cache_dir, cache_size_limit=64 << 30,
                      cache_row_size_estimate=512)
    if columns:
        # schema_fields are regular expressions; escape so names are taken literally.
        kwargs["schema_fields"] = [re.escape(c) for c in columns]
    return make_batch_reader(
        dataset_url_or_urls="file://" + os.path.abspath(path),
        reader_pool_type="thread",
        workers_count=workers,
        shuffle_row_groups=True,
        shuffle_rows=False,
        seed=seed,
        num_epochs=1,
        **kwargs,
    )


def _close(reader) -> None:
    # Not reader.__exit__: its cache cleanup prints to stdout, which carries our JSON.
    reader.stop()
    reader.join()


class EpochReaders:
    """Supplies one epoch's row-group chunks at a time in the chosen epoch mode.

    new-reader: a fresh reader per epoch with seed + epoch, which is how a user gets a different
    but reproducible shuffle each epoch (the same seed would repeat the same order).
    reset: one reader whose threads persist; reset() after each epoch re-permutes the previous
    order with the same generator.
    """

    def __init__(self, path, workers, seed, columns, mode, convert_early=False, cache_dir=None):
        if seed == 0:
            raise SystemExit("petastorm treats seed=0 as 'no seed'; pass a non-zero --seed")
        self.path, self.workers, self.seed, self.columns, self.mode = path, workers, seed, columns, mode
        self.extra = {"convert_early": convert_early, "cache_dir": cache_dir}
        self.reader = _make_reader(path, workers, seed, columns, **self.extra)
        self.epoch_seeds = [seed]

    def epoch(self, epoch: int):
        if epoch > 0:
            if self.mode == "reset":
                self.reader.reset()
            else:
                _close(self.reader)
                self.reader = _make_reader(self.path, self.workers, self.seed + epoch, self.columns, **self.extra)
                self.epoch_seeds.append(self.seed + epoch)
        return (chunk if isinstance(chunk, dict) else chunk._asdict() for chunk in self.reader)

    def close(self) -> None:
        _close(self.reader)


def _run(args, on_batch=None, columns=None) -> tuple[dict, EpochReaders]:
    holder: list[EpochReaders] = []

    def open_loader():
        holder.append(EpochReaders(args.path, args.workers, args.seed, columns, args.epoch_mode,
                                   convert_early=args.convert_early, cache_dir=args.cache_dir))
        return holder[0]

    result = measure_epochs(
        loader="petastorm",
        workers=args.workers,
        epochs=args.epochs,
        open_loader=open_loader,
        epoch_batches=lambda r, e: rebatch(r.epoch(e), args.batch_size),
        close_loader=lambda r: r.close(),
        on_batch=on_batch,
        expected_rows=dataset_rows(args.path),
    )
    return result, holder[0]


def run_bench(args) -> dict:
    result, readers = _run(args, columns=args.columns)
    result.update(
        batch_size=args.batch_size,
        seed=args.seed,
        epoch_mode=args.epoch_mode,
        epoch_seeds=readers.epoch_seeds if args.epoch_mode == "new-reader" else [args.seed],
        columns=args.columns,
        convert_early=args.convert_early,
        cache="local-disk" if args.cache_dir else None,
    )
    return result


def run_order(args) -> dict:
    epochs: list[dict] = [{"rows": 0, "batches": []} for _ in range(args.epochs)]

    def record(epoch: int, batch: dict) -> None:
        epochs[epoch]["batches"].append(np.asarray(batch[args.id_column]).tolist())
        epochs[epoch]["rows"] += batch_rows(batch)

    # Row-group order does not depend on which columns are read, so only ids are decoded.
    result, readers = _run(args, on_batch=record, columns=args.columns or [args.id_column])
    doc = {
        "loader": "petastorm",
        "dataset": os.path.abspath(args.path),
        "dataset_rows": result["dataset_rows"],
        "batch_size": args.batch_size,
        "workers": args.workers,
        "seed": args.seed,
        "epoch_mode": args.epoch_mode,
        "epoch_seeds": readers.epoch_seeds if args.epoch_mode == "new-reader" else [args.seed],
        "id_column": args.id_column,
        "epochs": epochs,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, args.out)
    return {
        "out": os.path.abspath(args.out),
        "dataset_rows": result["dataset_rows"],
        "epochs": [{"rows": e["rows"], "batches": len(e["batches"])} for e in epochs],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    for name in ("bench", "order"):
        p = sub.add_parser(name)
        p.add_argument("path", help="dataset folder of *.parquet files")
        p.add_argument("--batch-size", type=int, default=4096)
        p.add_argument("--workers", type=int, default=4 if name == "order" else 2)
        p.add_argument("--epochs", type=int, default=3)
        p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="non-zero")
        p.add_argument("--columns", nargs="+", default=None, help="default: all columns")
        p.add_argument("--epoch-mode", choices=["new-reader", "reset"], default="new-reader")
        p.add_argument("--convert-early", action="store_true", help="convert_early_to_numpy=True")
        p.add_argument("--cache-dir", default=None,
                       help='cache_type="local-disk" in this directory (filled by the first epoch)')
    sub.choices["order"].add_argument("--id-column", default="id")
    sub.choices["order"].add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    if args.mode == "bench" and args.epochs < 3:
        ap.error("bench needs --epochs >= 3 so steady state is visible past the first epoch")
    if args.mode == "order" and args.columns and args.id_column not in args.columns:
        args.columns = [*args.columns, args.id_column]

    # petastorm's deprecation chatter goes to stderr; keep it out of the way of real errors.
    warnings.simplefilter("ignore")
    try:
        out = run_bench(args) if args.mode == "bench" else run_order(args)
    except RuntimeError as exc:
        # e.g. a variable-length list column: petastorm vstacks lists and its message then
        # lists every row's length, megabytes for a real dataset.
        sys.stderr.write(f"petastorm failed: {str(exc)[:500]}\n")
        return 2
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
