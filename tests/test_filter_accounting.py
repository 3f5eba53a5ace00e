"""What a loader read: stats().reads and the trace count row groups read (from the source or the
cache) and skipped, their column-chunk bytes from the footers, and the rows selected per epoch;
a filter's selection pass is traced as the "select" stage, like the workers' gather of its rows."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from strategies import write_dataset

from detload import Loader, Pool

f = pc.field

# Sorted ids per file: statistics prune row groups of a range filter.
LAYOUT = {"a.parquet": [300, 200, 17], "b.parquet": [250, 0, 99], "c.parquet": [210, 90, 33, 120]}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return write_dataset(str(tmp_path_factory.mktemp("acct") / "ds"), LAYOUT, seed=2).root


def _chunk_bytes(root: str, columns: list[str], groups: list[tuple[str, int]]) -> int:
    # Independently of detload: the footers' compressed sizes of the named top-level columns.
    total = 0
    for rel, g in groups:
        md = pq.read_metadata(os.path.join(root, rel))
        rg = md.row_group(g)
        total += sum(rg.column(j).total_compressed_size for j in range(rg.num_columns)
                     if rg.column(j).path_in_schema.split(".")[0] in columns)
    return total


def _groups(root: str) -> list[tuple[str, int, int]]:
    out = []
    for rel in sorted(LAYOUT):
        md = pq.read_metadata(os.path.join(root, rel))
        out.extend((rel, g, md.row_group(g).num_rows) for g in range(md.num_row_groups) if md.row_group(g).num_rows)
    return out


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("window", [64, 2])
def test_an_unfiltered_loader_counts_every_row_group_and_its_bytes_per_epoch(root, kind, window):
    cols = ["id", "f32"]
    groups = _groups(root)
    with Loader(root, columns=cols, batch_size=64, seed=1, workers=2, pool=kind, mix_window=window) as ld:
        tasks = len(ld.plan().tasks[0])
        for e in (0, 1):
            ld.set_epoch(e)
            for _ in ld:
                pass
        reads = ld.stats().reads
    per_epoch = _chunk_bytes(root, cols, [(r, g) for r, g, _ in groups])
    rows = sum(n for *_, n in groups)
    assert [e.epoch for e in reads.epochs] == [0, 1]
    # mix_window 64: one task an epoch, whose window the workers keep for the next epoch,
    # which then reads nothing. 2: several tasks, every row group read once an epoch.
    assert (tasks == 1) is (window == 64)
    epochs_reading = 1 if tasks == 1 else 2
    for e in reads.epochs:
        # Process workers that share a task's window (fewer tasks than workers) do so through
        # a scratch cache in /dev/shm: what a worker maps from there is not the cache's (no
        # cache= is given), and the row group was read once, by the worker that converted it.
        reading = e.epoch < epochs_reading
        assert (e.row_groups_read, e.row_groups_cached, e.bytes_read, e.rows_selected) == (
            len(groups) if reading else 0, 0, per_epoch if reading else 0, rows)
    assert reads.bytes_read == epochs_reading * per_epoch and reads.row_groups_read == epochs_reading * len(groups)
    assert reads.row_groups_skipped == 0 and reads.rows_selected == 2 * rows and reads.planning == {}


def test_a_filtered_loader_counts_planning_and_skipped_row_groups(root, tmp_path):
    expr = f("id") < 1300  # ids are a permutation of 1000.. : about a fifth of the rows
    cols = ["id", "s"]
    with Loader(root, columns=cols, batch_size=50, seed=1, workers=2, filter=expr,
                pool=Pool(trace=True)) as ld:
        delivered = sum(len(b["id"]) for b in ld)
        fs = ld.filter_stats
        st = ld.stats()
        st.write_trace(tmp_path / "t.json")
    assert fs is not None
    reads = st.reads
    expected = pq.read_table(root, columns=["id"]).filter(expr).num_rows
    assert delivered == expected == reads.rows_selected == fs["rows_selected"]
    assert reads.row_groups_skipped == fs["pruned_total"] + fs["selected_empty"] == fs["row_groups_skipped"]
    (epoch,) = reads.epochs
    assert epoch.row_groups_skipped == reads.row_groups_skipped
    assert epoch.row_groups_read == fs["row_groups"] - fs["row_groups_skipped"]
    # Random ids: statistics settle nothing, so the selection pass read the filter's column of
    # every row group, and the workers read the requested columns of those the plan kept.
    assert fs["selection_pass"] == fs["row_groups"] == len(_groups(root))
    assert fs["bytes_read"] == _chunk_bytes(root, ["id"], [(r, g) for r, g, _ in _groups(root)])
    assert reads.bytes_read == epoch.bytes_read + fs["bytes_read"]
    # The "select" stage: one span per row group of the selection pass, one per gather in a
    # worker (every kept row group is partly selected here).
    assert st.stages["select"].count == fs["selection_pass"] + epoch.row_groups_read
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert any(n.startswith("planning thread") for n in names)
    assert any(e["name"] == "select" for e in trace["traceEvents"] if e["ph"] == "X")
    assert trace["otherData"]["reads_per_epoch"]["0"] == {
        "row_groups_read": epoch.row_groups_read, "bytes_read": epoch.bytes_read, "row_groups_cached": 0,
        "rows_selected": expected, "row_groups_skipped": reads.row_groups_skipped}
    assert trace["otherData"]["planning"]["bytes_read"] == fs["bytes_read"]
    assert any(e["name"].startswith("read from the source") for e in trace["traceEvents"] if e["ph"] == "C")
    assert "row group(s) from the source" in st.table() and "skipped per epoch" in st.table()


def test_the_selection_pass_bytes_are_the_filter_columns_of_the_row_groups_it_read(tmp_path):
    # Ids sorted within each file, so statistics settle some row groups and leave others to the pass.
    root = tmp_path / "sorted"
    root.mkdir()
    for i in range(3):
        ids = np.arange(i * 1000, i * 1000 + 1000, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 2.0, "s": [str(v) for v in ids]}), root / f"{i}.parquet",
                       row_group_size=250)
    expr = (f("id") >= 1100) & (f("id") < 1600)
    with Loader(str(root), columns=["x"], batch_size=64, seed=0, workers=1, filter=expr) as ld:
        for _ in ld:
            pass
        fs = ld.filter_stats
        reads = ld.stats().reads
    assert fs is not None
    # Row groups of 250: [1000,1250) and [1500,1750) partly match, [1250,1500) wholly, the rest not at all.
    assert (fs["selection_pass"], fs["all_rows"], fs["pruned"]["statistics"]) == (2, 1, 9)
    passed = [(p, g) for p, g, *_ in fs["examples"]["selection_pass"]]
    assert passed == [("1.parquet", 0), ("1.parquet", 2)]
    assert fs["bytes_read"] == _chunk_bytes(str(root), ["id"], passed)
    kept = [("1.parquet", 0), ("1.parquet", 1), ("1.parquet", 2)]
    assert reads.epochs[0].bytes_read == _chunk_bytes(str(root), ["x"], kept)
    assert reads.bytes_read == fs["bytes_read"] + reads.epochs[0].bytes_read
    assert reads.row_groups_skipped == 9 and reads.rows_selected == 500


def test_a_warm_cache_reads_no_source_bytes_and_a_window_leaves_planning_out(root, tmp_path):
    expr = f("id") < 1300
    kw = dict(columns=["id", "s"], batch_size=50, seed=1, workers=2, filter=expr, cache=str(tmp_path / "c"))
    with Loader(root, **kw) as ld:
        for _ in ld:
            pass
        cold = ld.stats().reads
    with Loader(root, **kw) as ld:
        mark = ld.stats_mark()
        for _ in ld:
            pass
        warm = ld.stats().reads
        window = ld.stats(since=mark).reads
        fs = ld.filter_stats
    assert fs is not None and fs["selection_cached"] == fs["selection_pass"] + fs["selection_cached"] > 0
    assert cold.row_groups_read > 0 and cold.bytes_read > 0
    assert warm.row_groups_read == 0 and warm.bytes_read == 0  # selections and row groups both cached
    assert warm.row_groups_cached == cold.row_groups_read and warm.rows_selected == cold.rows_selected
    assert window.rows_selected == warm.rows_selected and window.row_groups_cached == warm.row_groups_cached
    assert window.row_groups_skipped == warm.row_groups_skipped  # the plan's, in every window


def test_a_worker_gather_that_dominates_names_select_as_the_bound():
    """The gather of selected rows is its own stage: it can bound throughput (and so
    `starvation_check`'s verdict), and planning's selection pass, one-time, does not."""
    from detload._trace import CONSUMER, Tracer
    from detload.stats import summarize

    tr = Tracer()
    tr.planned([(0, 0.0, 5.0), (1, 0.0, 5.0)], {"row_groups": 2, "row_groups_skipped": 0})
    tr.run_started(2, "thread")
    tr.pool_started(2)
    t = 0.0
    for _ in range(20):
        for w in (0, 1):
            tr.worker_spans(w, [("read", t, t + 0.002), ("convert", t, t + 0.001), ("select", t, t + 0.03),
                                ("permute", t, t + 0.001)], 0)
    for _ in range(40):
        tr.span("consumer_wait", CONSUMER, t, t + 0.02)
        tr.span("consumer_step", CONSUMER, t, t + 0.0001)
    tr.run_ended()
    tr.wall = 1.0
    st = summarize(tr)
    assert st.bottleneck == "select", st.verdict
    assert st.stages["select"].total_s == pytest.approx(10.0 + 40 * 0.03)
    assert st.stages["select"].busy == pytest.approx(40 * 0.03 / 2)  # planning's 10 s is not busy time
