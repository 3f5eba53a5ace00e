"""The loaders compared, each as `epochs -> iterator of (epoch, batch)` with batches as dicts of NumPy arrays.

Every loader yields the same columns, in schema order, with the same dtypes, so
`detload.hash_batch` gives comparable hashes whichever loader produced a batch.
- detload: `detload.Loader`, one `set_epoch` per epoch, in the order named (`detload_orders`).
- iid: the yardstick, a NumPy permutation of all rows of the in-memory table per epoch.
- torch_dataloader: the usual hand-rolled loader, a torch `DataLoader` over an
  `IterableDataset` that deals shuffled row groups to workers; the consumer re-batches.
- petastorm: its order is recorded by experiments/bench/petastorm_runner.py in the
  Petastorm venv (row ids per batch); `replay` rebuilds exactly those batches here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent / "bench"
# measure.rebatch is the re-batcher the benchmark baselines (and the Petastorm runner) use.
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
from measure import parquet_files, rebatch  # noqa: E402

Batch = dict[str, np.ndarray]


def detload_orders(options_cls: type | None = None) -> list[str]:
    """detload's orders by name, its default first: "windowed" (plan format 2) always, and "mix"
    (the default) once `detload.OrderOptions` has an ``order`` field."""
    import dataclasses

    if options_cls is None:
        import detload

        options_cls = detload.OrderOptions
    return ["mix", "windowed"] if "order" in {f.name for f in dataclasses.fields(options_cls)} else ["windowed"]


def detload_batches(path: Path, *, batch_size: int, seed: int, workers: int, pool: str,
                    shuffle_window: int, epochs: int, manifest: Path | None = None,
                    order: str = "windowed") -> Iterator[tuple[int, Batch]]:
    """detload's batches in the order named (`detload_orders`); ``shuffle_window`` is the windowed
    order's window."""
    import detload

    opts: dict = {"shuffle_window": shuffle_window} if order == "windowed" else {}
    if len(detload_orders()) > 1:
        opts["order"] = order  # the loader names its orders: say which one
    elif order != "windowed":
        raise ValueError(f"this detload has no order {order!r}: it plans the windowed order only")
    with detload.Loader(str(path), batch_size=batch_size, seed=seed, workers=workers, pool=pool,
                        manifest=manifest, **opts) as loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                yield epoch, batch  # type: ignore[misc]


#: The i.i.d. reference's stream, as experiments/mixing and the mixing report use it:
#: ``[TAG_IID, seed_lo32, seed_hi32, epoch]``.
TAG_IID = 0x4D58_4949  # "MXII"


def iid_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """A uniform permutation of ``n`` rows for (seed, epoch): a stable argsort of PCG64's raw
    output, which NumPy keeps stable (``Generator.permutation``'s algorithm it does not)."""
    entropy = [TAG_IID, seed & 0xFFFF_FFFF, seed >> 32, epoch]
    raw = np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(n)
    return np.argsort(np.asarray(raw, dtype=np.uint64), kind="stable")


def iid_batches(table: Mapping[str, np.ndarray], *, batch_size: int, seed: int,
                epochs: int) -> Iterator[tuple[int, Batch]]:
    """The yardstick: every epoch a fresh uniform permutation of all rows of the in-memory
    training table, cut into consecutive batches (the last one short, as detload's)."""
    n = len(table["id"])
    for epoch in range(epochs):
        perm = iid_permutation(seed, epoch, n)
        for lo in range(0, n, batch_size):
            idx = perm[lo : lo + batch_size]
            yield epoch, {k: v[idx] for k, v in table.items()}


class RowGroupShards:
    """IterableDataset body: every worker computes the same seeded shuffle of all row groups and keeps its share.

    This is what a user writes when they shard Parquet across DataLoader workers. Each worker
    yields one row group at a time, its rows shuffled by a seeded generator; which worker's row
    group the consumer gets next is up to the DataLoader. `shard="contiguous"` gives worker k
    the k-th slice of the shuffled list (the split in the PyTorch IterableDataset docs);
    `shard="strided"` gives it items k, k+W, k+2W, ..., which DataLoader's in-order round robin
    turns back into the single-worker order.
    """

    def __init__(self, path: Path, seed: int, shard: str = "contiguous") -> None:
        self.files = [str(f) for f in parquet_files(path)]
        self.units = [(fi, rg) for fi, f in enumerate(self.files) for rg in range(pq.ParquetFile(f).num_row_groups)]
        self.seed = seed
        self.shard = shard
        self.epoch = 0

    def __iter__(self) -> Iterator[Batch]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.units))
        opened: dict[int, pq.ParquetFile] = {}
        if self.shard == "strided":
            mine = order[wid::nw]
        else:  # the split of the PyTorch IterableDataset docs: one contiguous slice per worker
            per_worker = -(-len(order) // nw)
            mine = order[wid * per_worker : (wid + 1) * per_worker]
        for u in mine:
            fi, rg = self.units[int(u)]
            pf = opened.get(fi) or opened.setdefault(fi, pq.ParquetFile(self.files[fi]))
            table = pf.read_row_group(rg, use_threads=False)
            perm = np.random.default_rng([self.seed, self.epoch, int(u)]).permutation(table.num_rows)
            yield {name: table.column(name).to_numpy()[perm] for name in table.column_names}


def torch_dataloader_batches(path: Path, *, batch_size: int, seed: int, workers: int, in_order: bool,
                             shard: str, epochs: int) -> Iterator[tuple[int, Batch]]:
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class _Shards(RowGroupShards, IterableDataset):  # type: ignore[misc]
        pass

    # Arrow-backed arrays are read-only; torch warns when wrapping them. Nothing writes to them.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    # More workers than cores is the point of the 4-worker configurations on a 2-core machine.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    ds = _Shards(path, seed, shard)
    for epoch in range(epochs):
        ds.epoch = epoch  # workers are started per epoch (persistent_workers=False) and get a copy
        # batch_size=None: one item is one row group; default_convert makes tensors, which the
        # workers hand back through shared memory.
        dl = DataLoader(ds, batch_size=None, num_workers=workers, in_order=in_order,
                        generator=torch.Generator().manual_seed(seed))
        chunks = ({k: v.numpy() for k, v in item.items()} for item in dl)
        for batch in rebatch(chunks, batch_size):
            yield epoch, batch


def petastorm_record(python: str, path: Path, out: Path, *, batch_size: int, seed: int, workers: int,
                     epochs: int, timeout: float = 600) -> dict:
    """Runs petastorm_runner.py `order` in the Petastorm venv; returns its JSON document."""
    cmd = [python, str(BENCH / "petastorm_runner.py"), "order", str(path), "--batch-size", str(batch_size),
           "--workers", str(workers), "--seed", str(seed), "--epochs", str(epochs), "--id-column", "id",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"petastorm_runner failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def replay(doc: Mapping, table: Mapping[str, np.ndarray]) -> Iterator[tuple[int, Batch]]:
    """Yields the batches a recorded run delivered, rebuilt from the in-memory training table.

    `table` holds the training split in id order (ids are 0..rows-1), so a row id is its index.
    """
    ids = table["id"]
    for epoch, ep in enumerate(doc["epochs"]):
        for batch_ids in ep["batches"]:
            idx = np.asarray(batch_ids, dtype=np.int64)
            if not np.array_equal(ids[idx], idx):
                raise RuntimeError("the recorded ids do not index the training table")
            yield epoch, {k: v[idx] for k, v in table.items()}
