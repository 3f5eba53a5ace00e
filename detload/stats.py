"""`Stats`: what `Loader.stats()` returns — per-stage counts, totals and percentiles, queue
depths, and the stage that bounds throughput, with a plain-language explanation.

Also writes the Chrome trace-event file (opens in Perfetto or chrome://tracing).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._trace import STAGES, Tracer
from .errors import OptionError

__all__ = ["EpochReads", "Reads", "StageStats", "Stats", "summarize"]

# The worker stages that do a block's work (the verdict names the largest).
_WORKER_WORK = ("read", "convert", "select", "transform", "pack", "permute")
# Below this share of wall time spent waiting for data, the loader is keeping up.
FED_WAIT_FRACTION = 0.05


@dataclass(frozen=True)
class StageStats:
    name: str
    where: str          # worker, merger or consumer
    count: int
    total_s: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    busy: float         # total / (wall x threads running the stage): how saturated it is


@dataclass(frozen=True)
class EpochReads:
    """What the workers read for one epoch (of what this window saw)."""

    epoch: int
    row_groups_read: int     # read from the source (file or object store)
    row_groups_cached: int   # served by the row-group cache instead
    bytes_read: int          # column-chunk bytes of the row groups read from the source, from the footers
    rows_selected: int       # rows delivered to the training loop (with a filter: only selected rows)
    row_groups_skipped: int  # never read in any epoch: the filter pruned them at planning or selected none of their rows


@dataclass(frozen=True)
class Reads:
    """Bytes and row groups read, and rows selected: in all and per epoch.

    ``bytes_read`` is the column-chunk bytes (compressed, as the footers give them) of the
    requested columns of every row group read from the source, by the workers and, for a
    filter, by planning's selection pass (the filter's columns); the row-group cache's reads
    are not in it. ``planning`` is what planning did with the filter (`Loader.filter_stats`;
    empty without one), ``planning["bytes_read"]`` its share of the bytes.
    """

    bytes_read: int
    row_groups_read: int
    row_groups_cached: int
    row_groups_skipped: int
    rows_selected: int
    epochs: tuple[EpochReads, ...] = ()
    planning: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        out = (f"read {self.row_groups_read:,} row group(s) from the source ({size_text(self.bytes_read)} of "
               "column chunks), "
               f"{self.row_groups_cached:,} from the cache; {self.rows_selected:,} rows selected")
        if self.planning:
            p = self.planning
            out += (f"; filter: {self.row_groups_skipped:,} of {p.get('row_groups', 0):,} row groups skipped "
                    f"per epoch, selection pass {p.get('selection_pass', 0):,} row group(s) "
                    f"({size_text(p.get('bytes_read', 0))}) in {p.get('seconds', 0.0):.2f} s at planning, "
                    f"{p.get('selection_cached', 0):,} from the cache")
        if len(self.epochs) > 1:
            out += "; per epoch: " + ", ".join(
                f"{e.epoch}: {e.row_groups_read:,} read ({size_text(e.bytes_read)}), {e.row_groups_cached:,} "
                f"cached, {e.rows_selected:,} rows" for e in self.epochs)
        return out


def size_text(n: float) -> str:
    """``1.2 MB``: bytes in decimal units, three significant digits or so."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n):,} B"


def reads_of(tr: Tracer) -> Reads:
    planning = dict(tr.planning)
    skipped = int(planning.get("row_groups_skipped", 0))
    epochs = tuple(
        EpochReads(e, r[0], r[2], r[1], tr.epoch_rows.get(e, 0), skipped)
        for e, r in sorted({**{e: [0, 0, 0] for e in tr.epoch_rows}, **tr.reads}.items()))
    # Planning read its bytes before any mark: a window since one holds none of them.
    plan_bytes = 0 if tr.windowed else int(planning.get("bytes_read", 0))
    return Reads(
        bytes_read=sum(e.bytes_read for e in epochs) + plan_bytes,
        row_groups_read=sum(e.row_groups_read for e in epochs),
        row_groups_cached=sum(e.row_groups_cached for e in epochs),
        row_groups_skipped=skipped,
        rows_selected=sum(e.rows_selected for e in epochs),
        epochs=epochs,
        planning=planning,
    )


@dataclass(frozen=True)
class Stats:
    """A snapshot of the loader's stage timings since it was created (all epochs)."""

    wall_s: float
    batches: int
    rows: int
    workers: int
    pool: str
    stages: dict[str, StageStats]
    worker_queue_depth_mean: float
    ready_queue_depth_mean: float
    consumer_wait_fraction: float
    bottleneck: str       # a stage name from STAGES
    verdict: str
    startup_s: float = 0.0  # of wall_s: new pools' first batches (worker start-up, first block)
    #: Bytes and row groups read, row groups skipped and rows selected, in all and per epoch.
    reads: Reads = field(default_factory=lambda: Reads(0, 0, 0, 0, 0))
    _tracer: Tracer | None = field(default=None, repr=False, compare=False)

    @property
    def rows_per_s(self) -> float:
        """Rows per second of wall time after start-up."""
        active = self.wall_s - self.startup_s
        return self.rows / active if active > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("_tracer", None)
        d["rows_per_s"] = self.rows_per_s
        return d

    def table(self) -> str:
        lines = [f"{'stage':<18} {'where':<8} {'count':>7} {'total s':>8} {'busy':>6} "
                 f"{'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}"]
        for s in self.stages.values():
            if not s.count:
                continue
            mark = "  <- bound" if s.name == self.bottleneck else ""
            lines.append(f"{s.name:<18} {s.where:<8} {s.count:>7,} {s.total_s:>8.3f} {s.busy:>6.0%} "
                         f"{s.p50_ms:>8.3f} {s.p90_ms:>8.3f} {s.p99_ms:>8.3f} {s.max_ms:>8.3f}{mark}")
        start = f" (start-up {self.startup_s:.2f} s)" if self.startup_s else ""
        lines.append(f"wall {self.wall_s:.2f} s{start}, {self.batches:,} batches, {self.rows:,} rows "
                     f"({self.rows_per_s:,.0f} rows/s after start-up), {self.workers} {self.pool} worker(s); mean queue "
                     f"depth: worker {self.worker_queue_depth_mean:.2f} blocks, ready "
                     f"{self.ready_queue_depth_mean:.2f} batches; consumer waited "
                     f"{self.consumer_wait_fraction:.0%} of the time")
        lines.append(self.reads.line())
        lines.append(f"bound by: {self.bottleneck} -- {self.verdict}")
        return "\n".join(lines)

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the Chrome trace-event JSON of the recorded spans and queue depths."""
        if self._tracer is None or not self._tracer.enabled:
            raise OptionError("these stats carry no trace events: the loader was made with Pool(trace=False) "
                              "(or the Stats were built by hand); make it with Pool(trace=True) to write a trace")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self._tracer.chrome_trace(), f)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def summarize(tr: Tracer) -> Stats:
    wall = tr.wall_now()
    startup = min(tr.total["startup"], wall)
    # The consumer's shares leave start-up out: the training loop runs only after it.
    active = wall - startup
    W = max(tr.workers, 1)
    stages: dict[str, StageStats] = {}
    for name, where in STAGES.items():
        samples = np.fromiter(tr.samples[name], dtype=np.float64) * 1e3
        p = np.percentile(samples, [50, 90, 99]) if samples.size else np.zeros(3)
        threads = W if where == "worker" else 1
        span = wall if where != "consumer" or name == "startup" else active
        total = tr.total[name]
        n = tr.count[name]
        # Planning's selection pass ran before the wall clock: only the workers' share is busy time.
        busy_total = total - tr.planning_select_s if name == "select" else total
        stages[name] = StageStats(
            name, where, n, total, total / n * 1e3 if n else 0.0, float(p[0]), float(p[1]), float(p[2]),
            float(samples.max()) if samples.size else 0.0, busy_total / (span * threads) if span > 0 else 0.0,
        )
    n_depths, wq_sum, rq_sum = tr.depth_sums
    wq = float(wq_sum / n_depths) if n_depths else 0.0
    rq = float(rq_sum / n_depths) if n_depths else 0.0
    cw = stages["consumer_wait"].total_s / active if active > 0 else 0.0
    bottleneck, verdict = _bottleneck(stages, cw, W, tr.warm_total)
    return Stats(wall, tr.batches, tr.rows, tr.workers, tr.pool, stages, wq, rq, cw, bottleneck, verdict,
                 startup, reads_of(tr), tr)


def _bottleneck(st: dict[str, StageStats], consumer_wait: float, workers: int,
                warm: dict[str, float] | None = None) -> tuple[str, str]:
    if st["consumer_wait"].count == 0 and st["consumer_step"].count == 0:
        if st["startup"].count:
            return "startup", "only the first batch was consumed: everything so far was start-up"
        return "consumer_wait", "nothing was consumed yet"
    if consumer_wait < FED_WAIT_FRACTION:
        return "consumer_step", (
            f"the training loop's own work: it waited for data only {consumer_wait:.1%} of the time, "
            "so the loader keeps up and a faster loader would not help")
    worker_busy = sum(st[s].busy for s in _WORKER_WORK)
    merger_busy = st["stitch"].busy + st["hash"].busy
    cores = _cores()
    if worker_busy >= merger_busy:
        # Which worker stage: by its time after each worker's first block, which carries the
        # one-time costs (imports, first use of a code path) that would otherwise decide a short run.
        totals = {s: st[s].total_s for s in _WORKER_WORK}
        steady = {s: t - (warm or {}).get(s, 0.0) for s, t in totals.items()}
        if sum(steady.values()) > 0:
            totals = steady
        stage = max(totals, key=lambda s: totals[s])
        share = totals[stage] / max(sum(totals.values()), 1e-12)
        if worker_busy > 0.6:
            hint = (f"all {cores} cores are in use: faster storage/decoding or more cores would help"
                    if workers >= cores else f"more workers would help (this machine has {cores} cores)")
        else:
            hint = ("no stage is saturated: the consumer waits on latency -- raise Pool.prefetch, or check "
                    "the worker_queue_wait and merge_wait rows in the trace")
        return stage, (f"the consumer waited {consumer_wait:.0%} of the time; workers were busy "
                       f"{worker_busy:.0%}, {share:.0%} of it in {stage}; {hint}")
    stage = "hash" if st["hash"].total_s >= st["stitch"].total_s else "stitch"
    return stage, (f"the consumer waited {consumer_wait:.0%} of the time; the merger thread was busy "
                   f"{merger_busy:.0%}, mostly in {stage}")
