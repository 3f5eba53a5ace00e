"""Paired before/after CPU time of one detload configuration: what paired.py's wall-time medians
cannot tell on a loaded machine.

Wall time on a shared 2-core machine moves with the other jobs; the CPU a pass costs moves far
less. Each pair runs the two trees seconds apart (order alternating), each in a fresh
subprocess started in its own tree's root, and counts the CPU seconds of the consumer process
and of every worker process (from /proc) over the epochs after the first, with the wall time
beside them. Both trees run the windowed order (window 4), as paired.py does, or with
``--order mix`` the mixed order with its defaults (``--rows 4000000``: several windows a
partition).

    cd <an empty directory>
    python <tree>/experiments/bench/paired_cpu.py --before <before> --after <after> --pool process --workers 2
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _proc_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes, from /proc/PID/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_one(tree: str, path: str, pool: str, workers: int, epochs: int, order: str = "windowed") -> dict:
    """In the subprocess: one loader of ``tree``'s detload, CPU and wall seconds per epoch."""
    import detload
    from detload import Loader, Pool

    if not os.path.realpath(detload.__file__).startswith(os.path.realpath(tree) + os.sep):
        raise SystemExit(f"detload imported from {detload.__file__}, not from {tree}")
    kw: dict = dict(batch_size=4096, seed=1234, workers=workers, pool=Pool(kind=pool, prefetch=2), shuffle=True)
    if order == "mix":
        kw["order"] = "mix"
    else:
        kw["shuffle_window"] = 4
        if "order" in inspect.signature(Loader).parameters:  # a tree from before the mixed order has no keyword
            kw["order"] = "windowed"
    ld = Loader(path, **kw)
    ld._ensure_pool()
    pids = ld._pool.pids() if pool == "process" else []
    out = []
    for e in range(epochs):
        ld.set_epoch(e)
        c0, w0 = time.process_time() + _proc_cpu(pids), time.perf_counter()
        for _ in ld:
            pass
        out.append({"cpu_s": time.process_time() + _proc_cpu(pids) - c0, "wall_s": time.perf_counter() - w0})
    ld.close()
    return {"epochs": out}


def one(tree: Path, path: str, pool: str, workers: int, epochs: int, order: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``tree`` over the epochs after the first."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, __file__, "_one", json.dumps([str(tree), path, pool, workers, epochs, order])],
                          capture_output=True, text=True, env=env, cwd=tree, timeout=900, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    eps = json.loads(done.stdout.strip().splitlines()[-1])["epochs"][1:]
    return sum(e["cpu_s"] for e in eps), sum(e["wall_s"] for e in eps)


def _summary(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_one":
        print(json.dumps(run_one(*json.loads(argv[1]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="source tree of the old code")
    ap.add_argument("--after", required=True, type=Path, help="source tree of the new code")
    ap.add_argument("--pool", choices=["thread", "process"], default="thread")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--epochs", type=int, default=4, help="per run; the first is not counted")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--data", default=str(HERE / "data"), help="the CTR data is made in DATA/ctr (or DATA/ctr-ROWS "
                    "for other than 1M rows)")
    ap.add_argument("--order", choices=["windowed", "mix"], default="windowed")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import datagen

    # A finished data folder is not rewritten: another row count needs a folder of its own.
    path = str(Path(a.data) / ("ctr" if a.rows == 1_000_000 else f"ctr-{a.rows}"))
    datagen.make_ctr(path, rows=a.rows)
    trees = [("before", a.before.resolve()), ("after", a.after.resolve())]
    cpu: list[float] = []
    wall: list[float] = []
    for i in range(a.pairs):
        got = {name: one(tree, path, a.pool, a.workers, a.epochs, a.order)
               for name, tree in (trees[::-1] if i % 2 else trees)}
        cpu.append(got["after"][0] / got["before"][0])
        wall.append(got["after"][1] / got["before"][1])
        print(f"[pair {i + 1}/{a.pairs}] CPU s before {got['before'][0]:.2f} after {got['after'][0]:.2f}; "
              f"wall s before {got['before'][1]:.2f} after {got['after'][1]:.2f}", file=sys.stderr, flush=True)
    print(f"detload {a.pool} W={a.workers}, order {a.order}, {a.rows:,} rows, {a.pairs} pairs: after / before CPU {_summary(cpu)}, "
          f"wall {_summary(wall)} (median of per-pair ratios; above 1 is slower)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
