"""Whether a signal to a `detload run`'s whole process group leaves shared-memory names behind.

Starts `detload run` (3 process workers, batch 500, 200,000 rows in 40 row groups, many epochs)
N times, sends SIGTERM or SIGINT to the group once the manifest holds a number of batches that
changes from run to run (so the signal lands at other points of the hand-off), waits for the run
to end, and counts the names in /dev/shm that carry the run's pid (every segment's name does:
_engine/shm.py). A name left there is memory nobody frees until the next pool's sweep.

    python experiments/faults/shm_leftovers.py --signal term --runs 40
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHM = "/dev/shm"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signal", choices=["int", "term"], default="term")
    ap.add_argument("--runs", type=int, default=40)
    a = ap.parse_args()
    sig = signal.SIGINT if a.signal == "int" else signal.SIGTERM
    tmp = tempfile.mkdtemp(prefix="detload-shm-")
    data = os.path.join(tmp, "data")
    os.mkdir(data)
    rng = np.random.default_rng(0)
    for i in range(4):
        n = 50_000
        pq.write_table(pa.table({"x": rng.random(n).astype(np.float32), "y": np.arange(n)}),
                       os.path.join(data, f"p{i}.parquet"), row_group_size=5_000)
    left_total = stuck = 0
    for r in range(a.runs):
        man = os.path.join(tmp, f"m{r}.jsonl")
        p = subprocess.Popen(
            [sys.executable, "-m", "detload", "run", data, "--seed", "0", "--batch-size", "500", "--workers", "3",
             "--pool", "process", "--epochs", "50", "--manifest", man],
            cwd=HERE, env={**os.environ, "PYTHONPATH": HERE}, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        want = 5 + (r % 7) * 20
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and p.poll() is None:
            try:
                with open(man) as f:
                    if sum(1 for _ in f) > want:
                        break
            except FileNotFoundError:
                pass
            time.sleep(0.005)
        os.killpg(p.pid, sig)
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            stuck += 1
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        time.sleep(0.5)
        left = sorted(n for n in os.listdir(SHM) if f"-{p.pid}-" in n)
        left_total += len(left)
        if left:
            print(f"run {r}: {len(left)} names left, e.g. {left[:3]}")
    print(f"{a.runs} runs, SIG{a.signal.upper()}: {left_total} names left in {SHM}, {stuck} runs not ended in 20 s")
    return 1 if left_total or stuck else 0


if __name__ == "__main__":
    sys.exit(main())
