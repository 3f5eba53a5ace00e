"""Stage tracing: Loader.stats(), the Chrome trace file, `detload bench`, and the benchmark-only unordered merge."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _perfdata import write_small

import detload
from detload import Loader, OptionError
from detload._trace import STAGES
from detload.cli import main


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("stats") / "d")


@pytest.mark.parametrize("pool", ["thread", "process"])
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

    from detload._worker import DebugHooks

    with Loader(data, batch_size=1000, seed=3, workers=2) as probe:
        j = probe.plan(0).schedule[0].units[0]
        first_unit = (probe.dataset.files[probe._unit_files[j]].path, int(probe._unit_rgs[j]))
    hooks = DebugHooks(stall_unit=first_unit, stall_seconds=1.0, stall_epoch=0)
    with Loader(data, batch_size=1000, seed=3, workers=2, _debug=hooks) as ld:
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


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_unordered_benchmark_switch_still_delivers_every_row_once(data, pool):
    with Loader(data, batch_size=256, seed=3, workers=2, pool=pool, _benchmark_unordered=True) as ld:
        ids = np.concatenate([b["id"] for b in ld])
    assert np.array_equal(np.sort(ids), np.arange(9000))


def test_unordered_switch_refuses_a_manifest(data, tmp_path):
    with pytest.raises(OptionError, match="benchmark-only"):
        Loader(data, batch_size=256, seed=3, manifest=tmp_path / "m.jsonl", _benchmark_unordered=True)


def test_bench_command_prints_the_bound_and_writes_a_trace(data, tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["bench", str(data), "--workers", "2", "--epochs", "2", "--batch-size", "500",
                 "--trace", str(out)]) == 0
    text = capsys.readouterr().out
    assert "epoch 1:" in text and "bound by:" in text
    assert json.loads(out.read_text())["traceEvents"]


def test_bench_command_with_a_cache_reports_hits_per_epoch(data, tmp_path, capsys):
    assert main(["bench", str(data), "--workers", "2", "--epochs", "2", "--batch-size", "500",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("epoch ")]
    assert lines[0].endswith(", 0 of its row groups from the cache")  # epoch 0 fills it
    assert lines[1].endswith(", 18 of its row groups from the cache")  # 3 files x 6 row groups


def test_stats_before_iterating(data):
    with Loader(data, batch_size=256, seed=3) as ld:
        st = ld.stats()
    assert st.batches == 0 and st.bottleneck == "consumer_wait" and "nothing was consumed" in st.verdict


def test_cache_reads_and_writes_are_traced_stages(data, tmp_path):
    with Loader(data, batch_size=1000, seed=3, workers=2, cache_dir=tmp_path / "cache") as ld:
        list(ld)
        first = ld.stats()
        ld.set_epoch(1)
        list(ld)
        second = ld.stats()
    assert first.stages["cache_write"].count == 18 and first.stages["cache_read"].count == 0
    assert second.stages["cache_read"].count == 18  # epoch 1 is served from the cache
    assert second.stages["read"].count == 18         # no more Parquet reads than epoch 0 made
