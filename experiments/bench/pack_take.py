"""How a mixed-order block is best gathered from a window pack: one ``take`` per group of
columns straight from the pack (what `assemble` does), against copying the block's chunks into
a scratch first and permuting there (what the windowed order does with its four row groups),
the whole group at once or in cache-sized chunks of columns (the chunks copied one by one, or
gathered in one ``take`` of their rows in pack order). Two references: what the windowed
order does (four whole row groups copied into a scratch in 1 MiB chunks of columns, each
chunk then permuted: long runs read, the take from L2), and a pack laid out by block (each
block's chunks of every piece back to back, one ``take`` from that slice: what such a
layout would save, had every pass the blocks it was laid out for). CTR shapes: 64 pieces of 16,384
rows, block-ordered, 16 blocks a task (1,024-row chunks), groups of 1 int64, 33 float32 and 8
int64 columns. Medians of 5 repeats of the task's 16 blocks, each repeat after a 64 MiB pass
that evicts the caches; one thread.

    PYTHONPATH=. python experiments/bench/pack_take.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

PIECES, ROWS, BLOCKS = 64, 16_384, 16
GROUPS = [(1, np.int64), (33, np.float32), (8, np.int64)]
CHUNK_BYTES = 1 << 20


def main() -> int:
    rng = np.random.default_rng(0)
    held = [rng.random((k, PIECES * ROWS)).astype(dt) for k, dt in GROUPS]
    n = ROWS // BLOCKS
    rows = PIECES * n
    perm = rng.permutation(rows)
    outs = [np.empty((k, rows), dt) for k, dt in GROUPS]
    stage = [np.empty((k, rows), dt) for k, dt in GROUPS]

    def starts(j: int) -> list[int]:  # block j's chunk of each piece, rotated per piece
        return [q * ROWS + ((j + q) % BLOCKS) * n for q in range(PIECES)]

    def one_take(j: int) -> None:
        shift = np.repeat(np.array(starts(j)) - np.arange(PIECES) * n, n)
        idx = perm + shift[perm]
        for h, o in zip(held, outs):
            np.take(h, idx, axis=1, out=o, mode="wrap")

    def copy_then_take(j: int) -> None:
        st = starts(j)
        for h, s, o in zip(held, stage, outs):
            for q, a in enumerate(st):
                s[:, q * n : (q + 1) * n] = h[:, a : a + n]
            np.take(s, perm, axis=1, out=o, mode="wrap")

    def copy_then_take_chunked(j: int) -> None:
        st = starts(j)
        for (k, dt), h, s, o in zip(GROUPS, held, stage, outs):
            step = max(1, CHUNK_BYTES // (rows * np.dtype(dt).itemsize))
            for j0 in range(0, k, step):
                j1 = min(k, j0 + step)
                part = s[j0:j1]
                for q, a in enumerate(st):
                    part[:, q * n : (q + 1) * n] = h[j0:j1, a : a + n]
                for c in range(j1 - j0):
                    np.take(part[c], perm, out=o[j0 + c], mode="wrap")

    def gather_then_take_chunked(j: int) -> None:
        st = np.array(starts(j))
        src = (st[:, None] + np.arange(n)[None, :]).ravel()  # the block's rows in pack order
        for (k, dt), h, s, o in zip(GROUPS, held, stage, outs):
            step = max(1, CHUNK_BYTES // (rows * np.dtype(dt).itemsize))
            for j0 in range(0, k, step):
                j1 = min(k, j0 + step)
                part = s[j0:j1]
                np.take(h[j0:j1], src, axis=1, out=part, mode="wrap")
                for c in range(j1 - j0):
                    np.take(part[c], perm, out=o[j0 + c], mode="wrap")

    def windowed(j: int) -> None:
        q0 = (4 * j) % PIECES
        for (k, dt), h, s, o in zip(GROUPS, held, stage, outs):
            step = max(1, CHUNK_BYTES // (4 * ROWS * np.dtype(dt).itemsize))
            for j0 in range(0, k, step):
                j1 = min(k, j0 + step)
                part = s[: j1 - j0, : 4 * ROWS]
                for q in range(4):
                    part[:, q * ROWS : (q + 1) * ROWS] = h[j0:j1, (q0 + q) * ROWS : (q0 + q + 1) * ROWS]
                np.take(part, perm4, axis=1, out=o[j0:j1, : 4 * ROWS], mode="wrap")

    def by_block(j: int) -> None:
        r0 = j * rows
        for h, o in zip(held, outs):
            np.take(h[:, r0 : r0 + rows], perm, axis=1, out=o, mode="wrap")

    perm4 = rng.permutation(4 * ROWS)
    ways = [("windowed order: 4 row groups, 1 MiB chunks", windowed),
            ("pack laid out by block: one take", by_block),
            ("one take per group from the pack", one_take), ("copy the chunks, then take", copy_then_take),
            ("copy and take in 1 MiB chunks of columns", copy_then_take_chunked),
            ("gather and take in 1 MiB chunks of columns", gather_then_take_chunked)]
    print("ms a block")
    for name, f in ways * 2:  # twice, interleaved: the spread shows
        times = []
        for _ in range(5):
            np.ones(64 << 20, np.uint8).sum()  # evict the caches: a window is read long before its blocks
            t0 = time.perf_counter()
            for j in range(BLOCKS):
                f(j)
            times.append((time.perf_counter() - t0) / BLOCKS * 1e3)
        print(f"{name:45s} {statistics.median(times):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
