"""The stall/death watch on a stand-in pool: when a stall is declared, and what a death says the
worker was doing (the fault tests check the same messages end to end, with real workers)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from detload._engine.watch import Watch
from detload.errors import WorkerError, WorkerStalledError


class _Status:
    def __init__(self, st: tuple[int, int, int, int]) -> None:
        self.st = st

    def get(self) -> tuple[int, int, int, int]:
        return self.st


def _pool(st: tuple[int, int, int, int], alive: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        statuses=[_Status(st)], alive=lambda w: alive, kind="process", exitcode=lambda w: -9,
        describe_death=lambda w: f"worker process {w} (pid 7) was killed by signal 9",
        cfg=SimpleNamespace(files=[SimpleNamespace(path="a.parquet"), SimpleNamespace(path="b.parquet")],
                            memory_map=False))


def test_a_worker_whose_status_does_not_change_stalls():
    pool = _pool((3, 0, 1, 2))
    watch = Watch(pool, 3, 0.2)  # type: ignore[arg-type]
    watch.expect(0)
    assert not watch.dead(0)
    watch.progress(0, 0)  # within the timeout
    time.sleep(0.3)
    assert not watch.dead(0)
    with pytest.raises(WorkerStalledError) as ei:
        watch.progress(0, 0)
    assert str(ei.value) == ("worker 0 made no progress for 0.2 s on block 0 (reading b.parquet row group 2). "
                             "A stalled read (network, disk)? Raise it with pool=detload.Pool(stall_timeout=...), "
                             "or stall_timeout=None to wait forever.")
    assert ei.value.unit == ("b.parquet", 2)


def test_progress_restarts_the_stall_clock():
    pool = _pool((3, 0, 0, 0))
    watch = Watch(pool, 3, 0.2)  # type: ignore[arg-type]
    watch.expect(0)
    for rg in range(1, 5):
        time.sleep(0.1)
        pool.statuses[0].st = (3, 0, 0, rg)  # a new row group each 0.1 s: never stalled
        assert not watch.dead(0)
        watch.progress(0, 0)


def test_no_stall_timeout_waits_forever():
    watch = Watch(_pool((3, 0, 0, 0)), 3, None)  # type: ignore[arg-type]
    watch.expect(0)
    time.sleep(0.05)
    assert not watch.dead(0)
    watch.progress(0, 0)


def test_a_stall_in_a_block_of_another_pass_says_so():
    watch = Watch(_pool((4, 1, 0, 5)), 3, 0.01)  # type: ignore[arg-type]
    watch.expect(0)
    time.sleep(0.05)
    watch.dead(0)
    with pytest.raises(WorkerStalledError, match=r"\(reading a.parquet row group 5, for a block of another pass "
                                                 r"that it must finish first\)"):
        watch.progress(0, 6)


@pytest.mark.parametrize(("st", "doing"), [
    ((3, -1, -1, -1), "waiting to produce block 6 (between row groups)"),
    ((3, 6, 1, 0), "producing block 6 (reading b.parquet row group 0)"),
    ((2, 4, 0, 1), "reading a.parquet row group 1 for a block of an earlier pass"),
    ((4, 0, 0, 1), "reading a.parquet row group 1 for a block of the next pass"),
])
def test_a_death_says_what_the_worker_was_doing(st, doing):
    watch = Watch(_pool(st, alive=False), 3, None)  # type: ignore[arg-type]
    watch.expect(0)
    assert watch.dead(0)
    err = watch.death(0, 6)
    assert isinstance(err, WorkerError) and err.worker == 0
    assert str(err) == (f"worker process 0 (pid 7) was killed by signal 9 while {doing}; block 6 is the first "
                        "of this pass it did not hand over. Every batch yielded before this error is intact.")


def test_a_death_in_the_unordered_merge_names_the_worker_only():
    watch = Watch(_pool((3, 0, 0, 0), alive=False), 3, None)  # type: ignore[arg-type]
    err = watch.death(0)
    assert str(err) == "worker process 0 (pid 7) was killed by signal 9" and err.unit is None
