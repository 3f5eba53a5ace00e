"""starvation_check: loader-fed vs replayed throughput, the verdict, and NumPy or torch batches."""

from __future__ import annotations

import time

import pytest
from _perfdata import write_small

from detload import Loader, starvation_check


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("starve") / "d", ragged=False)


def test_a_slow_step_is_reported_as_the_bottleneck(data):
    with Loader(data, batch_size=200, seed=1, workers=2) as ld:
        rep = starvation_check(ld, lambda b: time.sleep(0.01), steps=20, warmup=2)
    assert rep.steps == 20 and rep.rows == 20 * 200
    assert rep.feed_efficiency > 0.8  # a 10 ms step hides a loader that needs well under 1 ms a batch
    assert rep.bottleneck is not None
    assert "fed by the loader" in str(rep)


def test_a_starving_loader_is_reported(data):
    class Slow:
        """Any iterable works; this one takes 20 ms per batch while the step is free."""

        def __iter__(self):
            with Loader(data, batch_size=200, seed=1) as ld:
                for b in ld:
                    time.sleep(0.02)
                    yield b

    rep = starvation_check(Slow(), lambda b: None, steps=10, warmup=1)
    assert rep.feed_efficiency < 0.5
    assert rep.consumer_wait_fraction > 0.9
    assert rep.bottleneck is None  # not a detload loader: no trace to read
    assert "starves the step" in rep.verdict


def test_torch_batches(data):
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(1, 1)

    def step(b):
        x = torch.from_numpy(b["x"]).unsqueeze(1)
        lin(x).sum().backward()

    with Loader(data, batch_size=500, seed=1) as ld:
        rep = starvation_check(ld, step, steps=5, warmup=1)
    assert rep.steps == 5 and rep.loader_rows_per_s > 0 and rep.replay_rows_per_s > 0


def test_a_short_loader_measures_what_it_has(data):
    with Loader(data, batch_size=3000, seed=1) as ld:
        rep = starvation_check(ld, lambda b: None, steps=100, warmup=0)
    assert rep.steps == 3 and rep.rows == 9000


@pytest.mark.parametrize("kw, msg", [({"steps": 0}, "steps must be"), ({"warmup": -1}, "warmup must be")])
def test_bad_arguments(data, kw, msg):
    with Loader(data, batch_size=300, seed=1) as ld, pytest.raises(ValueError, match=msg):
        starvation_check(ld, lambda b: None, **kw)


def test_nothing_after_warmup(data):
    with Loader(data, batch_size=9000, seed=1) as ld, pytest.raises(ValueError, match="no batches"):
        starvation_check(ld, lambda b: None, steps=5, warmup=1)
