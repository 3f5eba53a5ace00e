"""Remote and cache benchmark: epoch 1 and epoch 2 rows/s from loopback S3 and local disk, with and without
the row-group cache, beside raw pyarrow on local disk. Prints a table and writes docs/benchmarks-remote.md.

    python experiments/bench/bench_remote.py [--rows 1000000] [--runs 3] [--epochs 6] [--workers 2] [--pool process]

S3 is a moto_server on 127.0.0.1 (started here, stopped at the end). Each run measures every
configuration once, in an interleaved order; ratios are taken within a run, then the median
over runs is reported, with the load average seen during the runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for p in (HERE, REPO, REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import pyarrow as pa  # noqa: E402
from _s3server import MotoServer, s3_env  # noqa: E402
from baselines import raw_pyarrow  # noqa: E402
from datagen import make_ctr, make_text_list  # noqa: E402
from measure import dataset_rows, measure_epochs  # noqa: E402

BATCH = 4096


def detload_epochs(source, *, workers: int, pool: str, cache_dir: str | None, epochs: int) -> dict:
    from detload import Loader

    def open_loader():
        return Loader(source, batch_size=BATCH, seed=1234, workers=workers, pool=pool, cache=cache_dir)

    def epoch_batches(loader, epoch):
        loader.set_epoch(epoch)
        return iter(loader)

    return measure_epochs("detload", workers, epochs, open_loader, epoch_batches,
                          close_loader=lambda loader: loader.close())


def one_run(local: str, uri: str, scratch: str, workers: int, pool: str, epochs: int) -> dict[str, list[float]]:
    """rows/s of every epoch for every configuration."""
    out: dict[str, list[float]] = {}

    def rates(res: dict) -> list[float]:
        return [e["rows_per_s"] for e in res["epochs"]]

    def run(source: str, cache_dir: str | None) -> dict:
        return detload_epochs(source, workers=workers, pool=pool, cache_dir=cache_dir, epochs=epochs)

    out["raw pyarrow, local"] = rates(raw_pyarrow(local, batch_size=BATCH, epochs=epochs))
    cache = os.path.join(scratch, "cache-local")
    shutil.rmtree(cache, ignore_errors=True)
    out["detload local, cache"] = rates(run(local, cache))
    out["detload local, no cache"] = rates(run(local, None))
    cache = os.path.join(scratch, "cache-s3")
    shutil.rmtree(cache, ignore_errors=True)
    out["detload S3, cache"] = rates(run(uri, cache))
    out["detload S3, no cache"] = rates(run(uri, None))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6,
                    help="epochs per loader: epoch 1 is cold, epoch 2 the first warm one, 3.. later warm ones "
                         "(at least 3)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--pool", choices=["thread", "process"], default="process")
    ap.add_argument("--kind", choices=["ctr", "text"], default="ctr",
                    help="ctr: numeric columns; text: a string and a variable-length list column")
    ap.add_argument("--data", default=None, help="dataset folder (default experiments/bench/data/<kind>-remote)")
    ap.add_argument("--out", default=None, help="markdown section to write (default docs/benchmarks-remote.md)")
    ap.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    a = ap.parse_args(argv)
    if a.epochs < 3:
        ap.error("--epochs must be at least 3 (epoch 1 fills the cache, epoch 2 maps its entries)")

    make = make_ctr if a.kind == "ctr" else make_text_list
    data = a.data or str(HERE / "data" / f"{a.kind}-remote")
    local = str(make(data, rows=a.rows, files=8, row_group_rows=16384, seed=0))
    rows = dataset_rows(local)
    size = sum(f.stat().st_size for f in Path(local).glob("*.parquet"))
    runs: list[dict[str, list[float]]] = []
    loads: list[float] = []
    with MotoServer() as moto, tempfile.TemporaryDirectory(prefix="detload-bench-") as scratch:
        os.environ.update(s3_env(moto.endpoint))
        uri = moto.upload_dir(local, "ctr")
        for r in range(a.runs):
            loads.append(os.getloadavg()[0])
            t = time.perf_counter()
            runs.append(one_run(local, uri, scratch, a.workers, a.pool, a.epochs))
            loads.append(os.getloadavg()[0])
            print(f"run {r + 1}/{a.runs}: {time.perf_counter() - t:.0f} s", file=sys.stderr)

    names = list(runs[0])

    def warm(run: dict[str, list[float]], n: str) -> float:
        """Median rows/s over the later warm epochs (3..E) of one run."""
        return statistics.median(run[n][2:])

    def ratio(a_name: str, b_name: str, of) -> float:  # noqa: ANN001 - of: (run, name) -> rows/s
        return statistics.median(of(run, a_name) / of(run, b_name) for run in runs)

    def epoch2(run: dict[str, list[float]], n: str) -> float:
        return run[n][1]

    med = {n: [statistics.median(run[n][0] for run in runs), statistics.median(epoch2(run, n) for run in runs),
               statistics.median(warm(run, n) for run in runs)] for n in names}
    raw = [warm(run, "raw pyarrow, local") for run in runs]
    cache, raw_n = "detload local, cache", "raw pyarrow, local"
    s3, local_nc = "detload S3, cache", "detload local, no cache"
    warm_cols = f"epochs 3-{a.epochs}" if a.epochs > 3 else "epoch 3"
    lines = [
        f"| configuration | epoch 1 rows/s | epoch 2 rows/s | {warm_cols} rows/s (median) |",
        "| --- | ---: | ---: | ---: |",
        *[f"| {n} | {med[n][0]:,.0f} | {med[n][1]:,.0f} | {med[n][2]:,.0f} |" for n in names],
    ]
    cmd = (f"python experiments/bench/bench_remote.py --kind {a.kind} --rows {a.rows} --runs {a.runs} "
           f"--epochs {a.epochs} --workers {a.workers} --pool {a.pool}")
    what = ("CTR: id, label, 32 float32, 8 int64" if a.kind == "ctr"
            else "text: id, label, 8 float32, a string `query`, a list<float32> `hist`")
    summary = [
        f"- warm converted cache (local) / raw pyarrow sequential, same epochs (target >= 4x): "
        f"{warm_cols} **{ratio(cache, raw_n, warm):.1f}x**; epoch 2, the first warm one (it maps "
        f"every entry): **{ratio(cache, raw_n, epoch2):.1f}x**",
        f"- S3 with cache / local without cache (target >= 1x): epoch 2 **{ratio(s3, local_nc, epoch2):.1f}x**; "
        f"{warm_cols} {ratio(s3, local_nc, warm):.1f}x",
        f"- S3 with cache / raw pyarrow, {warm_cols}: {ratio(s3, raw_n, warm):.1f}x",
        f"- raw pyarrow rows/s ({warm_cols} median) over the runs: {', '.join(f'{x:,.0f}' for x in raw)}",
    ]
    env = (f"Measured {time.strftime('%Y-%m-%d %H:%M')}. "
           f"{rows:,} rows ({what}; {size / 2**20:.0f} MiB Parquet, 8 files, "
           f"16,384-row row groups), batch {BATCH}, detload workers={a.workers} pool={a.pool}, shuffle on; "
           f"{a.runs} runs, medians; ratios taken within each run, median over runs. Machine: {os.cpu_count()} cores, "
           f"{platform.python_version()}, pyarrow {pa.__version__}; 1-min load average during the runs "
           f"{min(loads):.1f}-{max(loads):.1f} (a machine shared with other jobs).")
    print("\n".join(lines))
    print("\n".join(summary))
    print(env)
    intro = [
        "# Benchmark: remote sources and the row-group cache",
        "",
        "Per-epoch throughput from a loopback S3 server (moto_server on 127.0.0.1) and from local",
        "disk, with and without `cache_dir=`, beside raw pyarrow (one sequential `iter_batches` reader,",
        "unshuffled, Arrow's threads on, `to_numpy` per column) on local disk. With the cache, epoch 1 is cold",
        "(reads, converts and writes entries) and later epochs are warm (memory-map the converted arrays;",
        "nothing is fetched or decoded). Epoch 2, the first warm epoch, maps every entry (open, map,",
        "header); workers keep the mappings (`cache_map_limit`), so later epochs do not, except that",
        "each process worker maps an entry the first time it reads it, which with W process workers spreads",
        "over a few epochs. Each is reported: epoch 2 alone, and the median of epochs 3 on. An epoch here",
        "lasts well under a second, so a single epoch's rate moves with the machine's other load: compare",
        "the ratios, taken within each run. The cache lives on the local disk, and right after epoch 1",
        "its entries are also in the page cache.",
        "",
        "Loopback S3 is an in-memory Python server: it is slower than real S3 per request but has no",
        "network latency, so the uncached S3 rows say little about a real bucket; the cached epoch 2 does",
        "not touch the server at all.",
        "",
    ]
    doc = [
        f"## {a.kind} dataset",
        "",
        f"Command: `{cmd}`",
        "",
        env,
        "",
        *lines,
        "",
        *summary,
        "",
    ]
    out = Path(a.out or REPO / "docs" / "benchmarks-remote.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.append and out.exists():
        out.write_text(out.read_text() + "\n".join(doc))
    else:
        out.write_text("\n".join(intro + doc))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
