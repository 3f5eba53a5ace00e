"""The planner through the Loader: balanced partitions on unequal row groups, tiny datasets,
the block memory warning, and what happens to format-1 manifests and states."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from detload import BlockMemoryWarning, Distributed, Loader, OptionError, Pool, StateError
from detload.cli import main as cli_main
from detload.verify import verify

# The newcomer's dataset (issue #19): 27 row groups of unequal sizes, 500,000 rows.
NEWCOMER_ROWS = 500_000


def _newcomer_sizes() -> list[int]:
    rng = np.random.default_rng(19)
    sizes = rng.integers(2_000, 40_000, size=27)
    sizes = (sizes * NEWCOMER_ROWS // sizes.sum()).astype(np.int64)
    sizes[-1] += NEWCOMER_ROWS - sizes.sum()
    assert len(set(sizes.tolist())) > 20 and sizes.min() > 0
    return sizes.tolist()


def _write(path: str, sizes: list[int], **extra: object) -> str:
    """One file whose row groups have ``sizes``; column ``id`` numbers the rows 0, 1, ..."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    total = sum(sizes)
    cols = {"id": pa.array(np.arange(total, dtype=np.int64))}
    cols.update({k: pa.array(v) for k, v in extra.items()})  # type: ignore[call-overload]
    table = pa.table(cols)
    with pq.ParquetWriter(path, table.schema) as w:
        pos = 0
        for n in sizes:
            w.write_table(table.slice(pos, n), row_group_size=n)
            pos += n
    return os.path.dirname(path)


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory) -> str:
    return _write(str(tmp_path_factory.mktemp("newcomer") / "ds" / "part-0.parquet"), _newcomer_sizes())


def _rank_batches(root: str, R: int, **kw: object) -> list[list[np.ndarray]]:
    out = []
    for r in range(R):
        with Loader(root, seed=3, distributed=Distributed(r, R), columns=["id"], **kw) as loader:  # type: ignore[arg-type]
            batches = [np.array(b["id"]) for b in loader]
            assert len(batches) == len(loader)
        out.append(batches)
    return out


def test_the_newcomers_case_balances_partitions_and_drops_less_than_a_global_batch(newcomer):
    """P=8, R=2, batch 64: 3,907 steps, only the last one short, every row once (issue #19)."""
    ranks = _rank_batches(newcomer, 2, batch_size=64, partitions=8, workers=2)
    plan = Loader(newcomer, batch_size=64, seed=3, partitions=8, distributed=Distributed(0, 2)).plan()
    assert plan.partition_rows == (62_500,) * 8  # 500,000 / 8, whatever the row groups
    assert 0 < plan.redundant_reads <= 7
    assert [len(r) for r in ranks] == [3_907, 3_907]
    for batches in ranks:
        sizes = [len(b) for b in batches]
        assert set(sizes[:-1]) == {64}, "no short step except the last"
        assert sizes[-1] == 4 * 4  # 62,500 - 3,906 * 16 = 4 rows per partition, 4 partitions a rank
    per_rank = [sum(len(b) for b in batches) for batches in ranks]
    assert per_rank == [250_000, 250_000]
    ids = np.concatenate([b for batches in ranks for b in batches])
    assert np.array_equal(np.sort(ids), np.arange(NEWCOMER_ROWS)), "every row exactly once"

    kept = Loader(newcomer, batch_size=64, seed=3, partitions=8, distributed=Distributed(1, 2), drop_last=True)
    assert len(kept) == 3_906 and kept.plan().dropped_rows == NEWCOMER_ROWS - 3_906 * 128 < 128
    kept.close()


def test_per_rank_rows_are_equal_to_within_one(tmp_path):
    root = _write(str(tmp_path / "ds" / "a.parquet"), [1, 7, 3_001, 5, 40_000, 2, 999])
    total = 44_015
    for R in (1, 2, 4):
        ranks = _rank_batches(root, R, batch_size=64 // R, partitions=4, order="windowed", shuffle_window=2)
        rows = [sum(len(b) for b in batches) for batches in ranks]
        assert max(rows) - min(rows) <= 1 and sum(rows) == total
        steps = [np.concatenate([ranks[r][i] for r in range(R)]) for i in range(len(ranks[0]))]
        if R == 1:
            one = steps
        else:
            assert all(np.array_equal(a, b) for a, b in zip(one, steps, strict=True)), \
                "the union of each global step is the same at every world size"


def test_as_many_partitions_as_row_groups_of_one_row(tmp_path):
    """3 rows in 3 row groups, 3 partitions on 3 ranks: a row each; a fourth partition is refused."""
    root = _write(str(tmp_path / "ds" / "a.parquet"), [1, 1, 1])
    ranks = _rank_batches(root, 3, batch_size=1, partitions=3, shuffle=False)
    assert [[len(b) for b in r] for r in ranks] == [[1], [1], [1]]
    assert sorted(int(b[0]) for r in ranks for b in r) == [0, 1, 2]
    with pytest.raises(OptionError, match=r"^partitions=4 exceeds the 3 non-empty row groups"):
        Loader(root, batch_size=4, seed=0, partitions=4)


def test_fewer_rows_than_a_global_batch(tmp_path):
    root = _write(str(tmp_path / "ds" / "a.parquet"), [4, 6])
    (batches,) = _rank_batches(root, 1, batch_size=64, partitions=2)
    assert [len(b) for b in batches] == [10]
    loader = Loader(root, batch_size=64, seed=0, partitions=2, drop_last=True)
    with pytest.raises(OptionError, match=r"the epoch holds 10 rows, the smallest of the 2 partitions 5, fewer than "
                                          r"one micro-batch of 32 rows \(global batch 64 = 2 x 32\)"):
        iter(loader)
    loader.close()


def test_the_block_memory_warning_comes_once_per_loader(tmp_path):
    root = _write(str(tmp_path / "ds" / "a.parquet"), [5_000, 3_000], x=np.zeros(8_000, np.float32))
    loader = Loader(root, batch_size=100, seed=0, order="windowed", shuffle_window=2, pool=Pool(block_memory="50kB"))
    assert loader._bytes_per_row() == 12 == loader._row_bytes  # int64 + float32
    with pytest.warns(BlockMemoryWarning, match=r"the largest block holds 8,000 rows, about 0 MiB at 12 bytes per "
                                                r"row.*smaller shuffle_window \(now 2\).*smaller row groups") as got:
        loader.plan(0)
        loader.plan(1)
    assert len([w for w in got if issubclass(w.category, BlockMemoryWarning)]) == 1
    assert issubclass(BlockMemoryWarning, UserWarning)
    loader.close()
    quiet = Loader(root, batch_size=100, seed=0, pool=Pool(block_memory=None))
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error", BlockMemoryWarning)
        quiet.plan(0)
    quiet.close()


def test_block_memory_is_a_pool_option_with_a_size():
    assert Pool().block_memory_bytes == 2**30
    assert Pool(block_memory="2GB").block_memory_bytes == 2 * 10**9
    with pytest.raises(OptionError, match=r"Pool.block_memory 'lots' is not a size"):
        Pool(block_memory="lots")


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_block_bigger_than_estimated_warns_at_its_measured_size(tmp_path, pool):
    # Ten distinct 300-byte strings in a dictionary: Parquet stores about a byte a row, the
    # block holds 308. The estimate (8 id + 8 offset + ~1) keeps the planning quiet at a 1 MB
    # budget; the first block (4 x 5,000 rows, about 6 MB) does not.
    words = [chr(65 + i % 10) * 300 for i in range(20_000)]
    root = _write(str(tmp_path / "ds" / "a.parquet"), [5_000] * 4, s=words)
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = Loader(root, batch_size=1000, seed=0, order="windowed", pool=Pool(kind=pool, block_memory="1MB"),
                        workers=1)
        loader.plan(0)
        assert loader._row_bytes < 30
        assert not [w for w in seen if issubclass(w.category, BlockMemoryWarning)]
        for _ in range(2):  # two epochs: one warning
            for _ in loader:
                pass
        loader.close()
    got = [str(w.message) for w in seen if issubclass(w.category, BlockMemoryWarning)]
    assert len(got) == 1, got
    assert re.search(r"the largest block holds 20,000 rows, about 6 MiB at 31\d bytes per row, over the block "
                     r"memory budget of 1 MiB.*\(Measured on the first block: 31\d bytes per row, against \d+ "
                     r"estimated from the Parquet metadata before reading\.\) Pass Pool\(block_memory=None\)", got[0])


def test_a_block_as_estimated_gives_no_second_warning(tmp_path):
    root = _write(str(tmp_path / "ds" / "a.parquet"), [5_000] * 4, x=np.zeros(20_000, np.float32))
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with Loader(root, batch_size=1000, seed=0, order="windowed", pool=Pool(block_memory="100kB")) as loader:
            for _ in loader:
                pass
    got = [str(w.message) for w in seen if issubclass(w.category, BlockMemoryWarning)]
    assert len(got) == 1 and "Measured" not in got[0], got  # the planning's, at 12 bytes a row


def test_variable_length_columns_are_estimated_from_the_parquet_metadata(tmp_path):
    words = [f"{i:0100d}" for i in range(1_000)]  # unique: a dictionary would not shrink them
    root = _write(str(tmp_path / "ds" / "a.parquet"), [1_000], s=words)
    with Loader(root, batch_size=10, seed=0) as loader:
        per = loader._bytes_per_row()
    assert 100 < per < 140  # 8 (id) + 8 (offset) + ~104 uncompressed bytes per string


def _as_format_1(header: dict) -> dict:
    """A header or state as a format-1 detload wrote it: no units digest, plan_format 1 in `order`."""
    old = dict(header)
    old.pop("plan_format", None)
    old["order"] = {k: v for k, v in header["order"].items() if k != "units_digest"} | {"plan_format": 1}
    return old


def test_verify_between_format_1_and_format_2_says_the_plan_formats_differ(tmp_path, capsys):
    root = _write(str(tmp_path / "ds" / "a.parquet"), [30, 50])
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    for path in (a, b):  # format 1 is faked from format 2's manifest
        with Loader(root, batch_size=8, seed=1, order="windowed", manifest=path) as loader:
            for _ in loader:
                pass
    with open(a) as f:
        lines = f.read().splitlines()
    header = json.loads(lines[0])
    assert header["plan_format"] == 2 == header["order"]["plan_format"] and header["fingerprint"]
    with open(a, "w") as f:
        f.write("\n".join([json.dumps(_as_format_1(header)), *lines[1:]]) + "\n")
    res = verify(a, b)
    assert not res.identical and res.kind == "formats"
    assert res.message.startswith("plan formats differ (1 vs 2)")
    assert cli_main(["verify", a, b]) == 1
    assert "plan formats differ (1 vs 2)" in capsys.readouterr().out


def test_a_format_1_state_is_refused_with_the_reason(tmp_path):
    root = _write(str(tmp_path / "ds" / "a.parquet"), [30, 50])
    with Loader(root, batch_size=8, seed=1, order="windowed") as loader:
        state = loader.state_dict()
        assert state["plan_format"] == 2 and state["fingerprint"] == loader.fingerprint
        with pytest.raises(StateError, match=r"cannot resume: the plan format changed \(1 in the state, 2 here\): "
                                             r"this detload plans with format 2 .*Start a new run"):
            loader.load_state_dict(_as_format_1(state))


def test_resume_at_another_world_size_equals_the_uninterrupted_run(tmp_path):
    """Stopped at R=2 mid-epoch, resumed at R=4: the global steps are the uninterrupted R=1 run's."""
    root = _write(str(tmp_path / "ds" / "a.parquet"), [2, 900, 17, 3_000, 1, 450])
    opts = dict(seed=3, partitions=4, order="windowed", shuffle_window=2)
    (whole,) = _rank_batches(root, 1, batch_size=64, partitions=4, order="windowed", shuffle_window=2)
    stop = len(whole) // 2
    state = None
    for r in range(2):
        with Loader(root, batch_size=32, distributed=Distributed(r, 2), columns=["id"], **opts) as loader:
            it = iter(loader)
            for _ in range(stop):
                next(it)
            state = loader.state_dict()
    resumed = []
    for r in range(4):
        with Loader(root, batch_size=16, distributed=Distributed(r, 4), columns=["id"], workers=1 + r % 2,
                    **opts) as loader:
            loader.load_state_dict(state)
            resumed.append([np.array(b["id"]) for b in loader])
    steps = [np.concatenate([resumed[r][i] for r in range(4)]) for i in range(len(resumed[0]))]
    assert len(steps) == len(whole) - stop
    assert all(np.array_equal(a, b) for a, b in zip(whole[stop:], steps, strict=True))


def test_detload_plan_shows_ranges_rows_per_partition_and_redundant_reads(newcomer, capsys):
    assert cli_main(["plan", newcomer, "--batch-size", "64", "--seed", "3", "--partitions", "8",
                     "--world-size", "2", "--rank", "0", "--order", "windowed"]) == 0
    out = capsys.readouterr().out
    assert "(format 2)" in out and "rows per partition [" + ", ".join(["62,500"] * 8) + "]" in out
    assert "redundant reads: " in out
    assert "part-0.parquet#" in out and "[" in out.split("block k=0")[1]
    cut = [line for line in out.splitlines() if "block k=" in line and ":" in line.split("[", 1)[1]]
    assert cut, "a unit cut by a partition boundary is shown as a row range"
    assert cli_main(["plan", newcomer, "--batch-size", "64", "--seed", "3", "--partitions", "8",
                     "--world-size", "2", "--rank", "0", "--order", "windowed", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan_format"] == 2 and d["partition_rows"] == [62_500] * 8 and d["redundant_reads"] >= 1
    assert all(len(r) == 4 for blk in d["blocks"] for u in blk["units"] for r in u["ranges"])


def test_partitions_and_world_size_above_the_row_groups_are_refused_at_construction(tmp_path):
    """The planner works once per partition: a count the data cannot fill is refused when the
    loader is built (naming the option, its value and the bound), never left to len() to spin on."""
    root = _write(str(tmp_path / "ds" / "a.parquet"), [30, 50, 20])  # three row groups
    for kw, match in [
        (dict(batch_size=2**63, partitions=2**63),
         r"^partitions=9223372036854775808 exceeds the 3 non-empty row groups of the dataset \(after any "
         r"filter\): partitions must be at most 3\. Use a smaller partitions"),
        (dict(batch_size=1, distributed=Distributed(0, 10**20)),
         r"^world_size=100000000000000000000 exceeds the 3 non-empty row groups .*world_size must be at most 3\."),
        (dict(batch_size=4, partitions=4), r"^partitions=4 exceeds the 3 non-empty row groups .*at most 3\."),
        (dict(batch_size=4, partitions=4, distributed=Distributed(0, 4)),
         r"^world_size=4 exceeds the 3 non-empty row groups .*at most 3\."),
        # a filter's pruning counts: 2 row groups deliver rows
        (dict(batch_size=3, partitions=3, filter="id >= 30"), r"^partitions=3 exceeds the 2 non-empty row groups"),
    ]:
        with pytest.raises(OptionError, match=match):
            Loader(root, seed=0, **kw)
    with Loader(root, batch_size=3, seed=0, partitions=3) as loader:  # the bound itself plans
        assert len(loader) == 34 and loader.plan().partition_rows == (33, 33, 34)


def test_huge_batch_size_and_window_plan_at_once(tmp_path):
    """Other user numbers the planner counts with do not set its work: one step, one block."""
    root = _write(str(tmp_path / "ds" / "a.parquet"), [30, 50, 20])
    with Loader(root, batch_size=2**62, seed=0, order="windowed", shuffle_window=2**62) as loader:
        assert len(loader) == 1 and len(loader.plan().schedule) == 1
        assert sum(len(b["id"]) for b in loader) == 100
