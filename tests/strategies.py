"""Hypothesis strategies for datasets and loader options, and the test datasets' reference model.

A test dataset holds the standard columns, every one a function of the row's
unique ``id`` so that any delivered row can be checked on its own:

====  ======================  =======================================================
id    int64, not nullable     unique across the dataset
f32   float32                 id / 4
s     string                  "" when id % 7 == 0, else str(id) + "é" * (id % 3)
lf    list<float32>           [id, id + 1, ...], id % 4 values
nf    float64 with nulls      null when id % 5 == 0, else id / 2
ni    int64, nullable         id * 3 (declared nullable, holds no null)
====  ======================  =======================================================

`model_batches` recomputes the documented order from scratch (canonical unit
order, PCG64 raw output + stable argsort per purpose-tagged stream, blocks,
partitions) without calling detload's planner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from detload import Ragged

# The documented purpose tags of the random streams ("UNIT", "BLKR").
TAG_UNITS = 0x554E_4954
TAG_BLOCK = 0x424C_4B52

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("f32", pa.float32()),
    pa.field("s", pa.string()),
    pa.field("lf", pa.list_(pa.float32())),
    pa.field("nf", pa.float64()),
    pa.field("ni", pa.int64(), nullable=True),
])
COLUMNS = SCHEMA.names

MAX_ROWS = 20_000
MAX_RG = 5_000


# -- the data ------------------------------------------------------------------

def expected_string(i: int) -> str:
    return "" if i % 7 == 0 else str(i) + "é" * (i % 3)


def table_for(ids: np.ndarray) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    lengths = ids % 4
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = (np.repeat(ids, lengths) + _ranks(lengths)).astype(np.float32)
    nf_null = ids % 5 == 0
    return pa.table(
        [
            pa.array(ids, pa.int64()),
            pa.array((ids / 4).astype(np.float32), pa.float32()),
            pa.array([expected_string(int(i)) for i in ids], pa.string()),
            pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, pa.float32())),
            pa.array(ids / 2, pa.float64(), mask=nf_null),
            pa.array(ids * 3, pa.int64()),
        ],
        schema=SCHEMA,
    )


def _ranks(lengths: np.ndarray) -> np.ndarray:
    """[0, 1, .., l0-1, 0, 1, .., l1-1, ...] for the given lengths."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


@dataclass
class DatasetInfo:
    """What was written: ``units`` are the non-empty row groups in canonical order."""

    root: str
    files: dict[str, list[np.ndarray]]
    units: list[tuple[str, int, np.ndarray]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(len(ids) for _, _, ids in self.units)

    @property
    def all_ids(self) -> np.ndarray:
        if not self.units:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([ids for _, _, ids in self.units])

    @property
    def unit_rows(self) -> list[int]:
        return [len(ids) for _, _, ids in self.units]


def canonical(paths: list[str]) -> list[str]:
    """The documented file order: relative paths compared as UTF-8 bytes."""
    return sorted(paths, key=lambda p: p.encode("utf-8"))


def write_dataset(root: str, files: dict[str, list[int]], *, seed: int = 0) -> DatasetInfo:
    """Write ``{relative path: [row-group sizes]}`` under ``root`` with unique random ids.

    An empty list makes a file without row groups; a size of 0 an empty row group.
    """
    os.makedirs(root, exist_ok=True)
    total = sum(sum(sizes) for sizes in files.values())
    rng = np.random.default_rng(seed)
    ids = rng.permutation(total).astype(np.int64) + 1_000
    info = DatasetInfo(root, {})
    pos = 0
    for rel in canonical(list(files)):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        groups = []
        with pq.ParquetWriter(path, SCHEMA) as w:
            for g, n in enumerate(files[rel]):
                chunk = ids[pos : pos + n]
                pos += n
                w.write_table(table_for(chunk), row_group_size=max(n, 1))
                groups.append(chunk)
                if n:
                    info.units.append((rel, g, chunk))
        info.files[rel] = groups
    # every row group came out as written
    for rel, groups in info.files.items():
        md = pq.ParquetFile(os.path.join(root, rel)).metadata
        assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [len(g) for g in groups]
    return info


def check_rows(batch: dict[str, object]) -> None:
    """Assert every standard column of ``batch`` matches its row's id."""
    ids = np.asarray(batch["id"])
    assert ids.dtype == np.int64
    if "f32" in batch:
        f32 = batch["f32"]
        assert f32.dtype == np.float32
        np.testing.assert_array_equal(f32, (ids / 4).astype(np.float32))
    if "ni" in batch:
        assert batch["ni"].dtype == np.int64
        np.testing.assert_array_equal(batch["ni"], ids * 3)
    if "nf" in batch:
        nf = batch["nf"]
        assert nf.dtype == np.float64
        null = ids % 5 == 0
        assert np.isnan(nf[null]).all()
        np.testing.assert_array_equal(nf[~null], ids[~null] / 2)
    if "lf" in batch:
        lf = batch["lf"]
        assert isinstance(lf, Ragged)
        assert lf.values.dtype == np.float32 and lf.offsets.dtype == np.int64
        assert lf.offsets[0] == 0 and len(lf) == len(ids)
        lengths = ids % 4
        np.testing.assert_array_equal(lf.lengths, lengths)
        np.testing.assert_array_equal(lf.values, (np.repeat(ids, lengths) + _ranks(lengths)).astype(np.float32))
    if "s" in batch:
        s = batch["s"]
        assert isinstance(s, Ragged) and s.kind == "utf8"
        assert s.values.dtype == np.uint8 and s.offsets.dtype == np.int64
        assert s.offsets[0] == 0 and len(s) == len(ids)
        expected = "".join(expected_string(int(i)) for i in ids).encode("utf-8")
        assert s.values.tobytes() == expected
        np.testing.assert_array_equal(s.lengths, [len(expected_string(int(i)).encode()) for i in ids])


# -- the reference model of the order -----------------------------------------

def ref_permutation(entropy: list[int], n: int) -> np.ndarray:
    """Stable argsort of PCG64's raw output: the documented permutation method."""
    bits = np.random.PCG64(np.random.SeedSequence(entropy)).random_raw(n)
    return np.argsort(np.asarray(bits, dtype=np.uint64), kind="stable")


def model_batches(
    info: DatasetInfo,
    *,
    seed: int,
    batch_size: int,
    epoch: int = 0,
    shuffle: bool = True,
    shuffle_window: int = 4,
    drop_last: bool = False,
    partitions: int = 1,
    world_size: int = 1,
    rank: int = 0,
    order: str = "windowed",
) -> list[np.ndarray]:
    """The ids of every batch rank ``rank`` should get, from the design's description alone
    (plan format 2: partitions are equal row ranges of the permuted unit stream)."""
    assert order == "windowed", "the model is plan format 2's windowed order"
    unit_ids = [ids for _, _, ids in info.units]
    m = batch_size * world_size // partitions
    all_ids = np.concatenate(unit_ids) if unit_ids else np.empty(0, np.int64)
    streams = [all_ids[rows] for rows in model_partitions_v2(
        [len(x) for x in unit_ids], seed=seed, epoch=epoch, shuffle=shuffle,
        shuffle_window=shuffle_window, partitions=partitions)]
    if drop_last:
        steps = min(len(s) // m for s in streams)
    else:
        steps = max(-(-len(s) // m) for s in streams)
    per = partitions // world_size
    owned = range(rank * per, (rank + 1) * per)
    return [np.concatenate([streams[p][i * m : (i + 1) * m] for p in owned]) for i in range(steps)]


def model_mix_ids(info: DatasetInfo, *, seed: int, epoch: int = 0, mix_window: int = 64,
                  block_rows: int | None = None, partitions: int = 1) -> list[np.ndarray]:
    """Each partition's stream of ids under the mixed order (plan format 3), from the design's
    prototype (experiments/mixing/order.py), which imports nothing of detload."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments" / "mixing" / "order.py"
    spec = importlib.util.spec_from_file_location("_mix_prototype", path)
    assert spec is not None and spec.loader is not None
    proto = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(proto)
    order = proto.stratified_order([len(ids) for _, _, ids in info.units], seed, epoch, window=mix_window,
                                   block_rows=block_rows, partitions=partitions)
    return [info.all_ids[s] for s in order.streams]


# -- strategies ----------------------------------------------------------------

# Names chosen so that UTF-8 byte order differs from a per-folder walk
# ("a-b" < "a.parquet" < "a/x") and from a case-insensitive sort ("B" < "a").
FILE_NAMES = [
    "a.parquet", "B.parquet", "a-b.parquet", "a/x.parquet", "a/y.pq",
    "part-00000.parquet", "é/z.parquet", "Z.parq",
]


@st.composite
def file_layouts(draw: st.DrawFn, max_rows: int = MAX_ROWS, max_files: int = 6) -> dict[str, list[int]]:
    """1–``max_files`` files of 0–4 row groups each (1–5000 rows, sometimes 0), ``max_rows`` in all."""
    names = draw(st.lists(st.sampled_from(FILE_NAMES), min_size=1, max_size=max_files, unique=True))
    budget = max_rows
    layout: dict[str, list[int]] = {}
    for name in names:
        sizes = []
        for _ in range(draw(st.integers(0, 4))):
            cap = min(MAX_RG, budget)
            n = draw(st.one_of(st.integers(1, min(40, max(cap, 1))), st.integers(0, max(cap, 0)), st.just(0)))
            n = min(n, cap)
            budget -= n
            sizes.append(n)
        layout[name] = sizes
    if budget == max_rows:  # no row at all: give one row group some rows
        name = draw(st.sampled_from(names))
        layout[name].append(draw(st.integers(1, 3000)))
    return layout


@st.composite
def datasets(draw: st.DrawFn, max_rows: int = MAX_ROWS) -> tuple[dict[str, list[int]], int]:
    """(layout, data seed): write it with `write_dataset`."""
    return draw(file_layouts(max_rows=max_rows)), draw(st.integers(0, 2**32 - 1))


@st.composite
def load_options(draw: st.DrawFn, total: int, max_steps: int = 250) -> dict[str, object]:
    """Order options for a dataset of ``total`` rows (at most ~``max_steps`` batches).

    batch_size ranges from small up to larger than the dataset (only up to the
    dataset with drop_last, which would otherwise drop every row).
    """
    drop_last = draw(st.booleans())
    lo = max(1, -(-total // max_steps))
    hi = total if drop_last else total + 10
    batch_size = draw(st.one_of(st.integers(lo, max(lo, hi)), st.sampled_from([lo, max(lo, hi), max(lo, total)])))
    batch_size = min(batch_size, hi) if drop_last else batch_size
    return {
        "seed": draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 100))),
        "batch_size": max(1, batch_size),
        "shuffle": draw(st.booleans()),
        "order": "windowed",
        "shuffle_window": draw(st.integers(1, 8)),
        "drop_last": drop_last,
    }


@st.composite
def dataset_and_options(draw: st.DrawFn, max_rows: int = MAX_ROWS) -> tuple[dict[str, list[int]], int, dict[str, object]]:
    layout, data_seed = draw(datasets(max_rows=max_rows))
    total = sum(sum(v) for v in layout.values())
    return layout, data_seed, draw(load_options(total))


@st.composite
def unit_rows(draw: st.DrawFn, min_units: int = 1, max_units: int = 60) -> list[int]:
    """Row counts of the non-empty row groups of a dataset (planner input)."""
    return draw(st.lists(st.integers(1, 3000), min_size=min_units, max_size=max_units))


# -- plan format 2 ---------------------------------------------------------------

@st.composite
def skewed_row_groups(draw: st.DrawFn, min_units: int = 1, max_units: int = 40,
                      max_huge: int = 3) -> list[int]:
    """Row-group sizes as writers leave them: mostly tiny or small, a few huge (up to 100,000 rows)."""
    small = st.one_of(st.integers(1, 8), st.integers(1, 300), st.integers(1, 5_000))
    sizes = draw(st.lists(small, min_size=min_units, max_size=max_units))
    for _ in range(draw(st.integers(0, max_huge))):
        sizes.insert(draw(st.integers(0, len(sizes))), draw(st.integers(20_000, 100_000)))
    return sizes


def model_partitions_v2(unit_rows: list[int], *, seed: int, epoch: int = 0, shuffle: bool = True,
                        shuffle_window: int = 4, partitions: int = 1) -> list[np.ndarray]:
    """Format 2's partition streams as canonical row numbers, from the documented model alone.

    The units' rows are laid end to end in the permuted unit order; partition p is
    rows [p*T//P, (p+1)*T//P) of that stream; within it, the pieces of units (a
    unit cut by a boundary is two pieces) form blocks of ``shuffle_window``, whose
    rows are permuted by the block stream. No groups.
    """
    n = len(unit_rows)
    lo, hi = seed & 0xFFFF_FFFF, seed >> 32
    order = ref_permutation([TAG_UNITS, lo, hi, epoch], n) if shuffle else np.arange(n)
    starts = np.concatenate([[0], np.cumsum(unit_rows)[:-1]]).astype(np.int64)
    stream = np.concatenate([np.arange(starts[u], starts[u] + unit_rows[u]) for u in order])
    unit_of = np.repeat(np.arange(n), np.asarray(unit_rows)[order])  # position in order, per stream row
    total = len(stream)
    out = []
    for p in range(partitions):
        a, b = p * total // partitions, (p + 1) * total // partitions
        rows, owner = stream[a:b], unit_of[a:b]
        cuts = np.flatnonzero(np.diff(owner)) + 1
        pieces = np.split(rows, cuts) if len(rows) else []
        blocks = []
        for number, k in enumerate(range(0, len(pieces), shuffle_window)):
            block = np.concatenate(pieces[k : k + shuffle_window])
            if shuffle:
                block = block[ref_permutation([TAG_BLOCK, lo, hi, epoch, p, number], len(block))]
            blocks.append(block)
        out.append(np.concatenate(blocks) if blocks else np.empty(0, np.int64))
    return out
