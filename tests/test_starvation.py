"""starvation_check: loader-fed vs replayed throughput, the verdict, and NumPy or torch batches."""

from __future__ import annotations

import time

import pytest
from _perfdata import write_small

from detload import Loader, OptionError, starvation_check


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("starve") / "d", ragged=False)


def test_a_slow_step_is_reported_as_the_bottleneck(data, pool):
    with Loader(data, batch_size=200, seed=1, workers=2, pool=pool) as ld:
        rep = starvation_check(ld, lambda b: time.sleep(0.01), steps=20, warmup=2)
    assert rep.steps == 20 and rep.rows == 20 * 200
    assert rep.feed_efficiency > 0.8  # a 10 ms step hides a loader that needs well under 1 ms a batch
    # The trace covers the timed steps only: the pool's start-up (in the warm-up) is not
    # in it, so it names the step, as the verdict does.
    assert rep.bottleneck == "consumer_step", rep.verdict
    assert "fed by the loader" in str(rep) and "model step is the bottleneck" in rep.verdict


def test_a_torch_loader_names_its_bound(data):
    pytest.importorskip("torch")
    from detload.torch import TorchLoader

    with TorchLoader(Loader(data, batch_size=200, seed=1, workers=2)) as tl:
        rep = starvation_check(tl, lambda b: time.sleep(0.01), steps=10, warmup=2)
        assert tl.stats().batches >= 12
    assert rep.bottleneck is not None and rep.steps == 10


def test_a_step_slowed_by_competition_for_cores_is_not_told_to_add_workers():
    from detload.starvation import _verdict

    v = _verdict(0.57, 0.06, "read", "the consumer waited 89% of the time")
    assert "competes with the step for the CPU" in v and "more workers would not" in v
    assert "Add workers" not in v
    assert "starves the step" in _verdict(0.3, 0.65, None, "")


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
    assert "ran out after 3 of the 100 steps asked for" in rep.verdict


@pytest.mark.parametrize("kw, msg", [
    ({"steps": 0}, r"steps must be an int >= 1 \(batches to time\), got 0"),
    ({"steps": True}, r"steps must be an int >= 1 \(batches to time\), got bool True"),
    ({"warmup": -1}, r"warmup must be an int >= 0 \(batches stepped before timing\), got -1"),
])
def test_bad_arguments(data, kw, msg):
    # detload's own error (errors.py: every error detload raises on purpose is a DetloadError)
    with Loader(data, batch_size=300, seed=1) as ld, pytest.raises(OptionError, match=msg):
        starvation_check(ld, lambda b: None, **kw)


def test_step_fn_must_be_callable(data):
    with Loader(data, batch_size=300, seed=1) as ld, pytest.raises(OptionError, match="step_fn must be a callable"):
        starvation_check(ld, 5, steps=3)


def test_nothing_after_warmup(data):
    with (Loader(data, batch_size=3000, seed=1) as ld,
          pytest.raises(OptionError, match=r"ran out during the warm-up \(3 batch\(es\), warmup=5\)")):
        starvation_check(ld, lambda b: None, steps=5, warmup=5)
