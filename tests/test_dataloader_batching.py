"""A torch DataLoader must not batch detload's batches again: only ``batch_size=None`` is taken.

With automatic batching (torch's default ``batch_size=1``, or any other size) a DataLoader
would give every column a leading dimension of 1, or stack several batches; both loaders refuse
it at ``iter()`` with a message that says ``batch_size=None``, and stay usable. With
``batch_size=None`` the DataLoader yields the loader's own batches, byte for byte.
"""

from __future__ import annotations

import gc
import re

import _distdata
import numpy as np
import pytest
from leaks import stray_children, wait_until

from detload import Loader, OptionError, Ragged, hash_batch

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from detload.torch import RaggedTensor, TorchLoader  # noqa: E402

OPTS = dict(batch_size=200, seed=3, columns=["id", "x"])


def refused(what: str, given: str) -> str:
    """The whole message, as a regex."""
    return re.escape(
        f"a {what} already yields whole batches, and this torch DataLoader ({given}) would batch them again: at "
        "batch_size=1, the DataLoader's default, every column gains a leading dimension of 1, and at more, that "
        "many batches are stacked and a shorter last one fails. Pass batch_size=None to the DataLoader: it then "
        f"passes each batch on as the {what} made it (set the batch size with the Loader's own batch_size=; a "
        "collate_fn= then receives each whole batch)") + "$"


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("batching") / "ds")
    _distdata.write(root)  # 1,753 rows: 8 batches of 200 and a last one of 153
    return root


def reference(ds: str, epoch: int) -> list[str]:
    with Loader(ds, **OPTS) as loader:
        loader.set_epoch(epoch)
        return [hash_batch(b)[0] for b in loader]


def _numpy(batch: dict) -> dict:
    return {k: Ragged(v.values.numpy(), v.offsets.numpy(), v.kind) if isinstance(v, RaggedTensor) else v.numpy()
            for k, v in batch.items()}


def _subject(ds: str, what: str):
    loader = Loader(ds, **OPTS)
    return loader if what == "Loader" else TorchLoader(loader)


@pytest.mark.parametrize("what", ["Loader", "TorchLoader"])
@pytest.mark.parametrize("batching", [{}, {"batch_size": 1}, {"batch_size": 8}, {"batch_size": 8, "drop_last": True}])
def test_a_dataloader_that_batches_is_refused_and_the_loader_stays_usable(ds, what, batching):
    want = reference(ds, epoch=1)
    with _subject(ds, what) as subject:
        subject.set_epoch(1)
        with pytest.raises(OptionError, match=refused(what, f"batch_size={batching.get('batch_size', 1)}")):
            for _ in DataLoader(subject, **batching):
                pass
        # Refused at iter(), before the loader started a pass: the right form yields the whole epoch.
        assert [hash_batch(_numpy(b))[0] for b in DataLoader(subject, batch_size=None)] == want


@pytest.mark.parametrize("what", ["Loader", "TorchLoader"])
def test_batch_size_none_yields_the_loaders_own_batches(ds, what):
    for epoch in (0, 2):
        want = reference(ds, epoch)
        with _subject(ds, what) as subject:
            subject.set_epoch(epoch)
            got = list(DataLoader(subject, batch_size=None))
        assert [hash_batch(_numpy(b))[0] for b in got] == want
        assert [len(b["id"]) for b in got] == [200] * 8 + [153]
        assert all(b["id"].ndim == 1 for b in got)


def test_a_collate_fn_receives_each_whole_batch_with_batch_size_none(ds):
    seen: list[int] = []

    def collate(batch):
        seen.append(len(batch["id"]))
        return batch["id"]

    with Loader(ds, **OPTS) as loader:
        got = list(DataLoader(loader, batch_size=None, collate_fn=collate))
    assert seen == [200] * 8 + [153]
    assert [type(b) for b in got] == [np.ndarray] * 9  # the collate_fn's own result, not converted


class Rows(IterableDataset):
    """A user's dataset that iterates a Loader and yields its rows one by one."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def __iter__(self):
        for batch in iter(self.loader):
            yield from batch["id"]


def test_a_dataset_that_yields_a_loaders_rows_may_be_batched(ds):
    """Only a DataLoader over the loader itself is refused: rows re-batched by the user's dataset are theirs."""
    with Loader(ds, **OPTS) as loader:
        ids = np.concatenate([b["id"] for b in loader])
        got = list(DataLoader(Rows(loader), batch_size=500))
    assert [len(b) for b in got] == [500, 500, 500, 253]
    assert np.array_equal(torch.cat(got).numpy(), ids)


def test_a_batching_fetcher_without_a_dataloader_is_refused_too(ds):
    """torch's fetcher made directly (as wrappers of the DataLoader do): its batch size is not known."""
    from torch.utils.data import default_collate
    from torch.utils.data._utils.fetch import _IterableDatasetFetcher

    with Loader(ds, **OPTS) as loader:
        with pytest.raises(OptionError, match=refused("Loader", "a batch_size other than None")):
            _IterableDatasetFetcher(loader, True, default_collate, False)
        fetcher = _IterableDatasetFetcher(loader, False, lambda b: b, False)  # no batching: taken
        assert len(fetcher.fetch(None)["id"]) == 200


def test_dataloader_workers_are_refused_first_whatever_the_batch_size(ds):
    """num_workers > 0 with batching: the workers' message, which also says batch_size=None."""
    with Loader(ds, **OPTS) as loader:
        dl = DataLoader(loader, batch_size=8, num_workers=1, multiprocessing_context="fork")
        with pytest.raises(OptionError) as info:
            next(iter(dl))
        last = str(info.value).rstrip().splitlines()[-1]
        assert last == (
            "detload.errors.OptionError: a Loader cannot run in the worker processes of a torch DataLoader "
            "(num_workers=1): detload is already parallel, and each of them would read the whole epoch. Pass "
            "num_workers=0 to the DataLoader (with batch_size=None) and set the Loader's own workers= (and "
            "pool=\"process\")"), last
        del dl, info
        gc.collect()  # the error's traceback held the DataLoader's iterator, whose __del__ ends its worker
        wait_until(lambda: not stray_children(), 30.0)
