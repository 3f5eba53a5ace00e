"""The option groups (`Pool`, `Cache`, `Distributed`, `Storage`): checks at construction, shorthands,
and that every option and group field is documented in ``help(Loader)`` and docs/loader.md."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re

import pyarrow.fs as pafs
import pytest

from detload import Cache, Distributed, Loader, OptionError, Pool, Storage
from detload.options import as_cache, as_distributed, as_pool, as_storage

ROOT = pathlib.Path(__file__).resolve().parent.parent
GROUPS = {"pool": Pool, "cache": Cache, "distributed": Distributed, "storage": Storage}


def test_defaults_and_frozen():
    assert Pool() == Pool(kind="thread", prefetch=2, stall_timeout=300.0, trace=True)
    assert Cache("/c") == Cache(dir="/c", limit=None, map_limit="auto")
    assert Storage() == Storage(filesystem=None, partition_types=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Pool().prefetch = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Cache()  # type: ignore[call-arg]  # dir is required: "cache_limit needs cache_dir" cannot be said
    with pytest.raises(TypeError):
        Distributed(0)  # type: ignore[call-arg]


def test_values_are_normalised():
    import numpy as np

    assert Pool(prefetch=np.int64(3), stall_timeout=np.int32(5)) == Pool(prefetch=3, stall_timeout=5.0)
    assert type(Pool(prefetch=np.int64(3)).prefetch) is int
    assert Cache(pathlib.Path("/c")).dir == "/c"
    assert Distributed(np.int64(1), np.int64(2)) == Distributed(1, 2)
    types = {"day": "int64"}
    s = Storage(partition_types=types)
    types["day"] = "string"
    assert s.partition_types == {"day": "int64"}  # a copy: the frozen group does not change under it


@pytest.mark.parametrize("make, message", [
    (lambda: Pool(kind="fork"), "Pool.kind must be 'thread' or 'process', got 'fork'"),
    (lambda: Pool(prefetch=0), r"Pool.prefetch must be an int in \[1, 1024\] \(blocks queued per worker\), got 0"),
    (lambda: Pool(prefetch=True), r"Pool.prefetch must be an int in \[1, 1024\].*got bool True"),
    (lambda: Pool(prefetch=2.0), r"Pool.prefetch must be an int .*got float 2.0"),
    (lambda: Pool(stall_timeout=0), r"Pool.stall_timeout must be a positive number of seconds up to 1e\+09, "
                                    r"or None \(wait forever\), got int 0"),
    (lambda: Pool(stall_timeout="5"), "Pool.stall_timeout must be a positive number of seconds.*got str '5'"),
    (lambda: Pool(trace=1), "Pool.trace must be True or False, got int 1"),
    (lambda: Pool(spill=1), r"Pool.spill must be True, False or a folder's path, got 1"),
    (lambda: Pool(spill=""), "Pool.spill must name a folder, got ''"),
    (lambda: Pool(spill="/no/such/folder"), r"Pool.spill: '/no/such/folder' is not a folder \(the spill file of a "
                                            r"mixed-order window goes there; pass an existing folder, True for the "
                                            r"system's temporary folder, or False\)"),
    (lambda: Cache(""), "Cache.dir must name a folder, got ''"),
    (lambda: Cache("  "), "Cache.dir must name a folder, got '  '"),
    (lambda: Cache(b"/c"), r"Cache.dir must be a path \(str or os.PathLike\), got b'/c'"),
    (lambda: Cache(None), r"Cache.dir must be a path \(str or os.PathLike\), got None"),
    (lambda: Cache("/c", limit="lots"), "Cache.limit 'lots' is not a size; use bytes or e.g. '500MB', '20GiB'"),
    (lambda: Cache("/c", limit=0), "Cache.limit must be positive"),
    (lambda: Cache("/c", map_limit="lots"), "Cache.map_limit 'lots' is not a size.*'auto' \\(the default\\)"),
    (lambda: Cache("/c", map_limit=-1), "Cache.map_limit must be 0 or more, got -1"),
    (lambda: Distributed(2, 2), r"Distributed.rank must be an int in \[0, 2\), got 2"),
    (lambda: Distributed(-1, 2), r"Distributed.rank must be an int in \[0, 2\), got -1"),
    (lambda: Distributed(0, 0), "Distributed.world_size must be an int >= 1, got 0"),
    (lambda: Distributed(0, None), "Distributed.world_size must be an int >= 1, got NoneType None"),
    (lambda: Storage(filesystem="s3"), "Storage.filesystem must be a pyarrow.fs.FileSystem or an fsspec "
                                       "filesystem, got str"),
    (lambda: Storage(partition_types=["day"]), r"Storage.partition_types must be a dict \{key: 'int64' \| "
                                               r"'string'\} or None, got list \['day'\]"),
    (lambda: Storage(partition_types={"day": "int32"}),
     r"Storage.partition_types\['day'\] must be 'int64' or 'string', got 'int32'"),
    # One vocabulary (False, "auto", True): the words of other layers are refused by name.
    (lambda: Storage(memory_map="always"), r"^Storage.memory_map must be True, False or 'auto', got 'always'$"),
    (lambda: Storage(memory_map="never"), r"^Storage.memory_map must be True, False or 'auto', got 'never'$"),
    (lambda: Storage(memory_map="local-disk"), r"Storage.memory_map must be True, False or 'auto', got 'local-disk'"),
    (lambda: Storage(memory_map=1), r"Storage.memory_map must be True, False or 'auto', got 1$"),
])
def test_group_errors_name_the_field(make, message):
    with pytest.raises(OptionError, match=message):
        make()


def test_shorthands():
    assert as_pool(None) == Pool() and as_pool("process") == Pool(kind="process")
    assert as_pool(Pool(prefetch=4)) == Pool(prefetch=4)
    assert as_cache(None) is None and as_cache("/nvme/c") == Cache(dir="/nvme/c")
    assert as_cache(pathlib.Path("/nvme/c")) == Cache(dir="/nvme/c")
    assert as_distributed(None) is None and as_distributed((1, 4)) == Distributed(1, 4)
    fs = pafs.LocalFileSystem()
    assert as_storage(None) == Storage() and as_storage(fs) == Storage(filesystem=fs)


def test_fsspec_filesystem_is_a_storage_shorthand():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    assert as_storage(fs) == Storage(filesystem=fs)


@pytest.mark.parametrize("make, message", [
    (lambda: as_pool("fork"), "pool must be 'thread' or 'process', got 'fork'"),
    (lambda: as_pool(2), "pool must be a detload.Pool, 'thread' or 'process', or None, got int 2"),
    (lambda: as_cache(""), "cache must name a folder, got ''"),
    (lambda: as_cache(True), r"cache must be a detload.Cache, a folder \(str or os.PathLike\), or None, got bool True"),
    (lambda: as_distributed((0, 1, 2)), r"distributed must be a detload.Distributed, a \(rank, world_size\) "
                                        r"tuple, or None, got tuple \(0, 1, 2\)"),
    (lambda: as_distributed([0, 1]), "distributed must be a detload.Distributed.*got list"),
    (lambda: as_distributed((3, 2)), r"Distributed.rank must be an int in \[0, 2\), got 3"),
    (lambda: as_storage("s3://b"), "storage must be a detload.Storage, a pyarrow.fs.FileSystem or fsspec "
                                   "filesystem, or None, got str 's3://b'"),
])
def test_shorthand_errors_name_the_accepted_forms(make, message):
    with pytest.raises(OptionError, match=message):
        make()


def _options():
    params = inspect.signature(Loader).parameters.values()
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]


def test_help_documents_every_option_and_every_group_field():
    doc = inspect.getdoc(Loader) or ""
    assert set(GROUPS) <= set(_options())
    missing = [name for name in _options() if f"``{name}``" not in doc]
    for group, cls in GROUPS.items():
        missing += [f"{group}.{f.name}" for f in dataclasses.fields(cls) if f"``{f.name}``" not in doc]
        # each group's own help names its fields too
        missing += [f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls)
                    if f"``{f.name}``" not in (inspect.getdoc(cls) or "")]
    assert not missing, f"not in help(detload.Loader): {missing}"


def test_docs_loader_md_has_a_row_for_every_option_and_group_field():
    text = (ROOT / "docs" / "loader.md").read_text(encoding="utf-8")
    table = text.split("## Options", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([\w.]+)` \|", table, re.M))
    want = set(_options())
    for cls in GROUPS.values():
        want |= {f"{cls.__name__}.{f.name}" for f in dataclasses.fields(cls)}
    assert want <= rows, f"missing from docs/loader.md's options table: {sorted(want - rows)}"
    assert rows <= want, f"rows for options Loader does not take: {sorted(rows - want)}"


def test_the_group_keywords_take_their_shorthands(tmp_path):
    from _perfdata import write_small

    data = write_small(tmp_path / "d", files=1, rows=500, row_group=100)
    with Loader(data, batch_size=100, seed=1, pool="process", cache=tmp_path / "c", distributed=(0, 1),
                storage=pafs.LocalFileSystem()) as ld:
        assert (ld.pool_kind, ld.rank, ld.options.world_size) == ("process", 0, 1)
        assert ld.cache is not None and sum(len(b["id"]) for b in ld) == 500
    for kw, message in [({"pool": 1}, "pool must be a detload.Pool"), ({"cache": 1}, "cache must be a detload.Cache"),
                        ({"distributed": 1}, "distributed must be a detload.Distributed"),
                        ({"storage": 1}, "storage must be a detload.Storage")]:
        with pytest.raises(OptionError, match=message):
            Loader(data, batch_size=100, seed=1, **kw)


def test_what_a_loader_was_built_with_is_read_only(tmp_path):
    """Options and what planning decided are fixed when the loader is built: setting one raises
    (the plan, the workers and the manifest header were made from it), and mutable values are
    read-only views, so a caller cannot change them in place either."""
    from detload._demo import write_demo_dataset

    data = write_demo_dataset(str(tmp_path / "d"), rows=2_000, files=2)
    with Loader(data, batch_size=100, seed=1, null_fill={"price": 0.0}, pool=Pool(prefetch=3)) as ld:
        fixed = [name for name, value in vars(Loader).items() if type(value).__name__ == "_Fixed"]
        assert {"workers", "prefetch", "options", "order", "fingerprint", "specs", "null_fill", "cache"} <= set(fixed)
        for name in fixed:
            before = getattr(ld, name)
            with pytest.raises(AttributeError, match=rf"^Loader\.{name} is read-only: .*build a new Loader"):
                setattr(ld, name, before)
        assert ld.prefetch == 3 and ld.options.batch_size == 100 and ld.null_fill == {"price": 0.0}
        with pytest.raises(TypeError):
            ld.order["seed"] = 2  # type: ignore[index]
        with pytest.raises(TypeError):
            ld.null_fill["price"] = 1.0  # type: ignore[index]
        with pytest.raises(AttributeError):
            ld.specs.append(ld.specs[0])  # type: ignore[attr-defined]
        assert sum(len(b["id"]) for b in ld) == 2_000
