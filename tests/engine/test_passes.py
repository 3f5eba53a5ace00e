"""The pass-number rules (`Passes`): new passes, the pass built ahead, stops, staleness and close,
tested on the object alone, against a model of the rules, and over a shared slot as worker
processes read it."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from detload._engine.passes import CLOSED, EVERY, Passes, concerns
from detload._engine.spawn import SharedInts, Slot


def test_a_pass_begins_newer_than_anything_handed_out():
    p = Passes()
    n = p.fresh()
    p.begin(n)
    assert not p.is_stale(n) and p.is_stale(n - 1)
    a = p.ahead(n)
    assert a == n + 1 and not p.is_stale(a)  # built ahead: wanted while pass n runs
    # The pass that came was not the one built ahead: its number is newer than both.
    m = p.fresh()
    assert m > a
    p.begin(m)
    assert p.is_stale(a) and p.is_stale(n) and not p.is_stale(m)


def test_a_stop_after_the_merge_keeps_what_was_built_ahead():
    p = Passes()
    n = p.fresh()
    p.begin(n)
    a = p.ahead(n)
    p.stop(n, merged=True)
    assert p.is_stale(n) and not p.is_stale(a)
    p.begin(a)  # the next pass uses it
    assert not p.is_stale(a)


def test_a_stop_mid_pass_cancels_what_was_built_ahead_too():
    p = Passes()
    n = p.fresh()
    p.begin(n)
    a = p.ahead(n)
    p.stop(n, merged=False)
    assert p.is_stale(n) and p.is_stale(a)
    assert p.fresh() > a


def test_cancel_never_lowers_the_number():
    """The merger (on a failure) and the consumer (stopping a run) may cancel at once."""
    p = Passes()
    p.cancel(6)
    p.cancel(4)  # a late cancel of an older run
    assert p.oldest == 7
    p.begin(5)  # a late begin of an older pass
    assert p.oldest == 7


def test_close_makes_every_pass_stale():
    p = Passes()
    n = p.fresh()
    p.begin(n)
    a = p.ahead(n)
    assert not p.closed
    p.close()
    assert p.closed and p.oldest == CLOSED
    assert p.is_stale(n) and p.is_stale(a) and p.is_stale(CLOSED - 1)
    p.cancel(3)
    p.begin(9)
    assert p.closed  # nothing reopens a closed pool


def test_messages_for_every_pass_concern_each_one():
    assert concerns(4, 4) and concerns(EVERY, 4) and concerns(EVERY, 0)
    assert not concerns(3, 4) and not concerns(5, 4)


def test_a_worker_process_view_reads_the_pools_number():
    """Over a slot of SharedInts, a second `Passes` (what a worker process builds over its mapping)
    sees every move of the pool's at once."""
    ints = SharedInts(2)
    try:
        pool, worker = Passes(Slot(ints, 0)), Passes(Slot(ints, 0))
        n = pool.fresh()
        pool.begin(n)
        a = pool.ahead(n)
        assert ints[0] == n and not worker.is_stale(n) and not worker.is_stale(a)
        pool.stop(n, merged=True)
        assert worker.is_stale(n) and not worker.is_stale(a)
        assert not worker.closed
        pool.close()
        assert worker.closed and ints[1] == 0  # only its own slot is written
    finally:
        ints.close()


def test_concurrent_cancels_end_at_the_newest():
    p = Passes()
    barrier = threading.Barrier(4)

    def cancel(values: range) -> None:
        barrier.wait()
        for v in values:
            p.cancel(v)

    threads = [threading.Thread(target=cancel, args=(range(i, 4000, 4),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.oldest == 4000


_ops = st.lists(st.one_of(
    st.tuples(st.just("fresh")),
    st.tuples(st.just("ahead"), st.integers(0, 50)),
    st.tuples(st.just("begin"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("stop"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("close")),
), max_size=40)


@given(_ops)
def test_the_rules_against_a_model(ops):
    """The oldest wanted number is the largest bound any call set, never lower; a fresh number is
    newer than every number wanted or handed out; staleness is 'older than the oldest wanted'."""
    p = Passes()
    oldest, handed = 0, [0]
    for op in ops:
        before = p.oldest
        if op[0] == "fresh":
            n = p.fresh()
            assert n > oldest and n > max(handed)
            handed.append(n)
        elif op[0] == "ahead":
            assert p.ahead(op[1]) == op[1] + 1
            handed.append(op[1] + 1)
        elif op[0] == "begin":
            p.begin(op[1])
            oldest = max(oldest, op[1])
        elif op[0] == "cancel":
            p.cancel(op[1])
            oldest = max(oldest, op[1] + 1)
        elif op[0] == "stop":
            p.stop(op[1], merged=op[2])
            oldest = max(oldest, op[1] + (1 if op[2] else 2))
        else:
            p.close()
            oldest = CLOSED
        assert p.oldest == oldest >= before
        assert p.closed == (oldest >= CLOSED)
        for n in handed:
            assert p.is_stale(n) == (n < oldest)
