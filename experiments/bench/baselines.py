"""Baseline loaders for the throughput benchmark, each returning the same result dict as petastorm_runner.py.

raw_pyarrow: one sequential reader, the decode ceiling of a single consumer. torch_dataloader:
a torch DataLoader over row groups. petastorm: runs petastorm_runner.py in its own venv.
Run as a script for a quick check: python baselines.py DATASET_DIR [--epochs N] [--workers W].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# measure.py is a sibling shared with petastorm_runner.py, not an installed package.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure import dataset_rows, measure_epochs, parquet_files, rebatch  # noqa: E402

HERE = Path(__file__).resolve().parent
PETASTORM_PYTHON = HERE / ".venv-petastorm" / "bin" / "python"

# How consumer CPU per batch is measured (shared by every baseline, see measure.measure_epochs):
# time.thread_time() is read just before and just after each next() on the 4096-row batch
# iterator. thread_time is CPU time of the calling thread only, so while the consumer sleeps
# waiting on a queue, pipe or lock for a worker it accrues nothing: blocked time is excluded by
# construction, not by subtracting estimates. Included is everything the consumer thread itself
# does to produce the batch: decoding (raw_pyarrow decodes on this thread; Arrow's own helper
# threads are not counted), unpickling/mapping worker results, Arrow->NumPy conversion, and
# re-batching. Both median and mean are reported because chunked loaders are bimodal.


def _columns_to_numpy(table_or_batch, columns=None) -> dict:
    names = columns or table_or_batch.schema.names
    return {name: table_or_batch.column(name).to_numpy(zero_copy_only=False) for name in names}


def raw_pyarrow(path, batch_size: int = 4096, epochs: int = 3, columns: list[str] | None = None,
                on_epoch: Callable[[int], None] | None = None) -> dict:
    """Sequential ParquetFile.iter_batches over the files in sorted order, unshuffled.

    Arrow's default intra-read threading stays on. iter_batches restarts at each file, so the
    short tail batch of a file is joined with the next file's rows by the shared re-batcher,
    keeping every batch at exactly batch_size rows like the other loaders.
    """
    files = parquet_files(path)

    def epoch_batches(_state, _epoch):
        def chunks():
            for f in files:
                pf = pq.ParquetFile(f)
                for rb in pf.iter_batches(batch_size=batch_size, columns=columns):
                    yield _columns_to_numpy(rb, columns)

        return rebatch(chunks(), batch_size)

    result = measure_epochs(
        loader="raw_pyarrow",
        workers=0,
        epochs=epochs,
        open_loader=lambda: None,
        epoch_batches=epoch_batches,
        expected_rows=dataset_rows(path),
        on_epoch=on_epoch,
    )
    result.update(batch_size=batch_size, columns=columns, arrow_cpu_count=pa.cpu_count())
    return result


def _arrow_to_numpy(col: pa.ChunkedArray) -> list[np.ndarray]:
    """One column as NumPy, the way a loader must hand it over: fixed-width values as one
    array; strings, binary and lists as their values and offsets (no Python objects)."""
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        bufs = arr.buffers()
        width = np.int64 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else np.int32
        offsets = np.frombuffer(bufs[1], dtype=width, count=len(arr) + 1, offset=arr.offset * np.dtype(width).itemsize)
        return [offsets, np.frombuffer(bufs[2], dtype=np.uint8)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [arr.offsets.to_numpy(), *_arrow_to_numpy(pa.chunked_array([arr.flatten()]))]
    return [arr.to_numpy(zero_copy_only=False)]


def decode_limit(path, epochs: int = 2, mapped: bool = False) -> dict:
    """The machine's decode rate for one thread: every row group read with
    ``ParquetFile.read_row_group(i, use_threads=False)`` and converted to NumPy, in file order,
    on this thread. W x this rate is the decode limit of W workers (the row groups are
    independent, so W cores could at best do W times as many). The same result dict as the
    loaders (epochs of rows and seconds), so steady state is the epochs after the first.

    ``mapped``: each file read through one memory map, kept for every epoch, without
    pre-buffering: no page is copied out of the page cache and, after the first epoch, none is
    faulted in. detload's workers under Storage.memory_map="auto" or True map files too but give
    the pages back after each row group (to bound their memory), so this is a stricter limit
    than what they can reach."""
    import pyarrow as pa

    files = parquet_files(path)
    handles = ([pq.ParquetFile(pa.memory_map(str(f), "r"), pre_buffer=False) for f in files] if mapped
               else [pq.ParquetFile(f) for f in files])
    out = []
    for _ in range(epochs):
        rows = 0
        t0 = time.perf_counter()
        for pf in handles:
            for i in range(pf.num_row_groups):
                table = pf.read_row_group(i, use_threads=False)
                for col in table.columns:
                    _arrow_to_numpy(col)
                rows += table.num_rows
        seconds = time.perf_counter() - t0
        out.append({"rows": rows, "batches": 0, "timed_rows": rows, "seconds": seconds,
                    "rows_per_s": rows / seconds, "first_batch_s": None})
    return {"loader": "decode_limit", "workers": 1, "dataset_rows": dataset_rows(path), "startup_s": 0.0,
            "epochs": out, "consumer_cpu_us_per_batch_median": None, "consumer_cpu_us_per_batch_mean": None}


def torch_unavailable_reason() -> str | None:
    try:
        import torch  # noqa: F401
    except Exception as exc:  # a broken install can raise more than ImportError
        return f"import torch failed: {type(exc).__name__}: {exc}"
    return None


class RowGroupDataset:
    """Map-style dataset: item i is one (file, row group), returned as a dict of NumPy arrays.

    Plain __len__/__getitem__ is all DataLoader needs from a map-style dataset; not subclassing
    torch's Dataset keeps this module importable without torch and picklable for spawn.

    ParquetFile handles are opened lazily and cached per process, so each DataLoader worker
    opens its own after fork instead of sharing file positions with the parent.
    """

    def __init__(self, path, columns: list[str] | None = None):
        self.columns = columns
        self.items = [(str(f), rg) for f in parquet_files(path) for rg in range(pq.read_metadata(f).num_row_groups)]
        self._files: dict[str, pq.ParquetFile] = {}
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        if self._pid != os.getpid():
            self._files, self._pid = {}, os.getpid()
        path, rg = self.items[i]
        pf = self._files.get(path)
        if pf is None:
            pf = self._files[path] = pq.ParquetFile(path)
        return _columns_to_numpy(pf.read_row_group(rg, columns=self.columns), self.columns)


def torch_dataloader(
    path,
    batch_size: int = 4096,
    workers: int = 2,
    epochs: int = 3,
    seed: int = 0,
    columns: list[str] | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> dict | None:
    """torch DataLoader over row groups, shuffled with a seeded generator, re-batched to batch_size.

    batch_size=None turns off auto-collation, so each item is one row group; the default convert
    step turns its NumPy arrays into tensors inside the workers, which is what sends them back
    through shared memory instead of pickling the bytes through a pipe. The consumer views them
    as NumPy again (zero-copy) and re-batches. Returns None (with a warning giving the reason)
    when torch cannot be imported.
    """
    reason = torch_unavailable_reason()
    if reason is not None:
        warnings.warn(f"torch_dataloader skipped: {reason}", stacklevel=2)
        return None
    import torch
    from torch.utils.data import DataLoader

    # Arrow hands out read-only zero-copy arrays; torch warns once per process that the tensor
    # it wraps them in is not writable. Nothing writes to them here, so the warning is noise.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

    def open_loader():
        return DataLoader(
            RowGroupDataset(path, columns),
            batch_size=None,
            shuffle=True,
            generator=torch.Generator().manual_seed(seed),
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    def epoch_batches(loader, _epoch):
        as_numpy = ({k: _to_numpy(v) for k, v in item.items()} for item in loader)
        return rebatch(as_numpy, batch_size)

    def close_loader(loader):
        # A persistent-workers loader keeps its worker processes until the iterator is shut
        # down; do it now so the next baseline does not share the two cores with idle workers.
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()

    result = measure_epochs(
        loader="torch_dataloader",
        workers=workers,
        epochs=epochs,
        open_loader=open_loader,
        epoch_batches=epoch_batches,
        close_loader=close_loader,
        expected_rows=dataset_rows(path),
        on_epoch=on_epoch,
    )
    result.update(batch_size=batch_size, seed=seed, columns=columns, torch_version=torch.__version__)
    return result


def _to_numpy(v):
    return v.numpy() if hasattr(v, "numpy") else v


def petastorm_subprocess(
    path,
    batch_size: int = 4096,
    workers: int = 2,
    epochs: int = 3,
    seed: int = 1234,
    columns: list[str] | None = None,
    python: str | os.PathLike | None = None,
    timeout: float | None = None,
    convert_early: bool = False,
    cache_dir: str | None = None,
) -> dict | None:
    """Runs `petastorm_runner.py bench` with the Petastorm venv's interpreter and returns its JSON.

    Returns None (with a warning) when that venv does not exist; make_petastorm_env.sh creates it.
    """
    python = Path(python) if python else PETASTORM_PYTHON
    if not python.exists():
        warnings.warn(f"petastorm skipped: {python} missing; run make_petastorm_env.sh", stacklevel=2)
        return None
    cmd = [
        str(python), str(HERE / "petastorm_runner.py"), "bench", str(path),
        "--batch-size", str(batch_size), "--workers", str(workers),
        "--epochs", str(epochs), "--seed", str(seed),
    ]  # fmt: skip
    if columns:
        cmd += ["--columns", *columns]
    if convert_early:
        cmd.append("--convert-early")
    if cache_dir:
        cmd += ["--cache-dir", str(cache_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"petastorm_runner failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="dataset folder of *.parquet files (see datagen.py)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--columns", nargs="+", default=None)
    ap.add_argument("--only", nargs="+", choices=["raw_pyarrow", "torch", "petastorm"])
    args = ap.parse_args(argv)
    only = set(args.only or ["raw_pyarrow", "torch", "petastorm"])
    common = {"batch_size": args.batch_size, "epochs": args.epochs, "columns": args.columns}

    if "raw_pyarrow" in only:
        print(json.dumps(raw_pyarrow(args.path, **common)), flush=True)
    if "torch" in only:
        res = torch_dataloader(args.path, workers=args.workers, **common)
        print(json.dumps(res or {"loader": "torch_dataloader", "skipped": torch_unavailable_reason()}), flush=True)
    if "petastorm" in only:
        res = petastorm_subprocess(args.path, workers=args.workers, **common)
        print(json.dumps(res or {"loader": "petastorm", "skipped": f"{PETASTORM_PYTHON} missing"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
