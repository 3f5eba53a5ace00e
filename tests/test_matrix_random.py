"""The determinism matrix (tests/matrix.py) over configurations drawn at random from a seed.

The fixed configurations of tests/test_determinism_matrix.py each cover one path; a
fault may need several at once (the two of 3f92e5a and e8e5333 needed process workers
sharing a window, a row group cut by a partition boundary and fixed columns only). Each
seed here draws a dataset (files of uneven row groups, some empty) and the options that
decide the batches: the mixed order's window, blocks and partitions, or the windowed
order, drop_last, a column set (fixed columns only, or with strings and lists), a filter,
and whether every window is spilled. The reference run must deliver every row it should
exactly once per epoch, each row's values its id's; every cell of the matrix must then
equal it. CI runs a few seeds on the CI cells; ``DETLOAD_FULL=1`` runs 24 on all of them.
A failure names its seed: ``pytest tests/test_matrix_random.py -k 'seed-N'``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from matrix import EPOCHS, FULL, WORLDS, check_matrix, spill_every_window
from strategies import check_rows, write_dataset

import detload

#: CI's seeds: the mixed order with a filter over four partitions, fixed columns only (process
#: workers share windows in a mapped file) and with strings and lists, every window spilled;
#: and with drop_last and lists, several tasks a partition.
CI_SEEDS = (0, 3, 5)
SEEDS = range(24) if FULL else CI_SEEDS
FIXED_COLUMNS = ["f32", "nf", "ni"]
OTHER_COLUMNS = ["s", "lf"]
Keep = Callable[[np.ndarray], np.ndarray]


def draw(seed: int) -> tuple[dict[str, list[int]], int, dict[str, Any], bool, tuple[str, Keep] | None]:
    """A dataset layout, its ids' seed, the options, whether every window is spilled, and a
    filter (its text and which ids it keeps) or None."""
    r = random.Random(seed)
    names = r.sample(["a.parquet", "b.parquet", "c/d.parquet", "e-f.parquet"], r.randint(2, 4))
    layout: dict[str, list[int]] = {n: [] for n in names}
    for _ in range(r.randint(5, 30)):
        layout[r.choice(names)].append(r.choice([0, r.randint(1, 40), r.randint(1, 300), r.randint(150, 300)]))
    layout[names[0]].append(r.randint(200, 400))  # enough rows for a micro-batch of every partition
    total = sum(map(sum, layout.values()))
    partitions = r.choice([None, max(WORLDS), 2 * max(WORLDS)])  # (None: the matrix fixes max(WORLDS))
    opts: dict[str, Any] = dict(batch_size=r.randrange(16, 129, 2 * max(WORLDS)), seed=r.getrandbits(64))
    if r.random() < 0.8:
        opts.update(order="mix")
        if r.random() < 0.8:
            opts.update(mix_window=r.choice([1, 2, 3, r.randint(1, 64)]))
        if r.random() < 0.8:
            opts.update(block_rows=r.randint(20, 400))
    else:
        opts.update(order="windowed", shuffle_window=r.randint(1, 5))
    if partitions is not None:
        opts.update(partitions=partitions)
    if r.random() < 0.3:
        opts.update(drop_last=True)
    others = OTHER_COLUMNS if r.random() < 0.6 else []
    columns = ["id"] + r.sample(FIXED_COLUMNS + others, r.randint(1, len(FIXED_COLUMNS + others)))
    r.shuffle(columns)
    opts.update(columns=columns)
    keep: tuple[str, Keep] | None = None
    if r.random() < 0.3:
        # Keeps at least about half of the rows, so that drop_last keeps a micro-batch.
        a = 1_000 + r.randint(total // 2, total)
        b = 1_000 + r.randint(0, total // 4)
        keep = r.choice([(f"id < {a}", lambda ids: ids < a),
                         (f"id >= {b}", lambda ids: ids >= b),
                         (f"id < {b} or id >= {b + 20}", lambda ids: (ids < b) | (ids >= b + 20))])
        opts.update(filter=keep[0])
    return layout, r.getrandbits(32), opts, r.random() < 0.5, keep


def _reference_rows(root: str, opts: dict[str, Any], want: np.ndarray) -> None:
    """Each epoch of the reference execution delivers the wanted ids once each (with drop_last,
    a part of them), each row's values its id's."""
    with detload.Loader(root, **{"partitions": max(WORLDS), **opts}) as loader:
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            got = []
            for batch in loader:
                check_rows(batch)
                got.append(np.asarray(batch["id"]))
            ids = np.sort(np.concatenate(got)) if got else np.empty(0, np.int64)
            assert len(np.unique(ids)) == len(ids), f"epoch {epoch}: a row delivered twice"
            if opts.get("drop_last"):
                assert np.isin(ids, want).all(), f"epoch {epoch}: a row that is not the data's"
                assert len(want) - len(ids) <= opts["batch_size"], f"epoch {epoch}: more than a batch dropped"
            else:
                np.testing.assert_array_equal(ids, want, err_msg=f"epoch {epoch}: not every row once")


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed-{s}")
def test_a_drawn_configuration_gives_the_reference_batches_in_every_cell(tmp_path, monkeypatch, seed):
    layout, data_seed, opts, spill_all, keep = draw(seed)
    info = write_dataset(str(tmp_path / "ds"), layout, seed=data_seed)
    want = np.sort(info.all_ids)
    if keep is not None:
        want = want[keep[1](want)]
    if spill_all:
        spill_every_window(monkeypatch, str(tmp_path / "spill"))
    _reference_rows(info.root, opts, want)
    check_matrix(info.root, opts, str(tmp_path / "cells"))


def test_the_draws_cover_the_paths_they_are_for():
    """Over the full run's seeds, every kind of draw occurs (a draw that never varies tests nothing)."""
    drawn = [draw(s) for s in range(24)]
    opts = [o for _, _, o, _, _ in drawn]
    assert {o.get("order") for o in opts} == {"mix", "windowed"}
    assert {o.get("partitions") for o in opts} == {None, max(WORLDS), 2 * max(WORLDS)}
    assert {bool(o.get("drop_last")) for o in opts} == {True, False}
    assert {bool(set(o["columns"]) & set(OTHER_COLUMNS)) for o in opts} == {True, False}
    assert {"filter" in o for o in opts} == {True, False}
    assert {spill for *_, spill, _ in drawn} == {True, False}
    assert any(o.get("mix_window", 64) < 4 for o in opts)  # several tasks a partition
    # The CI seeds hold the mixed order with and without spilling.
    ci = [draw(s) for s in CI_SEEDS]
    assert {(o.get("order"), spill) for _, _, o, spill, _ in ci} >= {("mix", True), ("mix", False)}
