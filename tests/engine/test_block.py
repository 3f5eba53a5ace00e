"""Block assembly: the grouped fast path writes exactly what a column-by-column gather writes."""

from __future__ import annotations

import os
import re
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detload._engine import block as _block
from detload._engine import spill as _spill
from detload._engine import worker as _worker
from detload._engine.block import assemble, views
from detload._engine.messages import Timings
from detload._types import ColumnSpec, Ragged, UnitColumns
from detload.plan import chunk_rows

_FIXED = ["<f4", "<i8", "|i1", "<f8", "<u2", "|b1"]


@st.composite
def blocks(draw):
    """Column specs, units (plain or with strided runs, as cache entries give), and a permutation or None."""
    kinds = draw(st.lists(st.sampled_from(_FIXED + ["2d", "list", "utf8", "liststr"]), min_size=1, max_size=9))
    specs = []
    for i, k in enumerate(kinds):
        if k == "2d":
            specs.append(ColumnSpec(f"c{i}", "fixed_size_list", "fixed", "<f4", inner=(3,)))
        elif k == "list":
            specs.append(ColumnSpec(f"c{i}", "list<float>", "ragged", "<f4", ragged_kind="list"))
        elif k == "utf8":
            specs.append(ColumnSpec(f"c{i}", "string", "ragged", "|u1", ragged_kind="utf8"))
        elif k == "liststr":
            specs.append(ColumnSpec(f"c{i}", "list<string>", "ragged", "|u1", ragged_kind="list", item_kind="utf8"))
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
            if s.item_kind is not None:  # a list of strings: rows over strings over bytes
                offs = np.concatenate([[0], np.cumsum(rng.integers(0, 4, n))]).astype(np.int64)
                soffs = np.concatenate([[0], np.cumsum(rng.integers(0, 5, int(offs[-1])))]).astype(np.int64)
                chars = rng.integers(97, 123, int(soffs[-1])).astype(np.uint8)
                u[s.name] = Ragged(Ragged(chars, soffs, "utf8"), offs, "list")
                runs.append([])
            elif s.kind == "ragged":
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


def _cuts(rng, units, specs):
    """A random (first row, rows) of each unit."""
    out = []
    for u in units:
        n = len(u[specs[0].name])
        a = int(rng.integers(0, n + 1))
        out.append((a, int(rng.integers(0, n - a + 1))))
    return out


def _picks(rng, units, specs):
    """Random rows of each unit as a mixed-order block takes them (`Rows`): a slice, or
    runs of L rows one period of L x M rows apart (`MixTask.block_chunks`)."""
    out = []
    for u in units:
        n = len(u[specs[0].name])
        if n >= 2 and rng.integers(0, 2):
            run = int(rng.integers(1, n // 2 + 1))
            period = run * int(rng.integers(1, n // run + 1))
            runs = int(rng.integers(1, n // period + 1))
            first = run * int(rng.integers(0, period // run))
            out.append((first, runs * run, run, period))
        else:
            a = int(rng.integers(0, n + 1))
            m = int(rng.integers(0, n - a + 1))
            out.append((a, m, m, m))
    return out


def _taken(units, specs, ranges):
    """The reference: each unit's rows ``ranges``, gathered row by row."""
    return [{s.name: _block.take_rows(u[s.name], chunk_rows(*r)) for s in specs} for u, r in zip(units, ranges)]


def _gathers_as_plain(specs, held, plain, ranges, rng):
    """A block of rows ``ranges`` of ``held`` (units, or pieces of packs), permuted at random,
    is byte for byte the block the same rows of ``plain`` give."""
    perm = rng.permutation(sum(r[1] for r in ranges)).astype(np.int64)
    buf, layout = assemble(specs, held, perm, lambda n: np.zeros(n, dtype=np.uint8), ranges)
    _check_block(buf, layout, specs, _reference(specs, _taken(plain, specs, ranges), perm))


def _packed(specs, units, pieces, orders):
    """A window pack of each unit's rows ``pieces`` (first, rows), in ``orders``, and its pieces."""
    pack = _block.WindowPack(specs, [n for _, n in pieces], orders)
    return pack, [pack.put(q, u if isinstance(u, UnitColumns) else UnitColumns(u), a, n)
                  for q, (u, (a, n)) in enumerate(zip(units, pieces))]


@settings(max_examples=150, deadline=None)
@given(blocks(), st.integers(0, 2**32 - 1))
def test_a_window_pack_assembles_the_same_block(block, seed):
    # A mixed-order window holds its pieces (a range of each row group) in one WindowPack; a
    # block takes a range of each piece, in any order of pieces, and gathers them from the
    # pack: byte for byte the block the same rows give as plain units.
    specs, units, _ = block
    rng = np.random.default_rng(seed)
    pieces = _cuts(rng, units, specs)
    pack, held = _packed(specs, units, pieces, None)
    for q, (u, p, (a, n)) in enumerate(zip(units, held, pieces)):
        assert p.at[0] is pack and p.at[1] == pack.starts[q]
        for s in specs:
            want = _block.slice_rows(u[s.name], a, a + n)
            if s.kind == "fixed":
                assert np.array_equal(p[s.name], want) and p[s.name].dtype == want.dtype
            if s.kind == "fixed" and not s.inner:
                assert np.shares_memory(pack.columns[s.name][0], p[s.name]) or n == 0
    order = [int(q) for q in rng.permutation(len(units))]
    units_b = [held[q] for q in order]
    ranges = _picks(rng, units_b, specs)
    plain = [{s.name: _block.slice_rows(units[q][s.name], pieces[q][0], pieces[q][0] + pieces[q][1])
              for s in specs} for q in order]
    _gathers_as_plain(specs, units_b, plain, ranges, rng)


def _order(rng, n):
    """A block order for a piece of ``n`` rows (`_block.Order`): None, or (runs, run, blocks)
    with runs x run x blocks <= n, as `MixTask.block_chunks` cuts a piece (runs > 1)."""
    if n < 4 or not rng.integers(0, 4):
        return None
    run = int(rng.integers(1, n // 2 + 1))
    runs = int(rng.integers(2, n // run + 1))
    blocks = int(rng.integers(1, n // (runs * run) + 1))
    return (runs, run, blocks)


def _block_picks(rng, orders, sizes):
    """Each piece's rows of one block, as `MixTask.block_chunks` names them: run c of every
    period of a block-ordered piece, else a slice of its rows after the runs."""
    out = []
    for order, n in zip(orders, sizes):
        if order is not None and rng.integers(0, 3):
            runs, run, blocks = order
            out.append((run * int(rng.integers(0, blocks)), runs * run, run, run * blocks))
        else:
            lo = 0 if order is None else order[0] * order[1] * order[2]
            a = int(rng.integers(lo, n + 1))
            m = int(rng.integers(0, n - a + 1))
            out.append((a, m, m, m))
    return out


@settings(max_examples=150, deadline=None)
@given(blocks(), st.integers(0, 2**32 - 1))
def test_a_block_ordered_pack_assembles_the_same_block(block, seed):
    # A window pack holds each piece in its block order: a block's runs of a piece lie in
    # one slice there. Blocks gathered from it, in any order of pieces, are byte for byte
    # those the same rows give as plain units; a piece moved from it into a pack of other
    # orders (a window kept from the pass before, or a row group two windows share) keeps
    # its rows, and so does a piece taken out of it in stored order: every column, the
    # ragged and multi-dimensional ones (held in the piece's order too) as well.
    specs, units, _ = block
    rng = np.random.default_rng(seed)
    pieces = _cuts(rng, units, specs)
    orders = [_order(rng, n) for _, n in pieces]
    pack, held = _packed(specs, units, pieces, orders)
    plain = [{s.name: _block.slice_rows(u[s.name], a, a + n) for s in specs} for u, (a, n) in zip(units, pieces)]
    order = [int(q) for q in rng.permutation(len(units))]
    ranges = _block_picks(rng, [orders[q] for q in order], [pieces[q][1] for q in order])
    _gathers_as_plain(specs, [held[q] for q in order], [plain[q] for q in order], ranges, rng)
    other = _block.WindowPack(specs, [n for _, n in pieces], [_order(rng, n) for _, n in pieces])
    for q, (p, (_, n)) in enumerate(zip(held, pieces)):
        back = _block.stored_order(p)
        for moved in (back, _block.stored_order(other.put(q, p, 0, n))):
            for s in specs:
                got, want = moved[s.name], plain[q][s.name]
                if s.kind == "fixed":
                    assert np.array_equal(got, want)
                else:
                    assert [_plain(got[i]) for i in range(n)] == [_plain(want[i]) for i in range(n)]
        for s in specs:
            if s.kind == "fixed" and not s.inner:
                # a copy where the piece is held in another order, the piece itself where not
                assert np.shares_memory(back[s.name], p[s.name]) == (orders[q] is None and n > 0)
    ranges = _block_picks(rng, other.orders, [n for _, n in pieces])
    moved_all = [other.put(q, p, 0, n) for q, (p, (_, n)) in enumerate(zip(held, pieces))]
    _gathers_as_plain(specs, moved_all, plain, ranges, rng)


def _spilled(specs, units, pieces, orders):
    """`_packed`, the pack spilled to a file in the temporary folder (`SpillPack`)."""
    pack = _spill.SpillPack(specs, [n for _, n in pieces], orders, tempfile.gettempdir())
    return pack, [pack.put(q, u if isinstance(u, UnitColumns) else UnitColumns(u), a, n)
                  for q, (u, (a, n)) in enumerate(zip(units, pieces))]


def _same_rows(specs, got, want, n):
    for s in specs:
        if s.kind == "fixed":
            assert np.array_equal(got[s.name], want[s.name]) and got[s.name].dtype == want[s.name].dtype
        else:
            assert [_plain(got[s.name][i]) for i in range(n)] == [_plain(want[s.name][i]) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(blocks(), st.integers(0, 2**32 - 1), st.sampled_from([0, 1 << 16]))
def test_a_spilled_pack_assembles_the_same_block(block, seed, small):
    # A large window is spilled (_engine/spill.py): its fixed 1-D columns go to a file, each
    # piece chunk by chunk, and a block reads its chunk of each piece back (a whole chunk in
    # one call; part of a segment read whole, or through the file's map where ``small`` is 0).
    # Its system calls take two columns each here (as a table of over 512 columns does).
    # Blocks from it, in any order of pieces, are byte for byte those the same rows give as
    # plain units; a piece taken back to stored order, moved into a pack in memory or into
    # another spilled pack of other orders keeps every column's rows; and blocks from the
    # other spilled pack are right too.
    specs, units, _ = block
    rng = np.random.default_rng(seed)
    pieces = _cuts(rng, units, specs)
    orders = [_order(rng, n) for _, n in pieces]
    pack, held = _spilled(specs, units, pieces, orders)
    assert all(p.at[0] is pack for p in held)
    assert not any(s.name in p for p in held for s in specs if s.kind == "fixed" and not s.inner)  # on disk only
    plain = [{s.name: _block.slice_rows(u[s.name], a, a + n) for s in specs} for u, (a, n) in zip(units, pieces)]
    was = _spill._SMALL_SEGMENT, _spill._IOV
    _spill._SMALL_SEGMENT = small
    _spill._IOV = 2  # a block's reads and a piece's writes in calls of two columns
    try:
        order = [int(q) for q in rng.permutation(len(units))]
        ranges = _block_picks(rng, [orders[q] for q in order], [pieces[q][1] for q in order])
        _gathers_as_plain(specs, [held[q] for q in order], [plain[q] for q in order], ranges, rng)
        sizes = [n for _, n in pieces]
        other = _block.WindowPack(specs, sizes, [_order(rng, n) for n in sizes])
        spilled = _spill.SpillPack(specs, sizes, [_order(rng, n) for n in sizes], tempfile.gettempdir())
        for q, (p, n) in enumerate(zip(held, sizes)):
            for moved in (_block.stored_order(p), _block.stored_order(other.put(q, p, 0, n)),
                          _block.stored_order(spilled.put(q, p, 0, n))):
                _same_rows(specs, moved, plain[q], n)
        ranges = _block_picks(rng, spilled.orders, sizes)
        _gathers_as_plain(specs, [spilled.put(q, p, 0, n) for q, (p, n) in enumerate(zip(held, sizes))], plain,
                          ranges, rng)
    finally:
        _spill._SMALL_SEGMENT, _spill._IOV = was


@settings(max_examples=60, deadline=None)
@given(blocks(), st.integers(0, 2**32 - 1))
def test_process_workers_sharing_a_spill_file_hand_over_the_other_columns(tmp_path_factory, block, seed):
    # Process workers sharing a window spill its fixed 1-D columns to one file (a SpillPack
    # made on the same path by each); the worker that converted a piece publishes its other
    # columns (strings, lists, multi-dimensional ones, in the piece's order) in a file of
    # the piece's beside it and holds them mapped from there, not on its heap; another
    # worker's pack takes the piece from the two files. Blocks cut from either worker's
    # pieces, in any order of pieces, are byte for byte those of the same rows as plain
    # units. A piece whose file is missing (its worker could not write it) is None: that
    # worker converts the row group itself. With fixed 1-D columns only, nothing is published.
    specs, units, _ = block
    rng = np.random.default_rng(seed)
    folder = tmp_path_factory.mktemp("share")
    path = str(folder / "7-0-0-0.spill")
    pieces = _cuts(rng, units, specs)
    sizes = [n for _, n in pieces]
    orders = [_order(rng, n) for n in sizes]
    writer = _spill.SpillPack(specs, sizes, orders, str(folder), path=path)
    reader = _spill.SpillPack(specs, sizes, orders, str(folder), path=path)
    beside = not _block.all_flat(specs)
    assert writer.beside is beside
    held = []
    for q, (u, (a, n)) in enumerate(zip(units, pieces)):
        put = writer.put(q, u if isinstance(u, UnitColumns) else UnitColumns(u), a, n)
        published = writer.publish(q, put)
        assert published.at == put.at and set(published) == set(put)
        for name, col in put.items():  # the same rows, now mapped from the file, no longer the heap copy
            arrays = [col.offsets, col.values] if isinstance(col, Ragged) else [col]
            assert not any(np.shares_memory(a, b) for a in arrays
                           for b in ([published[name].offsets, published[name].values]
                                     if isinstance(col, Ragged) else [published[name]]))
        held.append(published)
        assert os.path.exists(_spill.beside_name(path, q)) is beside
    taken = [reader.piece(q) for q in range(len(units))]
    assert all(p is not None and p.at == (reader, reader.starts[q], orders[q], q) for q, p in enumerate(taken))
    plain = [{s.name: _block.slice_rows(u[s.name], a, a + n) for s in specs} for u, (a, n) in zip(units, pieces)]
    # A worker's own window (no path): the columns go to unlinked files in the folder, mapped.
    own = _spill.SpillPack(specs, sizes, orders, str(folder))
    alone = [own.publish(q, own.put(q, u if isinstance(u, UnitColumns) else UnitColumns(u), a, n))
             for q, (u, (a, n)) in enumerate(zip(units, pieces))]
    assert len(own.mapped) == (len(units) if beside else 0)
    assert len(writer.mapped) == len(reader.mapped) == (len(units) if beside else 0)
    assert sorted(os.listdir(folder)) == sorted(["7-0-0-0.spill"] + [f"7-0-0-0.spill.{q}" for q in range(len(units))
                                                                     if beside])  # nothing named of its own
    for pieces_of, pack in ((held, writer), (taken, reader), (alone, own)):
        for _ in range(2):  # the maps' pages dropped after a block: the next block's rows are the same
            order = [int(q) for q in rng.permutation(len(units))]
            ranges = _block_picks(rng, [orders[q] for q in order], [sizes[q] for q in order])
            _gathers_as_plain(specs, [pieces_of[q] for q in order], [plain[q] for q in order], ranges, rng)
            pack.settle_beside()
        for q, p in enumerate(pieces_of):
            _same_rows(specs, _block.stored_order(p), plain[q], sizes[q])
    os.unlink(path + ".0") if beside else None
    assert (reader.piece(0) is None) is beside


def test_a_piece_whose_other_columns_cannot_be_published_raises_and_is_kept(tmp_path):
    # The folder went (or is full): publish raises OSError, leaving no part file; the worker
    # then keeps the piece as it is (_engine/worker._published, which warns once).
    specs = [ColumnSpec("a", "float", "fixed", "<f4"), ColumnSpec("s", "string", "ragged", "|u1", ragged_kind="utf8")]
    rg = UnitColumns({"a": np.arange(8, dtype=np.float32),
                      "s": Ragged(np.frombuffer(b"abcdefgh", dtype=np.uint8), np.arange(9, dtype=np.int64), "utf8")})
    path = str(tmp_path / "sub" / "1-0-0-0.spill")
    os.mkdir(tmp_path / "sub")
    pack = _spill.SpillPack(specs, [8], [None], str(tmp_path), path=path)
    put = pack.put(0, rg, 0, 8)
    os.unlink(path)
    os.rmdir(tmp_path / "sub")
    with pytest.raises(FileNotFoundError):
        pack.publish(0, put)
    assert not os.path.exists(tmp_path / "sub")
    _worker._WARNED.clear()
    t = Timings()
    with pytest.warns(ResourceWarning) as caught:
        for _ in range(2):  # once per folder and process
            assert _worker._published(t, pack, 0, (put, put)) == (put, put)
    assert [str(w.message) for w in caught] == [
        f"could not write a mixed-order window's string, list or multi-dimensional columns to "
        f"{str(tmp_path / 'sub')!r} ([Errno 2] No such file or directory: "
        f"{path + '.0.' + str(os.getpid()) + '.' + str(threading.get_ident())!r}); they are held in memory instead "
        f"(and workers sharing the window convert those row groups again). Free space there, or pass "
        f"Pool(spill=FOLDER) for another folder (on the command line: --spill FOLDER)"]
    assert [s for s, _, _ in t.spans] == ["pack", "pack"]  # traced as the window's pack, like the spill's writes


def test_a_piece_whose_other_columns_cannot_leave_the_heap_is_kept_there(tmp_path):
    # A worker's own window (no shared file): its strings go to an unlinked file in the spill
    # folder; where that folder went (or is full) they stay on the heap, with one warning
    # naming the folder and what to do.
    specs = [ColumnSpec("a", "float", "fixed", "<f4"), ColumnSpec("s", "string", "ragged", "|u1", ragged_kind="utf8")]
    rg = UnitColumns({"a": np.arange(8, dtype=np.float32),
                      "s": Ragged(np.frombuffer(b"abcdefgh", dtype=np.uint8), np.arange(9, dtype=np.int64), "utf8")})
    folder = tmp_path / "spill"
    folder.mkdir()
    pack = _spill.SpillPack(specs, [8], [None], str(folder))
    put = pack.put(0, rg, 0, 8)
    folder.rmdir()
    with pytest.raises(FileNotFoundError):
        pack.publish(0, put)
    assert pack.mapped == []
    _worker._WARNED.clear()
    t = Timings()
    with pytest.warns(ResourceWarning) as caught:
        for _ in range(2):  # once per folder and process
            assert _worker._published(t, pack, 0, (put, put)) == (put, put)
    assert len(caught) == 1
    assert re.fullmatch(
        re.escape(f"could not write a mixed-order window's string, list or multi-dimensional columns to {str(folder)!r} "
                  f"([Errno 2] No such file or directory: '{folder}") + r"(/[^']*)?" + re.escape(
            "'); they are held in memory instead (and workers sharing the window convert those row groups again). "
            "Free space there, or pass Pool(spill=FOLDER) for another folder (on the command line: --spill FOLDER)"),
        str(caught[0].message)), str(caught[0].message)


def test_a_piece_already_spilled_is_not_written_again(monkeypatch):
    # A window kept from the pass before lends its spilled pack to the next window of the same
    # pieces: putting a piece that lies there already writes nothing, and its rows are read
    # back as they were written.
    specs = [ColumnSpec(n, "float", "fixed", "<f4") for n in "ab"] + [ColumnSpec("c", "int64", "fixed", "<i8")]
    rng = np.random.default_rng(3)
    rg = UnitColumns({"a": rng.random(64).astype(np.float32), "b": rng.random(64).astype(np.float32),
                      "c": rng.integers(0, 99, 64)})
    pack = _spill.SpillPack(specs, [64, 10], [(4, 4, 4), None], tempfile.gettempdir())
    writes = []
    real = _spill._write_all
    monkeypatch.setattr(_spill, "_write_all", lambda *a: writes.append(a[2]) or real(*a))
    whole = pack.put(0, rg, 0, 64)
    part = pack.put(1, rg, 20, 10)
    assert writes == [0, 64 * 16]  # piece 1 follows piece 0's 64 rows of 16 bytes
    again = pack.put(0, whole, 0, 64)
    assert len(writes) == 2 and again.at == (pack, 0, (4, 4, 4), 0)
    for name in "abc":
        assert np.array_equal(_block.stored_order(again)[name], rg[name])
        assert np.array_equal(_block.stored_order(part)[name], rg[name][20:30])


def test_a_chunk_that_is_not_of_the_pieces_order_is_refused():
    # packed_rows maps a block chunk of a block-ordered piece to its slice; rows cut another
    # way would be gathered from the wrong place, so they are an error, not a silent mix-up.
    assert _block.packed_rows((4, 3, 5), (6, 12, 3, 15)) == (24, 12, 12, 12)
    assert _block.packed_rows((4, 3, 5), (60, 7, 7, 7)) == (60, 7, 7, 7)
    assert _block.packed_rows(None, (6, 12, 3, 15)) == (6, 12, 3, 15)
    for bad in [(6, 12, 3, 12), (7, 12, 3, 15), (15, 12, 3, 15), (6, 9, 3, 15)]:
        try:
            _block.packed_rows((4, 3, 5), bad)
        except AssertionError as exc:
            assert "not a block chunk" in str(exc)
        else:
            raise AssertionError(f"{bad} was taken")


def test_a_piece_already_in_the_pack_is_not_copied_again():
    # A window kept from the pass before lends its pack to the next window with the same
    # pieces: putting a piece that lies there already writes nothing; a piece of another
    # pack is copied.
    specs = [ColumnSpec(n, "float", "fixed", "<f4") for n in "ab"] + [ColumnSpec("c", "int64", "fixed", "<i8")]
    rng = np.random.default_rng(1)
    rg = UnitColumns({"a": rng.random(10).astype(np.float32), "b": rng.random(10).astype(np.float32),
                      "c": rng.integers(0, 9, 10)})
    pack = _block.WindowPack(specs, [10, 4])
    whole = pack.put(0, rg, 0, 10)
    part = pack.put(1, rg, 3, 4)
    assert np.array_equal(part["c"], rg["c"][3:7])
    pack.arrays[("a", "b")][0, 0] = -1.0  # marks the pack's own bytes
    again = pack.put(0, whole, 0, 10)
    assert again["a"][0] == -1.0 and again.at[0] is pack and again.at[1] == 0
    other = _block.WindowPack(specs, [3])
    moved = other.put(0, whole, 2, 3)
    assert moved.at[0] is other and np.array_equal(moved["b"], rg["b"][2:5])
    assert not np.shares_memory(moved["b"], whole["b"])


def test_a_block_ordered_piece_goes_back_to_stored_order_once_per_group(monkeypatch):
    # A piece of a block-ordered pack taken by a window of another order is first put back in
    # stored order (`stored_order`): one copy per group of same-typed columns, which its
    # columns share, not one of the whole group per column (that made a kept window's pieces
    # cost 27 ms each on CTR data: 42 columns in two groups).
    specs = [ColumnSpec(n, "float", "fixed", "<f4") for n in "abcd"] + [ColumnSpec(n, "int64", "fixed", "<i8")
                                                                        for n in "xyz"]
    rng = np.random.default_rng(2)
    rg = UnitColumns({s.name: rng.random(64).astype(np.float32) if s.dtype == "<f4" else rng.integers(0, 99, 64)
                      for s in specs})
    pack = _block.WindowPack(specs, [64], [(4, 4, 4)])  # 4 runs of 4 rows in periods of 4 chunks
    piece = pack.put(0, rg, 0, 64)
    assert not np.array_equal(piece["a"], rg["a"])  # held block-ordered
    calls = []
    real = _block._from_order
    monkeypatch.setattr(_block, "_from_order", lambda src, order: calls.append(src.shape) or real(src, order))
    back = _block.stored_order(piece)
    assert sorted(calls) == [(3, 64), (4, 64)]
    # Also where each column names a view of its own of its group.
    calls.clear()
    apart = UnitColumns(piece)
    apart.runs = {name: (run[:], i, names) for name, (run, i, names) in piece.runs.items()}
    apart.at, apart.check = piece.at, piece.check
    back_apart = _block.stored_order(apart)
    assert sorted(calls) == [(3, 64), (4, 64)]
    assert all(np.array_equal(back_apart[s.name], rg[s.name]) for s in specs)
    for s in specs:
        assert np.array_equal(back[s.name], rg[s.name])
    # And it moves into a pack of another order (or none) as the same rows.
    moved = _block.WindowPack(specs, [64]).put(0, piece, 0, 64)
    assert all(np.array_equal(moved[s.name], rg[s.name]) for s in specs)


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
        ranges = _picks(rng, units, specs)
        perm = rng.permutation(sum(r[1] for r in ranges)).astype(np.int64)
    old = _block._MANY_UNITS, _block._MANY_CHUNK_BYTES
    _block._MANY_UNITS, _block._MANY_CHUNK_BYTES = 0, chunk
    try:
        buf, layout = assemble(specs, units, perm, lambda n: np.zeros(n, dtype=np.uint8), ranges)
    finally:
        _block._MANY_UNITS, _block._MANY_CHUNK_BYTES = old
    cut = units if ranges is None else _taken(units, specs, ranges)
    _check_block(buf, layout, specs, _reference(specs, cut, perm))
