"""starvation_check: loader-fed vs replayed throughput, the verdict, and NumPy or torch batches.

The verdict's logic is tested on recorded timings (`_report`, `stats._bottleneck`); the live
checks assert only what holds at any machine speed, so a loaded machine cannot fail them.
"""

from __future__ import annotations

import time

import pytest
from _perfdata import write_small

from detload import Loader, OptionError, starvation_check
from detload._trace import STAGES
from detload.starvation import _report, _verdict
from detload.stats import StageStats, _bottleneck


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("starve") / "d", ragged=False)


def _stages(consumer_wait_s: float, consumer_step_s: float, **worker_s: float) -> dict[str, StageStats]:
    """Recorded stage totals as stats.summarize makes them (busy: total over 1 s of wall per thread)."""
    totals = {"consumer_wait": consumer_wait_s, "consumer_step": consumer_step_s, **worker_s}
    return {name: StageStats(name, where, 20 if name in totals else 0, totals.get(name, 0.0), 0.0, 0.0, 0.0,
                             0.0, 0.0, totals.get(name, 0.0)) for name, where in STAGES.items()}


def test_a_slow_step_is_reported_as_the_bottleneck():
    """Recorded timings of 20 steps of a 10 ms model step fed by a loader that needs well under
    1 ms a batch: the loader's trace names the step, and so does the report."""
    bottleneck, detail = _bottleneck(_stages(0.0011, 0.2000, read=0.02, permute=0.01), 0.0011 / 0.2042, 2)
    assert bottleneck == "consumer_step" and "a faster loader would not help" in detail
    rep = _report(20, 20, 20 * 200, loader_s=0.2042, replay_s=0.2010, waited=0.0011,
                  bottleneck=bottleneck, detail=detail)
    assert rep.steps == 20 and rep.rows == 4000
    assert rep.feed_efficiency == pytest.approx(0.2010 / 0.2042)
    assert rep.consumer_wait_fraction == pytest.approx(0.0011 / 0.2042)
    assert rep.loader_steps_per_s == pytest.approx(20 / 0.2042) and rep.replay_rows_per_s == pytest.approx(4000 / 0.2010)
    assert rep.verdict.startswith("The model step is the bottleneck: the loader costs it 2% of its throughput")
    assert str(rep).startswith("fed by the loader: 97.9 steps/s (19,589 rows/s); replayed from memory: 99.5 steps/s")


@pytest.mark.parametrize("eff, wait, starts", [
    (0.95, 0.04, "The model step is the bottleneck"),   # at the threshold: fed
    (0.90, 0.08, "Mild starvation: the step runs at 90% of its speed from memory and waited for data 8%"),
    (0.90, 0.04, "The step ran at 90% of its speed from memory, yet waited for data only 4%"),  # < half the loss
    (0.50, 0.45, "The data path starves the step: it runs at 50%"),
])
def test_the_verdict_follows_the_recorded_efficiency_and_wait(eff, wait, starts):
    rep = _report(10, 10, 1000, loader_s=1.0, replay_s=eff, waited=wait, bottleneck="read", detail="workers busy")
    assert rep.verdict.startswith(starts), rep.verdict
    # The trace's stage is named only where it explains a wait.
    assert ("names `read`: workers busy" in rep.verdict) is starts.startswith(("Mild", "The data path"))


def test_a_short_run_says_so_in_the_verdict():
    rep = _report(100, 3, 9000, loader_s=0.3, replay_s=0.3, waited=0.0, bottleneck=None, detail="")
    assert rep.steps == 3 and rep.verdict.endswith("(The loader ran out after 3 of the 100 steps asked for; all 3 were timed.)")


def test_a_live_check_reports_on_its_own_timings(data, pool):
    """A smoke test on the live machine: it asserts what holds at any machine speed, that the
    report is complete and its verdict is the one its own recorded timings call for."""
    with Loader(data, batch_size=200, seed=1, workers=2, pool=pool) as ld:
        rep = starvation_check(ld, lambda b: time.sleep(0.01), steps=20, warmup=2)
    assert rep.steps == 20 and rep.rows == 20 * 200
    assert rep.loader_seconds >= 20 * 0.01 and rep.replay_seconds >= 20 * 0.01
    assert rep.feed_efficiency == pytest.approx(rep.replay_seconds / rep.loader_seconds)
    assert 0.0 <= rep.consumer_wait_fraction <= 1.0
    assert rep.bottleneck in STAGES  # a detload loader names a stage from its trace of the timed steps
    kind = _verdict(rep.feed_efficiency, rep.consumer_wait_fraction, None, "").split(":")[0]
    assert rep.verdict.split(":")[0] == kind, rep.verdict
    assert str(rep).startswith("fed by the loader: ") and rep.verdict in str(rep)


def test_a_torch_loader_names_its_bound(data):
    pytest.importorskip("torch")
    from detload.torch import TorchLoader

    with TorchLoader(Loader(data, batch_size=200, seed=1, workers=2)) as tl:
        rep = starvation_check(tl, lambda b: time.sleep(0.01), steps=10, warmup=2)
        assert tl.stats().batches >= 12
    assert rep.bottleneck is not None and rep.steps == 10


def test_a_step_slowed_by_competition_for_cores_is_not_told_to_add_workers():
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
