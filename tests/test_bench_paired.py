"""experiments/bench/paired.py and paired_cpu.py: both trees run the same configuration (the windowed
order, which a tree from before the mixed order has alone), in alternating order, and a tree whose
processes import detload from elsewhere is refused before anything is measured."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def paired(bench_script):
    return bench_script("paired")


def _result(rate: float) -> dict:
    ep = {"timed_rows": 1000, "seconds": 1000 / rate}
    return {"epochs": [dict(ep, seconds=10.0), ep, ep], "timed_epochs": 3}


def test_both_trees_run_the_same_windowed_spec_in_alternating_order(paired, monkeypatch, tmp_path, capsys):
    calls: list[tuple[str, dict]] = []
    rate = {"before": 100.0, "after": 110.0}

    def one(tree: Path, spec: dict) -> dict:
        calls.append((tree.name, spec))
        return _result(rate[tree.name])

    monkeypatch.setattr(paired, "one", one)
    monkeypatch.setattr(paired, "check_imports", lambda tree, spec: 1)
    monkeypatch.setattr("datagen.make_ctr", lambda path, rows: None)
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    assert paired.main(["--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--runs", "2",
                        "--data", str(tmp_path)]) == 0
    assert len(calls) == 2 * 2 * len(paired.CASES)
    assert all(spec["order"] == "windowed" for _, spec in calls)
    for i in range(0, len(calls), 2):
        assert calls[i][1] == calls[i + 1][1]  # the pair measures one configuration
    first_run = [name for name, _ in calls[: 2 * len(paired.CASES)]]
    second_run = [name for name, _ in calls[2 * len(paired.CASES):]]
    assert first_run[:2] == ["before", "after"] and second_run[:2] == ["after", "before"]
    out = capsys.readouterr().out
    assert "| detload thread W=1 | 100 | 110 | 1.100 (range 1.100-1.100) |" in out


def test_detload_files_are_read_from_the_verbose_log(paired):
    log = ("import 'os' # <class '_frozen_importlib.FrozenImporter'>\n"
           "# code object from /w/before/detload/__init__.py\n"
           "# code object from '/w/before/detload/_engine/__pycache__/worker.cpython-311.pyc'\n"
           "# code object from '/usr/lib/python3.11/json/__pycache__/decoder.cpython-311.pyc'\n"
           "# code object from /w/before/experiments/bench/measure.py\n")
    assert paired.detload_files(log) == {"/w/before/detload/__init__.py",
                                         "/w/before/detload/_engine/__pycache__/worker.cpython-311.pyc"}


def test_a_tree_that_imports_detload_from_elsewhere_is_refused(paired, monkeypatch, tmp_path):
    tree = tmp_path / "before"
    tree.mkdir()
    log = f"# code object from {tree}/detload/__init__.py\n# code object from /elsewhere/detload/pool.py\n"
    monkeypatch.setattr(paired, "_run", lambda tree, spec, timeout, **env: type("Done", (), {"stderr": log}))
    with pytest.raises(SystemExit, match=r"before: detload was not imported from this tree only: "
                                         r"\['/elsewhere/detload/pool\.py'\]"):
        paired.check_imports(tree, {})
    monkeypatch.setattr(paired, "_run", lambda tree, spec, timeout, **env: type("Done", (), {"stderr": ""}))
    with pytest.raises(SystemExit, match="no detload module seen"):
        paired.check_imports(tree, {})


def test_the_cpu_pairs_alternate_and_report_per_pair_ratios(bench_script, monkeypatch, tmp_path, capsys):
    cpu = bench_script("paired_cpu")
    calls: list[tuple[str, tuple]] = []
    cost = {"before": (2.0, 4.0), "after": (1.8, 5.0)}

    def one(tree: Path, *args: object) -> tuple[float, float]:
        calls.append((tree.name, args))
        return cost[tree.name]

    monkeypatch.setattr(cpu, "one", one)
    monkeypatch.setattr("datagen.make_ctr", lambda path, rows: None)
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    assert cpu.main(["--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--pool", "process",
                     "--workers", "2", "--pairs", "2", "--data", str(tmp_path)]) == 0
    assert [name for name, _ in calls] == ["before", "after", "after", "before"]
    assert {args for _, args in calls} == {(str(tmp_path / "ctr"), "process", 2, 4, "windowed")}
    assert capsys.readouterr().out == ("detload process W=2, order windowed, 1,000,000 rows, 2 pairs: after / before "
                                       "CPU 0.900 (range 0.900-0.900), wall 1.250 (range 1.250-1.250) (median of "
                                       "per-pair ratios; above 1 is slower)\n")
    # The mixed order on another row count: its data in a folder of its own (a finished folder
    # is never rewritten, so the 1M-row one must not be taken for it).
    calls.clear()
    assert cpu.main(["--before", str(tmp_path / "before"), "--after", str(tmp_path / "after"), "--order", "mix",
                     "--rows", "4000000", "--pairs", "1", "--data", str(tmp_path)]) == 0
    assert {args for _, args in calls} == {(str(tmp_path / "ctr-4000000"), "thread", 1, 4, "mix")}
    assert "order mix, 4,000,000 rows, 1 pairs" in capsys.readouterr().out

