"""The engine's memory helpers: finalizers that keep a Ctrl-C, buffer addresses."""

from __future__ import annotations

import gc
import mmap
import signal
import sys
import time
import weakref

import numpy as np
import pytest

from detload._engine.memory import address_of, finalize, install_ctrl_c_hook


class _Thing:
    pass


def _interrupted() -> None:
    raise KeyboardInterrupt  # what a SIGINT landing inside the finalizer raises there


def test_a_ctrl_c_inside_a_finalizer_reaches_the_loop():
    """With a plain weakref.finalize Python prints "Exception ignored" and the interrupt is lost."""
    thing = _Thing()
    finalize(thing, _interrupted)
    with pytest.raises(KeyboardInterrupt):
        del thing
        deadline = time.monotonic() + 5  # the re-raised interrupt comes within moments
        while time.monotonic() < deadline:
            time.sleep(0.001)


class _Stop(KeyboardInterrupt):
    """Like detload run's SIGTERM exception: a KeyboardInterrupt of its own kind."""


def _stopped() -> None:
    raise _Stop


@pytest.mark.parametrize("kind", [KeyboardInterrupt, _Stop])
def test_a_ctrl_c_inside_a_finalizer_reaches_the_loop_when_the_handler_ignores_signals(kind):
    """`detload run`'s handler ignores both signals before it raises (the first one decides):
    re-raising by simulating SIGINT must not depend on that handler. The same exception comes
    out and the ignoring handler is back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        thing = _Thing()
        finalize(thing, _interrupted if kind is KeyboardInterrupt else _stopped)
        with pytest.raises(kind) as info:
            del thing
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.001)
        assert type(info.value) is kind
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_finalizer_that_runs_cleanly_raises_nothing():
    seen = []
    thing = _Thing()
    finalize(thing, seen.append, 1)
    del thing
    time.sleep(0)
    assert seen == [1]


def test_other_unraisable_exceptions_still_reach_the_previous_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    thing = _Thing()
    finalize(thing, _fails)
    del thing
    gc.collect()
    assert seen == [ValueError]


def _fails() -> None:
    raise ValueError("boom")


def test_a_ctrl_c_in_any_weakref_callback_is_redelivered_once_the_hook_is_in(monkeypatch):
    """Python's own callbacks (WeakSet._remove of a finished thread) swallow it as well."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    install_ctrl_c_hook()
    install_ctrl_c_hook()  # once is enough: a second call does not chain twice
    thing = _Thing()
    keep = weakref.ref(thing, lambda ref: _interrupted())  # noqa: F841 (a dead ref calls nothing)
    with pytest.raises(KeyboardInterrupt):
        del thing
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.001)
    assert seen == []


def test_address_of_holds_no_export():
    mm = mmap.mmap(-1, 4096)
    address, n = address_of(mm)
    assert n == 4096 and address != 0
    mm.close()  # would raise BufferError if address_of had kept a view
    arr = np.zeros(100, dtype=np.uint8)
    assert address_of(arr) == (arr.ctypes.data, 100)
