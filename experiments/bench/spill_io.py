"""What a spilled mixed-order window costs in its file (`detload/_engine/spill.py`), two ways each:

1. **Writing a window**: into a new unlinked file per window (closed after its last block),
   against into one file reused by every window (what a pool does since spill files are
   reused). A new file's pages are allocated as it is written and freed as it is closed.
   Time of the writes, of the reads back, and the process's CPU seconds per window (the
   close included), for 8 windows of 200 MiB written in 3 MiB pieces (a CTR row group).
2. **Reading a block back**: every chunk of a block (CTR shapes: 62 pieces, 16 blocks of
   1,024-row chunks, an int64 group of 9 columns and a float32 group of 33) read into a
   ``(columns, rows)`` staging array of the whole block, then permuted with one ``take``
   per group (before), against a few columns at a time: each group's columns read into a
   staging array of about ``--stage`` bytes and permuted while it is in L2 (now).

Medians over ``--repeats`` rounds, one thread, a file in ``--folder`` (the system's temporary
folder by default; it must be on a disk, not in memory). Prints a table with the ratio of each
"now" to its "before" measured in the same run.

    PYTHONPATH=. python experiments/bench/spill_io.py        # about 20 s
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time

import numpy as np

PIECES, BLOCKS, CHUNK = 62, 16, 1024
GROUPS = [(9, np.dtype(np.int64)), (33, np.dtype(np.float32))]
WINDOW, PIECE = 200 << 20, 3 << 20


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _window(f: object, piece: np.ndarray) -> tuple[float, float]:
    """Write a window into ``f`` piece by piece, then read it back: (write s, read s)."""
    fd = f.fileno()  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    for at in range(0, WINDOW, piece.nbytes):
        os.pwrite(fd, piece, at)
    t1 = time.perf_counter()
    back = np.empty_like(piece)
    for at in range(0, WINDOW, piece.nbytes):
        os.preadv(fd, [back], at)
    return t1 - t0, time.perf_counter() - t1


def files(folder: str, windows: int) -> dict[str, tuple[float, float, float]]:
    """Per way: median write s, median read s, CPU s per window."""
    piece = np.random.default_rng(0).integers(0, 255, PIECE, dtype=np.uint8)
    out = {}
    times = []
    c0 = _cpu()
    for _ in range(windows):
        with tempfile.TemporaryFile(dir=folder) as f:
            times.append(_window(f, piece))
    out["a new file per window"] = (statistics.median(w for w, _ in times), statistics.median(r for _, r in times),
                                    (_cpu() - c0) / windows)
    times = []
    with tempfile.TemporaryFile(dir=folder) as f:
        _window(f, piece)  # the file's pages exist, as after a pool's first window
        c0 = _cpu()
        for _ in range(windows):
            times.append(_window(f, piece))
        cpu = (_cpu() - c0) / windows
    out["one file reused"] = (statistics.median(w for w, _ in times), statistics.median(r for _, r in times), cpu)
    return out


def blocks(folder: str, stage_bytes: int, repeats: int) -> dict[str, float]:
    """Median ms a block, per way."""
    rng = np.random.default_rng(1)
    seg = CHUNK * sum(k * dt.itemsize for k, dt in GROUPS)  # one chunk of a piece, every group
    rows = PIECES * CHUNK
    perm = rng.permutation(rows)
    outs = [np.empty((k, rows), dt) for k, dt in GROUPS]
    with tempfile.TemporaryFile(dir=folder) as f:
        fd = f.fileno()
        for q in range(PIECES):
            os.pwrite(fd, rng.integers(0, 255, BLOCKS * seg, dtype=np.uint8), q * BLOCKS * seg)

        def at(q: int, j: int) -> int:  # block j's chunk of piece q, rotated per piece
            return (q * BLOCKS + (j + q) % BLOCKS) * seg

        stages = [np.empty((k, rows), dt) for k, dt in GROUPS]

        def whole(j: int) -> None:
            lines = [(s[i].data.cast("B"), dt.itemsize) for s, (k, dt) in zip(stages, GROUPS) for i in range(k)]
            for q in range(PIECES):
                e0 = q * CHUNK
                os.preadv(fd, [ln[e0 * it : (e0 + CHUNK) * it] for ln, it in lines], at(q, j))
            for s, o in zip(stages, outs):
                np.take(s, perm, axis=1, out=o, mode="wrap")

        def staged(j: int) -> None:
            before = 0
            for (k, dt), o in zip(GROUPS, outs):
                it = dt.itemsize
                step = min(k, max(1, stage_bytes // (rows * it)))
                scratch = np.empty((step, rows), dt)
                for j0 in range(0, k, step):
                    j1 = min(k, j0 + step)
                    st = scratch[: j1 - j0]
                    lines = [st[i].data.cast("B") for i in range(j1 - j0)]
                    for q in range(PIECES):
                        e0 = q * CHUNK
                        os.preadv(fd, [ln[e0 * it : (e0 + CHUNK) * it] for ln in lines],
                                  at(q, j) + CHUNK * (before + j0 * it))
                    np.take(st, perm, axis=1, out=o[j0:j1], mode="wrap")
                before += k * it

        staged(0)
        want = [o.copy() for o in outs]
        whole(0)
        if not all(np.array_equal(a.view(np.uint8), b.view(np.uint8)) for a, b in zip(want, outs)):
            raise SystemExit("the two ways gave different blocks")
        ms: dict[str, list[float]] = {"the whole block staged (before)": [], "a few columns at a time (now)": []}
        for _ in range(repeats):  # alternated, so that both see the same machine
            for name, fn in (("the whole block staged (before)", whole), ("a few columns at a time (now)", staged)):
                for j in range(BLOCKS):
                    t0 = time.perf_counter()
                    fn(j)
                    ms[name].append((time.perf_counter() - t0) * 1e3)
        return {k: statistics.median(v) for k, v in ms.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", default=tempfile.gettempdir())
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stage", type=int, default=2 << 20, help="bytes of columns staged at a time")
    a = ap.parse_args()
    print(f"spill file folder: {a.folder}\n")
    print("| writing 200 MiB windows | write ms (median) | read ms (median) | CPU ms a window | CPU vs a new file |")
    print("|---|---:|---:|---:|---:|")
    res = files(a.folder, a.windows)
    base = res["a new file per window"][2]
    for name, (w, r, c) in res.items():
        print(f"| {name} | {w * 1e3:.1f} | {r * 1e3:.1f} | {c * 1e3:.0f} | {c / base:.2f}x |")
    print("\n| reading a CTR block back | ms a block (median) | vs before |")
    print("|---|---:|---:|")
    got = blocks(a.folder, a.stage, a.repeats)
    before = got["the whole block staged (before)"]
    for name, v in got.items():
        print(f"| {name} | {v:.2f} | {v / before:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
