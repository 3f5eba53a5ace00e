"""What importing detload costs and pulls in: the public names, a light ``import detload``,
and workers that never import pandas (0.2-0.6 s and ~30 MiB each, and a wrong verdict).

The checks run in fresh interpreters: this test process has imported far more by now.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import detload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The public API, as it stands: a change here is a change of the API, made on purpose.
PUBLIC = [
    "BlockMemoryWarning", "Cache", "CacheWarning", "ColumnSpec", "DataError", "DatasetError", "DetloadError",
    "Distributed", "EmptyDatasetError", "Loader", "ManifestError", "OptionError", "OrderOptions", "Packed", "Plan",
    "Pool", "Ragged", "SchemaMismatchError", "SharedMemoryError", "SkippedFilesWarning", "SourceError", "StateError",
    "Stats", "Storage", "TimeZoneWarning", "Transform", "TransformContext", "UnitList", "UnsupportedTypeError", "WorkerError",
    "WorkerStalledError", "__version__", "hash_batch", "make_plan", "read_manifest", "starvation_check",
]
#: The layout tool is a submodule of its own, and every exception and warning is defined in errors.py.
LAYOUT = ["Digest", "DigestMismatchError", "LayoutCheck", "LayoutError", "LayoutReport", "UnfinishedLayoutWarning",
          "check", "digest", "rewrite"]


def _python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_all_is_sorted_and_is_exactly_the_public_names():
    assert detload.__all__ == sorted(detload.__all__)
    assert detload.__all__ == PUBLIC
    exported = {n for n in detload._EXPORTS} | {"__version__"}
    assert exported == set(detload.__all__)
    for name in detload.__all__:
        assert getattr(detload, name) is not None
    assert set(detload.__all__) <= set(dir(detload))
    with pytest.raises(AttributeError, match="module 'detload' has no attribute 'nope'"):
        detload.nope  # noqa: B018


def test_names_come_from_their_modules():
    from detload.errors import OptionError
    from detload.loader import Loader

    assert detload.Loader is Loader and detload.OptionError is OptionError
    assert detload.SkippedFilesWarning.__mro__[1] is UserWarning


def test_every_exception_and_warning_is_defined_in_errors():
    import detload.errors
    import detload.layout

    assert detload.layout.__all__ == LAYOUT
    for module in (detload, detload.layout):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, (Exception, Warning)):
                assert value.__module__ == "detload.errors", name
                assert getattr(detload.errors, name) is value
    defined = [n for n, v in vars(detload.errors).items() if isinstance(v, type) and issubclass(v, (Exception, Warning))
               and v.__module__ == "detload.errors"]
    assert sorted(defined) == detload.errors.__all__


def test_the_layout_tool_is_a_submodule_reached_as_an_attribute():
    code = "import detload; print(detload.layout.rewrite.__name__, detload.layout.check.__name__)"
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["layout", "check_layout"]
    assert "layout" in dir(detload) and "layout" not in detload.__all__


def test_import_detload_is_light():
    """``import detload`` imports neither NumPy nor pyarrow (the command line's first
    instants, where a Ctrl-C must still be handled by detload's own code)."""
    res = _python("""
        import sys
        import detload
        heavy = [m for m in ("numpy", "pyarrow", "xxhash", "pandas", "torch") if m in sys.modules]
        print(",".join(heavy) or "none")
        from detload import Loader  # the names still work
        print("numpy" in sys.modules)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["none", "True"]


# -- no pandas in workers ------------------------------------------------------------------

_ALL_TYPES = """
    import datetime, os, sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    n = 300
    rng = np.random.default_rng(0)
    ids = np.arange(n, dtype=np.int64)
    valid = rng.random(n) > 0.1
    cols = {
        "id": pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(ids)]),
        "i8": pa.Array.from_buffers(pa.int8(), n, [None, pa.py_buffer((ids % 100).astype(np.int8))]),
        "f": pa.Array.from_buffers(pa.float32(), n, [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                                     pa.py_buffer(ids.astype(np.float32))]),
        "ni": pa.Array.from_buffers(pa.int64(), n, [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                                    pa.py_buffer(ids)]),
        "b": pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(ids % 3 == 0, bitorder="little"))]),
        "ts": pa.Array.from_buffers(pa.timestamp("us", "UTC"), n, [None, pa.py_buffer(ids * 1_000_000)]),
        "d": pa.Array.from_buffers(pa.date32(), n, [None, pa.py_buffer((ids % 1000).astype(np.int32))]),
        "du": pa.Array.from_buffers(pa.duration("ms"), n, [None, pa.py_buffer(ids)]),
    }
    table = pa.table(cols)
    # Text, lists, dictionaries and embeddings, built by pyarrow from NumPy buffers too.
    offs = (np.arange(n + 1) * 3).astype(np.int32)
    table = table.append_column("s", pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offs),
                                pa.py_buffer(np.frombuffer(b"abc" * n, np.uint8))]))
    table = table.append_column("l", pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1,
                                [None, pa.py_buffer(offs)]), pa.Array.from_buffers(pa.float64(), 3 * n,
                                [None, pa.py_buffer(np.arange(3 * n, dtype=np.float64))])))
    table = table.append_column("e", pa.FixedSizeListArray.from_arrays(pa.Array.from_buffers(pa.float32(), 4 * n,
                                [None, pa.py_buffer(np.ones(4 * n, np.float32))]), 4))
    table = table.append_column("cat", table["s"].combine_chunks().dictionary_encode())
    pq.write_table(table, os.path.join(root, "a.parquet"), row_group_size=100)
    pq.write_table(table, os.path.join(root, "b.parquet"), row_group_size=150)
"""


@pytest.fixture(scope="module")
def typed_data(tmp_path_factory) -> str:
    if importlib.util.find_spec("pandas") is None:
        pytest.skip("pandas is not installed: nothing could import it (the dev extras install it)")
    root = str(tmp_path_factory.mktemp("types") / "d")
    res = _python(_ALL_TYPES, root)
    assert res.returncode == 0, res.stderr
    return root


def test_thread_workers_never_import_pandas(typed_data, tmp_path):
    """Every column kind, nulls as NaN and through null_fill, a permutation of strings,
    the row-group cache (cold, then warm), and a manifest: pandas stays unimported."""
    res = _python("""
        import sys
        import detload
        root, cache = sys.argv[1], sys.argv[2]
        with detload.Loader(root, batch_size=64, seed=1, workers=2, null_fill={"ni": -1},
                            cache=cache, manifest=cache + "/../m.jsonl") as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                rows = sum(len(b["id"]) for b in loader)
        assert rows == 600, rows
        print("pandas" in sys.modules)
    """, typed_data, str(tmp_path / "cache"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_process_workers_never_import_pandas(typed_data):
    """Asked of the worker processes themselves: pandas' compiled modules are not mapped
    (the consumer imports pandas first here, as a user's script may)."""
    res = _python("""
        import sys
        import pandas  # noqa: F401 - the consumer may use pandas; its workers must not pay for it
        import detload
        root = sys.argv[1]
        with detload.Loader(root, batch_size=64, seed=1, workers=2, pool="process", null_fill={"ni": -1}) as loader:
            it = iter(loader)
            rows = sum(len(b["id"]) for b in it)
            pids = loader._pool.pids()
            mapped = []
            for pid in pids:
                with open(f"/proc/{pid}/maps") as f:
                    mapped.append(any("/pandas/" in line for line in f))
        assert rows == 600 and len(pids) == 2, (rows, pids)
        print(mapped)
    """, typed_data)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[False, False]"


def test_the_errors_tree_in_the_docs_names_every_exception_and_warning():
    import detload.errors

    with open(os.path.join(ROOT, "docs", "loader.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Errors"):text.index("## Process workers")]
    missing = [n for n in detload.errors.__all__ if n not in section]
    assert not missing, f"docs/loader.md's Errors section does not name {missing}"
    for n in detload.errors.__all__:
        assert n in detload.errors.__doc__, n
