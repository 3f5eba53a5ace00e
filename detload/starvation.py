"""`starvation_check`: is the training step or the data path the bottleneck? One call answers it.

Runs the user's own step fed by the loader, then fed by the same batches replayed
from memory, and compares the two throughputs (the feed efficiency). Works with
NumPy or torch batches; torch is imported only if the caller already uses it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ._check import check_int
from .errors import OptionError
from .stats import _cores

__all__ = ["StarvationReport", "starvation_check"]

# Feed efficiency at or above this: the loader costs the step (almost) nothing.
FED = 0.95
STARVED = 0.80


@dataclass(frozen=True)
class StarvationReport:
    steps: int
    rows: int
    loader_seconds: float
    replay_seconds: float
    loader_rows_per_s: float
    replay_rows_per_s: float
    loader_steps_per_s: float
    replay_steps_per_s: float
    feed_efficiency: float        # loader throughput / replayed-from-memory throughput
    consumer_wait_fraction: float  # share of the loader phase spent waiting for the next batch
    bottleneck: str | None         # the loader's bounding stage (detload loaders only)
    verdict: str

    def __str__(self) -> str:
        return (f"fed by the loader: {self.loader_steps_per_s:,.1f} steps/s ({self.loader_rows_per_s:,.0f} rows/s); "
                f"replayed from memory: {self.replay_steps_per_s:,.1f} steps/s ({self.replay_rows_per_s:,.0f} rows/s)\n"
                f"feed efficiency {self.feed_efficiency:.2f}, waited for data {self.consumer_wait_fraction:.0%} "
                f"of the time\n{self.verdict}")


def _rows(batch: Any) -> int:
    n_items = getattr(batch, "n_items", None)  # detload.Packed, detload.torch.PackedTensors
    if n_items is not None:
        return int(n_items)
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    elif isinstance(batch, (tuple, list)):
        batch = batch[0] if batch else None
    if batch is None:
        return 0
    values = getattr(batch, "offsets", None)  # Ragged: rows = len(offsets) - 1
    if values is not None and not hasattr(batch, "shape"):
        return int(len(values)) - 1
    return int(len(batch))


def _sync() -> None:
    """Wait for queued GPU work, so a phase's time includes the steps it launched."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # pragma: no cover - a broken CUDA setup is not ours to report
        pass


def starvation_check(loader: Iterable[Any], step_fn: Callable[[Any], Any], steps: int = 200,
                     *, warmup: int = 5) -> StarvationReport:
    """Run ``step_fn(batch)`` for ``steps`` batches from ``loader``, then again on the same
    batches replayed from memory, and report both throughputs and a verdict.

    ``warmup`` batches are stepped first and not timed (worker start-up, compilation,
    allocator warm-up). The batches are kept (not copied) for the replay, so ``steps``
    batches must fit in memory. Any iterable of batches works; a detload ``Loader`` or
    ``TorchLoader`` also names its bounding stage, from its trace of the timed steps.
    Bad arguments, and a loader that runs out during the warm-up, raise OptionError.
    """
    steps = check_int("steps", steps, 1, what="batches to time")
    warmup = check_int("warmup", warmup, 0, what="batches stepped before timing")
    if not callable(step_fn):
        raise OptionError(f"step_fn must be a callable taking one batch, got {type(step_fn).__name__} {step_fn!r}")
    it = iter(loader)
    kept: list[Any] = []
    warmed = 0
    window = None
    # A detload Loader or TorchLoader: stats over the timed window only.
    mark_fn = getattr(loader, "stats_mark", None)
    stats_fn = getattr(loader, "stats", None)
    try:
        for _ in range(warmup):
            try:
                step_fn(next(it))
            except StopIteration:
                break
            warmed += 1
        _sync()
        mark = mark_fn() if callable(mark_fn) else None
        waited = 0.0
        clock = time.perf_counter
        t_start = clock()
        for _ in range(steps):
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                break
            waited += clock() - t0
            step_fn(batch)
            kept.append(batch)
        _sync()
        loader_s = clock() - t_start
        if mark is not None and callable(stats_fn):
            window = stats_fn(since=mark)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()  # a detload iteration stops its run and frees its blocks
    if not kept:
        raise OptionError(f"the loader ran out during the warm-up ({warmed} batch(es), warmup={warmup}): "
                         "nothing left to time; use a smaller warmup or a loader with more batches")
    t0 = time.perf_counter()
    for batch in kept:
        step_fn(batch)
    _sync()
    replay_s = time.perf_counter() - t0
    return _report(steps, len(kept), sum(_rows(b) for b in kept), loader_s, replay_s, waited,
                   window.bottleneck if window is not None else None, window.verdict if window is not None else "")


def _report(asked: int, n: int, rows: int, loader_s: float, replay_s: float, waited: float,
            bottleneck: str | None, detail: str) -> StarvationReport:
    """The report of recorded timings: ``n`` of the ``asked`` steps ran (``rows`` rows) in
    ``loader_s`` fed by the loader, of which ``waited`` in ``next()``, and in ``replay_s`` from
    memory; ``bottleneck`` and ``detail`` are the loader's own verdict on that window, if any.
    A pure function, so that the verdict's logic is tested on timings rather than on a machine."""
    eff = (replay_s / loader_s) if loader_s > 0 else 1.0
    wait = waited / loader_s if loader_s > 0 else 0.0
    verdict = _verdict(eff, wait, bottleneck, detail)
    if n < asked:
        verdict += f" (The loader ran out after {n} of the {asked} steps asked for; all {n} were timed.)"
    return StarvationReport(
        n, rows, loader_s, replay_s, rows / loader_s, rows / replay_s, n / loader_s, n / replay_s,
        eff, wait, bottleneck, verdict,
    )


def _verdict(eff: float, wait: float, bottleneck: str | None, detail: str) -> str:
    where = f" The loader's trace of these steps names `{bottleneck}`: {detail}." if bottleneck else ""
    if eff >= FED:
        return (f"The model step is the bottleneck: the loader costs it {max(0.0, 1 - eff):.0%} of its "
                "throughput. A faster data path would not speed training up.")
    if wait < 0.5 * (1 - eff):
        # Waiting explains less than half of the lost time: the steps themselves ran slower.
        return (f"The step ran at {eff:.0%} of its speed from memory, yet waited for data only {wait:.0%} of "
                f"the time: the loader's work competes with the step for the CPU (this machine has "
                f"{_cores()} cores). Fewer workers, or moving the step's CPU work elsewhere, may help; "
                "more workers would not.")
    if eff >= STARVED:
        return (f"Mild starvation: the step runs at {eff:.0%} of its speed from memory and waited for data "
                f"{wait:.0%} of the time.{where} More workers (up to the core count), pool='process' or a "
                "larger prefetch may close the gap.")
    return (f"The data path starves the step: it runs at {eff:.0%} of its speed from memory and waited for "
            f"data {wait:.0%} of the time.{where} Add workers (up to the core count), use pool='process', "
            "read fewer columns, or cache the data on local disk.")
