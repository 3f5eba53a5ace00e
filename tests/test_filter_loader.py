"""Loader(filter=...): the rows delivered are exactly pyarrow's, pruned row groups are never read,
the batches do not depend on how the run executes, and an unfiltered loader's order is unchanged."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from matrix import check_matrix
from strategies import check_rows, write_dataset

import detload
from detload import Loader
from detload.cli import main as cli_main
from detload.errors import EmptyDatasetError, OptionError

f = pc.field

# Uneven row groups (one empty) over three files, under Hive folders p=0 / p=1.
LAYOUT = {"p=0/a.parquet": [300, 200, 17], "p=0/b.parquet": [250, 0, 99], "p=1/c.parquet": [210, 90, 33, 120]}

FILTERS = {
    "range": (f("id") >= 1200) & (f("id") < 1900),
    "isin": f("id").isin(list(range(1000, 2400, 7))),
    "is_null": f("nf").is_null(),
    "is_valid-and": f("nf").is_valid() & (f("ni") > 4500),
    "string": (f("s") == "") | (f("s") == "1236"),
    "or-not": (f("id") < 1100) | ~(f("f32") < 500.0),
    "partition": (f("p") == 1) & (f("ni") <= 4000),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return write_dataset(str(tmp_path_factory.mktemp("filt") / "ds"), LAYOUT, seed=4).root


def _expected_ids(root: str, expr: pc.Expression) -> list[int]:
    # pyarrow's in-memory filter over the whole dataset (the reference; see docs/filters.md on NaN).
    table = pads.dataset(root, partitioning="hive").to_table()
    return sorted(table.filter(expr).column("id").to_pylist())


def _delivered(loader: Loader) -> list[int]:
    out: list[int] = []
    for batch in loader:
        check_rows(batch)  # every column of every delivered row belongs to its id
        out.extend(np.asarray(batch["id"]).tolist())
    return out


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_delivers_exactly_the_rows_pyarrow_selects(root, name):
    expr = FILTERS[name]
    want = _expected_ids(root, expr)
    assert want, "the test filter should select something"
    with Loader(root, batch_size=64, seed=3, filter=expr) as loader:
        got = _delivered(loader)
        assert len(got) == len(set(got))  # each once
        assert sorted(got) == want
        stats = loader.filter_stats
        assert stats is not None and stats["rows_selected"] == len(want)
        assert len(loader) == -(-len(want) // 64)


@pytest.mark.parametrize("workers,kind", [(1, "process"), (3, "thread"), (3, "process")])
def test_same_batches_at_any_worker_count_and_pool(root, workers, kind):
    expr = FILTERS["or-not"]
    with Loader(root, batch_size=50, seed=9, order="windowed", shuffle_window=2, filter=expr) as ref:
        want = [{k: np.asarray(v).tolist() for k, v in b.items() if k in ("id", "ni")} for b in ref]
    with Loader(root, batch_size=50, seed=9, order="windowed", shuffle_window=2, filter=expr, workers=workers, pool=kind) as loader:
        got = [{k: np.asarray(v).tolist() for k, v in b.items() if k in ("id", "ni")} for b in loader]
    assert got == want


def test_equal_filters_in_any_form_give_one_order(root):
    forms = [(f("id") >= 1200) & (f("s") != "id-1500"), [("id", ">=", 1200), ("s", "!=", "id-1500")],
             '[["id", ">=", 1200], ["s", "!=", "id-1500"]]', 'id >= 1200 and s != "id-1500"']
    prints = set()
    for form in forms:
        with Loader(root, batch_size=64, seed=1, filter=form) as loader:
            prints.add(loader.fingerprint)
            assert json.loads(loader.order["filter"])["op"] == "and"
    assert len(prints) == 1


def test_pruned_row_groups_are_never_read(tmp_path, unit_log, monkeypatch):
    # Sorted ids: statistics settle every row group but the one the range falls in.
    root = str(tmp_path / "sorted")
    os.makedirs(root)
    ids = np.arange(1000, dtype=np.int64)
    pq.write_table(pa.table({"id": ids, "v": ids * 2}), os.path.join(root, "a.parquet"), row_group_size=100)
    planned: list[int] = []
    real = pq.ParquetFile.read_row_group

    def read_row_group(self, i, *a, **kw):
        planned.append(i)
        return real(self, i, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)
    expr = (f("id") >= 250) & (f("id") < 330)
    with Loader(root, batch_size=16, seed=0, filter=expr) as loader:
        assert planned == [2, 3]  # the selection pass reads only the two row groups the range cuts
        got = sorted(x for b in loader for x in np.asarray(b["id"]).tolist())
        stats = loader.filter_stats
    assert got == list(range(250, 330))
    assert sorted({rg for _, rg in unit_log}) == [2, 3]
    assert stats is not None and stats.pop("seconds") > 0
    assert stats.pop("bytes_read") == sum(pq.read_metadata(os.path.join(root, "a.parquet")).row_group(g)
                                          .column(0).total_compressed_size for g in (2, 3))
    assert stats.pop("examples") == {"statistics": [["a.parquet", g, 100, 0] for g in (0, 1, 4, 5, 6)],
                                     "selection_pass": [["a.parquet", 2, 100, 50], ["a.parquet", 3, 100, 30]]}
    assert stats == {"row_groups": 10, "pruned": {"partition": 0, "statistics": 8, "bloom": 0},
                     "pruned_total": 8, "all_rows": 0, "selection_pass": 2, "selection_cached": 0, "selected_empty": 0,
                     "row_groups_skipped": 8, "rows_total": 1000, "rows_selected": 80}


def test_a_row_group_every_row_of_which_matches_is_not_read_at_planning(tmp_path, monkeypatch):
    root = str(tmp_path / "sorted")
    os.makedirs(root)
    ids = np.arange(400, dtype=np.int64)
    pq.write_table(pa.table({"id": ids}), os.path.join(root, "a.parquet"), row_group_size=100)
    planned: list[int] = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, *a, **kw: planned.append(i) or real(self, i, *a, **kw))
    with Loader(root, batch_size=100, seed=0, shuffle=False, filter=f("id") >= 150) as loader:
        assert planned == [1]
        assert loader.filter_stats["all_rows"] == 2
        got = [x for b in loader for x in np.asarray(b["id"]).tolist()]
    assert got == list(range(150, 400))


def test_filter_enters_order_and_manifest_header(root, tmp_path):
    path = str(tmp_path / "m.jsonl")
    expr = FILTERS["range"]
    with Loader(root, batch_size=64, seed=3, filter=expr, manifest=path) as loader:
        for _ in loader:
            pass
        canonical = loader.filter.canonical_json
        assert loader.order["filter"] == canonical
    header = detload.read_manifest(path).header
    assert header["order"]["filter"] == canonical
    assert header["filter"] == json.loads(canonical)


def test_without_a_filter_the_order_is_unchanged(root):
    with Loader(root, batch_size=64, seed=3) as plain:
        assert "filter" not in plain.order
        assert plain.filter is None and plain.filter_stats is None
        order, fingerprint = dict(plain.order), plain.fingerprint
    with Loader(root, batch_size=64, seed=3, filter=None) as again:
        assert again.order == order and again.fingerprint == fingerprint
    with Loader(root, batch_size=64, seed=3, filter=FILTERS["range"]) as filtered:
        rest = {k: v for k, v in filtered.order.items() if k != "filter"}
        assert rest.keys() == order.keys()
        assert filtered.fingerprint != fingerprint


def test_resume_state_names_the_filter(root):
    with Loader(root, batch_size=32, seed=3, filter=FILTERS["range"]) as a:
        it = iter(a)
        next(it)
        state = a.state_dict()
        rest = [np.asarray(b["id"]).tolist() for b in it]
    with Loader(root, batch_size=32, seed=3, filter=FILTERS["range"]) as b:
        b.load_state_dict(state)
        assert [np.asarray(x["id"]).tolist() for x in b] == rest
    with Loader(root, batch_size=32, seed=3, filter=FILTERS["isin"]) as c, pytest.raises(Exception, match="filter"):
        c.load_state_dict(state)


def test_a_filter_that_selects_nothing_is_an_empty_dataset_error_naming_it(root):
    with pytest.raises(EmptyDatasetError, match=r'selects no row.*"id-nobody"|"id-nobody".*selects no row'):
        Loader(root, batch_size=8, seed=0, filter=f("s") == "id-nobody")


def test_bad_filters_are_refused_with_a_message(root):
    with pytest.raises(OptionError, match="nope"):
        Loader(root, batch_size=8, seed=0, filter=f("nope") == 1)
    with pytest.raises(OptionError, match="callable"):
        Loader(root, batch_size=8, seed=0, filter=lambda row: True)
    with pytest.raises(OptionError, match="JSON"):
        Loader(root, batch_size=8, seed=0, filter="[not json")


def test_cli_run_takes_filter_text(root, tmp_path):
    path = str(tmp_path / "m.jsonl")
    rc = cli_main(["run", root, "--batch-size", "64", "--seed", "3", "--manifest", path, "--quiet",
                   "--filter", "id >= 1200 and id < 1900"])
    assert rc == 0
    m = detload.read_manifest(path)
    want = len(_expected_ids(root, FILTERS["range"]))
    assert sum(b["rows"] for b in m.batches()) == want
    with Loader(root, batch_size=64, seed=3, filter=FILTERS["range"]) as loader:
        assert m.header["fingerprint"] == loader.fingerprint


@pytest.mark.slow
def test_filtered_matrix(root, tmp_path):
    check_matrix(root, dict(batch_size=64, seed=7, order="windowed", shuffle_window=2, filter=FILTERS["or-not"]), str(tmp_path))


def test_verify_names_a_differing_filter(root, tmp_path):
    from detload.verify import verify

    paths = []
    for name in ("range", "isin"):
        path = str(tmp_path / f"{name}.jsonl")
        with Loader(root, batch_size=64, seed=3, filter=FILTERS[name], manifest=path) as loader:
            for _ in loader:
                pass
        paths.append(path)
    res = verify(paths[0], paths[1])
    assert not res.identical
    assert "filter" in res.option_diffs and "units_digest" in res.option_diffs


def test_bloom_filters_prune_an_absent_value(tmp_path, monkeypatch):
    root = str(tmp_path / "bloom")
    os.makedirs(root)
    ids = np.random.default_rng(0).permutation(np.arange(0, 4000, 2))  # even ids, unsorted: min/max never prune
    pq.write_table(pa.table({"id": ids}), os.path.join(root, "a.parquet"), row_group_size=500,
                   bloom_filter_options={"id": {"ndv": 500, "fpp": 0.01}})
    planned: list[int] = []
    real = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, *a, **kw: planned.append(i) or real(self, i, *a, **kw))
    with Loader(root, batch_size=8, seed=0, filter=f("id").isin([1001, 1003, int(ids[7])])) as loader:
        assert planned == [0]  # odd ids are absent: bloom filters rule out the other row groups
        assert loader.filter_stats["pruned"]["bloom"] == 3
        got = [x for b in loader for x in np.asarray(b["id"]).tolist()]
    assert got == [int(ids[7])]


def test_a_value_of_the_wrong_type_is_refused(root):
    with pytest.raises(OptionError, match="does not fit column 'id' of type int64"):
        Loader(root, batch_size=8, seed=0, filter=f("id") == "x")


def test_a_cached_selection_is_read_back_instead_of_the_filter_columns(root, tmp_path, monkeypatch):
    """With cache=, each row group's selection is a derived entry (file version + filter):
    the next loader with the same filter reads no filter column at planning and yields the
    same batches; another filter misses."""
    from detload.audit import hash_batch

    expr = FILTERS["is_valid-and"]
    cache = str(tmp_path / "cache")
    with Loader(root, batch_size=64, seed=3, filter=expr, cache=cache) as cold:
        cold_stats = cold.filter_stats
        want = [hash_batch(b)[0] for b in cold]
    assert cold_stats["selection_pass"] > 0 and cold_stats["selection_cached"] == 0
    reads: list[int] = []
    real = pq.ParquetFile.read_row_group

    def read_row_group(self, i, *a, **kw):
        reads.append(i)
        return real(self, i, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)
    with Loader(root, batch_size=64, seed=3, filter=expr, cache=cache) as warm:
        assert reads == []  # planning took every selection from the cache
        stats = warm.filter_stats
        assert stats["selection_cached"] == cold_stats["selection_pass"] and stats["selection_pass"] == 0
        assert warm.order == cold.order
        assert [hash_batch(b)[0] for b in warm] == want
    with Loader(root, batch_size=64, seed=3, filter=FILTERS["or-not"], cache=cache) as other:
        assert other.filter_stats["selection_cached"] == 0 and other.filter_stats["selection_pass"] > 0
