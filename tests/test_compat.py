"""The flat keywords of earlier releases: each still works, warns once naming its new spelling,
and gives the batches, ``order``, state and manifest bytes of the new spelling."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from _perfdata import write_small

import detload
from detload import Cache, Distributed, Loader, OptionError, Pool, Storage

OPTS = {"batch_size": 256, "seed": 3, "workers": 2}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_small(tmp_path_factory.mktemp("compat") / "d")


@pytest.fixture(scope="module")
def hive(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat") / "h"
    for day in (1, 2):
        (root / f"day={day}").mkdir(parents=True)
        pq.write_table(pa.table({"id": np.arange(day * 100, day * 100 + 300)}), root / f"day={day}" / "a.parquet",
                       row_group_size=100)
    return root


def _cases(tmp):
    """(old keywords, the same in the new spelling, the keywords that warn)."""
    fs = pafs.LocalFileSystem()
    c = str(tmp / "c")
    return [
        ({"prefetch": 3}, {"pool": Pool(prefetch=3)}, ["prefetch"]),
        ({"stall_timeout": None}, {"pool": Pool(stall_timeout=None)}, ["stall_timeout"]),
        ({"trace": False}, {"pool": Pool(trace=False)}, ["trace"]),
        ({"pool": "process", "prefetch": 1}, {"pool": Pool(kind="process", prefetch=1)}, ["prefetch"]),
        ({"cache_dir": c}, {"cache": Cache(c)}, ["cache_dir"]),
        ({"cache_dir": c, "cache_limit": "1GB", "cache_map_limit": 0},
         {"cache": Cache(c, limit="1GB", map_limit=0)}, ["cache_dir", "cache_limit", "cache_map_limit"]),
        ({"rank": 1, "world_size": 2}, {"distributed": Distributed(1, 2)}, ["rank", "world_size"]),
        ({"filesystem": fs}, {"storage": Storage(filesystem=fs)}, ["filesystem"]),
    ]


def _run(source, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Loader(source, **OPTS, **kw) as ld:
            hashes = [detload.hash_batch(b)[0] for b in ld]
            state, order = ld.state_dict(), dict(ld.order)
    return hashes, state, order, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def test_each_old_keyword_works_warns_once_and_matches_the_new_spelling(data, tmp_path):
    for old, new, warned in _cases(tmp_path):
        h_old, s_old, o_old, w_old = _run(data, **old)
        h_new, s_new, o_new, w_new = _run(data, **new)
        assert h_old == h_new and s_old == s_new and o_old == o_new, old
        assert not w_new, [str(w.message) for w in w_new]
        assert sorted(str(w.message) for w in w_old) == sorted(detload.options.deprecation(k) for k in warned)
        assert all(w.filename == __file__ for w in w_old)  # shown where the old spelling is written


def test_the_warnings_name_the_new_spelling():
    assert detload.options.deprecation("prefetch") == "prefetch= is deprecated: use pool=detload.Pool(prefetch=...)"
    assert detload.options.deprecation("cache_dir") == "cache_dir= is deprecated: use cache=detload.Cache(dir=...)"
    assert (detload.options.deprecation("partitioning")
            == "partitioning= is deprecated: use storage=detload.Storage(partition_types=...)")
    assert (detload.options.deprecation("world_size")
            == "world_size= is deprecated: use distributed=detload.Distributed(world_size=...)")


def test_partitioning_becomes_partition_types(hive):
    for types in ({"day": "string"}, {"day": "int64"}):
        h_old, s_old, o_old, w_old = _run(hive, partitioning=types)
        h_new, s_new, o_new, w_new = _run(hive, storage=Storage(partition_types=types))
        assert (h_old, s_old, o_old) == (h_new, s_new, o_new) and not w_new
        assert [str(w.message) for w in w_old] == [detload.options.deprecation("partitioning")]


def test_manifests_are_byte_identical(data, tmp_path):
    """Old and new spellings write the same manifest bytes (the header's detload version included)."""
    old = tmp_path / "old.jsonl"
    new = tmp_path / "new.jsonl"
    with pytest.warns(DeprecationWarning), Loader(data, **OPTS, manifest=old, prefetch=3, rank=0, world_size=1,
                                                  cache_dir=tmp_path / "c1", stall_timeout=60) as ld:
        for e in range(2):
            ld.set_epoch(e)
            for _ in ld:
                pass
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with Loader(data, **OPTS, manifest=new, pool=Pool(prefetch=3, stall_timeout=60),
                    distributed=(0, 1), cache=tmp_path / "c2") as ld:
            for e in range(2):
                ld.set_epoch(e)
                for _ in ld:
                    pass
    assert old.read_bytes() == new.read_bytes()


def test_a_state_of_the_old_spelling_resumes_in_the_new(data):
    with pytest.warns(DeprecationWarning), Loader(data, **OPTS, prefetch=1) as ld:
        it = iter(ld)
        first = [detload.hash_batch(next(it))[0] for _ in range(3)]
        state = ld.state_dict()
        rest = [detload.hash_batch(b)[0] for b in it]
    with Loader(data, **OPTS, pool=Pool(prefetch=4)) as ld:
        ld.load_state_dict(state)
        assert [detload.hash_batch(b)[0] for b in ld] == rest
    assert len(first) == 3


@pytest.mark.parametrize("kw, group", [
    ({"prefetch": 3, "pool": Pool()}, "pool"),
    ({"trace": False, "pool": Pool()}, "pool"),
    ({"cache_limit": "1GB", "cache": "/tmp/c"}, "cache"),
    ({"rank": 0, "distributed": (0, 1)}, "distributed"),
    ({"partitioning": {}, "storage": Storage()}, "storage"),
])
def test_an_old_keyword_with_its_group_is_refused(data, kw, group):
    old = next(k for k in kw if k != group)
    with pytest.raises(OptionError, match=rf"{old}= \(deprecated\) and {group}= both set it: pass only "
                                          rf"{group}=detload\.\w+\(\.\.\., \w+=\.\.\.\)"):
        Loader(data, **OPTS, **kw)


def test_an_unknown_keyword_is_a_type_error(data):
    with pytest.raises(TypeError, match=r"^Loader.__init__\(\) got an unexpected keyword argument 'prefetc'$"):
        Loader(data, **OPTS, prefetc=2)
    for hook in ("_debug", "_cache_fail_after_bytes", "_benchmark_unordered"):
        # Test hooks are not keywords (tests/testhooks.py sets them).
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{hook}'"):
            Loader(data, **OPTS, **{hook: None})


def test_no_test_hooks_in_the_public_signatures():
    from detload.torch import TorchLoader

    for cls in (Loader, TorchLoader):
        assert not [p for p in inspect.signature(cls).parameters if p.startswith("_")], cls


def test_old_keywords_keep_their_messages(data):
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match="^cache_limit needs cache_dir$"):
        Loader(data, **OPTS, cache_limit="1GB")
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match="^cache_map_limit needs cache_dir$"):
        Loader(data, **OPTS, cache_map_limit=None)
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match=r"^prefetch must be an int in \[1, 1024\]"):
        Loader(data, **OPTS, prefetch=0)
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match=r"^partitioning must be a dict"):
        Loader(data, **OPTS, partitioning=["day"])
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match=r"^filesystem must be a pyarrow"):
        Loader(data, **OPTS, filesystem="s3")
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match=r"^rank must be an int in \[0, 2\)"):
        Loader(data, **OPTS, rank=2, world_size=2)


def test_rank_alone_still_takes_the_world_size_from_the_environment(data, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(DeprecationWarning, match="rank= is deprecated"):
        ld = Loader(data, **OPTS, rank=1)
    assert (ld.rank, ld.options.world_size) == (1, 2)
