"""Soak test (not in CI): many epochs with the process pool, recording resources per epoch.

Per epoch it records the consumer's USS (the memory only it holds, what a leak in
the consumer grows) and RSS, the workers' RSS, open file descriptors, threads,
and /dev/shm usage (detload segments and the file system's used bytes), then
prints a table and, with --json, the raw numbers. A leak shows as a column that
grows with the epoch; the end says whether the consumer's USS stayed within
--flat-mib of its value at epoch --flat-from (exit 1 if not).
docs/benchmarks.md keeps the numbers of the last long run.

    python experiments/bench/soak.py --epochs 200 --workers 2 --rows 200000
    python experiments/bench/soak.py --epochs 200 --workers 2 --rows 200000 --no-trace
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from datagen import make_text_list  # noqa: E402

import detload
from detload import Loader  # noqa: E402

SHM = "/dev/shm"


def _shm() -> tuple[int, int, int]:
    """(this process's detload segments present, their bytes, bytes used in /dev/shm by anyone)."""
    n = size = 0
    prefix = f"detload-{os.getpid()}-"
    for name in os.listdir(SHM):
        if name.startswith(prefix):
            n += 1
            try:
                size += os.stat(os.path.join(SHM, name)).st_size
            except FileNotFoundError:
                pass
    st = os.statvfs(SHM)
    return n, size, (st.f_blocks - st.f_bfree) * st.f_frsize


def _procs(loader: Loader) -> list[psutil.Process]:
    out = []
    for pid in loader._pool.pids():
        try:
            out.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return out


def sample(loader: Loader) -> dict[str, float]:
    me = psutil.Process()
    workers = _procs(loader)
    segs, seg_bytes, shm_used = _shm()
    mapped = 0
    with open("/proc/self/maps") as f:
        mapped = sum(1 for line in f if f"/dev/shm/detload-{os.getpid()}-" in line)
    return {
        "consumer_uss_mib": me.memory_full_info().uss / 2**20,
        "consumer_rss_mib": me.memory_info().rss / 2**20,
        "workers_rss_mib": sum(p.memory_info().rss for p in workers) / 2**20,
        "consumer_fds": me.num_fds(),
        "workers_fds": sum(p.num_fds() for p in workers),
        "threads": threading.active_count(),
        "worker_procs": len(workers),
        "shm_segments": segs,
        "shm_segment_mib": seg_bytes / 2**20,
        "shm_used_mib": shm_used / 2**20,
        "mapped_segments": mapped,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="experiments/bench/data/soak_text_list")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--no-trace", action="store_true", help="Loader(trace=False): no trace buffers at all")
    ap.add_argument("--flat-from", type=int, default=10, help="the epoch whose consumer USS is the reference")
    ap.add_argument("--flat-mib", type=float, default=5.0, help="the growth of consumer USS allowed after it")
    ap.add_argument("--json", help="write the per-epoch samples to this file")
    a = ap.parse_args(argv)

    make_text_list(a.data, rows=a.rows, files=8, row_group_rows=8192, seed=0)
    rows_seen = []
    samples = []
    t_start = time.perf_counter()
    with Loader(a.data, batch_size=a.batch_size, seed=1, workers=a.workers, pool=detload.Pool(kind="process", trace=not a.no_trace)) as loader:
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            t = time.perf_counter()
            rows = 0
            for batch in loader:
                rows += len(batch["id"])
            dt = time.perf_counter() - t
            del batch
            s = {"epoch": epoch, "seconds": dt, "rows": rows, **sample(loader)}
            samples.append(s)
            rows_seen.append(rows)
            if epoch == 0:
                print(f"{'epoch':>5} {'s':>6} {'rows':>8} {'cons USS':>9} {'cons RSS':>9} {'wrk RSS':>8} {'cons fd':>7} "
                      f"{'wrk fd':>6} {'thr':>4} {'procs':>5} {'shm seg':>7} {'shm MiB':>7} {'shm used':>8} {'mapped':>6}")
            print(f"{epoch:>5} {dt:6.2f} {rows:>8} {s['consumer_uss_mib']:9.1f} {s['consumer_rss_mib']:9.1f} "
                  f"{s['workers_rss_mib']:8.1f} "
                  f"{s['consumer_fds']:>7} {s['workers_fds']:>6} {s['threads']:>4} {s['worker_procs']:>5} "
                  f"{s['shm_segments']:>7} {s['shm_segment_mib']:7.1f} {s['shm_used_mib']:8.1f} {s['mapped_segments']:>6}",
                  flush=True)
    # children: multiprocessing's forkserver and resource tracker live until interpreter exit.
    after = {"consumer_fds": psutil.Process().num_fds(), "threads": threading.active_count(),
             "shm_segments": _shm()[0], "children": len(psutil.Process().children(recursive=True))}
    total = time.perf_counter() - t_start
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    print(f"\n{a.epochs} epochs, {a.workers} process workers, {sum(rows_seen):,} rows in {total:.1f} s"
          f"{' (trace=False)' if a.no_trace else ''}")
    for k in ("consumer_uss_mib", "consumer_rss_mib", "workers_rss_mib", "consumer_fds", "workers_fds",
              "shm_used_mib"):
        print(f"  {k}: epoch 1 {first[k]:.1f} -> epoch {last['epoch']} {last[k]:.1f}")
    flat = True
    if len(samples) > a.flat_from:
        ref = samples[a.flat_from]["consumer_uss_mib"]
        top = max(s["consumer_uss_mib"] for s in samples[a.flat_from:])
        flat = top - ref <= a.flat_mib
        print(f"  consumer USS after epoch {a.flat_from}: {ref:.1f} MiB, at most {top:.1f} MiB later "
              f"(+{top - ref:.2f} MiB): {'flat' if flat else 'GROWS'} (allowed +{a.flat_mib:g} MiB)")
    print(f"  after close: {after}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "epochs": samples, "after_close": after}, f, indent=1)
    ok = len(set(rows_seen)) == 1 and after["shm_segments"] == 0 and flat
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
