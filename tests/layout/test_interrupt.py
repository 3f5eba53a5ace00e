"""An interrupted, killed or concurrent `detload layout`: DST is absent or complete with its report, and a rerun works.

Each run writes into a marked folder beside DST and renames it into place once the digests match.
Signals are sent at each phase (held there by the private DETLOAD_TEST_LAYOUT_HOLD hook), in-process
for every phase and in real ``python -m detload`` processes for the exit status and SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("duckdb")

import detload._layout.rewrite as rewrite  # noqa: E402
from detload import Loader  # noqa: E402
from detload._discovery import UNFINISHED_LAYOUT, UnfinishedLayoutWarning  # noqa: E402
from detload._layout.digest import digest  # noqa: E402
from detload._layout.rewrite import REPORT_NAME  # noqa: E402
from detload.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("DETLOAD_FULL") == "1"
PHASES = ["claimed", "reading", "writing", "written", "digested"]
EXPECT = {signal.SIGINT: (130, "interrupted\n"), signal.SIGTERM: (143, "terminated\n")}
PARTIAL = ".dst" + rewrite._PARTIAL_INFIX


def _write_src(root: Path, rows: int = 3000, files: int = 3) -> str:
    rng = np.random.default_rng(rows)
    t = pa.table({"k": rng.permutation(rows), "v": rng.random(rows)})
    root.mkdir()
    step = rows // files
    for i in range(files):
        pq.write_table(t.slice(i * step, step if i < files - 1 else rows - i * step), root / f"p{i}.parquet",
                       row_group_size=700)
    return str(root)


@pytest.fixture
def src(tmp_path) -> str:
    return _write_src(tmp_path / "src")


@pytest.fixture
def signals_restored():
    """main() ignores SIGINT and SIGTERM once a signal ended a command; the test process gets them back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _argv(src: str, dst: str) -> list[str]:
    return ["layout", src, dst, "--sort-by", "k", "--row-group-rows", "500", "--files", "2", "--no-progress"]


def _beside(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path))


def _check_complete(dst: Path, src: str) -> None:
    """DST holds the source's rows and its report says so; no unfinished marker is left in it."""
    names = sorted(os.listdir(dst))
    assert names == [REPORT_NAME, "part-00000.parquet", "part-00001.parquet"], names
    report = json.loads((dst / REPORT_NAME).read_text())
    assert report["digests_match"] is True and report["dst"] == str(dst)
    assert digest(str(dst)).value == digest(src).value == report["src_digest"]["digest"]


def _rerun(src: str, tmp_path: Path, capsys) -> None:
    capsys.readouterr()
    assert main(_argv(src, str(tmp_path / "dst"))) == 0, capsys.readouterr().err
    assert "digests match" in capsys.readouterr().out
    assert _beside(tmp_path) == ["dst", "src"]
    _check_complete(tmp_path / "dst", src)


# -- in-process: a signal at every phase ------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("phase", [*PHASES, "renamed"])
def test_a_signal_at_each_phase_leaves_no_dst_or_a_complete_one(src, tmp_path, capsys, monkeypatch, signals_restored,
                                                                 phase, sig):
    seen = []

    def hook(name: str) -> None:
        seen.append(name)
        if name == phase:
            signal.raise_signal(sig)  # the handler raises here, as at a real signal in this phase

    monkeypatch.setattr(rewrite, "_phase", hook)
    assert (main(_argv(src, str(tmp_path / "dst"))), capsys.readouterr().err) == EXPECT[sig]
    assert seen[-1] == phase
    if phase == "renamed":  # after the rename: DST is complete, and stays
        assert _beside(tmp_path) == ["dst", "src"]
        _check_complete(tmp_path / "dst", src)
        return
    assert _beside(tmp_path) == ["src"]
    monkeypatch.setattr(rewrite, "_phase", lambda name: None)
    _rerun(src, tmp_path, capsys)


def test_an_empty_dst_folder_is_replaced_and_a_filled_one_refused(src, tmp_path, capsys):
    (tmp_path / "dst").mkdir()
    _rerun(src, tmp_path, capsys)  # the rename replaces the empty folder
    assert main(_argv(src, str(tmp_path / "dst"))) == 2
    assert "exists and is not empty (3 entries, e.g. '_detload_layout.json')" in capsys.readouterr().err
    assert _beside(tmp_path) == ["dst", "src"]
    _check_complete(tmp_path / "dst", src)


def test_without_locks_a_leftover_is_named_not_removed(src, tmp_path, capsys, monkeypatch):
    import errno

    left = tmp_path / f"{PARTIAL}7-ee"
    left.mkdir()
    (left / UNFINISHED_LAYOUT).write_text(json.dumps({"dst": str(tmp_path / "dst"), "pid": 7}))

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(rewrite.fcntl, "flock", no_locks)
    assert main(_argv(src, str(tmp_path / "dst"))) == 2
    assert capsys.readouterr().err == (
        f"detload layout: error: {left} is the unfinished output of an earlier `detload layout` into DST "
        f"{tmp_path / 'dst'}, and this filesystem cannot tell whether that run still lives; if it does not, remove "
        "that folder and run again\n")
    assert _beside(tmp_path) == [left.name, "src"]


def test_a_dst_filled_meanwhile_is_not_replaced(src, tmp_path, capsys, monkeypatch):
    def meanwhile(name: str) -> None:
        if name == "digested":  # another program makes DST while the digests were computed
            (tmp_path / "dst").mkdir()
            (tmp_path / "dst" / "theirs.txt").write_text("x")

    monkeypatch.setattr(rewrite, "_phase", meanwhile)
    assert main(_argv(src, str(tmp_path / "dst"))) == 2
    assert capsys.readouterr().err == (
        f"detload layout: error: DST {tmp_path / 'dst'} was created or filled by something else while the layout ran; "
        "the output was removed. Choose another DST or remove that one\n")
    assert _beside(tmp_path) == ["dst", "src"] and os.listdir(tmp_path / "dst") == ["theirs.txt"]


def test_a_wakeup_fd_set_before_still_hears_of_the_signal(src, tmp_path, capsys, monkeypatch, signals_restored):
    # An event loop learns of signals through its wakeup descriptor; layout borrows it while DuckDB runs.
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w)
    try:
        monkeypatch.setattr(rewrite, "_phase", lambda name: signal.raise_signal(signal.SIGINT) if name == "reading"
                            else None)
        assert main(_argv(src, str(tmp_path / "dst"))) == 130
        assert signal.set_wakeup_fd(old) == w  # given back
        assert os.read(r, 16) == bytes([signal.SIGINT])
    finally:
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
    assert _beside(tmp_path) == ["src"]


# -- real processes -----------------------------------------------------------------------------------------

def _start(tmp_path: Path, argv: list[str], hold: str | None = None) -> tuple[subprocess.Popen, int]:
    """``python -m detload ARGV`` with the phase hook: returns the process and the read end of its phase pipe."""
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DETLOAD_TEST_LAYOUT_FD": str(w)}
    env.pop("DETLOAD_TEST_LAYOUT_HOLD", None)
    if hold is not None:
        env["DETLOAD_TEST_LAYOUT_HOLD"] = hold
    proc = subprocess.Popen([sys.executable, "-m", "detload", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, pass_fds=(w,), start_new_session=True, cwd=tmp_path)
    os.close(w)
    return proc, r


def _wait_for(proc: subprocess.Popen, r: int, phase: str) -> None:
    """Until the process reports ``phase`` (it then waits there, held by the hook)."""
    got = b""
    deadline = time.monotonic() + 120  # only a guard against a hang
    while f"{phase}\n".encode() not in got.splitlines(keepends=True):
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(r, 4096) if ready else b""
        if not chunk:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no phase {phase!r} (saw {got!r}); exit {proc.returncode}, stderr {err.decode()!r}")
        got += chunk


def _finish(proc: subprocess.Popen, r: int) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    os.close(r)
    return proc.returncode, err.decode()


@pytest.mark.parametrize("phase, sig, group", [("writing", signal.SIGINT, True), ("reading", signal.SIGTERM, False)])
def test_ctrl_c_and_sigterm_in_a_process(src, tmp_path, capsys, phase, sig, group):
    # Ctrl-C reaches the whole process group; SIGTERM (a job scheduler's) the process alone.
    proc, r = _start(tmp_path, _argv(src, "dst"), hold=phase)
    _wait_for(proc, r, phase)
    assert any(n.startswith(PARTIAL) for n in _beside(tmp_path))  # the run has its folder now, DST not yet
    (os.killpg if group else os.kill)(proc.pid, sig)
    assert _finish(proc, r) == EXPECT[sig]
    assert _beside(tmp_path) == ["src"]
    _rerun(src, tmp_path, capsys)


@pytest.mark.parametrize("phase", ["writing", "digested"])
def test_sigkill_leaves_a_marked_folder_that_the_loader_warns_about_and_a_rerun_removes(src, tmp_path, capsys, phase):
    proc, r = _start(tmp_path, _argv(src, "dst"), hold=phase)
    _wait_for(proc, r, phase)
    proc.kill()
    assert _finish(proc, r)[0] == -signal.SIGKILL
    left = [n for n in _beside(tmp_path) if n != "src"]
    assert len(left) == 1 and left[0].startswith(PARTIAL), left  # DST itself was never created
    partial = tmp_path / left[0]
    marker = json.loads((partial / UNFINISHED_LAYOUT).read_text())
    assert marker["dst"] == str(tmp_path / "dst") and marker["pid"] == proc.pid
    want = rf"{partial} holds {UNFINISHED_LAYOUT}: it is the output of a `detload layout` run that was interrupted"
    for source in (str(partial), str(partial / "*.parquet")):
        with pytest.warns(UnfinishedLayoutWarning, match=want):
            if phase == "writing":  # a part file without its footer: also refused
                with pytest.raises(Exception, match="does not end with the Parquet magic bytes"):
                    Loader(source, batch_size=100, seed=1)
            else:  # complete files, never renamed into place: readable, but not silently
                assert len(Loader(source, batch_size=100, seed=1)) > 0
    _rerun(src, tmp_path, capsys)  # removes the dead run's folder by itself
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnfinishedLayoutWarning)
        Loader(str(tmp_path / "dst"), batch_size=100, seed=1)


def test_a_second_run_is_refused_while_the_first_lives(src, tmp_path, capsys):
    first, r = _start(tmp_path, _argv(src, "dst"), hold="writing")
    _wait_for(first, r, "writing")
    partial = next(n for n in _beside(tmp_path) if n.startswith(PARTIAL))
    assert main(_argv(src, str(tmp_path / "dst"))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"detload layout: error: another `detload layout` is writing DST {tmp_path / 'dst'} right now "
                          f"(pid {first.pid} on ") and err.endswith(
        f", into {tmp_path / partial}); wait for it to finish, or stop it and run again\n"), err
    assert partial in _beside(tmp_path)  # the live run's folder is not touched
    os.kill(first.pid, signal.SIGTERM)
    assert _finish(first, r) == EXPECT[signal.SIGTERM]
    _rerun(src, tmp_path, capsys)


def test_leftovers_a_kill_can_leave_are_removed_and_foreign_folders_kept(src, tmp_path, capsys):
    # Killed after the marker's removal, just before the rename: its report names DST.
    (tmp_path / f"{PARTIAL}1-aa").mkdir()
    (tmp_path / f"{PARTIAL}1-aa" / REPORT_NAME).write_text(json.dumps({"dst": str(tmp_path / "dst")}))
    (tmp_path / f"{PARTIAL}1-aa" / "part-00000.parquet").write_bytes(b"PAR1")
    # Killed as it started: a folder with nothing, or with a marker half written.
    (tmp_path / f"{PARTIAL}2-bb").mkdir()
    (tmp_path / f"{PARTIAL}3-cc").mkdir()
    (tmp_path / f"{PARTIAL}3-cc" / UNFINISHED_LAYOUT).write_text('{"wh')
    # Named alike but nothing says it is a layout's: left alone, with a warning.
    (tmp_path / f"{PARTIAL}4-dd").mkdir()
    (tmp_path / f"{PARTIAL}4-dd" / "notes.txt").write_text("mine")
    assert main(_argv(src, str(tmp_path / "dst"))) == 0
    assert capsys.readouterr().err == (f"detload layout: warning: {tmp_path / PARTIAL}4-dd looks like an unfinished "
                                       f"layout of {tmp_path / 'dst'} but holds no marker of one; it was left alone: "
                                       "remove it if nothing uses it\n")
    assert _beside(tmp_path) == [f"{PARTIAL}4-dd", "dst", "src"]
    assert (tmp_path / f"{PARTIAL}4-dd" / "notes.txt").read_text() == "mine"
    _check_complete(tmp_path / "dst", src)


def test_a_signal_at_a_random_moment(tmp_path, capsys):
    """Signals while DuckDB sorts too (no Python runs there): the outcome is one of the two, never a third."""
    src = _write_src(tmp_path / "src", rows=200_000, files=2)
    rng = random.Random(36)
    outcomes = []
    for i in range(16 if FULL else 3):
        sig = (signal.SIGINT, signal.SIGTERM)[i % 2]
        proc, r = _start(tmp_path, ["layout", src, "dst", "--sort-by", "k", "--no-progress"])
        _wait_for(proc, r, "claimed")
        time.sleep(rng.uniform(0, 1.0))
        os.kill(proc.pid, sig)
        code, err = _finish(proc, r)
        outcomes.append(code)
        if code == 0:  # finished first: DST complete, checked
            assert err == "" and _beside(tmp_path) == ["dst", "src"], f"trial {i}"
            assert json.loads((tmp_path / "dst" / REPORT_NAME).read_text())["digests_match"] is True
            shutil.rmtree(tmp_path / "dst")
            continue
        assert (code, err) == EXPECT[sig], f"trial {i}"
        assert _beside(tmp_path) == ["src"], f"trial {i}"
    print("exit statuses:", outcomes)
