"""Stage tracing: spans of every pipeline stage and queue depths over time, recorded cheaply.

Workers time their own stages and send the spans along with each block; the
merger thread records them together with its own, the consumer records its
waits. Each stage is written by exactly one thread, so recording takes no lock.
Memory is bounded: recent spans live in rings, everything else in running sums.
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

__all__ = ["CONSUMER", "MAX_DEPTHS", "MAX_EVENTS", "MAX_SAMPLES", "MERGER", "PLANNING", "STAGES", "StatsMark",
           "Tracer"]

# Where each stage runs, in pipeline order.
STAGES: dict[str, str] = {
    "worker_startup": "worker",     # a worker's one-time start: imports (pyarrow.compute) before its first block
    "cache_read": "worker",         # a row group served by the local row-group cache
    "read": "worker",               # pyarrow read_row_group: file I/O and Parquet decoding
    "convert": "worker",            # Arrow -> NumPy
    "select": "worker",             # a filter: planning's selection pass, and the workers' gather of its rows
    "transform": "worker",          # the loader's transform= on a row group (not when its output is cached)
    "cache_write": "worker",        # storing a converted row group in the cache
    "pack": "worker",               # the mixed order: a row group copied into its window's pack (memory or spill file)
    "permute": "worker",            # assembling the block into its buffer in permuted row order
    "window_wait": "worker",        # the mixed order: waiting for row groups another worker converts
    "worker_queue_wait": "worker",  # blocked on the worker's own full queue (the merger is behind)
    "merge_wait": "merger",         # waiting for the next block of the plan from its worker
    "stitch": "merger",             # cutting a batch: a view, or a copy where it spans blocks
    "hash": "merger",               # xxh3-128 of the batch for the manifest
    "merge_output_wait": "merger",  # blocked on the full ready queue (the consumer is behind)
    "startup": "consumer",          # a new pool's first batch: workers starting, then its first block
    "consumer_wait": "consumer",    # the training loop waiting for its next batch
    "consumer_step": "consumer",    # the training loop holding a batch (its own work)
}

MERGER = -1
CONSUMER = -2
PLANNING = -100  # planning thread k (a filter's selection pass) is track PLANNING - k
# Every buffer below is a ring of the most recent entries, so a loader's memory stays
# flat however many epochs it runs (about 136 B an event, 32 B a sample, 170 B a depth
# sample: at most ~1.7 MiB in all, measured flat within 5 MiB over a 200-epoch soak);
# counts, totals and depth means are running sums.
MAX_EVENTS = 8_192    # spans for the trace file
MAX_SAMPLES = 512     # durations per stage, for percentiles
MAX_DEPTHS = 2_048    # queue-depth samples for the trace file
#: What `Tracer.mark` returns (`Loader.stats_mark`): opaque to users, passed back to ``since``.
StatsMark = tuple[Any, ...]


class Tracer:
    """Counts and totals per stage since the start, and rings of recent samples, events and
    queue depths. ``enabled=False`` keeps only the counts, totals and depth sums: no rings.

    Each worker's first block after a pool starts carries its one-time costs (lazy imports,
    first use of a code path); its spans are also summed apart (``warm_total``) so that
    the verdict can leave them out.
    """

    def __init__(self, max_events: int = MAX_EVENTS, *, enabled: bool = True) -> None:
        self.origin = time.perf_counter()
        self.pid = os.getpid()
        self.enabled = enabled
        self.count: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.total: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.warm_total: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        keep = max_events if enabled else 0
        self.samples: dict[str, deque[float]] = {s: deque(maxlen=MAX_SAMPLES if keep else 0) for s in STAGES}
        # (stage, track, start, end, pid); track: worker index, MERGER or CONSUMER.
        self.events: deque[tuple[str, int, float, float, int]] = deque(maxlen=keep)
        # (time, worker queue depths, ready-queue depth)
        self.depths: deque[tuple[float, tuple[int, ...], int]] = deque(maxlen=min(keep, MAX_DEPTHS))
        # Running sums for the mean queue depths: (samples, sum of mean worker depth, sum of ready depth).
        self.depth_sums: list[float] = [0, 0.0, 0.0]
        self.wall = 0.0          # seconds during which a run was active (closed runs)
        self._open_since: float | None = None
        self.workers = 0
        self.pool = ""
        self.batches = 0
        self.rows = 0
        self.worker_pids: dict[int, int] = {}  # worker index -> pid: at most one entry per worker
        # Per epoch, written by the merger: [row groups read from the source, their column-chunk
        # bytes (from the footers), row groups served by the cache]; and rows delivered, by the consumer.
        self.reads: dict[int, list[int]] = {}
        self.epoch_rows: dict[int, int] = {}
        # What planning did with a filter (FilterStats.as_dict), set once before any run, and the
        # seconds of "select" spans it recorded (its threads ran before the wall clock starts).
        self.planning: dict[str, Any] = {}
        self.planning_select_s = 0.0
        self.windowed = False  # made by `since`: planning happened before the window
        # (time, row groups read, bytes read) running totals, for the trace's counters.
        self.read_totals: deque[tuple[float, int, int]] = deque(maxlen=min(keep, MAX_DEPTHS))
        self._first_block: set[int] = set()    # workers of the current pool still to hand over a block

    def keep_events(self, n: int) -> None:
        """Keep the ``n`` most recent spans from now on (a trace file of a whole benchmark)."""
        if self.enabled:
            self.events = deque(self.events, maxlen=n)
            self.depths = deque(self.depths, maxlen=n)

    # -- recording (one writer thread per stage) ---------------------------
    def span(self, stage: str, track: int, t0: float, t1: float, pid: int = 0) -> None:
        d = t1 - t0
        self.count[stage] += 1
        self.total[stage] += d
        if self.enabled:
            self.samples[stage].append(d)
            self.events.append((stage, track, t0, t1, pid or self.pid))

    def planned(self, spans: Any, planning: dict[str, Any]) -> None:
        """A filter's planning: its selection pass's (thread, start, end) spans, traced as the
        "select" stage (one-time costs, like a worker's first block), and what it did."""
        self.planning = dict(planning)
        for lane, t0, t1 in spans:
            self.span("select", PLANNING - lane, t0, t1)
            self.warm_total["select"] += t1 - t0
            self.planning_select_s += t1 - t0

    def block_reads(self, epoch: int, row_groups: int, nbytes: int, cached: int) -> None:
        """A block's reads (merger thread): row groups read from the source, their column-chunk
        bytes, and row groups the cache served."""
        r = self.reads.get(epoch)
        if r is None:
            r = self.reads[epoch] = [0, 0, 0]
        r[0] += row_groups
        r[1] += nbytes
        r[2] += cached
        if self.enabled and row_groups:
            last = self.read_totals[-1] if self.read_totals else (0.0, 0, 0)
            self.read_totals.append((time.perf_counter(), last[1] + row_groups, last[2] + nbytes))

    def delivered(self, epoch: int, rows: int) -> None:
        """A batch of ``rows`` rows of ``epoch`` handed to the training loop (consumer thread)."""
        self.batches += 1
        self.rows += rows
        self.epoch_rows[epoch] = self.epoch_rows.get(epoch, 0) + rows

    def pool_started(self, workers: int) -> None:
        """A new pool: each worker's next block is its first, one-time costs included."""
        self._first_block = set(range(workers))

    def worker_spans(self, w: int, spans: Any, pid: int) -> None:
        if pid:
            self.worker_pids[w] = pid
        first = w in self._first_block
        if first:
            self._first_block.discard(w)
        for stage, t0, t1 in spans:
            self.span(stage, w, t0, t1, pid)
            if first:
                self.warm_total[stage] += t1 - t0

    def depth(self, t: float, workers: tuple[int, ...], ready: int) -> None:
        sums = self.depth_sums
        sums[0] += 1
        if workers:
            sums[1] += sum(workers) / len(workers)
        sums[2] += ready
        if self.enabled:
            self.depths.append((t, workers, ready))

    def run_started(self, workers: int, pool: str) -> None:
        self.workers, self.pool = workers, pool
        if self._open_since is None:
            self._open_since = time.perf_counter()

    def run_ended(self) -> None:
        if self._open_since is not None:
            self.wall += time.perf_counter() - self._open_since
            self._open_since = None

    def wall_now(self) -> float:
        extra = time.perf_counter() - self._open_since if self._open_since is not None else 0.0
        return self.wall + extra

    # -- windows -----------------------------------------------------------------
    def mark(self) -> StatsMark:
        """A point to measure from: pass it to `since`."""
        return (time.perf_counter(), self.wall_now(), dict(self.count), dict(self.total), self.batches, self.rows,
                dict(self.warm_total), list(self.depth_sums), {e: list(r) for e, r in self.reads.items()},
                dict(self.epoch_rows), self.planning_select_s)

    def since(self, mark: StatsMark) -> Tracer:
        """A tracer holding only what was recorded after ``mark`` (spans that ended after it)."""
        t, wall, count, total, batches, rows, warm, depth_sums, reads, epoch_rows, planning_s = mark
        out = Tracer(enabled=self.enabled)
        out.origin, out.pid = self.origin, self.pid
        out.windowed = True
        out.count = {s: self.count[s] - count[s] for s in STAGES}
        out.total = {s: self.total[s] - total[s] for s in STAGES}
        out.warm_total = {s: self.warm_total[s] - warm[s] for s in STAGES}
        out.depth_sums = [a - b for a, b in zip(self.depth_sums, depth_sums)]
        for s in STAGES:
            n = min(out.count[s], len(self.samples[s]))
            if n:
                out.samples[s].extend(list(self.samples[s])[-n:])
        out.events.extend(e for e in list(self.events) if e[3] >= t)
        out.depths.extend(d for d in list(self.depths) if d[0] >= t)
        out.wall = self.wall_now() - wall
        out.workers, out.pool, out.worker_pids = self.workers, self.pool, dict(self.worker_pids)
        out.batches, out.rows = self.batches - batches, self.rows - rows
        for e, r in list(self.reads.items()):
            was = reads.get(e, [0, 0, 0])
            if r != was:
                out.reads[e] = [a - b for a, b in zip(r, was)]
        for e, n in list(self.epoch_rows.items()):
            if n != epoch_rows.get(e, 0):
                out.epoch_rows[e] = n - epoch_rows.get(e, 0)
        # What planning did describes the plan of every window; its spans, before any mark, are in none.
        out.planning = dict(self.planning)
        out.planning_select_s = self.planning_select_s - planning_s
        out.read_totals.extend(x for x in list(self.read_totals) if x[0] >= t)
        return out

    # -- trace file ------------------------------------------------------------
    def chrome_trace(self) -> dict[str, Any]:
        """Chrome trace-event format: complete ("X") events per stage and track, counter ("C")
        events for queue depths, and metadata ("M") events naming processes and threads."""
        us = 1e6
        o = self.origin
        out: list[dict[str, Any]] = []
        names: dict[tuple[int, int], str] = {}
        for stage, track, t0, t1, pid in list(self.events):
            tid = _tid(track)
            names.setdefault((pid, tid), _track_name(track))
            out.append({"name": stage, "cat": STAGES[stage], "ph": "X", "ts": round((t0 - o) * us, 3),
                        "dur": round(max(t1 - t0, 0.0) * us, 3), "pid": pid, "tid": tid})
        for t, wq, rq in list(self.depths):
            args = {f"worker {i}": d for i, d in enumerate(wq)}
            out.append({"name": "worker queue depth (blocks)", "ph": "C", "ts": round((t - o) * us, 3),
                        "pid": self.pid, "tid": 0, "args": args})
            out.append({"name": "ready queue depth (batches)", "ph": "C", "ts": round((t - o) * us, 3),
                        "pid": self.pid, "tid": 0, "args": {"ready": rq}})
        for t, groups, nbytes in list(self.read_totals):
            out.append({"name": "read from the source (since the start)", "ph": "C", "ts": round((t - o) * us, 3),
                        "pid": self.pid, "tid": 0, "args": {"row groups": groups, "column-chunk MB": nbytes / 1e6}})
        meta: list[dict[str, Any]] = []
        for pid in sorted({p for p, _ in names} | {self.pid}):
            label = "detload consumer process" if pid == self.pid else f"detload worker process (pid {pid})"
            meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        for (pid, tid), label in sorted(names.items()):
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}})
        # The trace format's free-form "otherData": the reads per epoch and what planning did.
        reads = {str(e): {"row_groups_read": r[0], "bytes_read": r[1], "row_groups_cached": r[2],
                          "rows_selected": self.epoch_rows.get(e, 0),
                          "row_groups_skipped": int(self.planning.get("row_groups_skipped", 0))}
                 for e, r in sorted(self.reads.items())}
        other = {"reads_per_epoch": reads, "planning": self.planning}
        return {"traceEvents": meta + out, "displayTimeUnit": "ms", "otherData": other}


def _tid(track: int) -> int:
    if track <= PLANNING:
        return 1000 + PLANNING - track
    if track == CONSUMER:
        return 1
    if track == MERGER:
        return 2
    return 10 + track


def _track_name(track: int) -> str:
    if track <= PLANNING:
        return f"planning thread {PLANNING - track} (selection pass)"
    if track == CONSUMER:
        return "consumer (training loop)"
    if track == MERGER:
        return "merger"
    return f"worker {track}"
