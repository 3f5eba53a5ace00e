"""Block assembly: the grouped fast path writes exactly what a column-by-column gather writes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from detload._engine import block as _block
from detload._engine.block import assemble, views
from detload._types import ColumnSpec, Ragged, UnitColumns

_FIXED = ["<f4", "<i8", "|i1", "<f8", "<u2", "|b1"]


@st.composite
def blocks(draw):
    """Column specs, units (plain or with strided runs, as cache entries give), and a permutation or None."""
    kinds = draw(st.lists(st.sampled_from(_FIXED + ["2d", "list", "utf8"]), min_size=1, max_size=9))
    specs = []
    for i, k in enumerate(kinds):
        if k == "2d":
            specs.append(ColumnSpec(f"c{i}", "fixed_size_list", "fixed", "<f4", inner=(3,)))
        elif k == "list":
            specs.append(ColumnSpec(f"c{i}", "list<float>", "ragged", "<f4", ragged_kind="list"))
        elif k == "utf8":
            specs.append(ColumnSpec(f"c{i}", "string", "ragged", "|u1", ragged_kind="utf8"))
        else:
            specs.append(ColumnSpec(f"c{i}", k, "fixed", k))
    lengths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    units = []
    for n in lengths:
        strided = draw(st.booleans())
        gap = draw(st.integers(0, 3))
        u = UnitColumns() if strided else {}
        runs: list[list[ColumnSpec]] = []
        for s in specs:
            if s.kind == "ragged":
                lens = rng.integers(0, 4, n)
                offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
                vals = rng.integers(97, 123, int(offs[-1])).astype(np.uint8) if s.ragged_kind == "utf8" \
                    else rng.random(int(offs[-1])).astype(np.float32)
                u[s.name] = Ragged(vals, offs, s.ragged_kind)
                runs.append([])
            elif s.inner:
                u[s.name] = rng.random((n, 3)).astype(np.float32)
                runs.append([])
            else:
                if runs and runs[-1] and runs[-1][-1].dtype == s.dtype:
                    runs[-1].append(s)
                else:
                    runs.append([s])
        for run in runs:
            if not run:
                continue
            # Like a cache entry: the run's columns at one stride, with a gap of `gap` items.
            dt = np.dtype(run[0].dtype)
            stride = n + gap
            flat = (rng.integers(0, 2**16, len(run) * stride) % (2 if dt.kind == "b" else 100)).astype(dt)
            grid = flat.reshape(len(run), stride)[:, :n]
            names = tuple(s.name for s in run)
            for i, s in enumerate(run):
                u[s.name] = grid[i]
                if strided and len(run) > 1:
                    u.runs[s.name] = (grid, i, names)
        units.append(u)
    total = sum(lengths)
    perm = draw(st.one_of(st.none(), st.just("perm")))
    if perm is not None:
        perm = rng.permutation(total).astype(np.int64)
    return specs, units, perm


def _reference(specs, units, perm):
    out = {}
    for s in specs:
        parts = [u[s.name] for u in units]
        if s.kind == "ragged":
            rows = [p[i] for p in parts for i in range(len(p))]
            out[s.name] = [rows[j] for j in (perm if perm is not None else range(len(rows)))]
        else:
            whole = np.concatenate(parts, axis=0)
            out[s.name] = whole[perm] if perm is not None else whole
    return out


def _plain(row):
    return row.tobytes() if isinstance(row, np.ndarray) else row


def _check_block(buf, layout, specs, want):
    """The block's columns are ``want``'s (`_reference`), with the specs' dtypes."""
    got = views(buf, layout)
    for s in specs:
        if s.kind == "ragged":
            g = got[s.name]
            assert [_plain(g[i]) for i in range(len(g))] == [_plain(x) for x in want[s.name]]
        else:
            assert got[s.name].dtype == np.dtype(s.dtype)
            assert np.array_equal(got[s.name], want[s.name])


@settings(max_examples=150, deadline=None)
@given(blocks(), st.sampled_from([1 << 20, 64]))
def test_assemble_equals_column_by_column(block, chunk):
    specs, units, perm = block
    old = _block._CHUNK_BYTES
    _block._CHUNK_BYTES = chunk  # small chunks: a group is permuted a column or two at a time
    try:
        buf, layout = assemble(specs, units, perm, lambda n: np.zeros(n, dtype=np.uint8))
    finally:
        _block._CHUNK_BYTES = old
    _check_block(buf, layout, specs, _reference(specs, units, perm))


def test_same_typed_columns_lie_back_to_back():
    """The layout packs a run of same-typed 1-D columns into one (k, rows) array."""
    specs = [ColumnSpec(n, "float", "fixed", "<f4") for n in "abc"] + [ColumnSpec("d", "int64", "fixed", "<i8")]
    layout = _block._plan_layout(specs, 7, {})
    a, b, c, d = layout.columns
    assert b.data.offset == a.data.offset + 28 and c.data.offset == b.data.offset + 28
    assert d.data.offset % 64 == 0
    assert _block._groups(layout) == ((0, 3, "<f4"), (3, 1, "<i8"))


@settings(max_examples=100, deadline=None)
@given(blocks(), st.integers(0, 2**32 - 1))
def test_packed_runs_assemble_the_same_block(block, seed):
    # A mixed-order window packs each row group's same-typed columns into runs (pack_runs): the
    # block its chunks make, with ranges and a permutation, is byte for byte the plain one.
    specs, units, _ = block
    rng = np.random.default_rng(seed)
    ranges = []
    for u in units:
        n = len(u[specs[0].name])
        a = int(rng.integers(0, n + 1))
        ranges.append((a, int(rng.integers(0, n - a + 1))))
    rows = sum(r for _, r in ranges)
    perm = rng.permutation(rows).astype(np.int64)
    packed = [_block.pack_runs(specs, u if isinstance(u, UnitColumns) else UnitColumns(u)) for u in units]
    for u, p in zip(units, packed):
        assert set(u) == set(p)
        for s in specs:
            if s.kind == "fixed":
                assert np.array_equal(u[s.name], p[s.name]) and p[s.name].dtype == u[s.name].dtype
            else:
                assert p[s.name] is u[s.name]  # ragged columns stay as they are
        if getattr(u, "runs", None):
            assert p is u  # a cache entry's runs are kept, not copied again
        else:
            for name, (run, i, names) in p.runs.items():
                assert names[i] == name and run.ndim == 2 and len(names) > 1
                assert run.shape[1] == 0 or np.shares_memory(run, p[name])
    plain = assemble(specs, units, perm, lambda n: np.zeros(n, dtype=np.uint8), ranges)
    got = assemble(specs, packed, perm, lambda n: np.zeros(n, dtype=np.uint8), ranges)
    assert plain[1] == got[1] and np.array_equal(plain[0], got[0])


@settings(max_examples=150, deadline=None)
@given(blocks(), st.sampled_from([1 << 20, 64]), st.integers(0, 2**32 - 1))
def test_the_many_units_path_equals_column_by_column(block, chunk, seed):
    # A mixed-order block has a unit per row group of its window (more than _MANY_UNITS):
    # its own path copies a chunk of columns from every unit, then permutes it. Forced here
    # for any unit count, with and without ranges, chunks of one column or of many.
    specs, units, perm = block
    rng = np.random.default_rng(seed)
    use_ranges = perm is not None and bool(rng.integers(0, 2))
    ranges = None
    if use_ranges:
        ranges = []
        for u in units:
            n = len(u[specs[0].name])
            a = int(rng.integers(0, n + 1))
            ranges.append((a, int(rng.integers(0, n - a + 1))))
        perm = rng.permutation(sum(r for _, r in ranges)).astype(np.int64)
    old = _block._MANY_UNITS, _block._MANY_CHUNK_BYTES
    _block._MANY_UNITS, _block._MANY_CHUNK_BYTES = 0, chunk
    try:
        buf, layout = assemble(specs, units, perm, lambda n: np.zeros(n, dtype=np.uint8), ranges)
    finally:
        _block._MANY_UNITS, _block._MANY_CHUNK_BYTES = old
    cut = units if ranges is None else [
        {s.name: _block.slice_rows(u[s.name], a, a + n) for s in specs}
        for u, (a, n) in zip(units, ranges)]
    _check_block(buf, layout, specs, _reference(specs, cut, perm))
