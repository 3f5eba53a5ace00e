"""Query-item packing: the same loader read flat and with ``group_by``, side by side in one run.

The table: generated query-item data, one row per (query, item) with the query's columns
repeated as training logs store them: ``qid``, 64 float32 query features, a 128-float query
embedding, 16 float32 item features and a label; 50-2,000 items per query, skewed (most
queries near 50, a long tail). Measured, each form with the same loader settings on a warm
cache (epoch 0 fills it, then warm epochs, the forms taking turns; the median): host bytes per batch, host-to-device bytes per
batch (what `TorchLoader` copies: items, group columns once per group, group index,
offsets), and CPU-side items/s; with a GPU, steps/s and feed efficiency of a two-tower model
fed packed (query tower once per query), unpacked on the device, unpacked on the host, and
from a torch DataLoader over the flat rows. Not a test: a script that prints a table.
``--tiny`` is a quick check of the whole path (tests/test_bench_pack.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # this tree's detload

import detload  # noqa: E402
from detload import Loader, Packed  # noqa: E402
from detload._types import Ragged  # noqa: E402

MARKER = "_done.json"
FORMAT_VERSION = 1
DEFAULT_ROOT = "/tmp/detload-bench-pack"
N_QF = 64
EMB = 128
N_IF = 16
GROUP_COLUMNS = ["qid", *(f"qf{i}" for i in range(N_QF)), "qemb"]


def group_sizes(queries: int, lo: int, hi: int, seed: int) -> np.ndarray:
    """Items per query: lo + a Pareto tail, clipped to [lo, hi] (most near lo, a few at hi)."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(lo * (1 + rng.pareto(1.3, queries))), lo, hi).astype(np.int64)


def make_queries(path: Path, *, queries: int, lo: int, hi: int, files: int, row_group_rows: int,
                 seed: int = 0) -> dict[str, Any]:
    """Write the table (whole queries per file); a finished folder is reused, not rewritten."""
    want = {"format": FORMAT_VERSION, "queries": queries, "lo": lo, "hi": hi, "files": files,
            "row_group_rows": row_group_rows, "seed": seed}
    marker = path / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("spec") == want:
        return json.loads(marker.read_text())
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    sizes = group_sizes(queries, lo, hi, seed)
    rng = np.random.default_rng(seed + 1)
    per_file = np.array_split(np.arange(queries), files)
    items = 0
    for f, qs in enumerate(per_file):
        n = sizes[qs]
        rows = int(n.sum())
        qid = np.repeat(qs.astype(np.int64), n)
        cols: dict[str, Any] = {"qid": qid}
        qf = rng.standard_normal((len(qs), N_QF), dtype=np.float32)
        for i in range(N_QF):
            cols[f"qf{i}"] = np.repeat(qf[:, i], n)
        emb = np.repeat(rng.standard_normal((len(qs), EMB), dtype=np.float32), n, axis=0)
        cols["qemb"] = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), EMB)
        for i in range(N_IF):
            cols[f"if{i}"] = rng.standard_normal(rows, dtype=np.float32)
        cols["label"] = (rng.random(rows) < 0.1).astype(np.float32)
        pq.write_table(pa.table(cols), path / f"part-{f:04d}.parquet", row_group_size=row_group_rows)
        items += rows
    info = {"spec": want, "items": items, "mean_items": items / queries, "max_items": int(sizes.max())}
    marker.write_text(json.dumps(info))
    return info


def _dir_bytes(path: Path) -> int:
    return sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(path) for f in fs)


def _nbytes(col: Any) -> int:
    return int(col.values.nbytes + col.offsets.nbytes) if isinstance(col, Ragged) else int(col.nbytes)


def batch_bytes(b: Any) -> tuple[int, int]:
    """(items, bytes) of a batch: every array it holds, as it reaches the host-to-device copy."""
    if isinstance(b, Packed):
        parts = [*b.items.values(), *b.groups.values(), b.group_index, b.offsets]
        return b.n_items, sum(_nbytes(c) for c in parts)
    return len(b["label"]), sum(_nbytes(c) for c in b.values())


def _loader(root: Path, cache: Path, form: str, *, batch_size: int, workers: int, pool: str) -> Loader:
    kw: dict[str, Any] = dict(batch_size=batch_size, seed=7, workers=workers, pool=pool,
                              cache=detload.Cache(str(cache / form.split("+")[0])))
    if form.startswith("packed"):
        kw.update(group_by="qid", group_columns=GROUP_COLUMNS)
    return Loader(str(root), **kw)


def _epoch(loader: Loader, form: str, epoch: int) -> dict[str, Any]:
    loader.set_epoch(epoch)
    items = nbytes = batches = 0
    t0 = time.perf_counter()
    for b in loader:
        if form == "packed+unpack":
            b = b.unpack()  # what TorchLoader(unpack="host") does before the copy
        n, nb = batch_bytes(b)
        items += n
        nbytes += nb
        batches += 1
    dt = time.perf_counter() - t0
    return dict(items=items, batches=batches, seconds=dt, items_per_s=items / dt,
                bytes_per_batch=nbytes / batches, bytes_per_item=nbytes / items)


def cpu_side(root: Path, cache: Path, forms: list[str], *, batch_size: int, workers: int, pool: str,
             repeats: int) -> list[dict[str, Any]]:
    """Every form through its own loader: epoch 0 fills the cache, then ``repeats`` warm epochs,
    the forms taking turns (so that a noisy neighbour slows all of them alike); the median."""
    loaders = {f: _loader(root, cache, f, batch_size=batch_size, workers=workers, pool=pool) for f in forms}
    try:
        runs: dict[str, list[dict[str, Any]]] = {f: [] for f in forms}
        for e in range(1 + repeats):
            for f in forms:
                r = _epoch(loaders[f], f, e)
                if e:
                    runs[f].append(r)
    finally:
        for loader in loaders.values():
            loader.close()
    out = []
    for f in forms:
        rs = sorted(runs[f], key=lambda r: r["items_per_s"])
        med = dict(rs[len(rs) // 2])
        med.update(form=f, warm_items_per_s=[round(r["items_per_s"]) for r in runs[f]])
        out.append(med)
    return out


def gpu_side(root: Path, cache: Path, *, batch_size: int, workers: int, steps: int, device: str) -> list[dict[str, Any]]:
    """Steps/s and feed efficiency of a two-tower model fed four ways (needs torch)."""
    import torch

    from detload.torch import PackedTensors, TorchLoader

    dev = torch.device(device)
    torch.manual_seed(0)
    qtower = torch.nn.Sequential(torch.nn.Linear(N_QF + EMB, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).to(dev)
    itower = torch.nn.Sequential(torch.nn.Linear(N_IF, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).to(dev)
    opt = torch.optim.SGD([*qtower.parameters(), *itower.parameters()], lr=0.01)
    qnames = [f"qf{i}" for i in range(N_QF)]
    inames = [f"if{i}" for i in range(N_IF)]
    stack = {"q": qnames, "i": inames}

    def step(qx: torch.Tensor, ix: torch.Tensor, label: torch.Tensor, index: torch.Tensor | None) -> None:
        q = qtower(qx)
        if index is not None:
            q = q.index_select(0, index)  # the query tower ran once per query
        logit = (q * itower(ix)).sum(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def feed(batch: Any) -> None:
        if isinstance(batch, PackedTensors):
            qx = torch.cat([batch.groups["q"], batch.groups["qemb"]], 1)
            step(qx, batch.items["i"], batch.items["label"], batch.group_index)
        else:
            step(torch.cat([batch["q"], batch["qemb"]], 1), batch["i"], batch["label"], None)

    def run(name: str, batches: Any) -> dict[str, Any]:
        n = 0
        it = iter(batches)
        first = next(it)
        feed(first)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        kept = first
        for b in it:
            feed(b)
            n += 1
            if n == steps:
                break
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        # The model alone: the same kind of batch fed again and again, nothing loaded.
        t1 = time.perf_counter()
        for _ in range(n):
            feed(kept)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        model = time.perf_counter() - t1
        return {"way": name, "steps": n, "steps_per_s": n / dt, "feed_efficiency": model / dt if dt else 0.0}

    out = []
    common = dict(batch_size=batch_size, seed=7, workers=workers, cache=detload.Cache(str(cache / "packed")),
                  group_by="qid", group_columns=GROUP_COLUMNS)
    for name, unpack in (("packed, query tower per query", None), ("packed, unpacked on the device", "device"),
                         ("packed, unpacked on the host", "host")):
        with TorchLoader(Loader(str(root), **common), device=dev, unpack=unpack, stack=stack) as tl:
            out.append(run(name, tl))
    with TorchLoader(Loader(str(root), batch_size=batch_size, seed=7, workers=workers,
                            cache=detload.Cache(str(cache / "flat"))), device=dev, stack=stack) as tl:
        out.append(run("flat rows (detload)", tl))
    out.append(run("torch DataLoader, flat rows", _torch_dataloader(root, batch_size, workers, dev, qnames, inames)))
    return out


def _torch_dataloader(root: Path, batch_size: int, workers: int, dev: Any, qnames: list[str],
                      inames: list[str]) -> Any:
    """A torch DataLoader over row groups (baselines.RowGroupDataset), re-batched, stacked, copied."""
    import torch
    from baselines import RowGroupDataset, rebatch
    from torch.utils.data import DataLoader

    loader = DataLoader(RowGroupDataset(str(root), None), batch_size=None, shuffle=True,
                        generator=torch.Generator().manual_seed(7), num_workers=workers)
    arrays = ({k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in item.items()} for item in loader)
    for b in rebatch(arrays, batch_size):
        emb = b["qemb"]
        if emb.dtype == object:  # a fixed-size list column arrives as an array of arrays
            emb = np.stack(emb)
        yield {"q": torch.from_numpy(np.stack([b[c] for c in qnames], 1)).to(dev, non_blocking=True),
               "qemb": torch.from_numpy(np.ascontiguousarray(emb)).to(dev, non_blocking=True),
               "i": torch.from_numpy(np.stack([b[c] for c in inames], 1)).to(dev, non_blocking=True),
               "label": torch.from_numpy(np.ascontiguousarray(b["label"])).to(dev, non_blocking=True)}


def table(rows: list[dict[str, Any]]) -> str:
    flat = next(r for r in rows if r["form"] == "flat")
    lines = ["| form | items/s (warm, median) | vs flat | host bytes / batch | H2D bytes / batch | H2D bytes / item | vs flat |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        h2d = r["bytes_per_batch"]
        lines.append(f"| {r['form']} | {r['items_per_s']:,.0f} | {r['items_per_s'] / flat['items_per_s']:.2f}x | "
                     f"{r['bytes_per_batch'] / 2**20:,.2f} MiB | {h2d / 2**20:,.2f} MiB | {r['bytes_per_item']:,.0f} | "
                     f"{r['bytes_per_item'] / flat['bytes_per_item']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="300 queries of 5-200 items: a quick check")
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--files", type=int, default=None, help="default: one per 1,000 queries")
    ap.add_argument("--batch-size", type=int, default=8192, help="items per batch (default 8192)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pool", default="thread", choices=["thread", "process"])
    ap.add_argument("--data", type=Path, default=Path(DEFAULT_ROOT))
    ap.add_argument("--repeats", type=int, default=3, help="warm epochs per form, taking turns (median)")
    ap.add_argument("--gpu-steps", type=int, default=200)
    ap.add_argument("--model-on-cpu", action="store_true", help="run the model comparison on the CPU (a check "
                    "of the code path; its numbers say nothing about a GPU)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    queries = 300 if args.tiny else args.queries
    lo, hi = (5, 200) if args.tiny else (50, 2000)
    files = args.files or max(1, queries // 1000) if not args.tiny else 3
    rg = 4096 if args.tiny else 65_536
    batch = 512 if args.tiny else args.batch_size
    root = args.data / f"q{queries}-{lo}-{hi}-f{files}-g{rg}"
    info = make_queries(root, queries=queries, lo=lo, hi=hi, files=files, row_group_rows=rg)
    print(f"## Query-item packing ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"pyarrow {pa.__version__}; load average {os.getloadavg()[0]:.1f} at the start)\n")
    print(f"table: {queries:,} queries, {info['items']:,} items ({info['mean_items']:.0f} per query on average, "
          f"at most {info['max_items']:,}), {N_QF} float32 query features + a {EMB}-float query embedding, "
          f"{N_IF} float32 item features + a label; {files} files, row groups of {rg:,} rows. "
          f"batch_size={batch} items, workers={args.workers}, pool={args.pool}; the median of {args.repeats} warm "
          "epochs per form (epoch 0 fills the cache), the forms taking turns.\n")
    cache = args.data / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    rows = cpu_side(root, cache, ["flat", "packed", "packed+unpack"], batch_size=batch, workers=args.workers,
                    pool=args.pool, repeats=args.repeats)
    print(table(rows))
    flat, packed = rows[0], rows[1]
    cut = 1 - packed["bytes_per_item"] / flat["bytes_per_item"]
    speed = packed["items_per_s"] / flat["items_per_s"]
    sizes = {f: _dir_bytes(cache / f) for f in ("flat", "packed")}
    print(f"\ncache on disk: flat {sizes['flat'] / 2**20:,.0f} MiB, packed {sizes['packed'] / 2**20:,.0f} MiB "
          f"({sizes['packed'] / max(1, sizes['flat']):.2f}x)")
    print(f"\ntargets: H2D bytes per item fall by {cut:.1%} (target >= 80 %: {'met' if cut >= 0.8 else 'NOT met'}); "
          f"warm items/s {speed:.2f}x flat (target >= 2x: {'met' if speed >= 2 else 'NOT met'})")
    result: dict[str, Any] = {"table": info, "cpu": rows, "cache_bytes": sizes}
    try:
        import torch
    except ModuleNotFoundError:
        torch = None  # type: ignore[assignment]
    device = "cuda" if torch is not None and torch.cuda.is_available() else ("cpu" if args.model_on_cpu else None)
    if device is None:
        print("\nGPU: not measured (no CUDA device here; --model-on-cpu runs the same code on the CPU)")
    else:
        gpu = gpu_side(root, cache, batch_size=batch, workers=args.workers,
                       steps=20 if args.tiny else args.gpu_steps, device=device)
        result["gpu"] = gpu
        print(f"\nmodel on {device}: two-tower (query MLP 192-256-64, item MLP 16-128-64, dot, BCE), "
              f"{gpu[0]['steps']} steps each\n")
        print("| fed | steps/s | feed efficiency |\n| --- | ---: | ---: |")
        for g in gpu:
            print(f"| {g['way']} | {g['steps_per_s']:,.1f} | {g['feed_efficiency']:.0%} |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
