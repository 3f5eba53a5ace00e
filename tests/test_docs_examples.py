"""Every fenced ```python block of README.md and docs/*.md runs as written.

The convention the pages follow:

- A block that cannot run alone (it continues an earlier one, needs a GPU cluster,
  an S3 bucket or a model defined elsewhere) is preceded by the HTML comment
  ``<!-- fragment -->`` on its own line, right before the fence; it is skipped.
- Every other block is saved as a script and run by a fresh interpreter
  (``python example.py``, as a reader would run it: with ``pool="process"`` the
  workers then re-import it, so a missing ``__main__`` guard fails here too), with
  its page's folder as the working directory. The blocks of a page run in order in that
  folder, which `SETUP` below prepares with the data the page refers to
  (``data/``, ``example-data/``); an example may also write its own files.
- A block whose first line is ``# NAME.py: ...`` is also saved as ``NAME.py`` in
  that folder, so that later blocks can import it (audit.md's ``ref_hash.py``).

Each block must exit 0 within its time limit; what it prints is not compared.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def blocks(page: str) -> list[tuple[int, str, bool]]:
    """(line, code, is_fragment) of every ```python block of ``page``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), before == FRAGMENT))
    return out


# -- what each page's folder holds before its blocks run --------------------------------------

def _example_data(where: Path) -> None:
    """determinism.md's make_example.py: the example-data/ that several pages use."""
    (code,) = [c for _, c, _ in blocks("docs/determinism.md") if c.startswith("# make_example.py:")]
    _python(code, where, name="make_example.py")


def _train_data(where: Path) -> None:
    """data/: 4 files x 3 row groups of a CTR-like table (label, features as a 4-wide embedding, ...)."""
    _python(textwrap.dedent("""
        import os
        import numpy as np, pyarrow as pa, pyarrow.parquet as pq
        os.makedirs("data", exist_ok=True)
        rng = np.random.default_rng(0)
        for f in range(4):
            n = 3 * 700
            table = pa.table({
                "id": np.arange(f * n, (f + 1) * n, dtype=np.int64),
                "label": (rng.random(n) < 0.3).astype(np.float32),
                "features": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(4 * n).astype(np.float32)), 4),
                "query": pa.array([f"q{i % 97}" for i in range(n)]),
            })
            pq.write_table(table, f"data/part-{f}.parquet", row_group_size=700)
    """), where, name="make_train_data.py")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _one_process_torchrun() -> dict[str, str]:
    """What torchrun sets for a world of one process (DDP examples run as one rank, on gloo)."""
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": _free_port(), "CUDA_VISIBLE_DEVICES": ""}


#: page -> (folder preparation, extra environment)
SETUP: dict[str, tuple[list[Callable[[Path], None]], Callable[[], dict[str, str]]]] = {
    "README.md": ([_train_data], dict),
    "docs/audit.md": ([_example_data], dict),
    "docs/determinism.md": ([_example_data], dict),
    "docs/loader.md": ([_example_data, _train_data], dict),
    "docs/distributed.md": ([_train_data], _one_process_torchrun),
    "docs/transforms.md": ([_train_data], dict),
}

#: seconds a block may take (process pools, torch); generous for a loaded 2-core CI machine
TIMEOUT = 240


def _python(code: str, cwd: Path, env: dict[str, str] | None = None, name: str = "example.py",
            ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    (cwd / name).write_text(code, encoding="utf-8")
    res = subprocess.run([sys.executable, name], cwd=cwd, env=full, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert res.returncode == 0, f"exit {res.returncode}\n--- code\n{code}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
    return res


_FOLDERS: dict[str, Path] = {}


@pytest.fixture
def page_folder(tmp_path_factory) -> Callable[[str], Path]:
    def get(page: str) -> Path:
        if page not in _FOLDERS:
            where = tmp_path_factory.mktemp(re.sub(r"\W", "_", page))
            for prepare in SETUP.get(page, ([], dict))[0]:
                prepare(where)
            for _, code, _ in blocks(page):
                m = re.match(r"# ([\w.]+\.py):", code)
                if m:
                    (where / m.group(1)).write_text(code, encoding="utf-8")
            _FOLDERS[page] = where
        return _FOLDERS[page]

    return get


CASES = [pytest.param(page, line, code, id=f"{page}:{line}",
                      marks=[pytest.mark.skip(reason="marked <!-- fragment -->")] if fragment else [])
         for page in PAGES for line, code, fragment in blocks(page)]


@pytest.mark.parametrize(("page", "line", "code"), CASES)
def test_example_runs(page_folder, page, line, code):
    env = SETUP.get(page, ([], dict))[1]()
    m = re.match(r"# ([\w.]+\.py):", code)
    _python(code, page_folder(page), env, name=m.group(1) if m else f"example_{line}.py")


def test_every_page_with_examples_is_set_up_or_self_contained():
    """A page whose runnable blocks read data must say how its folder is prepared (SETUP)."""
    for page in PAGES:
        runnable = [code for _, code, fragment in blocks(page) if not fragment]
        if any(("data/" in c or '"data' in c or "example-data" in c) for c in runnable):
            assert page in SETUP, f"{page} has examples that read data; add it to SETUP"


def test_fragments_are_marked_only_right_before_a_fence():
    for page in PAGES:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() == FRAGMENT:
                nxt = next((x for x in lines[i + 1:] if x.strip()), "")
                assert nxt.startswith("```python"), f"{page}:{i + 1}: {FRAGMENT} is not followed by a python block"
