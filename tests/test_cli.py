"""The command line: help texts, one-line errors with exit 2, the progress display, and signals.

Most cases call ``detload.cli.main`` in-process (a traceback there is an exception the
test sees); the signal cases run ``python -m detload`` in subprocesses, since what
matters there is what reaches the real stderr and the exit status.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _perfdata import write_small
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detload import cli
from detload.cli import main

ROOT = Path(__file__).resolve().parent.parent
FULL = os.environ.get("DETLOAD_FULL") == "1"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return str(write_small(tmp_path_factory.mktemp("cli") / "data", files=2, rows=1200, row_group=300))


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one in-process command; argparse's exits count too."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_error(err: str, cmd: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"detload {cmd}: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- help ------------------------------------------------------------------------------

def _walk(parser: argparse.ArgumentParser, path: str = "detload"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                assert helps.get(name), f"{path} {name} has no help line"
                assert sub.description, f"{path} {name} has no description"
                yield from _walk(sub, f"{path} {name}")
        else:
            yield path, parser, action


def test_every_command_and_option_has_help_with_its_default():
    seen = 0
    for path, parser, action in _walk(cli._parser()):
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction, cli._HelpAll)):
            continue
        name = "/".join(action.option_strings) or action.dest
        action = copy.copy(action)
        action.help = getattr(action, "full_help", action.help)  # a rare option's text, shown by --help-all
        assert action.help, f"{path} {name} has no help text"
        seen += 1
        if not action.option_strings or action.required or isinstance(action, argparse._StoreTrueAction):
            continue  # positionals, required options and flags (off unless given) have no default to state
        text = parser._get_formatter()._expand_help(action)
        assert "default" in text, f"{path} {name}: the help does not say its default: {text!r}"
    assert seen > 60


def test_help_groups_the_options_and_keeps_the_rare_ones_for_help_all(capsys):
    code, short, _ = _run(["run", "--help"], capsys)
    assert code == 0
    for title in ("what decides the batches", "which rows and columns", "distributed runs", "workers (never change",
                  "row-group cache", "the run and its output"):
        assert title in short, title
    rare = ("--null-fill", "--cast", "--prefetch", "--start-epoch", "--cache-limit", "--cache-map-limit",
            "--group-columns", "--max-group-items")
    def listed(text: str) -> list[str]:  # the options the help has an entry for
        return [o for o in rare if re.search(rf"^ +{o}\b", text, flags=re.M)]

    assert listed(short) == []
    code, full, _ = _run(["run", "--help-all"], capsys)
    assert code == 0
    assert listed(full) == list(rare)
    assert "replace nulls of COLUMN with VALUE" in " ".join(full.split())
    # A rare option is still an option: hidden from the short help only.
    assert cli._parser().parse_args(["run", "d", "--batch-size", "1", "--seed", "0", "--manifest", "m",
                                     "--prefetch", "3"]).prefetch == 3


def test_help_shows_the_defaults(capsys):
    code, out, _ = _run(["bench", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    for text in ("epochs; workers persist across them (default: 2)", "rows per batch (default: 4096)",
                 "(default: auto)", "what the workers are (default: thread)", "(default: no trace file)"):
        assert text in flat, text


def test_verify_with_one_argument_does_not_call_the_optional_third_required(capsys):
    code, _, err = _run(["verify", "a.jsonl"], capsys)
    assert code == 2
    assert "the following arguments are required: B" in err
    assert "B_RESUMED" not in err.splitlines()[-1]


# -- one error line, exit 2 -----------------------------------------------------------------

def test_manifest_inside_the_dataset_folder_is_refused(data, capsys):
    code, out, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--manifest",
                           os.path.join(data, "m.jsonl")], capsys)
    assert code == 2 and "epoch 0" not in out
    assert _one_error(err, "run").endswith(f"is inside the dataset folder {data}; write it elsewhere")
    assert not os.path.exists(os.path.join(data, "m.jsonl"))


def test_manifest_under_a_regular_file(data, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, _, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--manifest",
                         str(tmp_path / "f" / "m.jsonl")], capsys)
    assert code == 2
    assert f"cannot be created: {tmp_path / 'f'} is a file, not a folder" in _one_error(err, "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_manifest_in_a_read_only_folder(data, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        code, _, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--manifest", str(ro / "m.jsonl")],
                            capsys)
    finally:
        ro.chmod(0o700)
    assert code == 2 and "is not writable" in _one_error(err, "run")


def test_manifest_on_a_read_only_file_system(data, tmp_path, capsys, monkeypatch):
    # os.access reports EROFS as "not writable"; simulated here, since tests cannot mount.
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p).startswith(str(tmp_path)) and mode & os.W_OK
                        else real(p, mode, **kw))
    code, _, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--manifest",
                         str(tmp_path / "runs" / "m.jsonl")], capsys)
    assert code == 2
    assert f"cannot be created: {tmp_path} is not writable (permissions, or a read-only file system)" in \
        _one_error(err, "run")


def test_huge_prefetch_with_processes(data, tmp_path, capsys):
    code, out, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--pool", "process",
                           "--prefetch", "2147483648", "--manifest", str(tmp_path / "m.jsonl")], capsys)
    assert code == 2 and "epoch" not in out
    assert _one_error(err, "run").endswith(
        "--prefetch must be an int in [1, 1024] (blocks queued per worker), got 2147483648")


@pytest.mark.parametrize("flags, message", [
    (["--cache-limit", "1GB"], "--cache-limit needs --cache-dir"),
    (["--cache-map-limit", "0"], "--cache-map-limit needs --cache-dir"),
    (["--cache-dir", "{tmp}/c", "--cache-limit", "lots"], "--cache-limit 'lots' is not a size; use bytes or e.g. "
                                                          "'500MB', '20GiB'"),
    (["--rank", "2", "--world-size", "2"], "--rank must be an int in [0, 2), got 2"),
    (["--world-size", "0"], "--world-size must be an int >= 1, got 0"),
    (["--spill", "{tmp}/none"], "--spill: '{tmp}/none' is not a folder (the spill file of a mixed-order window "
                                "goes there; pass an existing folder, 'on' for the system's temporary folder, or 'off')"),
])
def test_errors_name_the_flags(data, tmp_path, capsys, monkeypatch, flags, message):
    # The flags stand for the Loader's option groups; a message names what was typed.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--manifest", str(tmp_path / "m.jsonl"),
                           *(f.format(tmp=tmp_path) for f in flags)], capsys)
    assert code == 2 and "epoch" not in out
    assert _one_error(err, "run") == f"detload run: error: {message.format(tmp=tmp_path)}"


@pytest.mark.parametrize("cmd", ["run", "plan", "bench"])
def test_a_cache_dir_that_is_a_file_is_refused_by_every_command(data, tmp_path, capsys, cmd):
    # `plan` does not open the cache; it refuses what `run` would, not print a plan for it.
    f = tmp_path / "f"
    f.write_text("x")
    extra = {"run": ["--batch-size", "64", "--seed", "1", "--manifest", str(tmp_path / "m.jsonl")],
             "plan": ["--batch-size", "64", "--seed", "1"], "bench": ["--workers", "1", "--epochs", "1"]}[cmd]
    code, out, err = _run([cmd, data, *extra, "--cache-dir", str(f)], capsys)
    assert code == 2 and out == ""
    assert _one_error(err, cmd) == f"detload {cmd}: error: --cache-dir '{f}' exists and is not a directory"


def test_plan_with_a_cache_dir_that_cannot_be_made_shows_the_schedules_of_the_uncached_run(data, tmp_path, capsys):
    # `run` warns and loads without a cache where the folder cannot be made (a file above it);
    # `plan`, which opens no cache, had shown the schedules of a cached run: workers sharing
    # every task's window. It says so now, and shows the uncached run's: a worker per task.
    (tmp_path / "f").write_text("x")
    bad = tmp_path / "f" / "cache"
    base = ["plan", data, "--batch-size", "64", "--seed", "1", "--mix-window", "2", "--workers", "2", "--json"]
    code, out, err = _run([*base, "--cache-dir", str(bad)], capsys)
    assert code == 0
    assert err == (f"detload plan: warning: --cache-dir '{bad}' cannot be used ({tmp_path / 'f'} is a file, not a "
                   "folder); a run would load without a cache, and these are its schedules\n")
    shown = json.loads(out)["tasks"]
    code, out, _ = _run(base, capsys)
    uncached = json.loads(out)["tasks"]
    code, out, err = _run([*base, "--cache-dir", str(tmp_path / "ok")], capsys)
    cached = json.loads(out)["tasks"]
    assert err == "" and not (tmp_path / "ok").exists()  # a usable folder: no warning, and plan makes nothing
    assert len(shown) == 4 and [t["worker"] for t in shown] == [0, 1, 0, 1]
    assert shown == uncached and all("worker" not in t for t in cached)  # cached: the workers share each window


@pytest.mark.parametrize("where", ["dir", "under_file", "ro"])
def test_bench_trace_path_is_checked_before_running(data, tmp_path, capsys, monkeypatch, where):
    if where == "dir":
        target = str(tmp_path)
        expect = "is a directory; give a file path"
    elif where == "under_file":
        (tmp_path / "f").write_text("x")
        target = str(tmp_path / "f" / "t.json")
        expect = "is a file, not a folder"
    else:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(tmp_path) else real(p, mode, **kw))
        target = str(tmp_path / "t.json")
        expect = "is not writable"
    t0 = time.monotonic()
    code, out, err = _run(["bench", data, "--workers", "1", "--trace", target], capsys)
    assert code == 2 and out == ""  # nothing ran
    assert expect in _one_error(err, "bench")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("action", ["info", "clear"])
def test_cache_dir_whose_objects_folder_is_a_file(tmp_path, capsys, action):
    from detload._cache import CACHE_FORMAT
    from detload._cache.format import _MARKER

    d = tmp_path / "cache"
    (d / f"v{CACHE_FORMAT}").mkdir(parents=True)
    (d / _MARKER).write_text("")
    (d / f"v{CACHE_FORMAT}" / "objects").write_text("not a folder")
    code, _, err = _run(["cache", action, str(d)], capsys)
    assert code == 2
    assert _one_error(err, "cache").startswith(f"detload cache: error: {d} is not a usable cache directory: ")


def test_verify_a_header_whose_order_is_a_string(data, tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    assert _run(["run", data, "--batch-size", "300", "--seed", "1", "--manifest", str(good)], capsys)[0] == 0
    lines = good.read_text().splitlines()
    header = json.loads(lines[0])
    header["order"] = "seed=1"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    code, _, err = _run(["verify", str(bad), str(good)], capsys)
    assert code == 2
    line = _one_error(err, "verify")
    assert f"{bad}: the header's 'order' is str 'seed=1', not an object of options" in line


def test_verify_unreadable_input_starts_with_error(tmp_path, capsys):
    code, _, err = _run(["verify", str(tmp_path / "nope.jsonl"), str(tmp_path / "nope2.jsonl")], capsys)
    assert code == 2 and _one_error(err, "verify").startswith("detload verify: error: cannot read manifest")


def test_verify_malformed_records_are_unreadable_input(data, tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    assert _run(["run", data, "--batch-size", "300", "--seed", "1", "--manifest", str(good)], capsys)[0] == 0
    lines = good.read_text().splitlines()
    rec = json.loads(lines[3])
    rec["columns"] = ["not", "a", "dict"]
    rec["hash"] = "0" * 32
    rec["parts"] = ["0" * 32]  # differs, so verify looks into the columns
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*lines[:3], json.dumps(rec), *lines[4:]]) + "\n")
    code, _, err = _run(["verify", str(bad), str(good)], capsys)
    assert code == 2 and "holds a malformed manifest record" in _one_error(err, "verify")


@pytest.mark.parametrize("where", ["file", "under_file", "ro"])
def test_demo_dir_that_cannot_be_written(tmp_path, capsys, monkeypatch, where):
    (tmp_path / "f").write_text("x")
    if where == "file":
        target, expect = tmp_path / "f", "is a file, not a folder"
    elif where == "under_file":
        target, expect = tmp_path / "f" / "demo", f"is under {tmp_path / 'f'}, which is a file, not a folder"
    else:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == str(tmp_path) else real(p, mode, **kw))
        target, expect = tmp_path / "demo", "is not writable"
    code, out, err = _run(["demo", "--dir", str(target), "--rows", "100"], capsys)
    assert code == 2 and out == ""
    assert expect in _one_error(err, "demo")


def test_demo_rows_must_be_positive(capsys):
    code, _, err = _run(["demo", "--rows", "-1"], capsys)
    assert code == 2 and "argument --rows: --rows must be an int >= 1, got -1" in err
    assert "negative dimensions" not in err


@pytest.mark.parametrize("value", ["-5", "0"])
def test_run_refuses_epochs_below_one(data, tmp_path, capsys, value):
    code, out, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--epochs", value,
                           "--manifest", str(tmp_path / "m.jsonl")], capsys)
    assert code == 2 and out == ""
    assert f"argument --epochs: --epochs must be an int >= 1, got {value}" in err


def test_run_past_the_last_epoch_fails_before_the_first(data, tmp_path, capsys):
    code, out, err = _run(["run", data, "--batch-size", "64", "--seed", "1", "--start-epoch", "4294967295",
                           "--epochs", "2", "--manifest", str(tmp_path / "m.jsonl")], capsys)
    assert code == 2 and out == ""  # not even the loader line: nothing ran
    assert _one_error(err, "run").endswith("--start-epoch 4294967295 --epochs 2 would run epochs up to "
                                           "4294967296; epochs are numbered 0 to 4294967295")
    assert not (tmp_path / "m.jsonl").exists()


def test_the_last_epoch_itself_runs(data, tmp_path, capsys):
    code, out, _ = _run(["run", data, "--batch-size", "600", "--seed", "1", "--start-epoch", "4294967295",
                         "--manifest", str(tmp_path / "m.jsonl")], capsys)
    assert code == 0 and "epoch 4294967295: 4 batches, 2,400 rows, 0 dropped" in out


def test_row_counts_have_thousands_separators(data, tmp_path, capsys):
    code, out, _ = _run(["run", data, "--batch-size", "100", "--seed", "1", "--manifest", str(tmp_path / "m.jsonl")],
                        capsys)
    assert code == 0 and "epoch 0: 24 batches, 2,400 rows, 0 dropped" in out
    code, out, _ = _run(["plan", data, "--batch-size", "100", "--seed", "1"], capsys)
    assert code == 0 and "8 units, 2,400 rows -> 24 steps of 100 rows, 0 dropped" in out
    code, out, _ = _run(["bench", data, "--workers", "1", "--batch-size", "100", "--epochs", "1"], capsys)
    assert code == 0 and "epoch 0: 2,400 rows in" in out and "24 batches, 2,400 rows" in out


def test_plan_schedules_follow_the_pool(tmp_path, capsys):
    # One task, two workers: threads share its window (blocks dealt k mod 2); process workers
    # share windows only through a cache of file columns, so loading only a partition column
    # (nothing cached) gives the one task to one worker, as the engine does.
    import pyarrow as pa
    import pyarrow.parquet as pq

    for day in (1, 2):
        (tmp_path / f"day={day}").mkdir()
        pq.write_table(pa.table({"x": list(range(40))}), tmp_path / f"day={day}" / "a.parquet", row_group_size=20)
    base = ["plan", str(tmp_path), "--batch-size", "10", "--seed", "1", "--block-rows", "20", "--workers", "2",
            "--json"]

    def workers(*more: str) -> tuple[list[object], list[object]]:
        code, out, err = _run([*base, *more], capsys)
        assert code == 0, err
        d = json.loads(out)
        return [t.get("worker") for t in d["tasks"]], [b["worker"] for b in d["blocks"]]

    assert workers("--columns", "day") == ([None], [0, 1, 0, 1])
    assert workers("--columns", "day", "--pool", "thread") == ([None], [0, 1, 0, 1])
    assert workers("--columns", "day", "--pool", "process") == ([0], [0, 0, 0, 0])
    assert workers("--pool", "process") == ([None], [0, 1, 0, 1])


def test_plan_schedules_follow_the_runs_cache(tmp_path, capsys):
    # Two tasks, two workers: without a cache each builds a whole task; with a cache of no
    # limit the workers share every window (blocks dealt k mod 2), as a run given that cache
    # does; a limited cache does not. The folder named is neither opened nor made, and
    # --cache-limit alone is refused as run refuses it.
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": list(range(80))}), tmp_path / "a.parquet", row_group_size=20)
    base = ["plan", str(tmp_path / "a.parquet"), "--batch-size", "10", "--seed", "1", "--mix-window", "2",
            "--block-rows", "20", "--workers", "2", "--json"]
    cache = tmp_path / "cache"

    def workers(*more: str) -> tuple[list[object], list[object]]:
        code, out, err = _run([*base, *more], capsys)
        assert code == 0, err
        d = json.loads(out)
        return [t.get("worker") for t in d["tasks"]], [b["worker"] for b in d["blocks"]]

    own = workers()
    assert sorted(own[0]) == [0, 1] and len(set(own[1])) == 2, own  # each task one worker's
    for pool in ("thread", "process"):
        assert workers("--pool", pool, "--cache-dir", str(cache)) == ([None, None], [0, 1, 0, 1]), pool
        assert workers("--pool", pool, "--cache-dir", str(cache), "--cache-limit", "1GB") == own, pool
    assert not cache.exists()
    code, _, err = _run([*base, "--cache-limit", "1GB"], capsys)
    assert code == 2 and "--cache-limit needs --cache-dir" in err


# -- skipped files ----------------------------------------------------------------------------

def test_inspect_lists_skipped_files_and_run_warns_once(tmp_path, capsys):
    d = write_small(tmp_path / "d", files=1, rows=600, row_group=300)
    (d / "stray.csv").write_text("a,b\n1,2\n")
    (d / "README.txt").write_text("notes")
    (d / "_SUCCESS").write_text("")
    (d / ".part-0.parquet.crc").write_text("")
    (d / "_common_metadata").write_bytes(b"x")
    code, out, _ = _run(["inspect", str(d)], capsys)
    assert code == 0
    assert "  2 files skipped: 1 .csv, 1 .txt (not Parquet):\n    README.txt\n    stray.csv\n" in out
    code, out, _ = _run(["inspect", str(d), "--json"], capsys)
    assert json.loads(out)["skipped"] == ["README.txt", "stray.csv"]
    code, out, err = _run(["run", str(d), "--batch-size", "300", "--seed", "1", "--manifest",
                           str(tmp_path / "m.jsonl")], capsys)
    assert code == 0
    assert err.count("warning:") == 1
    assert err.startswith("detload run: warning: 2 files skipped: 1 .csv, 1 .txt in ")


def test_inspect_names_backup_copies_as_such(tmp_path, capsys):
    d = write_small(tmp_path / "d", files=1, rows=600, row_group=300)
    part = next(p for p in sorted(d.iterdir()) if p.suffix == ".parquet")
    (d / f"{part.name}.bak").write_bytes(part.read_bytes())  # starts with PAR1: once read as data
    code, out, _ = _run(["inspect", str(d)], capsys)
    assert code == 0 and "1 files, 2 row groups, 600 rows" in out
    assert f"  1 file skipped: 1 .bak (backup or temporary copies):\n    {part.name}.bak\n" in out
    (d / "notes.csv").write_text("a\n")
    code, out, _ = _run(["inspect", str(d), "--json"], capsys)
    assert json.loads(out)["skipped"] == ["notes.csv", f"{part.name}.bak"]
    code, out, _ = _run(["inspect", str(d)], capsys)
    assert "  2 files skipped: 1 .bak, 1 .csv (not Parquet, or backup or temporary copies):\n" in out


# -- progress display ----------------------------------------------------------------------

class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("cmd", ["run", "bench", "cache"])
@pytest.mark.parametrize("mode", ["tty", "tty_quiet", "tty_json", "pipe"])
def test_progress_display_only_on_a_terminal_without_quiet_or_json(data, tmp_path, monkeypatch, cmd, mode):
    if cmd == "run":
        argv = ["run", data, "--batch-size", "100", "--seed", "1", "--epochs", "2",
                "--manifest", str(tmp_path / "m.jsonl")]
    elif cmd == "bench":
        argv = ["bench", data, "--workers", "1", "--batch-size", "100", "--epochs", "2"]
    else:
        cache = tmp_path / "cache"
        assert main(["bench", data, "--workers", "1", "--epochs", "1", "--cache-dir", str(cache), "--quiet"]) == 0
        argv = ["cache", "info", str(cache), "--verify"]
    if mode == "tty_quiet":
        argv.append("--quiet")
    if mode == "tty_json":
        if cmd == "run":
            pytest.skip("run has no --json")
        argv.append("--json")
    err = _Tty() if mode != "pipe" else io.StringIO()
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(argv) == 0
    shown = err.getvalue()
    if mode == "tty":
        unit = "B" if cmd == "cache" else "batch"
        assert ("verifying" if cmd == "cache" else "epoch 1") in shown and unit in shown, shown
    else:
        assert shown == "", shown
    assert "\r" not in out.getvalue()  # the display never mixes into the results


def test_progress_wanted_logic():
    ns = argparse.Namespace
    assert cli.progress_wanted(ns(quiet=False), _Tty())
    assert not cli.progress_wanted(ns(quiet=True), _Tty())
    assert not cli.progress_wanted(ns(quiet=False, json=True), _Tty())
    assert not cli.progress_wanted(ns(quiet=False), io.StringIO())
    closed = io.StringIO()
    closed.close()  # isatty() raises on a closed stream
    assert not cli.progress_wanted(ns(), closed)


# -- fuzzed argument combinations ---------------------------------------------------------

def _options_of(cmd: list[str]) -> list[str]:
    """The option strings a command accepts (read from the parser, so new options get fuzzed too)."""
    parser = cli._parser()
    for name in cmd:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return sorted(o for a in parser._actions for o in a.option_strings
                  if o.startswith("--") and o not in ("--help", "--version"))


def _argv_strategy(data: str, tmp: str) -> st.SearchStrategy:
    paths = st.sampled_from([data, os.path.join(data, "part-0.parquet"), os.path.join(tmp, "missing"),
                             os.path.join(tmp, "file"), os.path.join(tmp, "file", "under"), tmp, "", "a\0b"])
    outs = st.sampled_from([os.path.join(tmp, "m.jsonl"), os.path.join(tmp, "runs") + "/",
                            os.path.join(tmp, "file", "m.jsonl"), tmp, os.path.join(data, "m.jsonl"), ""])
    ints = st.sampled_from(["-5", "-1", "0", "1", "2", "3", "600", "2147483648", "4294967295", "x", "", "1.5"])
    small = st.sampled_from(["-1", "0", "1", "2", "x"])
    values: dict[str, st.SearchStrategy] = {
        "--batch-size": ints, "--seed": ints, "--prefetch": ints, "--shuffle-window": ints,
        "--workers": st.sampled_from(["0", "1", "2", "300", "auto", "x"]),
        "--partitions": small, "--rank": small, "--world-size": small, "--epochs": small, "--epoch": small,
        "--start-epoch": st.sampled_from(["0", "1", "-1", "4294967295", "x"]),
        "--columns": st.sampled_from(["id", "id,x", "nope", ",", ""]),
        "--null-fill": st.sampled_from(["id=1", "x=0.5", "=", "zz=1", "id=[1]", "nope"]),
        "--manifest": outs, "--trace": outs, "--resume": paths,
        "--cache-limit": st.sampled_from(["1KB", "-1", "x", "0"]),
        "--cache-map-limit": st.sampled_from(["0", "1KB", "auto", "x"]),
        "--cache-dir": st.sampled_from([os.path.join(tmp, "c"), os.path.join(tmp, "file"), os.path.join(data, "c")]),
        "--dir": st.sampled_from([os.path.join(tmp, "file"), os.path.join(tmp, "file", "d")]),
        "--rows": st.sampled_from(["-1", "0", "x"]),  # demo: only refusals here (a real demo takes seconds)
        "--pool": st.sampled_from(["thread", "fork"]),
    }
    requires = {"run": ["--batch-size", "--seed", "--manifest"], "plan": ["--batch-size", "--seed"]}
    positional = {"run": 1, "plan": 1, "bench": 1, "inspect": 1, "verify": 2, "cache": 1, "demo": 0}

    def option(name: str) -> st.SearchStrategy:
        return values[name].map(lambda v: (name, v)) if name in values else st.just((name,))

    def case(cmd: list[str]) -> st.SearchStrategy:
        known = _options_of(cmd)
        stray = st.sampled_from(["--nope", "--rows", "--verify"]).flatmap(option)
        some = st.sampled_from(known).flatmap(option) if known else stray
        needed = st.tuples(*[option(o) for o in requires.get(cmd[0], [])])
        args = st.lists(paths, min_size=positional[cmd[0]], max_size=positional[cmd[0]])
        return st.tuples(st.just(cmd), args, needed, st.lists(st.one_of(some, some, some, stray), max_size=4))

    cmd = st.sampled_from([["run"], ["bench"], ["plan"], ["inspect"], ["verify"], ["cache", "info"],
                           ["cache", "clear"], ["demo"]])
    return cmd.flatmap(case)


def test_fuzzed_command_lines_exit_0_1_or_2_without_a_traceback(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fuzz"))
    data = str(write_small(Path(tmp) / "data", files=2, rows=1200, row_group=300))  # its own: runs may write
    Path(tmp, "file").write_text("x")

    @settings(max_examples=400 if FULL else 60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=not FULL)
    @given(_argv_strategy(data, tmp))
    def check(case):
        cmd, args, needed, opts = case
        argv = [*cmd, *args, *[x for o in (*needed, *opts) for x in o]]
        if "--epochs" not in argv and cmd[0] == "bench":
            argv += ["--epochs", "1"]
        if cmd == ["demo"] and "--rows" not in argv:
            argv += ["--rows", "0"]  # a demo that would really run takes seconds: only its refusals here
        out, err = io.StringIO(), io.StringIO()
        real_out, real_err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.stdout, sys.stderr = real_out, real_err
        outcomes[code if not err.getvalue().startswith("usage:") else "usage"] = \
            outcomes.get(code if not err.getvalue().startswith("usage:") else "usage", 0) + 1
        assert code in (0, 1, 2), (argv, code, err.getvalue())
        assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
        if code == 2 and cmd == ["verify"] and "--json" in argv and not err.getvalue():
            assert json.loads(out.getvalue())["kind"] == "unreadable"  # verify --json reports it on stdout
        elif code == 2 and not err.getvalue().startswith("usage:"):
            lines = [line for line in err.getvalue().splitlines() if ": warning: " not in line]
            assert len(lines) == 1 and ": error: " in lines[0], (argv, err.getvalue())

    outcomes: dict[object, int] = {}
    check()
    print("fuzzed outcomes:", outcomes)
    assert outcomes.get(0, 0) >= 3 and outcomes.get(2, 0) >= 10  # the cases reach the commands, not only argparse


# -- signals ------------------------------------------------------------------------------------

def _start(tmp_path: Path, argv: list[str]) -> subprocess.Popen:
    """``python -m detload ARGV``; returns once detload's first lines installed its signal handlers.

    The moments before (the interpreter starting, site and runpy importing) are the
    interpreter's, not detload's: no Python code can handle a signal there.
    """
    r, w = os.pipe()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "DETLOAD_TEST_READY_FD": str(w)}
    proc = subprocess.Popen([sys.executable, "-m", "detload", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, pass_fds=(w,), start_new_session=True, cwd=tmp_path)
    os.close(w)
    ready = os.read(r, 1)
    os.close(r)
    assert ready == b"R", proc.communicate()
    return proc


def _signal_at(proc: subprocess.Popen, delay: float, sig: int, group: bool) -> tuple[int, str, str]:
    time.sleep(delay)
    try:
        (os.killpg if group else os.kill)(proc.pid, sig)
    except ProcessLookupError:
        pass
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out.decode(), err.decode()


def _check_outcome(code: int, err: str, sig: int, what: str) -> None:
    expect = {signal.SIGINT: (130, "interrupted\n"), signal.SIGTERM: (143, "terminated\n")}[sig]
    # Either the signal came first (one line, its exit status) or the command had already finished.
    assert (code, err) in (expect, (0, "")), f"{what}: exit {code}, stderr {err!r}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_at_a_random_moment_ends_with_one_line(data, tmp_path, sig):
    """Ctrl-C (SIGINT to the process group) or SIGTERM at random moments from start-up on:
    ``interrupted``/``terminated`` and exit 130/143, nothing else on stderr."""
    rng = random.Random(1234 + sig)
    trials = 40 if FULL else 6
    # The early moments matter most (imports, before main() runs): half the delays fall there.
    delays = [rng.uniform(0, 0.15) if i % 2 else rng.uniform(0, 1.5) for i in range(trials)]
    for i, delay in enumerate(delays):
        proc = _start(tmp_path, ["run", data, "--batch-size", "50", "--seed", "1", "--epochs", "20",
                                 "--manifest", str(tmp_path / f"m{i}.jsonl")])
        code, _, err = _signal_at(proc, delay, sig, group=True)
        _check_outcome(code, err, sig, f"delay {delay:.3f} s")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("group", [True, False])
def test_a_signal_at_a_random_moment_with_process_workers(data, tmp_path, sig, group):
    if not FULL:
        pytest.skip("DETLOAD_FULL=1 runs the process-pool form")
    rng = random.Random(99 + sig)
    for i in range(30):
        delay = rng.uniform(0, 2.0)
        proc = _start(tmp_path, ["run", data, "--batch-size", "50", "--seed", "1", "--epochs", "20",
                                 "--pool", "process", "--workers", "2", "--manifest", str(tmp_path / f"m{i}.jsonl")])
        code, _, err = _signal_at(proc, delay, sig, group=group)
        _check_outcome(code, err, sig, f"delay {delay:.3f} s, group {group}")


def test_an_interrupted_run_leaves_a_verifiable_prefix(data, tmp_path, capsys):
    full = tmp_path / "full.jsonl"
    assert _run(["run", data, "--batch-size", "50", "--seed", "1", "--epochs", "3", "--manifest", str(full)],
                capsys)[0] == 0
    cut = tmp_path / "cut.jsonl"
    proc = _start(tmp_path, ["run", data, "--batch-size", "50", "--seed", "1", "--epochs", "200",
                             "--manifest", str(cut)])
    # Interrupt once it has written some batches of epoch 0 (a mid-epoch cut).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if cut.exists() and cut.read_text().count('"batch"') >= 3:
            break
        time.sleep(0.005)
    code, _, err = _signal_at(proc, 0.0, signal.SIGINT, group=True)
    if code == 0:
        pytest.skip("the run finished before the interrupt")
    assert (code, err) == (130, "interrupted\n")
    code, out, _ = _run(["verify", str(cut), str(full), "--json"], capsys)
    res = json.loads(out)
    # A prefix: cut inside an epoch ("truncated"), or, if the signal came just as one ended, before
    # the next one's first line ("epochs": A stops before it). Never a divergence.
    assert code == 1 and res["kind"] in ("truncated", "epochs"), res
    assert "stops" in res["message"] and res["steps_compared"] >= 3, res


def test_demo_dataset_refuses_a_bad_row_count_by_name(tmp_path):
    from detload import OptionError
    from detload._demo import write_demo_dataset

    with pytest.raises(OptionError, match=r"^rows must be an int >= 1 \(rows of the example dataset\), got -1$"):
        write_demo_dataset(str(tmp_path / "d"), rows=-1)
    assert not (tmp_path / "d").exists()
