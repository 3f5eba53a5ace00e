"""Storage.memory_map on and off, paired: detload process W=2 on the CTR data, cold, shuffled.

Each run measures both settings back to back in fresh subprocesses (which goes first
alternates), over epochs 2-4 after a first warm-up epoch: rows/s, the summed `read` stage
time from `Loader.stats()`, and the peak PSS of the consumer and its workers (sampled as
bench.py does). Prints the medians and the per-run ratios.

    PYTHONPATH=. python experiments/bench/mapped_reads.py --runs 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def one(path: str, mapped: bool) -> dict:
    import time

    sys.path.insert(0, str(HERE))
    from bench import RssSampler

    from detload import Loader, Pool, Storage

    ld = Loader(path, batch_size=4096, seed=1234, workers=2, pool=Pool(kind="process", prefetch=2), shuffle=True,
                shuffle_window=4, storage=Storage(memory_map="auto" if mapped else False))
    with RssSampler() as sampler:
        ld.set_epoch(0)
        for _ in ld:
            pass
        mark = ld.stats_mark()
        t0 = time.perf_counter()
        rows = 0
        for epoch in range(1, 4):
            ld.set_epoch(epoch)
            for b in ld:
                rows += len(b["id"])
        wall = time.perf_counter() - t0
    st = ld.stats(since=mark)
    ld.close()
    return {"rows_per_s": rows / wall, "read_s": st.stages["read"].total_s, "peak_pss": sampler.peak}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_one":
        print(json.dumps(one(argv[1], argv[2] == "1")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--data", default=str(HERE / "data" / "ctr"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import datagen

    datagen.make_ctr(a.data, rows=1_000_000)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res: dict[bool, list[dict]] = {True: [], False: []}
    for r in range(a.runs):
        for mapped in ((True, False) if r % 2 == 0 else (False, True)):
            done = subprocess.run([sys.executable, __file__, "_one", a.data, "1" if mapped else "0"],
                                  capture_output=True, text=True, env=env, check=True)
            res[mapped].append(json.loads(done.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.2f} at the end; {a.runs} paired runs, epochs 2-4 each.\n")
    print("| memory_map | rows/s (median) | read s (median) | peak PSS MiB (median) |")
    print("|---|---:|---:|---:|")
    for mapped in (False, True):
        rs = res[mapped]
        label = '"auto"' if mapped else "False"
        print(f"| {label} | {statistics.median(x['rows_per_s'] for x in rs):,.0f} | "
              f"{statistics.median(x['read_s'] for x in rs):.3f} | "
              f"{statistics.median(x['peak_pss'] for x in rs) / 2**20:.0f} |")
    ratios = sorted(m["rows_per_s"] / p["rows_per_s"] for m, p in zip(res[True], res[False]))
    reads = sorted(m["read_s"] / p["read_s"] for m, p in zip(res[True], res[False]))
    print(f"\nmapped / plain rows/s per run: median {statistics.median(ratios):.3f} "
          f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}); read time: median {statistics.median(reads):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
