"""Paired before/after benchmark of detload's hot paths: two source trees, interleaved runs.

A change that claims "no hot path got slower" is checked here: each run measures the
same detload configurations from the *before* tree and the *after* tree back to back
(order alternating between runs), each in a fresh subprocess through that tree's own
``experiments/bench/bench.py _one``; the table gives per-run after/before ratios and
their median, which is what a noisy shared machine can support.

    git worktree add /tmp/before <old commit>
    PYTHONPATH=. python experiments/bench/paired.py --before /tmp/before --after . --runs 5
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
sys.path.insert(0, str(HERE))

CASES = [("thread", 1), ("thread", 2), ("process", 1), ("process", 2)]


def one(tree: Path, spec: dict, timeout: float = 900) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), DETLOAD_BENCH_MAIN_TORCH="0")
    done = subprocess.run([sys.executable, str(tree / "experiments" / "bench" / "bench.py"), "_one",
                           json.dumps(spec)], capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {spec}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def steady(res: dict) -> float:
    # A tree from 2026-12-03 on leaves the timed epochs unsampled and adds an untimed memory
    # epoch (`timed_epochs`); an older tree sampled memory through every epoch, which cost it
    # 7-10 % of its rows/s (bench.py's RssSampler), so main() warns when the two trees differ.
    timed = res["epochs"][: res.get("timed_epochs")]
    eps = timed[1:] or timed
    return sum(e["timed_rows"] for e in eps) / sum(e["seconds"] for e in eps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="source tree of the old code")
    ap.add_argument("--after", required=True, type=Path, help="source tree of the new code")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--data", default=str(HERE / "data"))
    a = ap.parse_args(argv)
    import datagen

    path = str(Path(a.data) / "ctr")
    datagen.make_ctr(path, rows=a.rows)
    ratios: dict[str, list[float]] = {}
    speed: dict[str, dict[str, list[float]]] = {}
    for r in range(a.runs):
        for pool, w in CASES:
            label = f"detload {pool} W={w}"
            spec = {"kind": "detload", "pool": pool, "workers": w, "path": path, "epochs": a.epochs}
            order = [("before", a.before), ("after", a.after)]
            if r % 2:
                order.reverse()
            res = {name: one(tree.resolve(), spec) for name, tree in order}
            if r == 0 and (pool, w) == CASES[0] and len({"timed_epochs" in x for x in res.values()}) > 1:
                print("warning: one tree samples memory during its timed epochs and the other does not; "
                      "the older one pays 7-10 % of its rows/s for it", file=sys.stderr)
            got = {name: steady(x) for name, x in res.items()}
            for name, v in got.items():
                speed.setdefault(label, {}).setdefault(name, []).append(v)
            ratios.setdefault(label, []).append(got["after"] / got["before"])
            print(f"[run {r + 1}/{a.runs}] {label}: before {got['before']:,.0f} after {got['after']:,.0f} rows/s",
                  file=sys.stderr, flush=True)
    print(f"Paired runs: {a.runs}, {a.epochs} epochs each, {a.rows:,} rows (ctr), steady-state rows/s.")
    print(f"Command: `PYTHONPATH=. python experiments/bench/paired.py {' '.join(sys.argv[1:])}`\n")
    print("| case | before rows/s (median) | after rows/s (median) | after / before (median of per-run ratios) |")
    print("|---|---:|---:|---:|")
    for label, rs in ratios.items():
        s = speed[label]
        print(f"| {label} | {statistics.median(s['before']):,.0f} | {statistics.median(s['after']):,.0f} | "
              f"{statistics.median(rs):.3f} (range {min(rs):.3f}-{max(rs):.3f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
