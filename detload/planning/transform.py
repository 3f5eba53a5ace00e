"""Planning a transform: its output schema (from the first row group), the check that a
transform not declared random gives the same output twice, and for ``rows="changes"``
the row-count pass whose counts become the units' rows.

It reads through the shared reader (detload._read) and runs the transform with the same
`TransformRunner` the workers use, so planning's cached outputs are the workers' hits.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .._cache.keys import specs_key
from .._filters.selection import Selection
from .._read import ReadConfig, ReadSettings, UnitReader, select_rows
from .._types import ColumnSpec, UnitColumns
from .._xform import (
    OUTPUT_FORMAT,
    TransformPlan,
    TransformRunner,
    _same,
    _same_rows,
    _where,
    call,
    check_output,
    output_specs,
)
from ..errors import EmptyDatasetError, OptionError
from ..plan import Range, Unit
from ..transform import Transform, TransformContext

__all__ = ["PlannedTransform", "plan_transform"]


class _Untimed:
    """Where planning's reads record their stage spans: nowhere (planning is traced as a whole)."""

    def __init__(self) -> None:
        self.units = self.source_reads = self.source_bytes = 0
        self.extra: dict[str, float] = {}

    def add(self, stage: str, t0: float, t1: float) -> None:
        pass


@dataclass
class PlannedTransform:
    plan: TransformPlan
    units: list[Unit] | None  # rows="changes": the units with the transform's row counts


def _identity(t: Transform, specs_key: str, partition_specs: Sequence[ColumnSpec]) -> str:
    # The input's bytes are decided by the file version (the entry's folder), the input columns'
    # specs and fills (specs_key), the Hive partition columns' types, and the filter's selection.
    parts = [[s.name, s.dtype, s.kind] for s in partition_specs]
    return f"transform/{OUTPUT_FORMAT}/{json.dumps(t.identity, sort_keys=True)}/{specs_key}/{json.dumps(parts)}"


def _select_of(cols: UnitColumns, r: Range, selections: Mapping[tuple[int, int], Selection] | None) -> UnitColumns:
    picked = selections.get((r.file, r.row_group)) if selections else None
    if picked is None:
        return cols
    return select_rows(cols, picked)


def _count_rows(plan: TransformPlan, cfg: ReadConfig, read_cfg: ReadSettings, ranges: Sequence[Range],
                selections: Mapping[tuple[int, int], Selection] | None, seed: int, threads: int) -> list[int]:
    """Each row group's output rows under ``plan`` (rows="changes"), in the order of ``ranges``:
    its cached output's, else read, selected and transformed (and kept, when cached).

    Runs in up to ``threads`` threads, like the filter's selection pass: each thread has its own
    reader and runner (as a thread worker does), and a count depends on its row group alone, so
    the counts are those of a sequential pass. The first failure in ``ranges`` order is raised.
    """
    if not ranges:
        return []
    local = threading.local()
    lanes: list[tuple[UnitReader, TransformRunner]] = []
    lock = threading.Lock()

    def count(r: Range) -> int:
        lane = getattr(local, "lane", None)
        if lane is None:
            lane = local.lane = (UnitReader(read_cfg), TransformRunner(plan, cfg), _Untimed())
            with lock:
                lanes.append(lane[:2])
        reader, runner, tm = lane
        got = runner.cached(cfg, r.file, r.row_group, tm)
        if got is None:
            cols = _select_of(reader.read(r.file, r.row_group, tm), r, selections)  # type: ignore[arg-type]
            picked = selections.get((r.file, r.row_group)) if selections else None
            got = runner.apply(cfg, cols, r.file, r.row_group, picked, seed, 0, tm)
        return len(next(iter(got.values())))

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(ranges)))) as ex:
            return list(ex.map(count, ranges))
    finally:
        for reader, runner in lanes:
            runner.close()
            reader.close()


def plan_transform(t: Transform, cfg: ReadConfig, units: Sequence[Unit],
                   selections: Mapping[tuple[int, int], Selection] | None, seed: int,
                   threads: int = 8) -> PlannedTransform:
    """Plan ``t`` over ``units`` (one whole row group each), reading through the shared reader
    with ``cfg`` (the columns as read, no transform).

    Infers the output schema from the first row group, reruns a deterministic transform on
    it to catch undeclared randomness, and for ``rows="changes"`` runs it over every row group
    (filling the cache, in up to ``threads`` threads) so that the plan counts its output rows.
    """
    sel_ids = {(u.ranges[0].file, u.ranges[0].row_group): u.selection for u in units if u.selection}
    skey = specs_key(cfg.specs, cfg.null_fill)
    identity = _identity(t, skey, [s for s in cfg.specs if s.partition])
    cached = t.cached and cfg.cache is not None
    # A cached transform keeps its output, not its input (as the workers' readers do).
    reader = UnitReader(dataclasses.replace(cfg, cache=None) if cached else cfg)
    tm = _Untimed()
    try:
        first = units[0].ranges[0]
        probe = TransformRunner(TransformPlan(t, (), identity, cached, None, sel_ids), cfg)

        def read(r: Range) -> UnitColumns:
            return _select_of(reader.read(r.file, r.row_group, tm), r, selections)  # type: ignore[arg-type]

        def run(r: Range, specs: Sequence[ColumnSpec] | None, cols: UnitColumns | None = None) -> UnitColumns:
            cols = read(r) if cols is None else cols
            picked = selections.get((r.file, r.row_group)) if selections else None
            ref = cfg.files[r.file]
            where = _where(ref.path, r.row_group)
            ctx = TransformContext(file=ref.path, file_index=r.file, row_group=r.row_group,
                                   rows=len(next(iter(cols.values()))),
                                   selected=picked.indices() if picked is not None else None, seed=seed, epoch=0,
                                   random=t.random)
            out = check_output(t, call(t, cols, ctx, where), where, specs)
            if t.rows == "same":
                _same_rows(t, len(next(iter(out.values()))), ctx.rows, where)
            return out

        # The first row group decides the schema (from the cache when a warm loader has it there).
        try:
            hit = probe.lookup(first.file, first.row_group)
            out0 = None if hit is None else check_output(t, hit, _where(cfg.files[first.file].path,
                                                                        first.row_group), None)
        finally:
            probe.close()
        if out0 is None:
            cols0 = read(first)
            out0 = run(first, None, cols0)
            if not t.random:
                again = run(first, None, cols0)  # the same input: fn saw read-only views of it
                diff = _same(out0, again)
                if diff is not None:
                    raise OptionError(
                        f"transform {t.name!r} is not declared random, but two runs on the same row group "
                        f"({_where(cfg.files[first.file].path, first.row_group)}) gave different {diff}: pass "
                        "random=True and draw from ctx.rng, so that its draws are seeded per (seed, epoch, "
                        "file, row group); a deterministic transform must give the same output for the same input")
        specs = output_specs(out0)
        plan = TransformPlan(t, specs, identity, cached, None, sel_ids)
        filled = TransformRunner(plan, cfg)
        try:
            if hit is None:
                filled.keep(first.file, first.row_group, out0)
        finally:
            filled.close()
        if t.rows == "same":
            return PlannedTransform(plan, None)
        # rows="changes": count every row group's output; the workers' runs are checked against it.
        rest = [u.ranges[0] for u in units if u.ranges[0] != first]
        got_n = dict(zip(rest, _count_rows(plan, cfg, reader.cfg, rest, selections, seed, threads)))
        got_n[first] = len(next(iter(out0.values())))
        counts: dict[tuple[int, int], int] = {}
        new_units: list[Unit] = []
        for u in units:
            r = u.ranges[0]
            n = got_n[r]
            counts[(r.file, r.row_group)] = n
            if n:
                new_units.append(Unit((Range(r.file, r.row_group, 0, n),), (), u.selection))
        if not new_units:
            raise EmptyDatasetError(f"transform {t.name!r} (rows='changes') returned no row for any of the "
                                    f"{len(units)} row group(s)")
        return PlannedTransform(TransformPlan(t, specs, identity, cached, counts, sel_ids), new_units)
    finally:
        reader.close()
