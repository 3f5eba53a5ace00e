"""Process workers in the places people run Python, and what a worker that cannot start says.

Each case runs a real interpreter: ``python -c``, a script on stdin with and
without the ``if __name__ == "__main__":`` guard, a script file without it.
Workers must not import the main module when nothing of it is needed (a
script's top level runs once, in the consumer). When the configuration does
refer to the main module (a filesystem class written in the script), workers
import it; a main module they cannot import is refused before any process
starts, and a worker that fails at start-up gives one error, with the
missing-guard advice only when that is the cause.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROWS = 2_000
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

HEADER = """\
import os, sys
sys.stderr.write(f"MAIN RAN {{os.getpid()}}\\n")  # one write: workers print it too, at the same time
from detload import Loader
{extra}
def run(root):
    with Loader(root, batch_size=100, seed=1, workers={workers}, pool="process"{opts}) as ld:
        rows = sum(len(b["id"]) for b in ld)
    print("ROWS", rows, flush=True)
"""
GUARDED = 'if __name__ == "__main__":\n    run(sys.argv[1])\n'
BARE = "run(sys.argv[1])\n"
# A filesystem class written in the script: the workers' configuration then refers to __main__.
MAIN_FS = "import fsspec.implementations.local as _local\nclass ScriptFS(_local.LocalFileSystem):\n    pass\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("start")
    for f in range(2):
        ids = np.arange(f * ROWS // 2, (f + 1) * ROWS // 2, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), d / f"part-{f}.parquet", row_group_size=250)
    return str(d)


def _script(*, guard: bool, workers: int = 2, main_fs: bool = False) -> str:
    head = HEADER.format(extra=MAIN_FS if main_fs else "", workers=workers,
                         opts=", storage=ScriptFS()" if main_fs else "")
    return head + (GUARDED if guard else BARE)


def _run(how: str, code: str, root: str, tmp_path, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
           **(env_extra or {})}
    if how == "-c":
        args, stdin = [sys.executable, "-c", code, root], None
    elif how == "stdin":
        args, stdin = [sys.executable, "-", root], code
    else:
        script = tmp_path / "train.py"
        script.write_text(code)
        args, stdin = [sys.executable, str(script), root], None
    return subprocess.run(args, input=stdin, capture_output=True, text=True, env=env, timeout=120,
                          cwd=str(tmp_path))


def _main_runs(err: str) -> int:
    return sum(line.startswith("MAIN RAN") for line in err.splitlines())


def _other_stderr(err: str) -> list[str]:
    return [line for line in err.splitlines() if not line.startswith("MAIN RAN")]


@pytest.mark.parametrize("how,guard", [("-c", False), ("stdin", True), ("stdin", False), ("file", False),
                                       ("file", True)])
def test_process_pool_runs_without_importing_the_main_module(root, tmp_path, how, guard):
    done = _run(how, _script(guard=guard), root, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"ROWS {ROWS}" in done.stdout
    assert _main_runs(done.stderr) == 1, "a worker process imported the main module"
    assert _other_stderr(done.stderr) == []


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_main_module_workers_need_but_cannot_import_is_refused_before_they_start(root, tmp_path, how):
    done = _run(how, _script(guard=True, main_fs=True), root, tmp_path)
    assert done.returncode == 1
    err = "\n".join(_other_stderr(done.stderr))
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "OptionError: pool='process' must send ScriptFS to its worker processes" in err
    why = "given with python -c" if how == "-c" else "read from standard input"
    assert why in err and "Use pool='thread', or move it into a module file" in err
    assert "ROWS" not in done.stdout


def test_a_guarded_script_whose_configuration_refers_to_it_still_works(root, tmp_path):
    """The workers import the main module then, as multiprocessing does (its top level runs
    in each of them, its guarded part only in the consumer)."""
    done = _run("file", _script(guard=True, main_fs=True, workers=2), root, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"ROWS {ROWS}" in done.stdout
    assert _main_runs(done.stderr) == 1 + 2
    assert _other_stderr(done.stderr) == []


@pytest.mark.parametrize("workers", [2, 8])
def test_a_missing_guard_that_matters_is_one_error_saying_so(root, tmp_path, workers):
    done = _run("file", _script(guard=False, main_fs=True, workers=workers), root, tmp_path)
    assert done.returncode == 1
    err = _other_stderr(done.stderr)
    text = "\n".join(err)
    assert text.count("Traceback (most recent call last)") == 1, text
    assert len(err) <= 30, text  # the consumer's own traceback, whatever the worker count
    assert "WorkerError: worker process" in text and "failed at start-up" in text
    assert "failed at start-up: it imports the main module train.py, because the loader's configuration " \
        "refers to ScriptFS, defined there, and that import creates and iterates a Loader again" in text
    assert 'Put that code under `if __name__ == "__main__":`, or move ScriptFS into a module' in text
    assert "ROWS" not in done.stdout


FAILS_AWAY = textwrap.dedent("""
    import os
    import fsspec.implementations.local as _local


    def _rebuild(home):
        if os.getpid() != home:
            raise RuntimeError("this filesystem only opens in the process that made it")
        return HomeFS()


    class HomeFS(_local.LocalFileSystem):
        def __reduce__(self):
            return (_rebuild, (os.getpid(),))
""")


@pytest.mark.parametrize("how,workers", [("file", 4), ("-c", 8)])
def test_a_worker_failing_at_start_up_is_one_error_without_the_guard_advice(root, tmp_path, how, workers):
    """The configuration cannot be rebuilt in a worker: one WorkerError naming the worker, the
    cause and the fix, no multiprocessing tracebacks, and no word of a guard (this script has one)."""
    (tmp_path / "homefs.py").write_text(FAILS_AWAY)
    code = _script(guard=True, workers=workers).replace(
        "from detload import Loader", "from detload import Loader\nfrom homefs import HomeFS").replace(
        'pool="process"', 'pool="process", storage=HomeFS()')
    done = _run(how, code, root, tmp_path, {"PYTHONPATH": os.pathsep.join([REPO, str(tmp_path)])})
    assert done.returncode == 1
    err = _other_stderr(done.stderr)
    text = "\n".join(err)
    assert text.count("Traceback (most recent call last)") == 1, text
    assert len(err) <= 30, text  # the consumer's own traceback, whatever the worker count
    assert "failed at start-up: RuntimeError: this filesystem only opens in the process that made it" in text
    assert "It could not rebuild the loader's configuration" in text and "Use pool='thread'" in text
    assert "__main__" not in text
