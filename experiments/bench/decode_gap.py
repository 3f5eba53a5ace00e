"""What separates detload W=2 from 2 x one-thread decode: a decomposition that adds up.

Each run measures, interleaved, the one-thread decode rate (`read_row_group(use_threads=False)`
+ NumPy, as bench.py's decode limit) and detload W=2 (cold: no cache; shuffle on; no manifest)
in a fresh subprocess, over the epochs after the first. Beside rows/s of wall time it takes CPU
time: of the decode thread, and of detload's whole loader (the consuming process and its worker
processes). The wall-time ratio then splits into three factors whose product it is, exactly:

    detload rows/s / (2 x decode rows/s)
      = (detload rows per CPU-second / decode rows per CPU-second)    CPU efficiency of the path
      x (detload CPU-seconds per second / 2)                          share of the 2 cores it got
      / (decode CPU-seconds per second)                               share of a core decode got

so a gap from CPU work detload does beyond decoding is told apart from one from cores it did not
get (a shared machine), which wall time alone cannot do. It also runs W one-thread decoders at
once (W processes): what W cores decode together, against W x one decoder alone. The stage table of `Loader.stats()`
over the same epochs is given with its worker shares and the rest (untracked) adding up to 100%.

    PYTHONPATH=. python experiments/bench/decode_gap.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

BATCH = 4096
WORKER_STAGES = ("worker_startup", "read", "cache_read", "cache_write", "convert", "permute", "worker_queue_wait")


def decode_one(path: str, epochs: int) -> dict:
    """One thread decoding every row group: rows/s of wall time and of its own CPU time."""
    import pyarrow.parquet as pq
    from baselines import _arrow_to_numpy
    from measure import parquet_files

    handles = [pq.ParquetFile(f) for f in parquet_files(path)]
    out = []
    for _ in range(epochs):
        rows = 0
        w0, c0 = time.perf_counter(), time.thread_time()
        for pf in handles:
            for i in range(pf.num_row_groups):
                t = pf.read_row_group(i, use_threads=False)
                for col in t.columns:
                    _arrow_to_numpy(col)
                rows += t.num_rows
        out.append({"rows": rows, "wall_s": time.perf_counter() - w0, "cpu_s": time.thread_time() - c0})
    return _steady(out)


def _steady(epochs: list[dict], skip_first: bool = True) -> dict:
    later = (epochs[1:] if skip_first else epochs) or epochs
    rows = sum(e["rows"] for e in later)
    wall = sum(e["wall_s"] for e in later)
    cpu = sum(e["cpu_s"] for e in later)
    return {"rows": rows, "wall_s": wall, "cpu_s": cpu, "rows_per_s": rows / wall, "rows_per_cpu_s": rows / cpu,
            "cores": cpu / wall}


def detload_one(path: str, pool: str, workers: int, epochs: int) -> dict:
    """detload as bench.py runs it (shuffle_window=4, shuffle on, no cache, no manifest)."""
    import psutil

    from detload import Loader, Pool

    ld = Loader(path, batch_size=BATCH, seed=1234, workers=workers, pool=Pool(kind=pool, prefetch=2), shuffle=True,
                shuffle_window=4)
    ld.set_epoch(0)
    for _ in ld:  # the first epoch: start-up, warm page cache and allocators
        pass
    kids = [psutil.Process(p) for p in (ld._pool.pids() if pool == "process" else [])]

    def cpu() -> float:
        total = time.process_time()
        for k in kids:
            t = k.cpu_times()
            total += t.user + t.system
        return total

    mark = ld.stats_mark()
    out = []
    for epoch in range(1, epochs):
        ld.set_epoch(epoch)
        rows = 0
        w0, c0 = time.perf_counter(), cpu()
        for b in ld:
            rows += len(next(iter(b.values())))
        out.append({"rows": rows, "wall_s": time.perf_counter() - w0, "cpu_s": cpu() - c0})
    st = ld.stats(since=mark)
    ld.close()
    res = _steady(out, skip_first=False)  # the warm-up epoch is already left out
    worker_wall = st.wall_s * max(st.workers, 1)
    shares = {s: st.stages[s].total_s / worker_wall for s in WORKER_STAGES if s in st.stages and st.stages[s].count}
    shares["untracked (between stages)"] = 1.0 - sum(shares.values())
    res.update(worker_shares=shares, stage_table=st.table())
    return res


def spawn(args: list[str], timeout: float = 600) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def decode_at_once(path: str, epochs: int, n: int) -> dict:
    """``n`` one-thread decoders in ``n`` processes at once, each over every row group: their
    summed rows/s is what ``n`` cores give together (shared caches and memory bandwidth), which
    ``n`` x one decoder alone may overstate."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, __file__, "_decode", path, str(epochs)], stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(n)]
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    return {"rows_per_s": sum(o["rows_per_s"] for o in outs), "each": [o["rows_per_s"] for o in outs]}


def factors(det: dict, dec: dict, workers: int) -> dict:
    """The wall-time ratio and the three factors it is the product of (see the module text)."""
    wall = det["rows_per_s"] / (workers * dec["rows_per_s"])
    eff = det["rows_per_cpu_s"] / dec["rows_per_cpu_s"]
    got = det["cores"] / workers
    return {"wall_ratio": wall, "cpu_efficiency": eff, "core_share": got, "decode_core_share": dec["cores"],
            "product": eff * got / dec["cores"]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_decode":
        print(json.dumps(decode_one(argv[1], int(argv[2]))))
        return 0
    if argv and argv[0] == "_detload":
        print(json.dumps(detload_one(argv[1], argv[2], int(argv[3]), int(argv[4]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE / "data" / "ctr"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4, help="per measurement; the first is left out")
    ap.add_argument("--pools", nargs="+", default=["process", "thread"])
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    import datagen

    datagen.make_ctr(a.data, rows=a.rows)
    load0 = os.getloadavg()
    rows: list[tuple[int, str, dict, dict]] = []
    for r in range(a.runs):
        for pool in a.pools:
            dec = spawn(["_decode", a.data, str(a.epochs)])
            det = spawn(["_detload", a.data, pool, str(a.workers), str(a.epochs)])
            dec["at_once"] = decode_at_once(a.data, a.epochs, a.workers)["rows_per_s"]
            rows.append((r, pool, dec, det))
            f = factors(det, dec, a.workers)
            print(f"[run {r + 1} {pool}] wall ratio {f['wall_ratio']:.3f} = efficiency {f['cpu_efficiency']:.3f} x "
                  f"core share {f['core_share']:.3f} / decode's {f['decode_core_share']:.3f}", file=sys.stderr,
                  flush=True)
    load1 = os.getloadavg()
    W = a.workers
    print(f"{os.cpu_count()} cores, load average {load0[0]:.2f} before / {load1[0]:.2f} after; "
          f"{a.rows:,} rows, batches of {BATCH}, W={W}, epochs 2..{a.epochs} of each measurement.\n")
    print(f"| run | pool | decode rows/s (1 thread) | decode rows/CPU-s | detload W={W} rows/s | detload rows/CPU-s "
          f"| wall ratio vs {W} x decode | = CPU efficiency | x core share got | / decode's core share "
          f"| {W} decoders at once rows/s | their / ({W} x one) | detload / {W} at once |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r, pool, dec, det in rows:
        f = factors(det, dec, W)
        assert abs(f["product"] - f["wall_ratio"]) < 1e-9 * max(1.0, f["wall_ratio"])
        print(f"| {r + 1} | {pool} | {dec['rows_per_s']:,.0f} | {dec['rows_per_cpu_s']:,.0f} | "
              f"{det['rows_per_s']:,.0f} | {det['rows_per_cpu_s']:,.0f} | {f['wall_ratio']:.3f} | "
              f"{f['cpu_efficiency']:.3f} | {f['core_share']:.3f} | {f['decode_core_share']:.3f} | "
              f"{dec['at_once']:,.0f} | {dec['at_once'] / (W * dec['rows_per_s']):.3f} | "
              f"{det['rows_per_s'] / dec['at_once']:.3f} |")
    print()
    for pool in a.pools:
        fs = [factors(det, dec, W) for _, p, dec, det in rows if p == pool]
        med = {k: statistics.median(x[k] for x in fs) for k in fs[0]}
        print(f"- {pool}: medians: wall ratio {med['wall_ratio']:.3f}, CPU efficiency {med['cpu_efficiency']:.3f}, "
              f"core share {med['core_share']:.3f}, decode's core share {med['decode_core_share']:.3f}")
        last = [det for _, p, _, det in rows if p == pool][-1]
        shares = ", ".join(f"{k} {v:.1%}" for k, v in last["worker_shares"].items())
        print(f"  worker time of the last run (wall x W, adds up to 100%): {shares}")
    print()
    for pool in a.pools:
        last = [det for _, p, _, det in rows if p == pool][-1]
        print(f"Stage table, {pool}, last run:\n```\n{last['stage_table']}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
