"""The engine's memory helpers: finalizers that keep a Ctrl-C, buffer addresses."""

from __future__ import annotations

import mmap
import time
import weakref

import numpy as np
import pytest

from detload._engine.memory import address_of, keeps_ctrl_c


class _Thing:
    pass


def _interrupted() -> None:
    raise KeyboardInterrupt  # what a SIGINT landing inside the finalizer raises there


def test_a_ctrl_c_inside_a_finalizer_reaches_the_loop():
    """Without the wrapper weakref prints "Exception ignored" and the interrupt is lost."""
    thing = _Thing()
    weakref.finalize(thing, keeps_ctrl_c(_interrupted))
    with pytest.raises(KeyboardInterrupt):
        del thing
        deadline = time.monotonic() + 5  # the re-raised interrupt comes within moments
        while time.monotonic() < deadline:
            time.sleep(0.001)


def test_a_finalizer_that_runs_cleanly_raises_nothing():
    seen = []
    thing = _Thing()
    weakref.finalize(thing, keeps_ctrl_c(seen.append), 1)
    del thing
    time.sleep(0)
    assert seen == [1]


def test_address_of_holds_no_export():
    mm = mmap.mmap(-1, 4096)
    address, n = address_of(mm)
    assert n == 4096 and address != 0
    mm.close()  # would raise BufferError if address_of had kept a view
    arr = np.zeros(100, dtype=np.uint8)
    assert address_of(arr) == (arr.ctypes.data, 100)
