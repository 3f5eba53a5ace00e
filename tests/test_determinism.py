"""The determinism contract: batches are a function of data, seed, epoch and order options only.

Not of the worker count, the pool kind, prefetch depth, timing, consumer speed
or an interrupted pass. Delivered ids are also checked against `model_batches`,
an independent re-derivation of the documented order.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from strategies import check_rows, dataset_and_options, model_batches, write_dataset
from testhooks import hooked

import detload
from detload import Loader, Pool, read_manifest
from detload._engine.config import DebugHooks

EXECUTION_FIELDS = {"workers", "pool", "detload_version"}


def manifest_signature(path: str) -> dict[str, object]:
    """Everything in a manifest that must not depend on how the run executed."""
    m = read_manifest(path)
    assert not m.torn_tail
    return {
        "header": {k: v for k, v in m.header.items() if k not in EXECUTION_FIELDS},
        "epochs": [(e.epoch, e.steps, e.dropped_rows, e.plan) for e in m.epochs.values()],
        "batches": [(b["epoch"], b["step"], b["rows"], b["hash"], b["columns"], b["parts"]) for b in m.batches()],
    }


def run_epoch(root: str, manifest: str, leak_check=None, *, check_values: bool = False, **kw) -> tuple[list[np.ndarray], int]:
    """Iterate one epoch; returns (ids per batch, len(loader))."""
    with Loader(root, manifest=manifest, **kw) as loader:
        n = len(loader)
        out = []
        for batch in loader:
            if leak_check is not None and not out:
                leak_check.track(loader)
            assert list(batch) == ["id", "f32", "s", "lf", "nf", "ni"]
            if check_values:
                check_rows(batch)
            out.append(np.array(batch["id"]))
    return out, n


CONFIGS = [
    ("thread", 1, 2),
    ("thread", 2, 1),
    ("thread", 3, 2),
    ("thread", 4, 3),
    ("thread", 8, 1),
    ("process", 1, 2),
    ("process", 3, 1),
]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dataset_and_options())
def test_batches_identical_for_every_worker_count_and_pool(leak_check, case):
    layout, data_seed, opts = case
    with tempfile.TemporaryDirectory() as d:
        info = write_dataset(os.path.join(d, "data"), layout, seed=data_seed)
        expected = model_batches(info, **opts)
        ref_sig = None
        for i, (pool, workers, prefetch) in enumerate(CONFIGS):
            man = os.path.join(d, f"m-{pool}-{workers}.jsonl")
            got, n = run_epoch(info.root, man, leak_check, check_values=(i == 0), workers=workers,
                               pool=Pool(kind=pool, prefetch=prefetch), **opts)
            # the documented order, batch by batch
            assert n == len(got) == len(expected)
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(g, e)
            sig = manifest_signature(man)
            if ref_sig is None:
                ref_sig = sig
                _check_rows_once(info, opts, got, sig)
            else:
                assert sig == ref_sig, f"{pool} pool with {workers} workers diverged"
        leak_check.assert_clean()


def _check_rows_once(info, opts, got, sig) -> None:
    """Every row once (minus the documented tail with drop_last); full batches but the last."""
    delivered = np.concatenate(got) if got else np.empty(0, np.int64)
    assert len(np.unique(delivered)) == len(delivered), "a row was delivered twice"
    (epoch, steps, dropped, _), = sig["epochs"]
    assert steps == len(got)
    B = opts["batch_size"]
    if opts["drop_last"]:
        assert dropped == info.total % B
        assert len(delivered) == info.total - dropped
        assert all(len(g) == B for g in got)
        assert set(delivered) <= set(info.all_ids.tolist())
    else:
        assert dropped == 0
        np.testing.assert_array_equal(np.sort(delivered), np.sort(info.all_ids))
        assert all(len(g) == B for g in got[:-1])
        assert 0 < len(got[-1]) <= B
    assert [b[2] for b in sig["batches"]] == [len(g) for g in got]


def test_canonical_file_order_is_utf8_bytes(make_dataset):
    """Without shuffle rows come file by file in byte order of the relative path, then row group."""
    layout = {"a.parquet": [3], "B.parquet": [2], "a-b.parquet": [1, 2], "a/x.parquet": [2],
              "é/z.parquet": [1], "Z.parq": [0, 2], "_SUCCESS": [], ".hidden.parquet": [4]}
    info = make_dataset(layout)
    os.remove(os.path.join(info.root, "_SUCCESS"))
    with open(os.path.join(info.root, "_SUCCESS"), "w"):
        pass
    with open(os.path.join(info.root, "a.parquet.crc"), "wb") as f:
        f.write(b"not parquet")
    with Loader(info.root, batch_size=100, seed=0, shuffle=False) as loader:
        (batch,) = list(loader)
    order = ["B.parquet", "Z.parq", "a-b.parquet", "a.parquet", "a/x.parquet", "é/z.parquet"]
    want = np.concatenate([g for rel in order for g in info.files[rel]])
    np.testing.assert_array_equal(batch["id"], want)
    assert [d.path for d in loader.dataset.files] == order


#: The default (mixed) order cut fine: 3 tasks of 2 row groups and blocks of at most 100 rows of
#: small_dataset, so that every worker has blocks to build and batches span blocks.
SPREAD = dict(mix_window=2, block_rows=100)


def test_random_worker_delays_and_slow_consumer_do_not_change_batches(small_dataset, tmp_path, pool, leak_check):
    kw = dict(batch_size=37, seed=2024, **SPREAD)
    ref, _ = run_epoch(small_dataset.root, str(tmp_path / "ref.jsonl"), **kw)
    ref_sig = manifest_signature(str(tmp_path / "ref.jsonl"))
    for attempt in range(3):
        man = str(tmp_path / f"m{attempt}.jsonl")
        rnd = random.Random(attempt)
        with hooked(Loader, small_dataset.root, manifest=man, workers=3, pool=detload.Pool(kind=pool, prefetch=1 + attempt),
                    debug=DebugHooks(delay_max=0.01, delay_seed=attempt), **kw) as loader:
            got = []
            for batch in loader:
                leak_check.track(loader)
                got.append(np.array(batch["id"]))
                if attempt == 2 and rnd.random() < 0.3:
                    time.sleep(0.005)  # a slow consumer on the last attempt
        assert manifest_signature(man) == ref_sig
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            np.testing.assert_array_equal(g, r)


def _hashes(loader: Loader, ids: list | None = None) -> list[str]:
    out = []
    for batch in loader:
        out.append(detload.hash_batch(batch)[0])
        if ids is not None:
            ids.append(np.array(batch["id"]))
    return out


def test_epochs_differ_and_repeat(small_dataset, tmp_path, pool, leak_check):
    with Loader(small_dataset.root, batch_size=50, seed=7, workers=2, pool=pool) as loader:
        ids0: list = []
        e0 = _hashes(loader, ids0)
        leak_check.track(loader)
        assert _hashes(loader) == e0, "re-iterating an epoch must repeat it"
        loader.set_epoch(1)
        ids1: list = []
        e1 = _hashes(loader, ids1)
        assert e1 != e0
        assert len(e1) == len(e0)
        np.testing.assert_array_equal(np.sort(np.concatenate(ids0)), np.sort(np.concatenate(ids1)))
        assert not np.array_equal(np.concatenate(ids0), np.concatenate(ids1))
        loader.set_epoch(0)
        assert _hashes(loader) == e0
        # a loader that jumps straight to epoch 1 agrees
    with Loader(small_dataset.root, batch_size=50, seed=7) as other:
        other.set_epoch(1)
        assert _hashes(other) == e1
        np.testing.assert_array_equal(np.concatenate(ids1), small_dataset.all_ids[other.plan().row_ids()])
    # The windowed order against its model, which knows nothing of detload.
    with Loader(small_dataset.root, batch_size=50, seed=7, order="windowed") as windowed:
        windowed.set_epoch(1)
        got = [np.array(b["id"]) for b in windowed]
    np.testing.assert_array_equal(np.concatenate(got), model_batches_concat(small_dataset, epoch=1))


def model_batches_concat(info, **kw) -> np.ndarray:
    return np.concatenate(model_batches(info, seed=7, batch_size=50, **kw))


@pytest.mark.parametrize("stop_after", [0, 1, 9])
def test_break_mid_epoch_then_full_epoch_again(small_dataset, tmp_path, pool, stop_after, leak_check):
    kw = dict(batch_size=64, seed=11, workers=2, pool=pool, **SPREAD)
    whole = tmp_path / "whole.jsonl"
    with Loader(small_dataset.root, manifest=str(whole), **kw) as loader:
        ref = _hashes(loader)
    broken = tmp_path / "broken.jsonl"
    with Loader(small_dataset.root, manifest=str(broken), **kw) as loader:
        for i, _batch in enumerate(loader):
            leak_check.track(loader)
            if i == stop_after:
                break
        assert loader.state_dict()["step"] == stop_after + 1
        again = _hashes(loader)
        assert loader.state_dict()["step"] == len(ref)
    assert again == ref, "the next iteration must give the whole epoch from step 0"
    assert broken.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("order", ["mix", "windowed"])
def test_distributed_ranks_union_is_independent_of_world_size(small_dataset, tmp_path, order):
    """With fixed partitions and global batch, step i's rows are the same set at world size 1 and 2."""
    P, G = 2, 40
    kw = {"order": "windowed", "shuffle_window": 2} if order == "windowed" else SPREAD

    def steps(world: int) -> list[list[np.ndarray]]:
        per_rank = []
        for rank in range(world):
            with Loader(small_dataset.root, batch_size=G // world, seed=5, partitions=P, distributed=(rank, world),
                        workers=2, **kw) as loader:
                ids = [np.array(b["id"]) for b in loader]
                assert len(ids) == len(loader)
                plan = loader.plan()
            if order == "windowed":  # against the model, which knows nothing of detload
                want = model_batches(small_dataset, seed=5, batch_size=G // world, partitions=P,
                                     world_size=world, rank=rank, shuffle_window=2)
                assert len(ids) == len(want)
                for g, w in zip(ids, want):
                    np.testing.assert_array_equal(g, w)
            else:  # the rows the rank's plan lists
                np.testing.assert_array_equal(np.concatenate(ids), small_dataset.all_ids[plan.row_ids()])
            per_rank.append(ids)
        return [np.concatenate(s) for s in zip(*per_rank)]

    one, two = steps(1), steps(2)
    assert len(one) == len(two)
    for a, b in zip(one, two):  # partition order: the concatenation is the same, not only the set
        np.testing.assert_array_equal(a, b)
    delivered = np.concatenate(one)
    np.testing.assert_array_equal(np.sort(delivered), np.sort(small_dataset.all_ids))


def test_source_forms_and_location_do_not_change_batches(small_dataset, tmp_path):
    """A directory, a glob, a list of files in any order, and a copy elsewhere: the same dataset, the same batches."""
    root = small_dataset.root
    files = [os.path.join(root, rel) for rel in small_dataset.files]
    copy = str(tmp_path / "elsewhere" / "copy")
    shutil.copytree(root, copy)
    sources = [root, os.path.join(root, "*.parquet"), files, list(reversed(files)), copy]
    results = []
    for src in sources:
        with Loader(src, batch_size=100, seed=77) as loader:
            results.append((loader.dataset.fingerprint, loader.fingerprint, _hashes(loader)))
    assert all(r == results[0] for r in results[1:])


def test_sixty_four_workers(small_dataset):
    kw = dict(batch_size=33, seed=64, mix_window=1, block_rows=50)  # a task per row group: work for many
    with Loader(small_dataset.root, workers=1, **kw) as one, Loader(small_dataset.root, workers=64, **kw) as many:
        assert _hashes(one) == _hashes(many)
