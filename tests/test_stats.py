"""Stage tracing: Loader.stats(), the Chrome trace file, `detload bench`, and the benchmark-only unordered merge."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _perfdata import write_small
from testhooks import hooked

import detload
from detload import Loader, OptionError
from detload._trace import STAGES
from detload.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("stats") / "d")


def test_stats_count_every_stage_and_name_the_bound(data, pool, tmp_path):
    # A manifest makes the merger hash every batch (without one nothing is hashed).
    with Loader(data, batch_size=256, seed=3, workers=2, pool=pool, manifest=tmp_path / "m.jsonl") as ld:
        rows = sum(len(b["id"]) for b in ld)
        st = ld.stats()
    assert rows == 9000 and st.rows == 9000 and st.batches == len(ld)
    assert set(st.stages) == set(STAGES)
    units = 18  # 3 files x 6 row groups
    assert st.stages["read"].count == units and st.stages["convert"].count == units
    assert st.stages["permute"].count == 5  # blocks of 4 units
    assert st.stages["merge_wait"].count == 5
    assert st.stages["hash"].count == st.batches
    # The first get waits for the new pool (start-up); the last one returns the end marker.
    assert st.stages["startup"].count == 1 and st.startup_s == st.stages["startup"].total_s > 0
    assert st.stages["consumer_wait"].count == st.batches
    assert st.stages["consumer_step"].count == st.batches  # the loop came back for each batch
    for s in st.stages.values():
        assert s.total_s >= 0 and s.p50_ms <= s.p90_ms <= s.p99_ms <= s.max_ms + 1e-9
    assert st.bottleneck in STAGES
    assert st.bottleneck in st.table() and "bound by" in st.table()
    assert st.wall_s > 0 and 0 <= st.consumer_wait_fraction <= 1


def test_no_manifest_means_no_hashing(data):
    with Loader(data, batch_size=256, seed=3, workers=2) as ld:
        for _ in ld:
            pass
        st = ld.stats()
    assert st.stages["hash"].count == 0


def test_a_slow_consumer_is_named_as_the_bound(data):
    import time

    with Loader(data, batch_size=1000, seed=3, workers=2) as ld:
        for _ in ld:
            time.sleep(0.05)
        st = ld.stats()
    assert st.bottleneck == "consumer_step", st.table()
    assert "training loop" in st.verdict
    step = st.stages["consumer_step"]
    # The step is the loop's own time between batches: here the sleeps, and most of the wall.
    assert step.count == st.batches == 9 and step.total_s >= 9 * 0.05 and step.p50_ms >= 50
    assert step.busy > 0.8 and st.consumer_wait_fraction < 0.2, st.table()


def test_start_up_is_traced_apart_from_the_waits_of_the_run(data):
    """A slow start (a process re-importing a heavy main module; here a 1 s first read)
    is traced as start-up, so a run bound by its step is not blamed on reading."""
    import time

    from detload._engine.config import DebugHooks

    with Loader(data, batch_size=1000, seed=3, workers=2) as probe:
        j = probe.plan(0).schedule[0].sources[0]
        first_unit = (probe.dataset.files[probe._unit_files[j]].path, int(probe._unit_rgs[j]))
    hooks = DebugHooks(stall_unit=first_unit, stall_seconds=1.0, stall_epoch=0)
    with hooked(Loader, data, batch_size=1000, seed=3, workers=2, debug=hooks) as ld:
        t0 = time.perf_counter()  # before iter(): the stalled read starts when the tasks go out
        it = iter(ld)
        next(it)
        first = time.perf_counter() - t0
        for _ in it:
            time.sleep(0.03)
        st = ld.stats()
    assert first >= 1.0
    assert st.stages["startup"].count == 1 and abs(st.startup_s - first) < 0.05
    assert st.bottleneck == "consumer_step", st.table()
    assert st.consumer_wait_fraction < 0.2
    assert st.rows_per_s == pytest.approx(st.rows / (st.wall_s - st.startup_s))
    assert "(start-up 1." in st.table()


def test_chrome_trace_has_complete_counter_and_name_events(data, tmp_path):
    with Loader(data, batch_size=256, seed=3, workers=2, pool="process", manifest=tmp_path / "m.jsonl") as ld:
        for _ in ld:
            pass
        out = tmp_path / "trace.json"
        ld.stats().write_trace(out)
        worker_pids = set(ld._pool.pids())
    doc = json.loads(out.read_text())
    ev = doc["traceEvents"]
    assert isinstance(ev, list) and ev
    complete = [e for e in ev if e["ph"] == "X"]
    for e in complete:
        assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 and e["name"] in STAGES
    assert {e["name"] for e in complete} >= {"read", "convert", "permute", "merge_wait", "hash", "consumer_wait"}
    # Worker stages carry the worker process's pid; merger and consumer the loader's.
    assert {e["pid"] for e in complete if e["name"] == "read"} <= worker_pids
    import os

    assert {e["pid"] for e in complete if e["name"] in ("hash", "consumer_wait")} == {os.getpid()}
    counters = [e for e in ev if e["ph"] == "C"]
    assert counters and all(isinstance(v, (int, float)) for e in counters for v in e["args"].values())
    names = [e for e in ev if e["ph"] == "M"]
    assert any(e["name"] == "thread_name" and e["args"]["name"] == "merger" for e in names)


def test_tracing_does_not_change_batches(data):
    """The same options give byte-identical hashes whatever the pool (tracing included)."""

    def hashes(pool, workers):
        with Loader(data, batch_size=333, seed=5, workers=workers, pool=pool) as ld:
            return [detload.hash_batch(b)[0] for b in ld]

    assert hashes("thread", 1) == hashes("process", 2) == hashes("thread", 3)


def test_unordered_benchmark_switch_still_delivers_every_row_once(data, pool):
    with hooked(Loader, data, batch_size=256, seed=3, workers=2, pool=pool, unordered=True) as ld:
        ids = np.concatenate([b["id"] for b in ld])
    assert np.array_equal(np.sort(ids), np.arange(9000))


def test_unordered_switch_refuses_a_manifest(data, tmp_path):
    with pytest.raises(OptionError, match="benchmark-only"):
        hooked(Loader, data, batch_size=256, seed=3, manifest=tmp_path / "m.jsonl", unordered=True)


def test_bench_command_prints_the_bound_and_writes_a_trace(data, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["bench", str(data), "--workers", "2", "--epochs", "2", "--batch-size", "500",
                 "--trace", str(out)]) == 0
    text = capsys.readouterr().out
    assert "epoch 1:" in text and "bound by:" in text
    assert json.loads(out.read_text())["traceEvents"]


def test_bench_command_with_a_cache_reports_hits_per_epoch(data, tmp_path, capsys):
    # --mix-window 3: six tasks an epoch, several a worker, so no window is kept from epoch 0
    # (a worker's only task of a pass is; its next pass then reads neither source nor cache).
    assert main(["bench", str(data), "--workers", "2", "--epochs", "2", "--batch-size", "500",
                 "--mix-window", "3", "--cache-dir", str(tmp_path / "cache")]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
    assert lines[0].endswith(", 0 of its row groups from the cache")  # epoch 0 fills it
    assert lines[1].endswith(", 18 of its row groups from the cache")  # 3 files x 6 row groups


def test_stats_before_iterating(data):
    with Loader(data, batch_size=256, seed=3) as ld:
        st = ld.stats()
    assert st.batches == 0 and st.bottleneck == "consumer_wait" and "nothing was consumed" in st.verdict


def test_cache_reads_and_writes_are_traced_stages(data, tmp_path):
    # mix_window=3: several tasks a worker, so epoch 1 reads every row group again (a worker's
    # only window of a pass is kept for the next one, which then reads nothing).
    with Loader(data, batch_size=1000, seed=3, workers=2, mix_window=3, cache=tmp_path / "cache") as ld:
        list(ld)
        first = ld.stats()
        ld.set_epoch(1)
        list(ld)
        second = ld.stats()
    assert first.stages["cache_write"].count == 18 and first.stages["cache_read"].count == 0
    assert second.stages["cache_read"].count == 18  # epoch 1 is served from the cache
    assert second.stages["read"].count == 18         # no more Parquet reads than epoch 0 made


@pytest.mark.parametrize(("order", "packed"), [({"order": "windowed"}, False), ({"mix_window": 64}, True)])
def test_copies_into_a_window_pack_are_the_pack_stage(data, order, packed):
    # One task an epoch, one thread worker: the window is packed as it is read (kept for the
    # next epoch), each row group copied in once and traced as `pack`; the windowed order
    # packs nothing.
    with Loader(data, batch_size=1000, seed=3, workers=1, **order) as ld:
        list(ld)
        st = ld.stats()
    assert (st.stages["pack"].count == 18) is packed, st.stages["pack"].count
    assert (st.stages["pack"].total_s > 0) is packed


# -- one-time costs, bounded buffers, tracing off -----------------------------------------------

def test_worker_start_up_is_its_own_stage(data):
    """Each worker warms pyarrow.compute before its first block, traced as worker_startup."""
    # mix_window=6: three tasks of the 18 row groups, so that every worker gets one.
    with Loader(data, batch_size=1000, seed=3, workers=3, mix_window=6) as ld:
        list(ld)
        st = ld.stats()
    assert st.stages["worker_startup"].count == 3
    assert st.stages["worker_startup"].where == "worker"
    assert "worker_startup" in st.table()


def test_one_time_costs_do_not_decide_the_verdict():
    """Each worker's first block carries its one-time costs: left out of the choice of stage."""
    from detload._trace import CONSUMER, Tracer
    from detload.stats import summarize

    tr = Tracer()
    tr.run_started(2, "thread")
    tr.pool_started(2)
    t = 0.0
    for w in (0, 1):  # first blocks: 0.6 s of imports inside convert
        tr.worker_spans(w, [("read", t, t + 0.01), ("convert", t, t + 0.6), ("permute", t, t + 0.001)], 0)
    for _ in range(20):  # afterwards reading dominates
        for w in (0, 1):
            tr.worker_spans(w, [("read", t, t + 0.02), ("convert", t, t + 0.001), ("permute", t, t + 0.001)], 0)
    for _ in range(40):
        tr.span("consumer_wait", CONSUMER, t, t + 0.02)
        tr.span("consumer_step", CONSUMER, t, t + 0.0001)
    tr.run_ended()
    tr.wall = 1.0
    st = summarize(tr)
    assert st.stages["convert"].total_s > st.stages["read"].total_s  # the totals keep everything
    assert st.bottleneck == "read", st.verdict


def test_a_short_bench_is_not_bound_by_start_up(tmp_path):
    """`detload bench` over 2 epochs of small data, in a fresh interpreter (where every
    lazy import is still to come): start-up must not make `convert` the bound."""
    import os
    import subprocess
    import sys

    small = write_small(tmp_path / "d", files=2, rows=2000, row_group=250, ragged=False)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "detload", "bench", str(small), "--workers", "2",
                          "--batch-size", "500"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    verdict = next(line for line in res.stdout.splitlines() if line.startswith("bound by:"))
    assert not verdict.startswith("bound by: convert"), res.stdout


def test_trace_buffers_are_bounded():
    from detload._trace import CONSUMER, MAX_DEPTHS, MAX_EVENTS, MAX_SAMPLES, MERGER, Tracer

    tr = Tracer()
    tr.pool_started(4)
    n = MAX_EVENTS + 5000
    for i in range(n):
        tr.span("consumer_wait", CONSUMER, i, i + 1.0)
        tr.span("stitch", MERGER, i, i + 0.5)
        tr.depth(float(i), (1, 2, 3, 4), 1)
        if i % 10 == 0:
            tr.worker_spans(i // 10 % 4, [("read", i, i + 2.0)], 1000 + i)  # a new pid each time (restarted pools)
    assert len(tr.events) == MAX_EVENTS
    assert len(tr.depths) == MAX_DEPTHS
    assert all(len(s) <= MAX_SAMPLES for s in tr.samples.values())
    assert len(tr.worker_pids) == 4
    # The aggregates still cover everything.
    assert tr.count["consumer_wait"] == n and tr.total["stitch"] == pytest.approx(0.5 * n)
    assert tr.depth_sums[0] == n and tr.depth_sums[1] / n == pytest.approx(2.5)


def test_many_epochs_keep_the_buffers_bounded(data):
    """The reduced form of the soak (experiments/bench/soak.py measures memory): after many
    small epochs every trace buffer is within its bound, while the counts cover every epoch."""
    from detload._trace import MAX_DEPTHS, MAX_EVENTS, MAX_SAMPLES

    with Loader(data, batch_size=50, seed=3, workers=2) as ld:
        for epoch in range(30):
            ld.set_epoch(epoch)
            for _ in ld:
                pass
        tr = ld._tracer
        st = ld.stats()
    assert st.batches == 30 * 180
    assert len(tr.events) == MAX_EVENTS and len(tr.depths) <= MAX_DEPTHS
    assert all(len(s) <= MAX_SAMPLES for s in tr.samples.values())
    assert len(tr.worker_pids) <= 2
    assert st.stages["consumer_step"].count == 30 * 180


def test_tracing_off_keeps_counts_but_no_events(data, tmp_path):
    with Loader(data, batch_size=500, seed=3, workers=2, pool=detload.Pool(trace=False)) as ld:
        rows = sum(len(b["id"]) for b in ld)
        st = ld.stats()
        tr = ld._tracer
    assert rows == 9000 and st.rows == 9000 and st.batches == 18
    assert st.stages["read"].count == 18 and st.stages["read"].total_s > 0
    assert st.bottleneck in STAGES
    assert not tr.events and not tr.depths and not any(tr.samples.values())
    with pytest.raises(OptionError, match=r"these stats carry no trace events: the loader was made with "
                                          r"Pool\(trace=False\)"):
        st.write_trace(tmp_path / "t.json")


def test_tracing_off_gives_the_same_batches(data):
    def hashes(trace):
        with Loader(data, batch_size=333, seed=5, workers=2, pool=detload.Pool(trace=trace)) as ld:
            return [detload.hash_batch(b)[0] for b in ld]

    assert hashes(True) == hashes(False)


def test_bench_trace_keeps_the_whole_run(data, tmp_path):
    """bench --trace widens the ring: the trace file holds every span of the benchmark."""
    out = tmp_path / "t.json"
    assert main(["bench", str(data), "--workers", "1", "--epochs", "3", "--batch-size", "3",
                 "--trace", str(out), "--quiet"]) == 0
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    waits = sum(1 for e in spans if e["name"] == "consumer_wait")
    # 9,000 batches: every wait but the first (start-up), plus each epoch's end; more than the default ring.
    assert waits == 3 * 3000 - 1 + 3
    from detload._trace import MAX_EVENTS

    assert len(spans) > MAX_EVENTS


@pytest.mark.parametrize("workers", [2, 3])
def test_each_row_group_counts_once_as_read_or_cached_when_process_workers_share_windows(data, tmp_path, workers):
    """Shared windows: one worker converts a row group into the cache (or the pool's scratch
    cache), the others map its entry; a warm run's workers all map entries already there.
    Either way each row group of the epoch is one read or one cache hit, not one per worker."""
    units = 18  # 3 files x 6 row groups
    seen = []
    for cache in (None, tmp_path / "c", tmp_path / "c"):  # scratch; cold cache; warm cache
        with Loader(data, batch_size=256, seed=3, workers=workers, pool="process", cache=cache) as ld:
            for _ in ld:
                pass
            r = ld.stats().reads
            seen.append((r.row_groups_read, r.row_groups_cached))
    assert seen == [(units, 0), (units, 0), (0, units)]
