"""The resume contract, tested once for every way a training loop iterates detload.

A state saved after k batches (at the start, mid-epoch, at an epoch's end, in a
later epoch, at the end of the run) and loaded into a new loader, at another
worker count or pool, gives exactly the batches an uninterrupted run gives
after those k (compared by `detload.audit.hash_batch`), and the manifest the two
parts write is the uninterrupted run's. Subjects: `Loader`, and `TorchLoader`
on the CPU both without a thread and with its feeder thread, which runs ahead
of the training loop while the state counts what the loop received.
Loader-only behaviour (rejected states, elastic resume, the CLI) stays in
test_resume.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import _distdata
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detload import Loader, Ragged
from detload.audit import hash_batch

EPOCHS = 2
CONFIGS: dict[str, dict[str, Any]] = {
    "shuffle": dict(batch_size=48, seed=11, columns=["id", "s"], order="windowed", shuffle_window=2),
    "ordered-drop-last": dict(batch_size=50, seed=3, shuffle=False, drop_last=True, columns=["id", "x"]),
    "partitions": dict(batch_size=32, seed=7, partitions=2, columns=["id", "s", "x"]),
}
# Where the first part stops, as a function of the steps in an epoch.
POINTS: dict[str, Callable[[int], int]] = {
    "start": lambda n: 0,
    "mid-epoch": lambda n: n // 2,
    "epoch-end": lambda n: n,
    "next-epoch": lambda n: n + n // 3,
    "run-end": lambda n: EPOCHS * n,
}
# The resumed loader's workers and pool, one per point: each test resumes in a process pool once.
RESUMED = [(1, "thread"), (3, "thread"), (2, "process"), (1, "thread"), (2, "thread")]


class Subject:
    """How a training loop iterates one kind of loader: build it, and hash what a step hands over."""

    def __init__(self, name: str) -> None:
        self.name = name

    def make(self, ds: str, opts: dict[str, Any], *, workers: int, pool: str, manifest: str) -> Any:
        loader = Loader(ds, workers=workers, pool=pool, manifest=manifest, **opts)
        if self.name == "loader":
            return loader
        from detload.torch import TorchLoader

        return TorchLoader(loader, device=None if self.name == "torch" else "cpu")

    def hash(self, batch: dict[str, Any]) -> str:
        if self.name == "loader":
            return hash_batch(batch)[0]
        from detload.torch import RaggedTensor

        arrays = {k: Ragged(v.values.numpy(), v.offsets.numpy(), v.kind) if isinstance(v, RaggedTensor)
                  else v.numpy() for k, v in batch.items()}
        return hash_batch(arrays)[0]

    def __repr__(self) -> str:
        return self.name


def _subjects() -> list[Any]:
    torch_missing = pytest.mark.skipif(not _has_torch(), reason="needs torch")
    return [pytest.param(Subject("loader"), id="loader"), pytest.param(Subject("torch"), marks=torch_missing, id="torch"),
            pytest.param(Subject("torch-feeder"), marks=torch_missing, id="torch-feeder")]


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("resume_contract") / "ds")
    _distdata.write(root)
    return root


@pytest.fixture(scope="module")
def reference(ds, tmp_path_factory) -> Callable[[str], tuple[list[str], int, list[str]]]:
    """reference(config): the uninterrupted run's batch hashes, steps per epoch and manifest body."""
    runs: dict[str, tuple[list[str], int, list[str]]] = {}

    def get(config: str) -> tuple[list[str], int, list[str]]:
        if config not in runs:
            path = str(tmp_path_factory.mktemp("reference") / "m.jsonl")
            hashes: list[str] = []
            with Loader(ds, workers=2, manifest=path, **CONFIGS[config]) as loader:
                for e in range(EPOCHS):
                    loader.set_epoch(e)
                    hashes += [hash_batch(b)[0] for b in loader]
                steps = len(loader)
            runs[config] = hashes, steps, _body(path)
        return runs[config]

    return get


def _body(path: str) -> list[str]:
    """A manifest without its header line (which records the worker count and pool)."""
    with open(path) as f:
        return f.read().split("\n")[1:]


def _batches(loader: Any, epochs: int = EPOCHS) -> Iterator[dict[str, Any]]:
    """What a training loop sees: from the loader's epoch and position to the end of the run."""
    for e in range(loader.epoch, epochs):
        loader.set_epoch(e)  # the same epoch keeps a loaded position
        yield from loader


def _resume_matches(subject: Subject, ds: str, config: str, reference: Any, tmp: str, k: int,
                    workers: int, pool: str) -> None:
    want, _, body = reference(config)
    opts = CONFIGS[config]
    manifest = os.path.join(tmp, "m.jsonl")
    first: list[str] = []
    with subject.make(ds, opts, workers=2, pool="thread", manifest=manifest) as a:
        if k:
            for batch in _batches(a):
                first.append(subject.hash(batch))
                if len(first) == k:
                    break
        state = json.loads(json.dumps(a.state_dict()))  # JSON round trip, as a checkpoint would
    assert set(state) == {"format", "fingerprint", "plan_format", "epoch", "step", "order"}
    with subject.make(ds, opts, workers=workers, pool=pool, manifest=manifest) as b:
        b.load_state_dict(state)
        rest = [subject.hash(batch) for batch in _batches(b)]
    assert first == want[:k], "the first part is not the uninterrupted run's start"
    assert rest == want[k:], f"resumed after {k} batches (state {state['epoch']}/{state['step']}): other batches"
    assert _body(manifest) == body, "the two parts' manifest is not the uninterrupted run's"


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("subject", _subjects())
def test_resume_at_the_start_mid_epoch_and_at_epoch_ends(subject, config, ds, reference, tmp_path):
    _, steps, _ = reference(config)
    for (point, at), (workers, pool) in zip(POINTS.items(), RESUMED):
        k = at(steps)
        out = tmp_path / point
        out.mkdir()
        _resume_matches(subject, ds, config, reference, str(out), k, workers, pool)


@settings(max_examples=12 if os.environ.get("DETLOAD_FULL") == "1" else 4, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("subject", _subjects())
def test_resume_after_any_number_of_batches(subject, ds, reference, tmp_path_factory, data):
    config = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
    _, steps, _ = reference(config)
    k = data.draw(st.integers(0, EPOCHS * steps), label="stop after")
    workers = data.draw(st.sampled_from([1, 3]), label="resumed workers")
    pool = data.draw(st.sampled_from(["thread", "process"]), label="resumed pool")
    _resume_matches(subject, ds, config, reference, str(tmp_path_factory.mktemp("any")), k, workers, pool)
