"""The mixing report: how well an epoch's order mixes, beside an i.i.d. shuffle of the same rows.

`epoch_rows` gives the global row ids a rank delivers, in order, from the plan alone (no data
read); `mixing_report` measures per batch the distinct source row groups and files, a chosen
column's values and their distance from the epoch's mix, and how far each row group is spread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._check import check_int
from .._drift import same_form
from .._read.parquet import open_parquet, read_row_group
from .._storage import object_uri
from .._streams import _entropy, _stream_permutation, block_permutation, group_permutation, group_row_order
from ..errors import OptionError
from ..plan import Block, Plan, Unit, UnitList

if TYPE_CHECKING:
    from .._filters.selection import Selection
    from .stage import Planned

__all__ = ["MAX_BATCHES", "MAX_VALUES", "QUANTILE_BINS", "TAG_MIX_IID", "epoch_rows", "mixing_report",
           "report_lines", "step_offsets"]

#: Batches measured at most: a longer epoch is measured on this many batches, evenly spaced
#: (the first and the last full batch among them), which bounds the report's work.
MAX_BATCHES = 1024
#: A column with at most this many distinct values is measured value by value; with more, a
#: numeric column is cut into `QUANTILE_BINS` quantile bins, another one keeps its most
#: frequent ``MAX_VALUES - 1`` values and pools the rest.
MAX_VALUES = 64
QUANTILE_BINS = 20
# Largest batches x codes table counted densely (8 M counters, 64 MiB); beyond, a sort.
_DENSE = 1 << 23
#: The i.i.d. reference's stream: ``[TAG_MIX_IID, seed_lo32, seed_hi32, epoch, rank]``. It is
#: no part of any order; it only fixes the yardstick the report prints.
TAG_MIX_IID = 0x4D58_4949  # "MXII"


# -- the rows of the epoch ----------------------------------------------------------------------

def _step_sizes(plan: Plan) -> np.ndarray:
    return np.fromiter((plan.step_rows(s) for s in range(plan.steps)), dtype=np.int64, count=plan.steps)


def step_offsets(plan: Plan) -> np.ndarray:
    """Where each step's rows begin in `epoch_rows` (``steps + 1`` values, the last its length)."""
    return np.concatenate([[0], np.cumsum(_step_sizes(plan))]).astype(np.int64)


def _unit_starts(units: UnitList) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(units.rows)[:-1]]).astype(np.int64)


def _piece_offset(piece: Unit, source: Unit) -> int:
    """Where ``piece`` (a source unit, or a part a partition boundary cut from it) begins in its
    source's delivered rows."""
    if piece is source or piece.ranges == source.ranges:
        return 0
    first = piece.ranges[0]
    pos = 0
    for r in source.ranges:
        if (r.file, r.row_group) == (first.file, first.row_group) and r.first <= first.first < r.first + r.rows:
            return pos + first.first - r.first
        pos += r.rows
    raise AssertionError(f"piece {piece!r} is not part of its source unit {source!r}")


class _WindowedRows:
    """Row ids of a format-2 plan's streams, computed from its blocks and their permutations
    exactly as the workers order them (`_engine.groups.block_order`): only the blocks asked
    for, each once while its steps are being asked for (steps come in increasing order)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.starts = _unit_starts(plan.units)
        self.block_starts = [np.asarray([b.start for b in part], dtype=np.int64) for part in plan.blocks]
        self.cache: dict[int, dict[int, np.ndarray]] = {p: {} for p in plan.owned_partitions}

    def pieces(self, b: Block) -> list[tuple[int, int]]:
        """The block's pieces before its permutation, as (first global row id, rows)."""
        src = self.plan.units.units
        return [(int(self.starts[s]) + _piece_offset(u, src[s]), u.rows) for u, s in zip(b.units, b.sources)]

    def block_ids(self, b: Block) -> np.ndarray:
        ids = np.concatenate([np.arange(n, dtype=np.int64) + a for a, n in self.pieces(b)])
        opts = self.plan.options
        if not opts.shuffle:
            return ids
        if self.plan.group_bounds is None:
            return ids[block_permutation(opts.seed, self.plan.epoch, b.partition, b.number, b.rows)]
        starts = np.asarray(b.group_starts, dtype=np.int64)
        order = group_permutation(opts.seed, self.plan.epoch, b.partition, b.number, len(starts))
        return ids[group_row_order(starts, b.rows, order)]

    def slice(self, p: int, lo: int, hi: int) -> list[np.ndarray]:
        """Rows ``[lo, hi)`` of partition ``p``'s stream."""
        blocks = self.plan.blocks[p]
        i = int(np.searchsorted(self.block_starts[p], lo, side="right")) - 1
        cache = self.cache[p]
        for k in [k for k in cache if k < i]:  # earlier blocks are never asked for again
            del cache[k]
        out = []
        while lo < hi:
            b = blocks[i]
            if i not in cache:
                cache[i] = self.block_ids(b)
            end = min(hi, b.end)
            out.append(cache[i][lo - b.start : end - b.start])
            lo = end
            i += 1
        return out

    def steps(self, steps: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """Each of ``steps``' rows (this rank's partitions in order, as the merger cuts them)."""
        owned = list(self.plan.owned_partitions)
        out = []
        for s in steps:
            parts = [x for p in owned for x in self.slice(p, *self.plan.micro_range(p, int(s)))]
            out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
        return out

    def pool(self) -> tuple[np.ndarray, np.ndarray]:
        """The rank's rows as (first id, rows) intervals: its partitions' pieces."""
        pieces = [x for p in self.plan.owned_partitions for b in self.plan.blocks[p] for x in self.pieces(b)]
        a = np.asarray(pieces, dtype=np.int64).reshape(-1, 2)
        return a[:, 0], a[:, 1]


def epoch_rows(plan: Plan) -> np.ndarray:
    """The global row ids (index in the concatenation of the units' delivered rows, canonical
    order) that ``plan``'s rank delivers in its epoch, step by step; `step_offsets` cuts them
    into batches. Computed from the plan alone: nothing is read.

    A plan that lists its rows itself (``plan.row_ids()``) is asked; for the windowed order
    (plan format 2) they are its blocks' pieces permuted by each block's stream.
    """
    row_ids = getattr(plan, "row_ids", None)
    if row_ids is not None:
        return np.asarray(row_ids(), dtype=np.int64)
    parts = _WindowedRows(plan).steps(range(plan.steps))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# -- what the report measures -------------------------------------------------------------------

class _Sources:
    """The units' ranges in canonical order: which file and row group each global row id is from."""

    def __init__(self, units: UnitList) -> None:
        self.ranges = [r for u in units.units for r in u.ranges]
        self.starts = np.concatenate([[0], np.cumsum([r.rows for r in self.ranges])]).astype(np.int64)
        codes: dict[tuple[int, int], int] = {}
        self.range_rg = np.asarray([codes.setdefault((r.file, r.row_group), len(codes)) for r in self.ranges],
                                   dtype=np.int64)
        self.range_file = np.asarray([r.file for r in self.ranges], dtype=np.int64)
        self.row_groups = len(codes)
        self.files = len(set(self.range_file.tolist()))

    def range_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, ids, side="right") - 1


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values of ``a`` and each element's index among them, by one sort
    (NumPy's hashing ``np.unique`` and binary searches of unsorted queries took 25 s of a
    30 s report on 5 million rows here)."""
    order = np.argsort(a)
    sa = a[order]
    first = np.concatenate([[True], sa[1:] != sa[:-1]])
    inv = np.empty(len(a), dtype=np.int64)
    inv[order] = np.cumsum(first) - 1
    return sa[first], inv


def _batch_index(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _distinct(codes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Distinct codes in each batch."""
    k = len(offsets) - 1
    if not codes.size:
        return np.zeros(k, dtype=np.int64)
    n = int(codes.max()) + 1
    keys = _batch_index(offsets) * n + codes
    if k * n <= _DENSE:
        return (np.bincount(keys, minlength=k * n).reshape(k, n) > 0).sum(axis=1)
    return np.bincount(_unique_inverse(keys)[0] // n, minlength=k)


def _tvd(codes: np.ndarray, offsets: np.ndarray, epoch: np.ndarray) -> np.ndarray:
    """Total variation distance of each batch's code mix from ``epoch`` (a distribution)."""
    k, n = len(offsets) - 1, len(epoch)
    counts = np.bincount(_batch_index(offsets) * n + codes, minlength=k * n).reshape(k, n)
    mix = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    return 0.5 * np.abs(mix - epoch).sum(axis=1)


def _spread(rg: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
    """For each row group with two rows or more among ``rg``, the part of the epoch between its
    rows' 5th and 95th percentile positions (``pos`` in [0, 1); linear interpolation, as
    ``np.percentile``)."""
    order = np.lexsort((pos, rg))
    x = pos[order]
    counts = np.bincount(rg, minlength=n)
    first = np.cumsum(counts) - counts
    keep = counts >= 2
    c, f = counts[keep], first[keep]

    def q(fraction: float) -> np.ndarray:
        h = (c - 1) * fraction
        lo = np.floor(h).astype(np.int64)
        a, b = x[f + lo], x[f + np.minimum(lo + 1, c - 1)]
        return a + (h - lo) * (b - a)

    return q(0.95) - q(0.05)


def _summary(x: np.ndarray, low: bool = True) -> dict[str, float | None]:
    """Median and the 5th (``low``) or 95th percentile (None when nothing was measured)."""
    if not x.size:
        return {"median": None, "p5" if low else "p95": None}
    return {"median": float(np.median(x)),
            ("p5" if low else "p95"): float(np.percentile(x, 5 if low else 95))}


def _side_by_side(order: np.ndarray, iid: np.ndarray, low: bool = True) -> dict[str, float | None]:
    a, b = _summary(order, low), _summary(iid, low)
    return {**a, **{f"iid_{k}": v for k, v in b.items()}}


# -- the mix column -----------------------------------------------------------------------------

def _check_column(planned: Planned | None, name: str) -> None:
    if not isinstance(name, str):
        raise OptionError(f"mix_column must be a column name (a string), got {type(name).__name__} {name!r}")
    if planned is None:
        raise OptionError(f"mix_column {name!r} needs the dataset: ask the loader (Loader.plan_stats)")
    ds = planned.dataset
    columns = ds.column_names()
    if name not in columns:
        raise OptionError(f"mix column {name!r} is not a column of the dataset; its columns are {columns}")
    if planned.transform is not None and planned.transform.rows == "changes":
        raise OptionError(
            f"mix column {name!r}: transform {planned.transform.name!r} has rows='changes', so the delivered rows "
            "are not the stored rows the column is read from; measure the mixing without mix_column, or "
            "with a loader without the transform")
    d = ds.drift(name) if name not in ds.partition_keys else None
    if d is not None and d.promoted is None:
        raise d.refusal()
    if d is not None and d.missing:
        raise d.lacked_error("mix_column names column", "the mixing report reads stored values", "Measure")
    if name not in ds.partition_keys:
        t = ds.column_type(name)
        if pa.types.is_nested(t) or (pa.types.is_dictionary(t) and pa.types.is_nested(t.value_type)):
            raise OptionError(f"mix column {name!r} holds {t} values; choose a column of single values "
                              "(a category, a day, a number)")


def _normal(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One form per kind, so that the pieces of every file concatenate: dictionaries decoded,
    text and bytes as their large types, dates and times as their integers, decimals as floats."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_string(t) or str(t) == "string_view":
        return arr.cast(pa.large_string())
    if pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t) or str(t) == "binary_view":
        return arr.cast(pa.large_binary())
    if pa.types.is_temporal(t):
        return arr.view(pa.int32() if t.bit_width == 32 else pa.int64())
    if pa.types.is_decimal(t) or pa.types.is_float16(t):
        return arr.cast(pa.float64())
    return arr


def _read_values(planned: Planned, name: str, src: _Sources, needed: np.ndarray) -> pa.Array:
    """The column's values of the delivered rows ``needed`` (sorted global ids): only that column,
    one read per row group through pyarrow, a filter's selection taken from the plan."""
    ds = planned.dataset
    ri = src.range_of(needed)
    bounds = np.flatnonzero(np.diff(ri)) + 1
    runs = np.split(np.arange(len(needed)), bounds)
    by_file: dict[int, list[tuple[int, np.ndarray]]] = {}
    for run in runs:
        r = src.ranges[int(ri[run[0]])]
        local = needed[run] - src.starts[ri[run[0]]] + r.first
        by_file.setdefault(r.file, []).append((r.row_group, local))
    files = sorted(by_file)
    selections: Mapping[tuple[int, int], Selection] = planned.selections or {}

    if name in ds.partition_keys:
        typed = dict(ds.partition_types)[name]
        t = pa.int64() if typed == "int64" else pa.string()
        out: list[pa.Array] = []
        for i in files:
            v = dict(ds.files[i].partition_values).get(name)
            one = pa.array([None if v is None else (int(v) if typed == "int64" else v)], t)
            n = sum(len(local) for _, local in by_file[i])
            out.append(_normal(one.take(pa.array(np.zeros(n, dtype=np.int64)))))
        return pa.concat_arrays(out)

    # Schema drift: every file's values as the promoted type, so that the files' pieces concatenate.
    promoted = ds.column_type(name) if ds.drift(name) is not None else None

    def read(i: int) -> list[pa.Array]:
        f = ds.files[i]
        handle = ds.filesystem.open_input_file(f.location)
        try:
            pf = open_parquet(handle)
            got: list[pa.Array] = []
            for g, local in by_file[i]:
                col = read_row_group(pf, g, [name], object_uri(ds.filesystem, f.location)).column(0)
                if promoted is not None and not same_form(col.type, promoted):
                    if pa.types.is_dictionary(col.type):
                        col = pa.chunked_array([c.dictionary_decode() for c in col.chunks],
                                               type=col.type.value_type)
                    col = col.cast(promoted)
                picked = selections.get((i, g))
                rows = picked.indices()[local] if picked is not None else local
                got.append(_normal(col.take(pa.array(rows))))
            return got
        finally:
            handle.close()

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(files)))) as ex:
        pieces = [a for got in ex.map(read, files) for a in got]
    return pa.concat_arrays(pieces)


def _codes(values: pa.Array, basis: np.ndarray) -> tuple[np.ndarray, int, str, list[str]]:
    """(a code per value, codes in all, how they were made, labels): each distinct value when there
    are at most `MAX_VALUES`; else quantile bins of a numeric column, or the most frequent values
    and "other". Bins and frequent values are taken from the rows ``basis`` selects (the epoch, or
    the i.i.d. sample of it). Nulls (and NaN) get a code of their own."""
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    t = values.type
    if pa.types.is_floating(t):
        valid &= ~np.isnan(values.to_numpy(zero_copy_only=False).astype(np.float64))
    present = values.filter(pa.array(valid))
    uniq = pc.unique(present)
    if len(uniq) <= MAX_VALUES:
        uniq = uniq.take(pc.sort_indices(uniq))
        codes = pc.index_in(values, value_set=uniq).to_numpy(zero_copy_only=False)
        n = len(uniq)
        out = np.where(valid, np.nan_to_num(codes, nan=n), n).astype(np.int64)
        labels = [str(v) for v in uniq.to_pylist()]
        kind = "values"
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        x = values.to_numpy(zero_copy_only=False).astype(np.float64)
        ref = x[valid & basis]
        edges = np.unique(np.quantile(ref if ref.size else x[valid], np.linspace(0, 1, QUANTILE_BINS + 1)[1:-1]))
        if not edges.size:  # (cannot happen with more than MAX_VALUES values, but keep labels sound)
            edges = np.asarray([float(np.median(x[valid]))])
        n = len(edges) + 1
        out = np.where(valid, np.searchsorted(edges, np.where(valid, x, 0.0), side="right"), n).astype(np.int64)
        labels = [f"< {edges[0]:g}", *(f"[{a:g}, {b:g})" for a, b in zip(edges, edges[1:])), f">= {edges[-1]:g}"]
        kind = "quantile bins"
    else:
        counted = pc.value_counts(values.filter(pa.array(valid & basis)))
        vals, cnt = counted.field("values"), counted.field("counts").to_numpy()
        # Most frequent first, ties by value, so that the kept values do not depend on the read order.
        by_value = np.asarray(pc.rank(vals, sort_keys="ascending", tiebreaker="first")) - 1
        keep = np.lexsort((by_value, -cnt))[: MAX_VALUES - 1]
        top = vals.take(pa.array(keep))
        n = len(top)
        codes = pc.index_in(values, value_set=top).to_numpy(zero_copy_only=False)
        out = np.where(valid, np.nan_to_num(codes, nan=n), n + 1).astype(np.int64)
        labels = [str(v) for v in top.to_pylist()] + ["(other)"]
        kind = "most frequent values"
        n += 1
    if not valid.all():
        labels.append("(null)")
        n += 1
    return out, n, kind, labels


# -- the report ---------------------------------------------------------------------------------

def _measured_steps(sizes: np.ndarray, max_batches: int) -> tuple[np.ndarray, bool]:
    """The steps measured and whether they are every full step: a short last batch is left out
    (it would count as poorly mixed for its size alone); beyond ``max_batches`` full steps,
    ``max_batches`` of them evenly spaced, the first and the last among them."""
    n = len(sizes)
    full = n - 1 if n > 1 and sizes[-1] < sizes[:-1].max() else n
    if full <= max_batches:
        return np.arange(full, dtype=np.int64), True
    return np.unique(np.linspace(0, full - 1, max_batches).round().astype(np.int64)), False


def _gather(ids: np.ndarray, offsets: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    parts = [ids[offsets[s] : offsets[s + 1]] for s in steps]
    return np.concatenate(parts), np.concatenate([[0], np.cumsum([len(x) for x in parts])]).astype(np.int64)


def mixing_report(plan: Plan, planned: Planned | None = None, *, mix_column: str | None = None,
                  max_batches: int = MAX_BATCHES) -> dict[str, Any]:
    """How well ``plan``'s epoch mixes for its rank, each measure beside an i.i.d. shuffle of the
    same rows (docs/loader.md, "plan_stats", states every number).

    ``planned`` (the loader's `Planned`) is needed for ``mix_column`` only: the column is read
    from the dataset, only it, one read per row group, a filter's selection taken from the plan.
    Up to ``max_batches`` full batches are measured; a longer epoch is measured on that many,
    evenly spaced, and the reference then draws each of its batches' rows uniformly from the
    rank's rows (with replacement) instead of permuting them all.
    """
    max_batches = check_int("max_batches", max_batches, 1)
    if mix_column is not None:
        _check_column(planned, mix_column)
    src = _Sources(plan.units)
    sizes = _step_sizes(plan)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    delivered = int(offsets[-1])
    steps, every = _measured_steps(sizes, max_batches)
    opts = plan.options
    entropy = _entropy(TAG_MIX_IID, opts.seed, plan.epoch, plan.rank)
    row_ids = getattr(plan, "row_ids", None)

    # ids: the measured batches' rows, batch after batch (``off`` cuts them); ref: the
    # reference's rows for the same batches.
    all_ids: np.ndarray | None = None
    perm: np.ndarray | None = None
    if every or row_ids is not None:
        all_ids = epoch_rows(plan)
        ids, off = _gather(all_ids, offsets, steps)
    else:
        windowed = _WindowedRows(plan)
        parts = windowed.steps(steps)
        ids = np.concatenate(parts)
        off = np.concatenate([[0], np.cumsum([len(x) for x in parts])]).astype(np.int64)
    if every:
        assert all_ids is not None
        # The measured batches are the epoch's first full ones: ids is a prefix of all_ids.
        perm = _stream_permutation(entropy, delivered)
        ref = all_ids[perm][: len(ids)]
    else:
        words = np.asarray(np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(len(ids)), dtype=np.uint64)
        if all_ids is not None:
            ref = all_ids[(words % np.uint64(len(all_ids))).astype(np.int64)]
        else:  # the rank's rows as intervals: its partitions' pieces
            starts, lengths = windowed.pool()
            cum = np.concatenate([[0], np.cumsum(lengths)])
            drawn = (words % np.uint64(cum[-1])).astype(np.int64)
            j = np.searchsorted(cum, drawn, side="right") - 1
            ref = starts[j] + drawn - cum[j]

    r_o, r_r = src.range_of(ids), src.range_of(ref)
    out: dict[str, Any] = {
        "epoch": plan.epoch, "rank": plan.rank, "plan_format": plan.plan_format,
        "order": getattr(opts, "order", "windowed"),
        "rows": delivered, "steps": plan.steps, "batch_size": opts.batch_size,
        "batches_measured": int(len(steps)), "every_batch": every,
        "row_groups": src.row_groups, "files": src.files,
        "row_groups_per_batch": _side_by_side(_distinct(src.range_rg[r_o], off), _distinct(src.range_rg[r_r], off)),
        "files_per_batch": _side_by_side(_distinct(src.range_file[r_o], off),
                                         _distinct(src.range_file[r_r], off)),
    }
    # Spread: over every row of the epoch, or over the measured batches' rows.
    if every:
        assert all_ids is not None and perm is not None
        rg_all = src.range_rg[src.range_of(all_ids)]
        pos = np.arange(delivered) / delivered
        sp_o, sp_r = _spread(rg_all, pos, src.row_groups), _spread(rg_all[perm], pos, src.row_groups)
    else:
        pos = (np.repeat(offsets[steps] - off[:-1], np.diff(off)) + np.arange(len(ids))) / delivered
        sp_o, sp_r = _spread(src.range_rg[r_o], pos, src.row_groups), _spread(src.range_rg[r_r], pos, src.row_groups)
    out["spread"] = {**_side_by_side(sp_o, sp_r), "row_groups_measured": int(len(sp_o))}
    out["mix_column"] = None
    if mix_column is not None:
        assert planned is not None
        # The rows read: every delivered row, or the measured and the reference batches' rows.
        # The epoch's mix is taken from every delivered row, or from the reference's rows (an
        # i.i.d. sample of them); so are quantile bins and frequent values.
        if every:
            assert all_ids is not None and perm is not None
            needed, inv = _unique_inverse(all_ids)
            values = _read_values(planned, mix_column, src, needed)
            codes, n, kind, labels = _codes(values, np.ones(len(needed), dtype=bool))
            c_all = codes[inv]
            c_b, c_o, c_r = c_all, c_all[: len(ids)], c_all[perm][: len(ids)]
        else:
            needed, inv = _unique_inverse(np.concatenate([ids, ref]))
            values = _read_values(planned, mix_column, src, needed)
            in_basis = np.zeros(len(needed), dtype=bool)
            in_basis[inv[len(ids):]] = True
            codes, n, kind, labels = _codes(values, in_basis)
            c_o, c_r = codes[inv[: len(ids)]], codes[inv[len(ids):]]
            c_b = c_r
        epoch_mix = np.bincount(c_b, minlength=n) / len(c_b)
        out["mix_column"] = {
            "name": mix_column, "kind": kind, "codes": n, "labels": labels,
            "values_per_batch": _side_by_side(_distinct(c_o, off), _distinct(c_r, off)),
            "tvd": _side_by_side(_tvd(c_o, off, epoch_mix), _tvd(c_r, off, epoch_mix), low=False),
        }
    return out


def _num(x: float | None) -> str:
    if x is None:  # nothing measured
        return "-"
    return f"{x:,.0f}" if float(x).is_integer() else (f"{x:.3f}" if abs(x) < 10 else f"{x:,.1f}")


def report_lines(stats: Mapping[str, Any]) -> list[str]:
    """`mixing_report`'s result as a table: one line per measure, this order beside i.i.d."""
    which = "every full one" if stats["every_batch"] else "evenly spaced"
    rows: list[tuple[str, float | None, float | None]] = []

    def add(label: str, d: Mapping[str, float | None], key: str) -> None:
        rows.append((label, d[key], d[f"iid_{key}"]))

    rg, fl = stats["row_groups_per_batch"], stats["files_per_batch"]
    add(f"source row groups per batch (of {stats['row_groups']:,}), median", rg, "median")
    add("  5th percentile", rg, "p5")
    add(f"source files per batch (of {stats['files']:,}), median", fl, "median")
    add("  5th percentile", fl, "p5")
    mc = stats.get("mix_column")
    if mc:
        what = {"values": "values", "quantile bins": "quantile bins",
                "most frequent values": "frequent values (rest pooled)"}[mc["kind"]]
        add(f"{mc['name']!r} {what} per batch (of {mc['codes']}), median", mc["values_per_batch"], "median")
        add("  5th percentile", mc["values_per_batch"], "p5")
        add(f"{mc['name']!r} distance from the epoch's mix (TVD), median", mc["tvd"], "median")
        add("  95th percentile", mc["tvd"], "p95")
    sp = stats["spread"]
    add("part of the epoch a row group's rows span (5th-95th pct), median", sp, "median")
    add("  5th percentile over row groups", sp, "p5")
    width = max(len(r[0]) for r in rows)
    lines = [f"mixing, epoch {stats['epoch']} rank {stats['rank']} ({stats['order']} order): "
             f"{stats['batches_measured']:,} of {stats['steps']:,} batches measured ({which}), beside an i.i.d. "
             "shuffle of the same rows",
             f"  {'':<{width}}  {'this order':>12}  {'i.i.d.':>12}"]
    lines += [f"  {label:<{width}}  {_num(a):>12}  {_num(b):>12}" for label, a, b in rows]
    return lines
