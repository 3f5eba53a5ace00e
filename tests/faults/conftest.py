"""Fixtures of the fault-injection suite: a checksummed test dataset, clean-run hashes, leak checks.

Everything here is local to ``tests/faults``; helpers shared by several test
files live in ``faultkit.py`` next to this file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faultkit import FaultData, LeakWatch, write_fault_dataset  # noqa: E402


@pytest.fixture
def leaks() -> Iterator[LeakWatch]:
    """Tracks loaders; at teardown asserts no worker, thread or /dev/shm segment of ours is left."""
    watch = LeakWatch()
    yield watch
    watch.assert_clean(grace=3.0)


@pytest.fixture
def fault_data(tmp_path) -> Callable[..., FaultData]:
    """``fault_data(files=4, row_groups=4, rows=250)`` writes a fresh dataset under tmp_path."""
    counter = [0]

    def make(**kw: int) -> FaultData:
        counter[0] += 1
        return write_fault_dataset(str(tmp_path / f"data{counter[0]}"), **kw)

    return make
