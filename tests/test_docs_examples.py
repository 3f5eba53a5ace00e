"""Every example of README.md and docs/*.md runs as written, and prints what the page shows.

The convention the pages follow (docs/README.md states it for readers):

- A fenced ```python block is saved as a script and run by a fresh interpreter
  (``python example.py``, as a reader would run it: with ``pool="process"`` the
  workers then re-import it, so a missing ``__main__`` guard fails here too), with
  its page's folder as the working directory. The blocks of a page run in order in that
  folder, which `SETUP` below prepares with the data the page refers to
  (``data/``, ``example-data/``); an example may also write its own files.
  A block whose first line is ``# NAME.py: ...`` is also saved as ``NAME.py`` in
  that folder, so that later blocks can import it (audit.md's ``ref_hash.py``).
- A ```text block right after a ```python block (nothing but blank lines between
  them) is what that block prints on stdout; it is compared with what the run printed.
- A ```console block is a shell session: each ``$ COMMAND`` line (continued by a
  trailing backslash) runs in bash in the page's folder, ``detload`` being this
  tree's command line, and the lines up to the next ``$`` are what it prints, stdout
  and stderr together as a terminal shows them. The commands of one block run in one
  shell, so ``$ echo $?`` shows the previous command's exit status.
- In an expected output, ``...`` stands for any text, on one line or across lines
  (doctest's ELLIPSIS): the mark for values that vary from run to run (timings,
  absolute paths). Trailing spaces and trailing blank lines are not compared.
- A ```text or ```console block that is a printed output no test can reproduce (it
  needs a GPU, an S3 bucket, minutes of benchmarking) is preceded by the HTML comment
  ``<!-- not run: REASON -->`` on its own line, right before the fence, and is not
  compared; so is a ```python block with it, and with ``<!-- fragment -->`` (a block
  that cannot run alone: it continues an earlier one). Illustrations that are not
  printed by anything (formats, synopses, file layouts) use a bare ``` fence.

`test_every_output_is_checked_or_marked` holds the pages to this: a ```text block is
the output of a block that runs, or marked; a fragment has no output block after it.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
_MARK = re.compile(r"<!-- (fragment|not run: .*?) -->")
_FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str
    line: int                     # of the opening fence, 1-based
    lang: str                     # "python", "text", "console", "" for a bare fence, ...
    body: str
    mark: str | None              # "fragment", "not run: REASON" or None
    output: Block | None = None   # a python block's ```text block

    @property
    def runs(self) -> bool:
        return self.mark is None


def page_blocks(page: str) -> list[Block]:
    """Every fenced block of ``page``, a python block's output block attached to it (and listed too)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        mark = _MARK.fullmatch(before)
        found.append((m, Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                               mark.group(1) if mark else None)))
    out = []
    for i, (m, b) in enumerate(found):
        if b.lang == "python" and i + 1 < len(found):
            nm, nb = found[i + 1]
            if nb.lang == "text" and not text[m.end(): nm.start()].strip():
                b = Block(b.page, b.line, b.lang, b.body, b.mark, nb)
        out.append(b)
    return out


def blocks(page: str) -> list[tuple[int, str, bool]]:
    """(line, code, is_fragment) of every ```python block of ``page``."""
    return [(b.line, b.body, not b.runs) for b in page_blocks(page) if b.lang == "python"]


# -- comparing outputs ----------------------------------------------------------------------

def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected``, each ``...`` in it standing for any text (doctest's ELLIPSIS)."""
    want, got = "\n".join(_lines(expected)), "\n".join(_lines(actual))
    if "..." not in want:
        return want == got
    pattern = ".*?".join(re.escape(piece) for piece in want.split("..."))
    return re.fullmatch(pattern, got, re.S) is not None


def _differences(expected: str, actual: str, where: str) -> str:
    """'' when ``actual`` matches ``expected``, else a diff headed by ``where``."""
    if matches(expected, actual):
        return ""
    diff = "\n".join(difflib.unified_diff(_lines(expected), _lines(actual), "the page", "the run", lineterm=""))
    return f"{where}: the output differs from the page (`...` matches any text)\n{diff}\n"


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


def _env(cwd: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, **(extra or {}), "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _python(code: str, cwd: Path, env: dict[str, str] | None = None, name: str = "example.py",
            ) -> subprocess.CompletedProcess[str]:
    (cwd / name).write_text(code, encoding="utf-8")
    res = subprocess.run([sys.executable, name], cwd=cwd, env=_env(cwd, env), capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert res.returncode == 0, f"exit {res.returncode}\n--- code\n{code}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
    return res


def console_commands(body: str) -> list[tuple[str, str]]:
    """(command, expected output) of each ``$ `` line of a console block."""
    out: list[tuple[str, str]] = []
    continued = False
    for line in body.rstrip("\n").split("\n"):
        if continued:
            cmd, want = out[-1]
            out[-1] = (cmd + "\n" + line, want)
        elif line.startswith("$ "):
            out.append((line[2:], ""))
        else:
            assert out, f"a console block must start with a '$ ' command line, not {line!r}"
            cmd, want = out[-1]
            out[-1] = (cmd, want + line + "\n")
            continue
        continued = line.endswith("\\")
    return out


_SECTION = "@@detload-docs-command-{}@@"
_SECTION_LINE = re.compile(r"\n?@@detload-docs-command-(\d+)@@\n")


def _console(body: str, cwd: Path, env: dict[str, str], where: str) -> None:
    """Run the block's commands in one bash shell and compare each one's output with the page."""
    commands = console_commands(body)
    bin_dir = cwd / ".docs-bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "detload"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m detload "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    # Each command starts with the previous one's exit status in $?, as in an interactive shell.
    script = ["exec 2>&1", "__status=0"]
    for i, (cmd, _) in enumerate(commands):
        script += [f"printf '\\n%s\\n' '{_SECTION.format(i)}'", "(exit $__status)", cmd, "__status=$?"]
    full = {**_env(cwd, env), "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])}
    res = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=full, capture_output=True, text=True,
                         timeout=TIMEOUT)
    parts = _SECTION_LINE.split(res.stdout)
    printed = dict(zip((int(n) for n in parts[1::2]), parts[2::2]))
    problems = "".join(_differences(want, printed.get(i, ""), f"{where}: $ {cmd}")
                       for i, (cmd, want) in enumerate(commands))
    assert not problems, problems


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


def _cases() -> list:
    cases = []
    for page in PAGES:
        for b in page_blocks(page):
            if b.lang not in ("python", "console"):
                continue
            marks = [] if b.runs else [pytest.mark.skip(reason=f"marked <!-- {b.mark} -->")]
            cases.append(pytest.param(b, id=f"{page}:{b.line}", marks=marks))
    return cases


@pytest.mark.parametrize("block", _cases())
def test_example_runs_and_prints_what_the_page_shows(page_folder, block: Block):
    env = SETUP.get(block.page, ([], dict))[1]()
    where = f"{block.page}:{block.line}"
    if block.lang == "console":
        _console(block.body, page_folder(block.page), env, where)
        return
    m = re.match(r"# ([\w.]+\.py):", block.body)
    res = _python(block.body, page_folder(block.page), env, name=m.group(1) if m else f"example_{block.line}.py")
    if block.output is not None:
        problems = _differences(block.output.body, res.stdout, where)
        assert not problems, problems


def test_every_page_with_examples_is_set_up_or_self_contained():
    """A page whose runnable blocks read data must say how its folder is prepared (SETUP)."""
    for page in PAGES:
        runnable = [b.body for b in page_blocks(page) if b.lang in ("python", "console") and b.runs]
        if any(("data/" in c or '"data' in c or "example-data" in c) for c in runnable):
            assert page in SETUP, f"{page} has examples that read data; add it to SETUP"


def test_every_output_is_checked_or_marked():
    """A ```text block is the output of a python block that runs, or it says why it is not run."""
    problems = []
    for page in PAGES:
        outputs = {b.output.line: b for b in page_blocks(page) if b.output is not None}
        for b in page_blocks(page):
            where = f"{page}:{b.line}"
            if b.mark is not None and b.mark.startswith("not run") and not _NOT_RUN.fullmatch(f"<!-- {b.mark} -->"):
                problems.append(f"{where}: say why the block is not run: <!-- not run: REASON -->")
            if b.lang == "text" and b.mark is None:
                src = outputs.get(b.line)
                if src is None:
                    problems.append(f"{where}: a ```text block is a printed output: put it right after the python "
                                    "block that prints it, or mark it <!-- not run: REASON -->")
                elif src.mark == "fragment":
                    problems.append(f"{where}: the output of a <!-- fragment --> is not checked; mark the python "
                                    "block <!-- not run: REASON --> instead")
    assert not problems, "\n".join(problems)


def test_marks_are_only_right_before_a_fence():
    for page in PAGES:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if _MARK.fullmatch(line.strip()):
                nxt = next((x for x in lines[i + 1:] if x.strip()), "")
                want = "```python" if line.strip() == FRAGMENT else "```"
                assert nxt.startswith(want), f"{page}:{i + 1}: {line.strip()} is not followed by a {want} block"


# A private detload name: a module or attribute with a leading underscore under detload
# (detload._filters.canonical, detload.layout._x), or one imported from a detload module.
_PRIVATE_PATH = re.compile(r"\bdetload(?:\.[A-Za-z]\w*)*\.(_\w+)")
_FROM_IMPORT = re.compile(r"^\s*from\s+detload(?:\.\w+)*\s+import\s+(\([^)]*\)|[^\n]*)", re.M)


def private_names(code: str) -> list[str]:
    """The private detload names a block of code uses (``__version__`` is public)."""
    found = [m.group(0) for m in _PRIVATE_PATH.finditer(code) if not m.group(1).startswith("__")]
    for m in _FROM_IMPORT.finditer(code):
        for part in m.group(1).strip("()").replace("\n", ",").split(","):
            name = part.split(" as ")[0].strip()
            if name.startswith("_") and not name.startswith("__"):
                found.append(name)
    return found


@pytest.mark.parametrize(("code", "found"), [
    ("from detload._filters.canonical import parse_filter", ["detload._filters"]),
    ("import detload.layout._x as x", ["detload.layout._x"]),
    ("from detload import _EXPORTS, Loader", ["_EXPORTS"]),
    ("from detload.filters import (\n    Filter,\n    _private,\n)", ["_private"]),
    ("print(detload._cache.CONVERTER_VERSION)", ["detload._cache"]),
    ("import detload.filters\nfrom detload import Loader, __version__\ndetload.filters.parse(x, s)", []),
])
def test_private_names_are_found(code, found):
    assert private_names(code) == found


def test_examples_use_only_public_names():
    """The pages show what a reader may use: no example imports or calls a private detload name."""
    problems = [f"{page}:{b.line}: {name}" for page in PAGES for b in page_blocks(page)
                if b.lang in ("python", "console") for name in private_names(b.body)]
    assert not problems, "examples that use private names:\n" + "\n".join(problems)


@pytest.mark.parametrize(("expected", "actual", "same"), [
    ("a 1\nb 2", "a 1  \nb 2\n\n", True),
    ("a 1\nb 2", "a 1\nb 3", False),
    ("epoch 0: ... rows/s", "epoch 0: 7,237 rows/s", True),
    ("epoch 0: ... rows/s", "epoch 0: 7,237 rows/min", False),
    ("first\n...\nlast", "first\nx\ny\nlast", True),
    ("Loader('.../example-data', workers=1)", "Loader('/tmp/x/example-data', workers=1)", True),
    ("Loader('.../example-data', workers=1)", "Loader('/tmp/x/example-data', workers=3)", False),
    ("a.b", "axb", False),  # only `...` is special
])
def test_the_comparison(expected, actual, same):
    assert matches(expected, actual) is same


def test_console_blocks_split_into_commands_and_outputs():
    body = "$ detload run x \\\n      --seed 1\nline 1\nline 2\n$ echo $?\n0\n"
    assert console_commands(body) == [("detload run x \\\n      --seed 1", "line 1\nline 2\n"), ("echo $?", "0\n")]


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    heads = re.findall(r"^#+\s+(.+?)\s*$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_links_between_pages_resolve():
    """Every relative link of the pages names a file that exists, and a heading of it when it has a #anchor."""
    problems = []
    for page in PAGES:
        path = ROOT / page
        text = _FENCE.sub("", path.read_text(encoding="utf-8"))
        for target, anchor in re.findall(r"\]\(([^)\s:#]*)(?:#([^)\s]+))?\)", text):
            dest = (path.parent / target).resolve() if target else path
            if not dest.exists():
                problems.append(f"{page}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{page}: link to {target or page}#{anchor}: no such heading")
    assert not problems, "\n".join(problems)
