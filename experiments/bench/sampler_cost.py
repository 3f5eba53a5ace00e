"""What bench.py's PSS sampler costs the loader it watches, paired in one run.

detload process W=2 on the CTR data (memory maps as by default), in fresh subprocesses that
import torch first (as bench.py's measured process does) and, in a second pair per run, import
nothing else. Each pair times epochs 2-4 once with the sampler running through them (every
0.1 s, as bench.py sampled before it left the timed epochs alone) and once with it off; which
goes first alternates. Prints the medians and the per-run ratios.

    PYTHONPATH=. python experiments/bench/sampler_cost.py --runs 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--data", default=str(HERE / "data" / "ctr"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import datagen
    from mapped_reads import paired_runs

    datagen.make_ctr(a.data, rows=1_000_000)
    imports = ["torch", "nothing"]
    # mapped_reads.py's `one` with maps on ("1") and the timed epochs sampled or not
    res = paired_runs(a.runs, imports, lambda sampled: [a.data, "1", "1" if sampled else "0"])
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end; {a.runs} paired runs, "
          "epochs 2-4 each.\n")
    print("| imports | timed epochs sampled | rows/s (median) | read s (median) |")
    print("|---|---|---:|---:|")
    for imp in imports:
        for sampled in (True, False):
            rs = res[(imp, sampled)]
            print(f"| {imp} | {'yes' if sampled else 'no'} | {statistics.median(x['rows_per_s'] for x in rs):,.0f} | "
                  f"{statistics.median(x['read_s'] for x in rs):.3f} |")
    print()
    for imp in imports:
        on, off = res[(imp, True)], res[(imp, False)]
        ratios = sorted(x["rows_per_s"] / y["rows_per_s"] for x, y in zip(on, off))
        print(f"- imports {imp}: sampled / unsampled rows/s per run: median {statistics.median(ratios):.3f} "
              f"(range {ratios[0]:.3f}-{ratios[-1]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
