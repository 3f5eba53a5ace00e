"""The default order: ``order`` not given is the mixed order (plan format 3), or the windowed
order with ``group_by``; what a run records names the order it resolved, and a state or
manifest of the windowed order is refused by a default loader with how to get that order back.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from strategies import check_rows

from detload import Loader, OptionError, StateError
from detload.audit import read_manifest
from detload.cli import main as cli_main
from detload.plan import PLAN_FORMAT_MIX, PLAN_FORMAT_VERSION, OrderOptions
from detload.verify import verify

FILES = {"a.parquet": [300, 200, 250, 120], "c.parquet": [250, 0, 250, 1, 90], "d/e.parquet": [210, 180, 75, 300]}


@pytest.fixture
def ds(make_dataset):  # type: ignore[no-untyped-def]
    return make_dataset(FILES)


def _ids(loader: Loader) -> list[np.ndarray]:
    out = []
    for b in loader:
        check_rows(b)
        out.append(np.asarray(b["id"]).copy())
    return out


def test_order_options_resolve_the_default() -> None:
    assert OrderOptions(seed=1, batch_size=8).order == "mix"
    assert OrderOptions(seed=1, batch_size=8).plan_format == PLAN_FORMAT_MIX
    grouped = OrderOptions(seed=1, batch_size=8, group_batches=True)
    assert grouped.order == "windowed" and grouped.shuffle_window == 4 and grouped.plan_format == PLAN_FORMAT_VERSION
    assert OrderOptions(seed=1, batch_size=8, order="windowed").order == "windowed"
    with pytest.raises(OptionError, match=r"^group_batches must be True or False, got 'yes'$"):
        OrderOptions(seed=1, batch_size=8, group_batches="yes")  # type: ignore[arg-type]


def test_the_default_is_the_mixed_order_and_records_it(ds, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "default.jsonl")
    with Loader(ds.root, batch_size=64, seed=3, workers=2, manifest=path) as loader:
        assert loader.options.order == "mix"
        plan = loader.plan()
        got = _ids(loader)
        state = loader.state_dict()
        block_rows, window = loader.options.block_rows, loader.options.mix_window
    # Resolved from the row groups' rows, so that the records name them.
    assert isinstance(block_rows, int) and block_rows >= 1 and isinstance(window, int) and window >= 64
    flat = np.concatenate(got)
    assert np.array_equal(flat, ds.all_ids[plan.row_ids()])
    assert np.array_equal(np.sort(flat), np.sort(ds.all_ids))  # every row once
    assert state["plan_format"] == PLAN_FORMAT_MIX
    recorded = {"order": "mix", "mix_window": window, "block_rows": block_rows}
    assert {k: state["order"].get(k) for k in recorded} == recorded and "shuffle_window" not in state["order"]
    header = read_manifest(path).header
    assert header["plan_format"] == PLAN_FORMAT_MIX
    assert {k: header["order"].get(k) for k in recorded} == recorded
    # Naming the default gives the same run: the same fingerprint and batches.
    with Loader(ds.root, batch_size=64, seed=3, order="mix", mix_window=window, block_rows=block_rows) as named:
        assert named.fingerprint == loader.fingerprint
        same = _ids(named)
    assert len(same) == len(got) and all(np.array_equal(a, b) for a, b in zip(got, same))


def test_group_by_without_order_is_the_windowed_order(ds) -> None:  # type: ignore[no-untyped-def]
    with Loader(ds.root, batch_size=32, seed=1, group_by="id") as loader:
        assert loader.options.order == "windowed" and loader.options.shuffle_window == 4
        state = loader.state_dict()
    assert state["plan_format"] == PLAN_FORMAT_VERSION and state["order"]["shuffle_window"] == 4
    assert state["order"]["group_batches"] is True
    with Loader(ds.root, batch_size=32, seed=1, group_by="id", shuffle_window=2) as loader:
        assert loader.options.shuffle_window == 2  # the windowed order's own option, without order=
    with pytest.raises(OptionError, match=r"group_by='id' is not available with order=\"mix\".*"
                                          r"Pass order=\"windowed\""):
        Loader(ds.root, batch_size=32, seed=1, order="mix", group_by="id")


def test_shuffle_window_alone_says_how_to_get_the_windowed_order(ds) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError, match=r"shuffle_window=3 is an option of order=\"windowed\".*the default since "
                                          r"plan format 3.*pass order=\"windowed\" with shuffle_window=3"):
        Loader(ds.root, batch_size=32, seed=1, shuffle_window=3)


def _windowed_state(ds, **kw):  # type: ignore[no-untyped-def]
    with Loader(ds.root, batch_size=32, seed=1, order="windowed", **kw) as old:
        for i, _ in enumerate(old):
            if i == 2:
                break
        return old.state_dict()


@pytest.mark.parametrize("window", [None, 3])
def test_a_windowed_state_is_refused_by_a_default_loader(ds, window) -> None:  # type: ignore[no-untyped-def]
    state = _windowed_state(ds, **({} if window is None else {"shuffle_window": window}))
    shown = 4 if window is None else window  # the windowed order's default window is named too
    with Loader(ds.root, batch_size=32, seed=1) as new, pytest.raises(
            StateError, match=r"this state was written with plan format 2 \(the windowed order\) and this loader "
                              r"plans the mixed order \(plan format 3, order=\"mix\"\)\. To resume it pass "
                              rf"order=\"windowed\" and shuffle_window={shown} as in the state"):
        new.load_state_dict(state)
    with Loader(ds.root, batch_size=32, seed=1, order="windowed", shuffle_window=shown) as again:
        again.load_state_dict(state)  # what the message says resumes it
        assert again.position == 3


def test_cli_resume_of_a_windowed_run_says_how(ds, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "old.jsonl")
    base = ["run", ds.root, "--batch-size", "32", "--seed", "1", "--manifest", path]
    assert cli_main([*base, "--order", "windowed", "--shuffle-window", "2", "--save-state"]) == 0
    with open(tmp_path / "old.state.json") as f:
        assert json.load(f)["plan_format"] == PLAN_FORMAT_VERSION
    capsys.readouterr()
    assert cli_main([*base, "--resume", path]) != 0
    err = capsys.readouterr().err
    assert "plan format 2 (the windowed order)" in err
    assert 'pass order="windowed" and shuffle_window=2 as in the state' in err
    assert "(on the command line: --order windowed --shuffle-window 2)" in err
    # As the message says: the old order by name resumes it (at the end of its epoch here).
    assert cli_main([*base, "--order", "windowed", "--shuffle-window", "2", "--resume", path]) == 0


def test_verify_a_windowed_manifest_against_a_default_one(ds, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    old, new = str(tmp_path / "old.jsonl"), str(tmp_path / "new.jsonl")
    with Loader(ds.root, batch_size=32, seed=1, order="windowed", manifest=old) as loader:
        list(loader)
    with Loader(ds.root, batch_size=32, seed=1, manifest=new) as loader:
        list(loader)
    res = verify(old, new)
    assert not res.identical and res.kind == "formats"
    assert res.message.startswith("plan formats differ (2 vs 3): A was planned with plan format 2 (the windowed "
                                  "order) and B with plan format 3 (the mixed order)")
    assert 'rerun the format-3 side with the windowed order (order="windowed", shuffle_window=4; ' in res.message
    assert "`detload run --order windowed --shuffle-window 4`" in res.message
    capsys.readouterr()
    assert cli_main(["verify", old, new]) != 0
    assert "--order windowed --shuffle-window 4" in capsys.readouterr().out


def test_a_state_of_the_row_group_count_window_says_how_to_resume(make_dataset) -> None:  # type: ignore[no-untyped-def]
    """80 row groups of 50 rows: the default window counts rows (one task of all 80, blocks of a
    sixteenth of it); a state written with the defaults before (mix_window=64: two tasks, blocks
    of 4 row groups) is refused, naming the options that resume it, which then do."""
    ds = make_dataset({"a.parquet": [50] * 40, "b.parquet": [50] * 40})
    with Loader(ds.root, batch_size=64, seed=5) as loader:
        assert (loader.options.mix_window, loader.options.block_rows) == (2**20 // 50, 250)
        assert [len(t.units) for t in loader.plan().tasks[0]] == [80]  # type: ignore[attr-defined]
    old = dict(batch_size=64, seed=5, mix_window=64, block_rows=200)
    with Loader(ds.root, **old) as before:
        assert [len(t.units) for t in before.plan().tasks[0]] == [40, 40]  # type: ignore[attr-defined]
        it = iter(before)
        for _ in range(7):
            next(it)
        state = before.state_dict()
        rest = [np.asarray(b["id"]).copy() for b in it]
    with Loader(ds.root, batch_size=64, seed=5) as default, pytest.raises(StateError) as err:
        default.load_state_dict(state)
    msg = str(err.value)
    assert f"mix_window: 64 in the state, {2**20 // 50} here" in msg
    assert "pass mix_window=64 and block_rows=200 as it records them" in msg
    assert "--mix-window 64 --block-rows 200" in msg
    with Loader(ds.root, **old) as again:
        again.load_state_dict(state)
        assert all(np.array_equal(a, np.asarray(b["id"])) for a, b in zip(rest, again, strict=True))
