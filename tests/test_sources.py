"""How a source string meets the ``filesystem=`` option on local and in-memory filesystems.

The S3 forms (s3:// with an S3 filesystem, the refusals that name the form to
pass) are tested against a real server in test_s3.py.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from detload import Loader
from detload._discovery import discover

FILES = {"a.parquet": [30, 20], "sub/b.parquet": [25]}


def _rows(loader):
    return sorted(int(i) for batch in loader for i in batch["id"])


def test_a_local_filesystem_takes_relative_paths_and_file_uris(make_dataset, monkeypatch):
    info = make_dataset(FILES)
    monkeypatch.chdir(os.path.dirname(info.root))
    rel = os.path.basename(info.root)
    want = discover(info.root).fingerprint
    for source in (rel, f"file://{info.root}", [f"{rel}/a.parquet", f"file://{info.root}/sub/b.parquet"]):
        ds = discover(source, filesystem=pafs.LocalFileSystem())
        assert ds.root == info.root and ds.fingerprint == want, source


def test_an_fsspec_filesystem_takes_its_own_uris(make_dataset):
    from fsspec.implementations.memory import MemoryFileSystem

    info = make_dataset(FILES)
    mem = MemoryFileSystem()
    for rel in FILES:
        with open(os.path.join(info.root, rel), "rb") as f:
            mem.pipe(f"/ds/{rel}", f.read())
    with Loader(info.root, batch_size=16, seed=1) as loader:
        want = _rows(loader)
    try:
        for source in ("memory:///ds", "/ds", "memory:///ds/*.parquet", ["memory:///ds/a.parquet", "/ds/sub/b.parquet"]):
            with Loader(source, storage=mem, batch_size=16, seed=1) as loader:
                assert _rows(loader) == want, source
                assert repr(loader).startswith("Loader('memory:///ds', files=2, rows=75,"), source
        with pytest.raises(FileNotFoundError, match=r"^dataset path 'memory:///nothing' does not exist$"):
            Loader("memory:///nothing", storage=mem, batch_size=16, seed=1)
    finally:
        mem.rm("/ds", recursive=True)
