"""How often `detload run` fails to end on a signal sent to its whole process group.

Starts `detload run` (3 process workers, batch 50, many epochs of 3,000 tiny rows, so that the
consumer's thread spends most of its time in the hand-off code where a lock could be
stranded) N times, sends SIGINT or SIGTERM to the group once the manifest holds 3 batches,
and counts the runs not gone within 5 s. A stuck one is sent SIGABRT with
PYTHONFAULTHANDLER=1, so its threads' stacks are printed. Optionally a busy loop runs
beside it (``--busy``), as a loaded CI machine does.

    python experiments/faults/signal_hang.py --signal int --runs 60 --busy
"""

from __future__ import annotations

import argparse
import contextlib
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signal", choices=["int", "term"], default="int")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--busy", action="store_true", help="a busy loop in another process meanwhile")
    a = ap.parse_args()
    sig = signal.SIGINT if a.signal == "int" else signal.SIGTERM
    tmp = tempfile.mkdtemp(prefix="detload-signal-")
    data = os.path.join(tmp, "data")
    os.mkdir(data)
    for f in range(3):
        ids = np.arange(f * 1000, (f + 1) * 1000, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), f"{data}/part-{f}.parquet", row_group_size=250)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
           "PYTHONFAULTHANDLER": "1"}
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if a.busy else None
    stuck = 0
    try:
        for i in range(a.runs):
            manifest = f"{tmp}/m{i}.jsonl"
            p = subprocess.Popen([sys.executable, "-m", "detload", "run", data, "--batch-size", "50", "--seed", "1",
                                  "--epochs", "1000", "--pool", "process", "--workers", "3", "--manifest", manifest],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                with contextlib.suppress(FileNotFoundError), open(manifest) as fh:
                    if fh.read().count('"batch"') >= 3:
                        break
                time.sleep(0.01)
            time.sleep(0.2)
            os.killpg(p.pid, sig)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                stuck += 1
                os.kill(p.pid, signal.SIGABRT)
                p.wait()
                print(f"run {i}: still running 5 s after the signal; its stacks:\n{p.stderr.read()[-6000:]}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
    finally:
        if busy is not None:
            busy.kill()
    print(f"SIG{a.signal.upper()}: {stuck} of {a.runs} runs did not end within 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
