"""Where a mixed-order window could live so that the process holds no more than its blocks:
a probe of five placements of one window, outside the loader (NumPy only, no detload import).

The mixed order's peak memory is its window (up to ``mix_window`` converted row groups, held
while the task's blocks are cut) on top of the blocks in flight; the windowed order holds
only the latter (docs/mixing-design.md, "Targets: where this stands"). This measures, for one
CTR-shaped window (62 row groups of 16,384 rows; an int64 group of 9 columns and a float32
group of 33, as `WindowPack` lays them out) cut into 16 blocks the way the mixed order cuts
them (block j takes chunk (j + o_q) mod 16 of every piece q, then permutes its rows):

- ``heap``: the window in process memory, column-major per group (today's `WindowPack`);
  a block is one `np.take` per group.
- ``mapped``: the same arrays in a file (unlinked at once) mapped shared; the same gathers,
  and after each block ``madvise(MADV_DONTNEED)`` gives the mapped pages back (the page cache
  keeps them).
- ``pread``: the window in a file, row-major per group, never mapped: a block reads each
  piece's chunk of each group with one ``preadv`` into a staging array, then gathers its rows
  and lays them out column-major (a transpose).
- ``pread-cols``: the same file column-major (as the pack): one ``preadv`` per piece and
  column, then the pack's gather.
- ``chunked``: the file laid out by chunk: each piece's chunk of a group is one run of bytes,
  its columns back to back, so one ``preadv`` per piece and group scatters it into the
  column-major staging array (one buffer per column), then the pack's gather. The chunks'
  cuts are the task's (the same every epoch for a window kept from one pass to the next);
  which block takes which chunk is not, and does not matter to the layout.

Reported per placement (each in its own process): the time to fill the window, the median
time of a block, and the peak PSS over the process's PSS before the window (sampled after each
block). The file's pages are in the page cache either way: reclaimable once written back,
which heap memory is not; they are not in the process's PSS unless mapped.

    python experiments/mixing/spill_probe.py [--dir /tmp] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

PIECES, ROWS, BLOCKS = 62, 16_384, 16
GROUPS: tuple[tuple[np.dtype, int], ...] = ((np.dtype("<i8"), 9), (np.dtype("<f4"), 33))


def _pss() -> int:
    """This process's PSS in bytes (Linux)."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss line in /proc/self/smaps_rollup")


def _file(nbytes: int, where: str) -> int:
    fd, path = tempfile.mkstemp(dir=where, prefix="spill-probe-")
    os.unlink(path)  # the pages go with the last descriptor or mapping
    os.ftruncate(fd, nbytes)
    return fd


def _chunks(rng: np.random.Generator) -> list[list[tuple[int, int]]]:
    """For each block, the (first row, rows) of every piece's chunk, in window rows."""
    offsets = rng.integers(0, BLOCKS, PIECES)
    cuts = [q * ROWS // BLOCKS for q in range(BLOCKS + 1)]
    return [
        [
            (
                p * ROWS + cuts[(j + offsets[p]) % BLOCKS],
                cuts[(j + offsets[p]) % BLOCKS + 1] - cuts[(j + offsets[p]) % BLOCKS],
            )
            for p in range(PIECES)
        ]
        for j in range(BLOCKS)
    ]


def run(placement: str, where: str, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    n = PIECES * ROWS
    # What a row group converts to, made once: the fill copies it as a window read copies
    # the converted columns into its pack.
    source = [
        rng.random((k, ROWS)).astype(dt) if dt.kind == "f" else rng.integers(0, 1 << 40, (k, ROWS), dtype=dt)
        for dt, k in GROUPS
    ]
    base = _pss()
    fds: list[int] = []
    maps: list[mmap.mmap] = []
    arrays: list[np.ndarray] = []
    t0 = time.perf_counter()
    for (dt, k), src in zip(GROUPS, source):
        nbytes = k * n * dt.itemsize
        if placement == "heap":
            arr = np.empty((k, n), dtype=dt)
        elif placement == "mapped":
            fd = _file(nbytes, where)
            m = mmap.mmap(fd, nbytes)
            os.close(fd)
            maps.append(m)
            arr = np.frombuffer(m, dtype=dt).reshape(k, n)
        elif placement == "chunked":
            fd = _file(nbytes, where)
            fds.append(fd)
            arr = np.empty(0, dtype=dt)
            cuts = [q * ROWS // BLOCKS for q in range(BLOCKS + 1)]
            for p in range(PIECES):
                for a, b in zip(cuts, cuts[1:]):
                    os.pwritev(fd, [src[c, a:b].data.cast("B") for c in range(k)], (p * ROWS + a) * k * dt.itemsize)
        elif placement == "pread-cols":
            fd = _file(nbytes, where)
            fds.append(fd)
            arr = np.empty(0, dtype=dt)
            for c in range(k):
                for p in range(PIECES):
                    os.pwrite(fd, src[c].data.cast("B"), (c * n + p * ROWS) * dt.itemsize)
        else:
            fd = _file(nbytes, where)
            fds.append(fd)
            arr = np.empty(0, dtype=dt)
            rowmajor = np.ascontiguousarray(src.T)
            for p in range(PIECES):
                os.pwrite(fd, rowmajor.data.cast("B"), p * ROWS * k * dt.itemsize)
        if placement not in ("pread", "pread-cols", "chunked"):
            for p in range(PIECES):
                arr[:, p * ROWS : (p + 1) * ROWS] = src
        arrays.append(arr)
    fill = time.perf_counter() - t0
    for m in maps:
        m.madvise(mmap.MADV_DONTNEED)
    times: list[float] = []
    peak = 0
    for _ in range(repeats):
        for chunks in _chunks(rng):
            rows = sum(r for _, r in chunks)
            perm = rng.permutation(rows)
            a = time.perf_counter()
            outs = []
            if placement == "pread":
                for (dt, k), fd in zip(GROUPS, fds):
                    stage = np.empty((rows, k), dtype=dt)
                    at = 0
                    for first, r in chunks:
                        os.preadv(fd, [stage[at : at + r].data.cast("B")], first * k * dt.itemsize)
                        at += r
                    out = np.empty((k, rows), dtype=dt)
                    out[:] = np.take(stage, perm, axis=0).T
                    outs.append(out)
            elif placement == "chunked":
                for (dt, k), fd in zip(GROUPS, fds):
                    stage = np.empty((k, rows), dtype=dt)
                    at = 0
                    for first, r in chunks:
                        os.preadv(fd, [stage[c, at : at + r].data.cast("B") for c in range(k)], first * k * dt.itemsize)
                        at += r
                    out = np.empty((k, rows), dtype=dt)
                    np.take(stage, perm, axis=1, out=out, mode="wrap")
                    outs.append(out)
            elif placement == "pread-cols":
                for (dt, k), fd in zip(GROUPS, fds):
                    stage = np.empty((k, rows), dtype=dt)
                    for c in range(k):
                        at = 0
                        for first, r in chunks:
                            os.preadv(fd, [stage[c, at : at + r].data.cast("B")], (c * n + first) * dt.itemsize)
                            at += r
                    out = np.empty((k, rows), dtype=dt)
                    np.take(stage, perm, axis=1, out=out, mode="wrap")
                    outs.append(out)
            else:
                index = np.concatenate([np.arange(first, first + r) for first, r in chunks])[perm]
                for (dt, k), arr in zip(GROUPS, arrays):
                    out = np.empty((k, rows), dtype=dt)
                    np.take(arr, index, axis=1, out=out, mode="wrap")
                    outs.append(out)
            times.append(time.perf_counter() - a)
            peak = max(peak, _pss() - base)
            for m in maps:
                m.madvise(mmap.MADV_DONTNEED)
            del outs
    window = sum(k * n * dt.itemsize for dt, k in GROUPS)
    return {
        "fill_ms": fill * 1e3,
        "block_ms": statistics.median(times) * 1e3,
        "peak_mib": peak / 2**20,
        "window_mib": window / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the window files go (a disk, not tmpfs)")
    ap.add_argument("--repeats", type=int, default=5, help="passes over the 16 blocks")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run(a.one, a.dir, a.repeats)))
        return
    print("| placement | window MiB | fill ms | block ms (median) | peak PSS over start, MiB |")
    print("|---|---:|---:|---:|---:|")
    for placement in ("heap", "mapped", "pread", "pread-cols", "chunked"):
        out = subprocess.run(
            [sys.executable, __file__, "--one", placement, "--dir", a.dir, "--repeats", str(a.repeats)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out)
        print(
            f"| {placement} | {r['window_mib']:.0f} | {r['fill_ms']:.0f} | {r['block_ms']:.1f} | {r['peak_mib']:.0f} |"
        )


if __name__ == "__main__":
    main()
