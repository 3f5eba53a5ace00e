"""Prototype of the mixed order ("stratified windows"): one epoch's order as a pure NumPy function.

`stratified_order` is the proposed default; `windowed_order` (today's plan format 2),
`iid_order` (the yardstick) and `chunk_order` (a cache-first global chunk shuffle) are here to
compare with it. Each returns an `EpochOrder`: every partition's stream of rows (global row ids,
row groups laid end to end in canonical order), the tasks a worker builds and their blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EpochOrder",
    "Piece",
    "Task",
    "build_task",
    "chunk_order",
    "iid_order",
    "permutation",
    "run_engine",
    "schedule",
    "stratified_order",
    "task_rows",
    "windowed_order",
]

# Today's tags (detload/plan.py), so that `windowed_order` reproduces plan format 2 exactly.
TAG_UNITS = 0x554E_4954  # "UNIT"
TAG_BLOCK = 0x424C_4B52  # "BLKR"
# The mixed order's own streams; every list below has a fixed length per tag.
TAG_MIX_PARTS = 0x4D58_5054  # "MXPT" [tag, seed_lo, seed_hi, epoch]: row groups -> partitions
TAG_MIX_TASKS = 0x4D58_544B  # "MXTK" [tag, seed_lo, seed_hi, epoch, partition]: -> tasks
TAG_MIX_ROWS = 0x4D58_5257  # "MXRW" [tag, seed_lo, seed_hi, epoch, partition, task]: a task's rows
TAG_MIX_CHUNKS = 0x4D58_434B  # "MXCK" [tag, seed_lo, seed_hi, epoch, partition]: chunks -> blocks
TAG_IID = 0x4D58_4949  # "MXII" [tag, seed_lo, seed_hi, epoch]: the i.i.d. reference permutation

_U32 = 0xFFFF_FFFF


def _entropy(tag: int, seed: int, *words: int) -> list[int]:
    return [tag, seed & _U32, seed >> 32, *words]


def _raw(entropy: list[int], n: int) -> np.ndarray:
    return np.asarray(np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(n), dtype=np.uint64)


def permutation(entropy: list[int], n: int) -> np.ndarray:
    """A permutation of range(n) fixed by PCG64's raw output (stable argsort), as detload's plan."""
    return np.argsort(_raw(entropy, n), kind="stable").astype(np.int64)


@dataclass(frozen=True)
class Piece:
    """Rows ``[first, first + rows)`` of canonical row group ``unit``."""

    unit: int
    first: int
    rows: int


@dataclass(frozen=True)
class Task:
    """What one worker builds in one go: its pieces read once, their rows permuted together,
    emitted as blocks ``[bounds[j], bounds[j + 1])`` of the permuted rows.

    ``start`` is the task's first row in its partition's stream.
    """

    partition: int
    number: int
    pieces: tuple[Piece, ...]
    bounds: tuple[int, ...]
    start: int

    @property
    def rows(self) -> int:
        return self.bounds[-1]

    @property
    def units(self) -> tuple[int, ...]:
        """The distinct row groups the task reads (its window), canonical order."""
        return tuple(sorted({p.unit for p in self.pieces}))


@dataclass(frozen=True)
class EpochOrder:
    """One epoch: ``streams[p]`` is partition p's rows in order, as global row ids."""

    name: str
    unit_rows: np.ndarray
    streams: tuple[np.ndarray, ...]
    tasks: tuple[Task, ...]
    #: The tag of the stream that permutes a task's rows: the engine needs only it, the seed,
    #: the epoch and the task to rebuild the task's blocks (`build_task`).
    row_tag: int = 0
    seed: int = 0
    epoch: int = 0

    @property
    def unit_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.unit_rows)[:-1]]).astype(np.int64)

    def global_steps(self, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch as global steps (``drop_last=False``): rows, and each step's offset into them.

        Step i is micro-batch i (``global_batch / P`` rows) of every partition, in partition order.
        """
        P = len(self.streams)
        if global_batch % P:
            raise ValueError(f"global_batch {global_batch} must divide by the {P} partitions")
        m = global_batch // P
        steps = max(-(-len(s) // m) for s in self.streams)
        parts, offsets = [], [0]
        for i in range(steps):
            for s in self.streams:
                parts.append(s[i * m:(i + 1) * m])
            offsets.append(offsets[-1] + sum(len(x) for x in parts[-P:]))
        return np.concatenate(parts), np.asarray(offsets, dtype=np.int64)

    def pairs(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row group, row within it) of global row ids."""
        starts = self.unit_starts
        unit = np.searchsorted(starts, rows, side="right") - 1
        return unit, rows - starts[unit]

    @property
    def block_rows(self) -> np.ndarray:
        return np.asarray([b - a for t in self.tasks for a, b in zip(t.bounds, t.bounds[1:])], dtype=np.int64)

    @property
    def decodes(self) -> np.ndarray:
        """How many tasks read each row group this epoch (1 = decoded once, cold)."""
        out = np.zeros(len(self.unit_rows), dtype=np.int64)
        for t in self.tasks:
            out[list(t.units)] += 1
        return out

    @property
    def window(self) -> int:
        """The most row groups one task holds (decoded, or mapped from the cache)."""
        return max(len(t.units) for t in self.tasks)


def _check_rows(unit_rows: Sequence[int] | np.ndarray) -> np.ndarray:
    rows = np.asarray(unit_rows, dtype=np.int64)
    if rows.ndim != 1 or rows.size == 0 or (rows <= 0).any():
        raise ValueError("unit_rows must be a non-empty list of positive row counts (canonical order)")
    return rows


def task_rows(pieces: Sequence[Piece], starts: np.ndarray) -> np.ndarray:
    """The global row ids of ``pieces`` laid end to end (a task's rows before its permutation)."""
    if not pieces:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(starts[p.unit] + p.first, starts[p.unit] + p.first + p.rows)
                           for p in pieces])


def cut_partitions(stream: Sequence[Piece], P: int) -> tuple[list[list[Piece]], int]:
    """Plan format 2's partitions balanced by rows: rows ``[p*T//P, (p+1)*T//P)`` of ``stream``.

    A piece that a boundary falls inside is cut there (one more read of its row group); a piece
    belongs to the partition its first row lies in. Returns the partitions and the cuts made.
    """
    total = sum(p.rows for p in stream)
    bounds = [p * total // P for p in range(P + 1)]
    parts: list[list[Piece]] = [[] for _ in range(P)]
    pos, cuts, b = 0, 0, 1
    for piece in stream:
        lo, hi = pos, pos + piece.rows
        start = piece.first
        while b < P and bounds[b] <= lo:
            b += 1
        inner = [x for x in bounds[b:P] if lo < x < hi]
        edges = [lo, *inner, hi]
        for a, z in zip(edges, edges[1:]):
            part = int(np.searchsorted(bounds, a, side="right")) - 1
            parts[part].append(Piece(piece.unit, start + (a - lo), z - a))
        cuts += len(inner)
        pos = hi
    return parts, cuts


def spread(n: int, groups: int, keys: np.ndarray, jitter: int | None) -> np.ndarray:
    """The group (0..groups-1) of each of ``n`` positions such that every group takes at most one
    position from each stratum of ``groups`` consecutive positions (the last stratum may be short).

    ``keys``: at least ``ceil(n / groups) * groups`` raw 64-bit words of one stream. Stratum s gives
    slot i to group ``sigma_s[i]``. ``jitter=None``: every ``sigma_s`` is an independent uniform
    permutation (argsort of the stratum's keys). ``jitter=g``: ``sigma_0`` is uniform and each next
    stratum permutes slots only within windows of g (windows shifted by g//2 every other stratum), so a
    group's slot moves by at most g-1 between strata: its positions are about ``groups`` apart
    (gap < groups + g) and any run of ``groups + g - 1`` positions holds one of every group
    (except where the short last stratum leaves some out).
    """
    S = -(-n // groups)
    k = keys[: S * groups].reshape(S, groups)
    out = np.empty(n, dtype=np.int64)
    sigma = np.argsort(k[0], kind="stable")
    slots = np.arange(groups)
    for s in range(S):
        if s:
            if jitter is None or jitter >= groups:
                sigma = np.argsort(k[s], kind="stable")
            else:
                window = (slots + (s % 2) * (jitter // 2)) // jitter
                sigma = sigma[np.lexsort((k[s], window))]
        size = min(groups, n - s * groups)
        out[s * groups:s * groups + size] = sigma[:size]
    return out


def balance(piece_rows: np.ndarray, tasks: int, keys: np.ndarray, tolerance: int) -> np.ndarray:
    """The task of each piece (canonical order) such that every task's rows stay level with the
    others' over every prefix: each piece goes to one of the tasks whose rows so far are below the
    smallest + ``tolerance``, the choice made by the piece's key. With equal pieces and a tolerance
    below their size this is `spread` with independent strata; with unequal ones (a file's short
    last row group) no task falls behind by more than ``tolerance`` + the largest piece anywhere in
    the canonical order, so every task covers every part of it in rows, not only in row groups."""
    load = np.zeros(tasks, dtype=np.int64)
    out = np.empty(len(piece_rows), dtype=np.int64)
    for i, r in enumerate(piece_rows.tolist()):
        low = np.flatnonzero(load < load.min() + tolerance)
        t = int(low[int(keys[i] % np.uint64(len(low)))])
        out[i] = t
        load[t] += r
    return out


def _balanced(rows: int, parts: int) -> tuple[int, ...]:
    return tuple(i * rows // parts for i in range(parts + 1))


def default_block_rows(unit_rows: np.ndarray, window: int = 4) -> int:
    """Today's block: ``shuffle_window`` (4) row groups; a function of the row counts alone."""
    return int(window * np.median(unit_rows))


def _partitions(units: list[Piece], seed: int, epoch: int, P: int, jitter: int | None
                ) -> tuple[list[list[Piece]], int]:
    """Row groups to P partitions, each taking one from every P consecutive (canonical) row groups,
    then balanced by rows with plan format 2's cuts; each partition's pieces in canonical order."""
    if P == 1:
        return [list(units)], 0
    n = len(units)
    keys = _raw(_entropy(TAG_MIX_PARTS, seed, epoch), -(-n // P) * P)
    group = spread(n, P, keys, jitter)
    stream = [units[j] for j in np.lexsort((np.arange(n), group))]
    parts, cuts = cut_partitions(stream, P)
    return [sorted(p, key=lambda x: (x.unit, x.first)) for p in parts], cuts


def stratified_order(unit_rows: Sequence[int] | np.ndarray, seed: int, epoch: int, *, window: int = 64,
                     block_rows: int | None = None, partitions: int = 1, jitter: int | None = None,
                     assign: str = "strata") -> EpochOrder:
    """The proposed default: stratified windows.

    Within each partition (its row groups in canonical order), T = ceil(n_p / window) tasks each take
    one row group from every stratum of T consecutive row groups (`spread`), so every task spans the
    whole partition and holds at most ``window`` row groups. A task's rows are permuted together
    (stream ``[TAG_MIX_ROWS, seed_lo, seed_hi, epoch, partition, task]``) and cut into
    ceil(rows / block_rows) blocks of equal size (within one row). The partition's stream is its
    tasks in number order.

    ``assign="rows"`` instead forms T = ceil(rows_p / (window * median rows)) tasks and deals row
    groups with `balance`, so tasks stay level in rows over the canonical order (unequal row groups).
    """
    rows = _check_rows(unit_rows)
    if window < 1 or partitions < 1:
        raise ValueError("window and partitions must be at least 1")
    S = block_rows if block_rows is not None else default_block_rows(rows)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    units = [Piece(j, 0, int(r)) for j, r in enumerate(rows)]
    parts, _ = _partitions(units, seed, epoch, partitions, jitter)
    streams, tasks = [], []
    for p, pieces in enumerate(parts):
        n = len(pieces)
        if n == 0:
            streams.append(np.zeros(0, dtype=np.int64))
            continue
        if assign == "rows":
            med = int(np.median(rows))
            prow = np.asarray([pc.rows for pc in pieces], dtype=np.int64)
            T = max(1, -(-int(prow.sum()) // (window * med)))
            task_of = balance(prow, T, _raw(_entropy(TAG_MIX_TASKS, seed, epoch, p), n), med)
        else:
            T = -(-n // window)
            keys = _raw(_entropy(TAG_MIX_TASKS, seed, epoch, p), -(-n // T) * T)
            task_of = spread(n, T, keys, jitter)
        pos, out = 0, []
        for t in range(T):
            mine = tuple(pieces[i] for i in np.flatnonzero(task_of == t))
            ids = task_rows(mine, starts)
            ids = ids[permutation(_entropy(TAG_MIX_ROWS, seed, epoch, p, t), len(ids))]
            tasks.append(Task(p, t, mine, _balanced(len(ids), max(1, -(-len(ids) // S))), pos))
            out.append(ids)
            pos += len(ids)
        streams.append(np.concatenate(out))
    return EpochOrder(f"stratified K={window}" + ("" if jitter is None else f" jitter={jitter}")
                      + (" by rows" if assign == "rows" else ""),
                      rows, tuple(streams), tuple(tasks), TAG_MIX_ROWS, seed, epoch)


def windowed_order(unit_rows: Sequence[int] | np.ndarray, seed: int, epoch: int, *, window: int = 4,
                   partitions: int = 1) -> EpochOrder:
    """Today's order (plan format 2, no groups or filters), recomputed with NumPy alone."""
    rows = _check_rows(unit_rows)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    order = permutation(_entropy(TAG_UNITS, seed, epoch), len(rows))
    parts, _ = cut_partitions([Piece(int(j), 0, int(rows[j])) for j in order], partitions)
    streams, tasks = [], []
    for p, pieces in enumerate(parts):
        pos, out = 0, []
        for number, lo in enumerate(range(0, len(pieces), window)):
            mine = tuple(pieces[lo:lo + window])
            ids = task_rows(mine, starts)
            ids = ids[permutation(_entropy(TAG_BLOCK, seed, epoch, p, number), len(ids))]
            tasks.append(Task(p, number, mine, (0, len(ids)), pos))
            out.append(ids)
            pos += len(ids)
        streams.append(np.concatenate(out) if out else np.zeros(0, dtype=np.int64))
    return EpochOrder(f"windowed w={window}", rows, tuple(streams), tuple(tasks), TAG_BLOCK, seed, epoch)


def iid_order(unit_rows: Sequence[int] | np.ndarray, seed: int, epoch: int, *, partitions: int = 1) -> EpochOrder:
    """The yardstick: one uniform permutation of all rows, split into equal partitions."""
    rows = _check_rows(unit_rows)
    total = int(rows.sum())
    perm = permutation(_entropy(TAG_IID, seed, epoch), total)
    b = _balanced(total, partitions)
    return EpochOrder("i.i.d.", rows, tuple(perm[b[p]:b[p + 1]] for p in range(partitions)), ())


def chunk_order(unit_rows: Sequence[int] | np.ndarray, seed: int, epoch: int, *, chunk_rows: int = 1024,
                block_rows: int | None = None, partitions: int = 1, jitter: int | None = None) -> EpochOrder:
    """Cache-first comparison: row groups cut into chunks of about ``chunk_rows``; each block takes
    one chunk from every stratum of the partition's chunks (`spread`) and permutes its rows.

    A block reads slices of many row groups, so it needs random access: every row group converted
    in the cache first (one decode each), then chunk slices of memory-mapped entries. Each block is
    reported as a task of its own (its "window" is the row groups it slices).
    """
    rows = _check_rows(unit_rows)
    S = block_rows if block_rows is not None else default_block_rows(rows)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    parts, _ = _partitions([Piece(j, 0, int(r)) for j, r in enumerate(rows)], seed, epoch, partitions, jitter)
    streams, tasks = [], []
    for p, pieces in enumerate(parts):
        chunks = []
        for pc in pieces:
            k = max(1, round(pc.rows / chunk_rows))
            b = _balanced(pc.rows, k)
            chunks += [Piece(pc.unit, pc.first + b[i], b[i + 1] - b[i]) for i in range(k)]
        total = sum(c.rows for c in chunks)
        if not total:
            streams.append(np.zeros(0, dtype=np.int64))
            continue
        M = -(-total // S)
        n = len(chunks)
        keys = _raw(_entropy(TAG_MIX_CHUNKS, seed, epoch, p), -(-n // M) * M)
        block_of = spread(n, M, keys, jitter)
        pos, out = 0, []
        for blk in range(M):
            mine = tuple(chunks[i] for i in np.flatnonzero(block_of == blk))
            ids = task_rows(mine, starts)
            ids = ids[permutation(_entropy(TAG_MIX_ROWS, seed, epoch, p, blk), len(ids))]
            tasks.append(Task(p, blk, mine, (0, len(ids)), pos))
            out.append(ids)
            pos += len(ids)
        streams.append(np.concatenate(out) if out else np.zeros(0, dtype=np.int64))
    return EpochOrder(f"chunks c={chunk_rows}", rows, tuple(streams), tuple(tasks), TAG_MIX_ROWS, seed, epoch)


# --- The engine's side, as a model: what a worker and the merger do with a plan. ---------------


def build_task(order: EpochOrder, task: Task, skip_to: int = 0) -> tuple[int, list[np.ndarray], set[int]]:
    """A worker's job: read the task's row groups once each, permute their rows together with the
    task's own stream, and cut the blocks; blocks ending at or before row ``skip_to`` of the task
    (a resume inside it) are not built, but every row group is still read (each block draws from
    all of them). Returns the task row where the first built block starts, the blocks built and
    the row groups read."""
    ids = task_rows(task.pieces, order.unit_starts)
    ids = ids[permutation(_entropy(order.row_tag, order.seed, order.epoch, task.partition, task.number), len(ids))]
    kept = [(a, b) for a, b in zip(task.bounds, task.bounds[1:]) if b > skip_to]
    return (kept[0][0] if kept else task.rows), [ids[a:b] for a, b in kept], set(task.units)


def schedule(order: EpochOrder, global_batch: int, workers: int, start_step: int = 0) -> list[list[Task]]:
    """Tasks dealt to workers: those with rows at or after ``start_step``, sorted by (first step,
    partition, number), task k of that list to worker k mod W. Only who builds a task changes
    with W, never what it holds."""
    m = global_batch // len(order.streams)
    need = [t for t in order.tasks if t.start + t.rows > start_step * m]
    need.sort(key=lambda t: (t.start // m, t.partition, t.number))
    out: list[list[Task]] = [[] for _ in range(workers)]
    for k, t in enumerate(need):
        out[k % workers].append(t)
    return out


def run_engine(order: EpochOrder, global_batch: int, workers: int, start_step: int = 0
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """The epoch from ``start_step`` as the engine would deliver it: every worker builds its tasks in
    schedule order into its own queue; the merger takes task k's blocks from worker k mod W's queue
    (waiting, never taking another's) and cuts micro-batches of every partition. Returns the rows,
    how many tasks read each row group, and the largest window (row groups held by one task)."""
    P = len(order.streams)
    m = global_batch // P
    per_worker = schedule(order, global_batch, workers, start_step)
    queues: list[list[tuple[Task, int, list[np.ndarray]]]] = [[] for _ in range(workers)]
    reads = np.zeros(len(order.unit_rows), dtype=np.int64)
    window = 0
    for w, tasks in enumerate(per_worker):
        for t in tasks:
            first, blocks, units = build_task(order, t, max(0, start_step * m - t.start))
            reads[list(units)] += 1
            window = max(window, len(units))
            queues[w].append((t, first, blocks))
    merged: list[list[np.ndarray]] = [[] for _ in range(P)]
    begin = [start_step * m] * P  # the partition row where each partition's merged rows begin
    heads = [0] * workers
    for k in range(sum(len(q) for q in queues)):
        t, first, blocks = queues[k % workers][heads[k % workers]]
        heads[k % workers] += 1
        if not merged[t.partition]:
            begin[t.partition] = t.start + first
        merged[t.partition] += blocks
    streams = [np.concatenate(b)[start_step * m - begin[p]:] if b else np.zeros(0, dtype=np.int64)
               for p, b in enumerate(merged)]
    steps = max(-(-(len(order.streams[p]) - start_step * m) // m) for p in range(P))
    rows = [s[i * m:(i + 1) * m] for i in range(max(steps, 0)) for s in streams]
    return (np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)), reads, window
