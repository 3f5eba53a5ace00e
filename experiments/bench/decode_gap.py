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

Two more columns place the rest of the gap. detload's CPU is split between its worker processes
and the consuming process (merger, hand-off, cutting batches, the loop): on 2 cores with W=2,
every CPU-second of the consumer is one the workers do not get. And "a worker's work alone" runs
a worker's own work without the pool (`work_one`: each block's row groups read through a memory
map given back after each row group, converted to NumPy, the block's permutation computed with
detload's `block_permutation`, every column copied into a scratch and gathered by it), one thread,
and W of them at once in W processes: detload W=2 against W of those at once is what the pool,
the hand-off and the consumer cost beyond the work itself.

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
from typing import Literal

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

    kind: Literal["thread", "process"] = "process" if pool == "process" else "thread"
    ld = Loader(path, batch_size=BATCH, seed=1234, workers=workers, pool=Pool(kind=kind, prefetch=2), shuffle=True,
                order="windowed", shuffle_window=4)
    ld.set_epoch(0)
    for _ in ld:  # the first epoch: start-up, warm page cache and allocators
        pass
    assert ld._pool is not None  # started by the first epoch
    kids = [psutil.Process(p) for p in (ld._pool.pids() if pool == "process" else [])]

    def workers_cpu() -> float:
        total = 0.0
        for k in kids:
            t = k.cpu_times()
            total += t.user + t.system
        return total

    mark = ld.stats_mark()
    out = []
    consumer_s = 0.0  # the consuming process (every thread of it); with threads, the workers too
    for epoch in range(1, epochs):
        ld.set_epoch(epoch)
        rows = 0
        w0, c0, k0 = time.perf_counter(), time.process_time(), workers_cpu()
        for b in ld:
            rows += len(next(iter(b.values())))
        c1, k1 = time.process_time(), workers_cpu()
        consumer_s += c1 - c0
        out.append({"rows": rows, "wall_s": time.perf_counter() - w0, "cpu_s": (c1 - c0) + (k1 - k0)})
    st = ld.stats(since=mark)
    ld.close()
    res = _steady(out, skip_first=False)  # the warm-up epoch is already left out
    if pool == "process":
        res["consumer_cores"] = consumer_s / res["wall_s"]
    worker_wall = st.wall_s * max(st.workers, 1)
    shares = {s: st.stages[s].total_s / worker_wall for s in WORKER_STAGES if s in st.stages and st.stages[s].count}
    shares["untracked (between stages)"] = 1.0 - sum(shares.values())
    res.update(worker_shares=shares, stage_table=st.table())
    return res


def work_one(path: str, epochs: int, window: int = 4, seed: int = 1234) -> dict:
    """A worker's work without the pool, one thread: blocks of ``window`` row groups in the
    plan's unit order, each row group read through a memory map whose pages are given back
    after it (detload's `MappedFile`, as its workers read local files), its columns as NumPy,
    then the block's permutation (detload's own `block_permutation`) and, per column, a copy of
    its units into a scratch and a gather by the permutation into a reused output (detload's
    per-thread `_workspace` arrays). No hand-off, no consumer. Fixed-width columns only (the CTR
    shape this script generates)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from baselines import _arrow_to_numpy
    from measure import parquet_files

    from detload._engine.block import _workspace
    from detload._read.mapping import open_mapped
    from detload._streams import block_permutation, unit_permutation

    pa.set_cpu_count(1)  # as in a worker process
    maps = []  # the worker's own maps
    for f in parquet_files(path):
        m = open_mapped(str(f))
        if m is None:
            raise SystemExit(f"{f} cannot be memory-mapped")
        maps.append(m)
    handles = [pq.ParquetFile(m.source, pre_buffer=False) for m in maps]
    units = [(i, g) for i, pf in enumerate(handles) for g in range(pf.num_row_groups)]
    out = []
    for epoch in range(epochs):
        order = unit_permutation(seed, epoch, len(units))  # the epoch's unit order, as the plan's
        rows = 0
        w0, c0 = time.perf_counter(), time.thread_time()
        for b, first in enumerate(range(0, len(units), window)):
            cols: list[list[np.ndarray]] = []
            for u in order[first : first + window]:
                i, g = units[int(u)]
                t = handles[i].read_row_group(g, use_threads=False)
                maps[i].release()
                cols.append([_arrow_to_numpy(c)[0] for c in t.columns])
                rows += t.num_rows
            n = sum(len(c[0]) for c in cols)
            perm = block_permutation(seed, epoch, 0, b, n)
            output = _workspace("output", n * sum(a.dtype.itemsize for a in cols[0]), np.uint8)
            at = 0
            for j in range(len(cols[0])):
                dt = cols[0][j].dtype
                src = _workspace("scratch", n, dt)
                np.concatenate([c[j] for c in cols], out=src)
                np.take(src, perm, out=output[at : at + n * dt.itemsize].view(dt), mode="wrap")
                at += n * dt.itemsize
        out.append({"rows": rows, "wall_s": time.perf_counter() - w0, "cpu_s": time.thread_time() - c0})
    del handles
    for m in maps:
        m.close()
    return _steady(out)


def spawn(args: list[str], timeout: float = 600) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def decode_at_once(path: str, epochs: int, n: int, what: str = "_decode") -> dict:
    """``n`` one-thread decoders (``what="_work"``: a worker's work, `work_one`) in ``n``
    processes at once, each over every row group: their summed rows/s is what ``n`` cores give
    together (shared caches and memory bandwidth), which ``n`` x one alone may overstate."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, __file__, what, path, str(epochs)], stdout=subprocess.PIPE,
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
    if argv and argv[0] == "_work":
        print(json.dumps(work_one(argv[1], int(argv[2]))))
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
            dec["work"] = spawn(["_work", a.data, str(a.epochs)])["rows_per_s"]
            dec["work_at_once"] = decode_at_once(a.data, a.epochs, a.workers, "_work")["rows_per_s"]
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
          f"| {W} decoders at once rows/s | their / ({W} x one) | detload / {W} at once "
          f"| consumer process cores | a worker's work alone rows/s | {W} of it at once rows/s "
          f"| detload / {W} works at once |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r, pool, dec, det in rows:
        f = factors(det, dec, W)
        assert abs(f["product"] - f["wall_ratio"]) < 1e-9 * max(1.0, f["wall_ratio"])
        consumer = (f"{det['consumer_cores']:.3f}" if "consumer_cores" in det
                    else "(threads: one process)")
        print(f"| {r + 1} | {pool} | {dec['rows_per_s']:,.0f} | {dec['rows_per_cpu_s']:,.0f} | "
              f"{det['rows_per_s']:,.0f} | {det['rows_per_cpu_s']:,.0f} | {f['wall_ratio']:.3f} | "
              f"{f['cpu_efficiency']:.3f} | {f['core_share']:.3f} | {f['decode_core_share']:.3f} | "
              f"{dec['at_once']:,.0f} | {dec['at_once'] / (W * dec['rows_per_s']):.3f} | "
              f"{det['rows_per_s'] / dec['at_once']:.3f} | {consumer} | {dec['work']:,.0f} | "
              f"{dec['work_at_once']:,.0f} | {det['rows_per_s'] / dec['work_at_once']:.3f} |")
    print()
    for pool in a.pools:
        fs = [factors(det, dec, W) for _, p, dec, det in rows if p == pool]
        med = {k: statistics.median(x[k] for x in fs) for k in fs[0]}
        mine = [(dec, det) for _, p, dec, det in rows if p == pool]
        vs_work = statistics.median(det["rows_per_s"] / dec["work_at_once"] for dec, det in mine)
        work_vs_decode = statistics.median(dec["work"] / dec["rows_per_s"] for dec, _ in mine)
        print(f"- {pool}: medians: wall ratio {med['wall_ratio']:.3f}, CPU efficiency {med['cpu_efficiency']:.3f}, "
              f"core share {med['core_share']:.3f}, decode's core share {med['decode_core_share']:.3f}; "
              f"a worker's work alone / one decoder {work_vs_decode:.3f}; detload / {W} works at once {vs_work:.3f}")
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
