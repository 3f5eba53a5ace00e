"""Storage.memory_map on and off, paired: detload process W=2 on the CTR data, cold, shuffled.

Each run measures both settings back to back in fresh subprocesses (which goes first
alternates), over epochs 2-4 after a first warm-up epoch: rows/s, the summed `read` stage
time from `Loader.stats()`, and the peak PSS of the consumer and its workers (sampled as
bench.py does: in the warm-up epoch and a fifth, untimed one). With `--main-imports both`
(the default) every run measures both settings twice: once in a process that imports
nothing else and once in one that imports torch first, as a training script does (detload's
worker processes import neither the main module nor torch; the PSS counts torch in the
consumer). Prints the medians and the per-run ratios.

    PYTHONPATH=. python experiments/bench/mapped_reads.py --runs 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# As in bench.py: the measured subprocess imports torch first when the driver asks for it.
if os.environ.get("DETLOAD_BENCH_MAIN_TORCH") == "1":
    import torch  # noqa: F401


def one(path: str, mapped: bool, sample_timed: bool = False) -> dict:
    """One loader, 5 epochs: epoch 0 warms up, epochs 1-3 are timed, epoch 4 only samples
    memory. The PSS sampler runs in epochs 0 and 4, and in the timed ones with `sample_timed`
    (its own cost, which sampler_cost.py measures)."""
    import time

    sys.path.insert(0, str(HERE))
    from bench import RssSampler

    from detload import Loader, Pool, Storage

    ld = Loader(path, batch_size=4096, seed=1234, workers=2, pool=Pool(kind="process", prefetch=2), shuffle=True,
                order="windowed", shuffle_window=4, storage=Storage(memory_map="auto" if mapped else False))
    # sample_timed reproduces bench.py's sampling before it left the timed epochs alone: 0.1 s
    # throughout; otherwise the untimed epochs are sampled at the sampler's default period.
    with (RssSampler(period=0.1) if sample_timed else RssSampler()) as sampler:
        ld.set_epoch(0)
        for _ in ld:
            pass
        sampler.sample(sample_timed)
        mark = ld.stats_mark()
        t0 = time.perf_counter()
        rows = 0
        for epoch in range(1, 4):
            ld.set_epoch(epoch)
            for b in ld:
                rows += len(b["id"])
        wall = time.perf_counter() - t0
        st = ld.stats(since=mark)
        sampler.sample(True)
        ld.set_epoch(4)
        for _ in ld:
            pass
    ld.close()
    return {"rows_per_s": rows / wall, "read_s": st.stages["read"].total_s, "peak_pss": sampler.peak}


def paired_runs(runs: int, imports: list[str], one_args: Callable[[bool], list[str]]) -> dict[tuple[str, bool], list[dict]]:
    """`one` in fresh subprocesses: in each run, for each of ``imports`` ("torch" or "nothing"
    imported first), once with the factor on and once off (``one_args(on)``: the arguments
    after "_one"). Which import and which factor value go first alternates between runs."""
    base = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res: dict[tuple[str, bool], list[dict]] = {(i, on): [] for i in imports for on in (True, False)}
    for r in range(runs):
        for imp in (imports if r % 2 == 0 else imports[::-1]):
            env = dict(base, DETLOAD_BENCH_MAIN_TORCH="1" if imp == "torch" else "0")
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                done = subprocess.run([sys.executable, __file__, "_one", *one_args(on)],
                                      capture_output=True, text=True, env=env, check=True)
                res[(imp, on)].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_one":
        print(json.dumps(one(argv[1], argv[2] == "1", len(argv) > 3 and argv[3] == "1")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--data", default=str(HERE / "data" / "ctr"))
    ap.add_argument("--main-imports", choices=["both", "torch", "nothing"], default="both",
                    help="what the measured process imports before detload (default: each run measures both)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import datagen

    datagen.make_ctr(a.data, rows=1_000_000)
    imports = ["nothing", "torch"] if a.main_imports == "both" else [a.main_imports]
    res = paired_runs(a.runs, imports, lambda mapped: [a.data, "1" if mapped else "0"])
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.2f} at the end; {a.runs} paired runs, epochs 2-4 each.\n")
    print("| imports | memory_map | rows/s (median) | read s (median) | peak PSS MiB (median) |")
    print("|---|---|---:|---:|---:|")
    for imp in imports:
        for mapped in (False, True):
            rs = res[(imp, mapped)]
            label = '"auto"' if mapped else "False"
            print(f"| {imp} | {label} | {statistics.median(x['rows_per_s'] for x in rs):,.0f} | "
                  f"{statistics.median(x['read_s'] for x in rs):.3f} | "
                  f"{statistics.median(x['peak_pss'] for x in rs) / 2**20:.0f} |")
    print()
    for imp in imports:
        on, off = res[(imp, True)], res[(imp, False)]
        ratios = sorted(m["rows_per_s"] / p["rows_per_s"] for m, p in zip(on, off))
        reads = sorted(m["read_s"] / p["read_s"] for m, p in zip(on, off))
        print(f"- imports {imp}: mapped / plain rows/s per run: median {statistics.median(ratios):.3f} "
              f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}); read time: median {statistics.median(reads):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
