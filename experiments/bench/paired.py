"""Paired before/after benchmark of detload's hot paths: two source trees, interleaved runs.

A change that claims "no hot path got slower" is checked here: each run measures the
same detload configurations from the *before* tree and the *after* tree back to back
(order alternating between runs), each in a fresh subprocess through that tree's own
``experiments/bench/bench.py _one``; the table gives per-run after/before ratios and
their median, which is what a noisy shared machine can support.

Both sides run the windowed order (shuffle window 4): a tree from before the mixed order has
no other, and the after tree's bench.py would otherwise run its default, the mixed one.
Each side's subprocess runs in its own tree's root, since the forkserver that starts process
workers puts its working directory first on sys.path; before measuring, one short run per
tree with PYTHONVERBOSE=1 checks that every process imported detload from that tree only.

    git worktree add --detach ../before <old commit>
    mkdir -p ../empty && cd ../empty
    python <after>/experiments/bench/paired.py --before <before> --after <after> --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CASES = [("thread", 1), ("thread", 2), ("process", 1), ("process", 2)]


def _run(tree: Path, spec: dict, timeout: float, **extra_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree), DETLOAD_BENCH_MAIN_TORCH="0", **extra_env)
    # cwd=tree: the forkserver (process workers) has the working directory first on its sys.path.
    done = subprocess.run([sys.executable, str(tree / "experiments" / "bench" / "bench.py"), "_one",
                           json.dumps(spec)], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tree, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {spec}: {done.stderr[-2000:]}")
    return done


def one(tree: Path, spec: dict, timeout: float = 900) -> dict:
    return json.loads(_run(tree, spec, timeout).stdout.strip().splitlines()[-1])


#: PYTHONVERBOSE's line for a module loaded from source or bytecode: "# code object from '<path>'".
_LOADED = re.compile(r"^# code object from '?([^'\n]+?)'?$", re.M)


def detload_files(verbose_stderr: str) -> set[str]:
    """The detload source files a PYTHONVERBOSE=1 run's processes loaded (from their stderr)."""
    return {p for p in _LOADED.findall(verbose_stderr) if re.search(r"/detload/[^/]*(\.py|/)", p)}


def check_imports(tree: Path, spec: dict, timeout: float = 900) -> int:
    """Run `spec` once with PYTHONVERBOSE=1 and fail unless every detload module that any of its
    processes (the main one, the forkserver, the workers) loaded came from `tree`; the count."""
    files = detload_files(_run(tree, spec, timeout, PYTHONVERBOSE="1").stderr)
    root = str(tree.resolve()) + os.sep
    stray = sorted(f for f in files if not os.path.realpath(f).startswith(root))
    if not files or stray:
        raise SystemExit(f"{tree}: detload was not imported from this tree only: "
                         f"{stray[:5] or 'no detload module seen'}")
    return len(files)


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
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    probe = {"kind": "detload", "pool": "process", "workers": 2, "path": path, "epochs": 1, "order": "windowed"}
    for name, tree in trees.items():
        print(f"{name}: {check_imports(tree, probe)} detload modules, all from {tree}", file=sys.stderr, flush=True)
    ratios: dict[str, list[float]] = {}
    speed: dict[str, dict[str, list[float]]] = {}
    for r in range(a.runs):
        for pool, w in CASES:
            label = f"detload {pool} W={w}"
            spec = {"kind": "detload", "pool": pool, "workers": w, "path": path, "epochs": a.epochs,
                    "order": "windowed"}
            order = list(trees.items())
            if r % 2:
                order.reverse()
            res = {name: one(tree, spec) for name, tree in order}
            if r == 0 and (pool, w) == CASES[0] and len({"timed_epochs" in x for x in res.values()}) > 1:
                print("warning: one tree samples memory during its timed epochs and the other does not; "
                      "the older one pays 7-10 % of its rows/s for it", file=sys.stderr)
            got = {name: steady(x) for name, x in res.items()}
            for name, v in got.items():
                speed.setdefault(label, {}).setdefault(name, []).append(v)
            ratios.setdefault(label, []).append(got["after"] / got["before"])
            print(f"[run {r + 1}/{a.runs}] {label}: before {got['before']:,.0f} after {got['after']:,.0f} rows/s",
                  file=sys.stderr, flush=True)
    print(f"Paired runs: {a.runs}, {a.epochs} epochs each, {a.rows:,} rows (ctr), windowed order, steady-state rows/s.")
    print(f"Command (from an empty directory): `python {Path(__file__).resolve()} {' '.join(sys.argv[1:])}`\n")
    print("| case | before rows/s (median) | after rows/s (median) | after / before (median of per-run ratios) |")
    print("|---|---:|---:|---:|")
    for label, rs in ratios.items():
        s = speed[label]
        print(f"| {label} | {statistics.median(s['before']):,.0f} | {statistics.median(s['after']):,.0f} | "
              f"{statistics.median(rs):.3f} (range {min(rs):.3f}-{max(rs):.3f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
