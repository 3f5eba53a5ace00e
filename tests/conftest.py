"""Shared test set-up: hypothesis profiles, Parquet dataset fixtures and the leak check.

Profiles: ``ci`` (the default; few examples, since most property tests start
workers) and ``local`` (many more). Pick one with ``HYPOTHESIS_PROFILE=local``.

``pool`` runs a test with each worker pool (thread, process).

``leak_check`` asserts that nothing a loader started outlives it: no worker
process, no ``detload-*`` thread, no ``/dev/shm/detload-<our pid>-*`` segment.

``bench_script`` loads a script of experiments/bench as a module, as it runs there.

A run started with SIGINT ignored (in the background by a shell without job control, or
under nohup) gets Python's handler back, so the Ctrl-C tests can see their KeyboardInterrupt.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, settings

# An ignored SIGINT is inherited across exec, so the Ctrl-C tests' child processes would
# ignore it too; a handler is not, so once this process has one, its children start with the
# default disposition and Python installs its own handler in them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Make the helper modules next to this file importable whatever the import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from strategies import DatasetInfo, write_dataset  # noqa: E402

import detload._read.reader  # noqa: E402

# "ci" keeps the suite within its time budget; "local" (HYPOTHESIS_PROFILE=local) searches harder.
for _name, _examples in (("ci", 10), ("local", 100)):
    settings.register_profile(
        _name,
        max_examples=_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# -- leak checking -------------------------------------------------------------

from leaks import LeakCheck  # noqa: E402


@pytest.fixture
def leak_check() -> Iterator[LeakCheck]:
    check = LeakCheck()
    yield check
    check.assert_clean()


# -- the two worker pools ------------------------------------------------------

@pytest.fixture(params=["thread", "process"])
def pool(request) -> str:
    """The worker pool: a test that takes ``pool`` runs once with threads, once with processes."""
    return request.param


# -- datasets ------------------------------------------------------------------

@pytest.fixture
def make_dataset(tmp_path) -> Callable[..., DatasetInfo]:
    """``make_dataset({"a.parquet": [100, 50], "b.parquet": []}, seed=0)`` writes the standard columns."""
    counter = [0]

    def make(files: dict[str, list[int]], seed: int = 0, name: str | None = None) -> DatasetInfo:
        counter[0] += 1
        root = tmp_path / (name or f"ds{counter[0]}")
        return write_dataset(str(root), files, seed=seed)

    return make


@pytest.fixture
def small_dataset(make_dataset) -> DatasetInfo:
    """Three data files (one empty, one with an empty row group), 1,211 rows in 6 units."""
    return make_dataset({
        "a.parquet": [300, 200],
        "b.parquet": [],
        "c.parquet": [250, 0, 250, 1],
        "sub/d.parquet": [210],
    })


# -- instrumentation -------------------------------------------------------------

@pytest.fixture
def unit_log(monkeypatch) -> list[tuple[str, int]]:
    """Records every (file, row group) a thread worker reads."""
    log: list[tuple[str, int]] = []
    real = detload._read.reader.UnitReader.read

    def read(self, file_idx, rg, t, **kw):
        log.append((self.cfg.files[file_idx].path, rg))
        return real(self, file_idx, rg, t, **kw)

    monkeypatch.setattr(detload._read.reader.UnitReader, "read", read)
    return log


# -- benchmark scripts ---------------------------------------------------------

BENCH = Path(__file__).resolve().parent.parent / "experiments" / "bench"


@pytest.fixture()
def bench_script(monkeypatch) -> Iterator[Callable[[str], ModuleType]]:
    """``load("bench")``: experiments/bench/bench.py as a fresh module, its folder on sys.path
    (where its own imports, datagen and the rest, are found)."""
    loaded: list[str] = []

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(BENCH))
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        loaded.append(spec.name)
        return mod

    yield load
    for name in loaded:
        sys.modules.pop(name, None)
