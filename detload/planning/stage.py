"""The planning stage: a discovered dataset and the options that decide the batches, in; one
frozen `Planned` value out.

`column_specs` types the requested columns (checked before anything is written, a cache
folder included); `plan` runs the passes in their fixed order (docs/determinism.md): the
filter's pruning and selection pass (_filters.planning), the group pass (groups.py), the
transform's plan (transform.py), then the order identity (`order`, `fingerprint`). The
loader asks for this value and runs it; the epoch's plan is `Planned.epoch_plan`.
"""

from __future__ import annotations

import dataclasses
import json
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import xxhash

from .._arrow import fill_value
from .._cache import object_key
from .._discovery import Dataset
from .._filters.selection import Selection
from .._read import FileRef, ReadConfig
from .._storage import object_uri
from .._types import SCALED, ColumnSpec, split_cast, type_mapping_version
from .._xform import TransformFailed, TransformPlan
from ..errors import OptionError, WorkerError
from ..plan import OrderOptions, Plan, UnitList
from ..transform import Transform
from .order import check_partitions, make_plan
from .transform import plan_transform

if TYPE_CHECKING:  # imported when a filter or group_by is given (below): they import pyarrow.compute
    from .._filters.canonical import Filter
    from .._filters.planning import FilteredUnits, FilterStats
    from .groups import GroupStats

__all__ = ["Planned", "column_specs", "file_refs", "plan"]


@dataclass(frozen=True)
class Planned:
    """Everything planning decided, before any worker starts: the dataset and its files, the
    units with their selections and groups, the delivered columns, and the order identity.

    ``options`` has ``group_batches`` set when ``group_by`` is; ``specs`` are the columns as
    read, ``block_specs`` what blocks hold (the transform's output, else ``specs``).
    """

    dataset: Dataset
    files: tuple[FileRef, ...]
    options: OrderOptions
    specs: tuple[ColumnSpec, ...]
    null_fill: Mapping[str, Any]
    cast: Mapping[str, str]
    units: UnitList
    #: A filter's selection: (file index, row group) -> the stored rows it delivers.
    selections: Mapping[tuple[int, int], Selection] | None
    filter: Filter | None
    filter_stats: FilterStats | None
    #: (planning thread, start, end) of each row group's selection pass, for the trace.
    select_spans: Sequence[tuple[int, float, float]]
    group_by: str | None
    group_columns: tuple[str, ...]
    max_group_items: int | None
    group_stats: GroupStats | None
    transform: Transform | None
    xform: TransformPlan | None
    #: Every option that decides which rows are delivered (the manifest header's and the
    #: state's ``order``), and its hash.
    order: Mapping[str, Any]
    fingerprint: str

    @property
    def block_specs(self) -> tuple[ColumnSpec, ...]:
        """The delivered columns: the transform's output, else the columns read."""
        return self.xform.specs if self.xform is not None else self.specs

    def epoch_plan(self, epoch: int, rank: int) -> Plan:
        """Epoch ``epoch``'s plan for ``rank`` (a pure function of this value)."""
        return make_plan(self.units, self.options, epoch=epoch, rank=rank, dataset_fingerprint=self.fingerprint)


def file_refs(dataset: Dataset) -> tuple[FileRef, ...]:
    """The dataset's files as readers check them, each with its version's row-group cache key."""
    fs = dataset.filesystem
    return tuple(FileRef(f.location, f.path, f.partition_values, f.row_groups,
                         object_key(fs, f.location, f.size, f.mtime_ns, f.etag), object_uri(fs, f.location),
                         f.size, f.etag, f.mtime_ns)
                 for f in dataset.files)


def column_specs(dataset: Dataset, columns: Sequence[str] | None, null_fill: Mapping[str, Any],
                 cast: Mapping[str, str]) -> tuple[ColumnSpec, ...]:
    """How each requested column is delivered, with ``null_fill`` checked against the columns."""
    specs = dataset.specs(columns, cast, filled=null_fill.keys())
    names = [s.name for s in specs]
    unknown_fill = [k for k in null_fill if k not in names]
    if unknown_fill:
        raise OptionError(f"null_fill names {unknown_fill}, which are not among the loaded columns {names}")
    for spec in specs:
        if spec.name in null_fill:
            _check_fill(spec, dataset, null_fill[spec.name])
    return tuple(specs)


def plan(dataset: Dataset, files: tuple[FileRef, ...], specs: tuple[ColumnSpec, ...], options: OrderOptions, *,
         null_fill: Mapping[str, Any], cast: Mapping[str, str], filter: Any = None,  # noqa: A002
         group_by: Any = None, group_columns: Any = None, max_group_items: Any = None,
         transform: Transform | None = None, cache: Any = None, footers: list[Any] | None = None) -> Planned:
    """Run the planning passes over ``dataset`` and return their frozen result.

    ``files`` from `file_refs`, ``specs`` from `column_specs`; ``cache`` the opened row-group
    cache (a `CacheConfig`) or None; ``footers`` what discovery read (``discover(footers=[])``),
    so that a filter's planning reads no footer again.
    """
    keys = [f.cache_key for f in files]
    names = [s.name for s in specs]
    flt: Filter | None = None
    chosen: FilteredUnits | None = None
    if filter is not None:
        # Import cost, not a cycle: pyarrow.compute and pyarrow.dataset, only for a filter.
        from .._filters.canonical import parse_filter
        from .._filters.planning import filter_units

        # Typed against the promoted types, so a literal that fits the dataset's column
        # (not only the first file's narrower type) is accepted and compared as such.
        flt = parse_filter(filter, dataset.typed_schema(), dict(dataset.partition_types))
        _check_filter_columns(dataset, flt.stored_columns)
        # Row groups are pruned and the selection pass runs now, so that the plan is exact:
        # len(), partitions and resume count the selected rows.
        chosen = filter_units(dataset, flt, cache=cache, cache_keys=keys, footers=footers)
        units = UnitList(chosen.units)
    else:
        fi, rg, rows = dataset.units()
        units = UnitList.from_row_groups(fi, rg, rows)
    selections = chosen.selections if chosen is not None else None

    g_by: str | None = None
    g_cols: tuple[str, ...] = ()
    g_max: int | None = None
    g_stats: GroupStats | None = None
    if group_by is not None and options.order == "mix":
        raise OptionError(
            f"group_by={group_by!r} is not available with order=\"mix\": the mixed "
            "order permutes rows across a task, not whole groups. Pass order=\"windowed\" (and "
            "shuffle_window=N, default 4) to load whole groups")
    if group_by is not None:
        # Import cost, not a cycle: pyarrow.compute, only for group_by.
        from .groups import check_group_options, group_units

        m = options.micro_batch
        g_by, g_cols, g_max = check_group_options(dataset, names, group_by, group_columns, max_group_items, m)
        grouped = group_units(dataset, g_by, units.units, selections=selections, micro_batch=m,
                              batch_size=options.batch_size, world_size=options.world_size,
                              partitions=options.partitions, max_group_items=g_max, cache=cache, cache_keys=keys)
        units = UnitList(grouped.units)
        g_stats = grouped.stats
        options = dataclasses.replace(options, group_batches=True)
    elif group_columns is not None or max_group_items is not None:
        raise OptionError("group_columns and max_group_items apply with group_by=, which is not set")

    xform: TransformPlan | None = None
    if transform is not None:
        if g_by is not None and transform.rows == "changes":
            raise OptionError(
                f"transform {transform.name!r} has rows='changes', which group_by= does not allow: the "
                f"groups of {g_by!r} are planned from the stored rows, so a transform under "
                "group_by must keep every row and the key (use rows='same')")
        read = ReadConfig(files, dataset.filesystem, specs, null_fill, cache=cache)
        try:
            planned = plan_transform(transform, read, units.units, selections, options.seed)
        except TransformFailed as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            raise WorkerError(f"planning failed: {exc}\n\nTraceback:\n{tb}", traceback=tb) from exc.__cause__
        xform = planned.plan
        if planned.units is not None:
            units = UnitList(planned.units)
    # Now, not at the first len() or iteration: the bound is known once the units are.
    check_partitions(units, options)
    if options.order == "mix":
        # Resolved from the final units (after a filter or transform), so that the order, the
        # state and the manifest header record the window and block size the plans use.
        from .mix import resolve_mix

        options = resolve_mix(options, units.rows)

    order: dict[str, Any] = {
        **options.order_dict(),
        "columns": names,
        "null_fill": {k: _jsonable(v) for k, v in sorted(null_fill.items())},
        # 1 unless an INT96 column is loaded, so that other datasets keep their states.
        "type_mapping": type_mapping_version(list(specs)),
        "plan_format": options.plan_format,
        "dataset": dataset.fingerprint,
        # The units the plan cuts into partitions; the fingerprint covers them through this.
        "units_digest": units.digest,
    }
    drift = {s.name: _drift_record(s) for s in specs if s.drift or s.missing}
    if drift:  # only when files drift: other loaders keep their fingerprints
        order["schema_drift"] = drift
    if cast:  # only when given: loaders without a cast keep their fingerprints
        order["cast"] = dict(sorted(cast.items()))
    if flt is not None:  # likewise: unfiltered loaders keep their order and fingerprint
        # A long isin list enters as its hash (the manifest header keeps it whole).
        order["filter"] = json.dumps(flt.order_value(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if g_by is not None:  # likewise: ungrouped loaders keep their order and fingerprint
        order["group_by"] = g_by
        order["group_columns"] = list(g_cols)
        if g_max is not None:
            order["max_group_items"] = g_max
    if transform is not None:  # likewise: loaders without a transform keep their fingerprints
        order["transform"] = transform.identity
    return Planned(
        dataset=dataset, files=files, options=options, specs=specs, null_fill=null_fill, cast=cast, units=units,
        selections=selections, filter=flt, filter_stats=chosen.stats if chosen is not None else None,
        select_spans=chosen.spans if chosen is not None else (), group_by=g_by, group_columns=g_cols,
        max_group_items=g_max, group_stats=g_stats, transform=transform, xform=xform, order=order,
        fingerprint=xxhash.xxh3_128_hexdigest(json.dumps(order, sort_keys=True).encode()))


def _check_fill(spec: ColumnSpec, dataset: Dataset, value: Any) -> None:
    """Reject a null_fill value that does not fit its column now, not at the first null."""
    if spec.partition:
        t = pa.int64() if spec.kind == "fixed" else pa.string()
    else:
        t = dataset.column_type(spec.name)
    if pa.types.is_dictionary(t):
        t = t.value_type
    if spec.cast is not None and split_cast(spec.cast)[1] and not pa.types.is_fixed_size_list(t):
        # A variable-length list takes a fill of any length; the shaped cast would refuse it
        # at the first null row, so refuse it now (a fixed-size list's own type checks it).
        width = int(np.prod(spec.inner, dtype=np.int64))
        n = len(value) if isinstance(value, (list, tuple, np.ndarray)) else None
        if n != width:
            what = f"holds {n} value(s)" if n is not None else "is not a list"
            raise OptionError(f"null_fill[{spec.name!r}] = {value!r} {what}, but cast[{spec.name!r}] = "
                              f"{spec.cast!r} needs {width} values in every row")
    target = _cast_target(spec, t)
    if fill_value(t, value) is not None and (target is None or fill_value(target, value) is not None):
        return  # fits (the cast too), decided without pa.scalar (which imports pandas: see _arrow.py)
    try:
        scalar = pa.scalar(value, type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise OptionError(f"null_fill[{spec.name!r}] = {value!r} does not fit the column's type {t}: {exc}") from None
    if target is not None:
        try:
            scalar.cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise OptionError(f"null_fill[{spec.name!r}] = {value!r} does not fit {spec.cast}, which "
                              f"cast[{spec.name!r}] asks for: {exc}") from None


def _drift_record(spec: ColumnSpec) -> dict[str, Any]:
    """The order's record of a column that files drift on: the type delivered, from what."""
    out: dict[str, Any] = {"type": spec.arrow_type}
    if spec.drift:
        out["from"] = list(spec.drift)
    if spec.missing:
        out["missing"] = "null_fill"
    return out


def _check_filter_columns(dataset: Dataset, stored: Sequence[str]) -> None:
    """Refuse a filter on a column some files lack: the selection pass reads stored values,
    and a fill is the delivered value, not a stored one."""
    for name in stored:
        d = dataset.drift(name)
        if d is not None and d.missing:
            raise d.lacked_error("the filter reads column", "a filter compares stored values only", "Filter on")


def _cast_target(spec: ColumnSpec, t: Any) -> Any:
    """The Arrow type a cast integer or timestamp column is checked against, else None."""
    if spec.cast is None or spec.cast == SCALED or not (pa.types.is_integer(t) or pa.types.is_timestamp(t)):
        return None
    dt = np.dtype(spec.dtype)
    return pa.timestamp(np.datetime_data(dt)[0], tz=t.tz) if dt.kind == "M" else pa.from_numpy_dtype(dt)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.generic,)):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("latin-1")
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v
