"""Resume of a Loader: what it reads, torn manifests, rejected states, elastic resume, `detload run --resume`.

A run stopped at any step and resumed (other worker count, pool or world size)
yields, and records, exactly what an uninterrupted run does, and reads no row
group that only the skipped steps needed. The single-rank form of that promise,
for Loader and TorchLoader alike, is test_resume_contract.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import _distdata
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from leaks import wait_until

import detload
from detload import Loader, ManifestError, StateError
from detload.cli import main as cli_main
from detload.verify import verify

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OPTS = dict(batch_size=48, seed=11, columns=["id", "s"], order="windowed", shuffle_window=2)


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("resume") / "ds")
    _distdata.write(root)
    return root


@pytest.fixture(scope="module")
def full(ds, tmp_path_factory) -> tuple[str, list[np.ndarray]]:
    """The uninterrupted 2-epoch run: its manifest and ids per batch."""
    path = str(tmp_path_factory.mktemp("full") / "full.jsonl")
    ids = []
    with Loader(ds, manifest=path, **OPTS) as loader:
        for e in range(2):
            loader.set_epoch(e)
            ids += [b["id"].copy() for b in loader]
    return path, ids


def body(path: str) -> list[str]:
    """The manifest without its header line (which records the worker count and pool)."""
    with open(path) as f:
        return f.read().split("\n")[1:]


def stop_after(loader: Loader, n: int, epochs: int = 2) -> list[np.ndarray]:
    """Consume ``n`` batches over the epochs (as a killed job would have), return them."""
    got: list[np.ndarray] = []
    for e in range(epochs):
        loader.set_epoch(e)
        for b in loader:
            got.append(b["id"].copy())
            if len(got) == n:
                return got
    return got


def finish(loader: Loader, epochs: int = 2) -> list[np.ndarray]:
    got = []
    for e in range(loader.epoch, epochs):
        loader.set_epoch(e)
        got += [b["id"].copy() for b in loader]
    return got


def test_state_counts_yielded_batches_not_prefetched(ds):
    with Loader(ds, pool=detload.Pool(prefetch=4), workers=2, **OPTS) as loader:
        it = iter(loader)
        for _ in range(3):
            next(it)
        # The merger cuts steps ahead of the consumer, into its bounded ready queue: read the
        # state only once it has cut more steps than were yielded, so that some are prefetched.
        wait_until(lambda: loader.stats().stages["stitch"].count > 3, 20.0)
        assert len(loader) > 4
        assert loader.state_dict()["step"] == 3 == loader.position


def test_resume_reads_nothing_for_skipped_steps(ds, unit_log):
    log = unit_log
    with Loader(ds, workers=2, **OPTS) as loader:
        plan = loader.plan()
        step = plan.steps - 3
        state = {**loader.state_dict(), "step": step}
        names = [(loader.dataset.files[f].path, int(g)) for f, g in zip(loader._unit_files, loader._unit_rgs)]
    with Loader(ds, workers=2, **OPTS) as loader:
        loader.load_state_dict(state)
        assert len(list(loader)) == 3
    needed = {names[u] for b in plan.schedule_from(step) for u in b.sources}
    assert sorted(log) == sorted(needed), "exactly the blocks the remaining steps need, once each"
    assert len(needed) < len(names) / 2


def _ranks(ds: str, R: int, out: str, *, P: int = 4, G: int = 64, state: dict | None = None,
           stop: int | None = None, epochs: int = 2) -> dict | None:
    """Ranks simulated one after another; with ``stop``, each is killed after that many batches."""
    saved = None
    for r in range(R):
        with Loader(ds, batch_size=G // R, seed=11, partitions=P, distributed=(r, R),
                    manifest=out + "/", workers=1 + r % 2, pool="thread") as loader:
            if state is not None:
                loader.load_state_dict(state)
            n = 0
            for e in range(loader.epoch, epochs):
                loader.set_epoch(e)
                for _ in loader:
                    n += 1
                    if n == stop:
                        break
                if n == stop:
                    break
            saved = loader.state_dict()
    return saved


@pytest.fixture(scope="module")
def elastic_full(ds, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("elastic") / "full")
    _ranks(ds, 1, out)
    return out


@settings(max_examples=12 if os.environ.get("DETLOAD_FULL") == "1" else 4, deadline=None)
@given(before=st.sampled_from([1, 2, 4]), after=st.sampled_from([1, 2, 4]), stop=st.integers(1, 60))
def test_elastic_resume_matches_the_uninterrupted_run(ds, elastic_full, tmp_path_factory, before, after, stop):
    tmp = tmp_path_factory.mktemp("el")
    state = _ranks(ds, before, str(tmp / "part1"), stop=stop)
    assert state is not None and "rank" not in state and "world_size" not in state
    _ranks(ds, after, str(tmp / "part2"), state=state)
    res = verify(elastic_full, [str(tmp / "part1"), str(tmp / "part2")])
    assert res.identical, res.message


def test_verify_of_resumed_runs(ds, elastic_full, tmp_path):
    stop = 4
    state = _ranks(ds, 4, str(tmp_path / "part1"), stop=stop)
    assert state == {**state, "epoch": 0, "step": stop}
    _ranks(ds, 2, str(tmp_path / "part2"), state=state)
    assert cli_main(["verify", elastic_full, str(tmp_path / "part1"), str(tmp_path / "part2")]) == 0
    # The interrupted run alone stops early: reported as truncated at the step it was killed.
    alone = verify(elastic_full, str(tmp_path / "part1"))
    assert alone.kind == "truncated" and alone.step == stop
    # A continuation that starts after a gap is truncated too.
    later = {**state, "step": stop + 3}
    _ranks(ds, 2, str(tmp_path / "late"), state=later)
    gap = verify(elastic_full, [str(tmp_path / "part1"), str(tmp_path / "late")])
    assert gap.kind == "truncated" and gap.step == stop
    # A continuation with other order options is not part of the same run.
    with Loader(ds, batch_size=64, seed=12, partitions=4, distributed=(0, 1),
                manifest=str(tmp_path / "x") + "/") as x:
        list(x)
    with pytest.raises(ManifestError, match="different order options"):
        verify(elastic_full, [str(tmp_path / "part1"), str(tmp_path / "x")])


def test_rejected_states_name_what_differs(ds, tmp_path):
    with Loader(ds, **OPTS) as loader:
        state = loader.state_dict()
    cases = [
        (dict(OPTS, seed=12), r"seed: 11 in the state, 12 here"),
        (dict(OPTS, order="windowed", shuffle_window=3), r"shuffle_window: 2 in the state, 3 here"),
        (dict(OPTS, columns=["id"]), r"columns: \['id', 's'\] in the state, \['id'\] here"),
        (dict(OPTS, batch_size=24), r"global_batch_size: 48 in the state, 24 here \(batch_size 24 x world size 1; "
                                    r"batch_size is per rank"),
        (dict(OPTS, batch_size=24, distributed=(0, 2)), r"partitions: 1 in the state, 2 here \(partitions "
                                                          r"defaults to the world size"),
        (dict(OPTS, drop_last=True), r"drop_last: False in the state, True here"),
    ]
    for opts, msg in cases:
        with Loader(ds, **opts) as other, pytest.raises(StateError, match=msg):
            other.load_state_dict(state)
    other_ds = str(tmp_path / "other")
    _distdata.write(other_ds, {"a.parquet": [100, 50], "b.parquet": [70]})
    with Loader(other_ds, **OPTS) as other, pytest.raises(StateError, match="the dataset changed"):
        other.load_state_dict(state)
    with Loader(ds, **OPTS) as same:
        bad = [
            ({}, "not a detload state"),
            ([1, 2], "not a detload state"),
            ({**state, "format": 99}, "state format 99 cannot be read"),
            ({**state, "order": "x"}, "its 'order' is not a dict"),
            ({**state, "fingerprint": "0" * 32}, "plan fingerprint does not match"),
            ({**state, "step": -1}, "bad position"),
            ({**state, "epoch": "0"}, "bad position"),
            ({**state, "step": same.plan().steps + 1}, f"state step {same.plan().steps + 1} is past the"),
        ]
        for st_, msg in bad:
            with pytest.raises(StateError, match=msg):
                same.load_state_dict(st_)
        same.load_state_dict({**state, "step": same.plan().steps})  # the end of an epoch is a valid position
        assert list(same) == []


def test_resumed_manifest_survives_a_torn_tail_and_refuses_gaps(ds, full, tmp_path):
    full_path, full_ids = full
    path = str(tmp_path / "m.jsonl")
    with Loader(ds, manifest=path, **OPTS) as a:
        stop_after(a, 6)
        state = a.state_dict()
    with open(path, "ab") as f:
        f.write(b'{"type":"batch","epoch":0,"st')  # a kill in the middle of a line
    with Loader(ds, manifest=path, workers=2, **OPTS) as b:
        b.load_state_dict(state)
        finish(b)
    assert body(path) == body(full_path)

    gap = str(tmp_path / "gap.jsonl")
    with Loader(ds, manifest=gap, **OPTS) as a:
        stop_after(a, 2)
    with Loader(ds, manifest=gap, **OPTS) as b:
        b.load_state_dict({**state, "step": 5})
        with pytest.raises(ManifestError, match=r"epoch 0 ends at step 1, so the continued record would have a gap"):
            next(iter(b))
    with Loader(ds, manifest=gap, **dict(OPTS, batch_size=24)) as c, \
            pytest.raises(ManifestError, match="cannot continue manifest .*batch_size"):
        c.load_state_dict({**c.state_dict(), "step": 1})
        next(iter(c))


def _cli_run(ds: str, manifest: str, *extra: str) -> list[str]:
    # Small batches: many steps, so the kill below lands mid-run.
    return ["run", ds, "--batch-size", "4", "--seed", "11", "--columns", "id,s",
            "--epochs", "2", "--manifest", manifest, *extra]


def test_cli_run_killed_and_resumed(ds, tmp_path):
    """A real kill (SIGKILL at whatever step it reached), then --resume with other workers and pool."""
    full_path = str(tmp_path / "full.jsonl")
    assert cli_main(_cli_run(ds, full_path)) == 0
    path = str(tmp_path / "m.jsonl")
    state_path = str(tmp_path / "m.state.json")
    env = {**os.environ, "PYTHONPATH": REPO}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    # A slow consumer would need hooks; instead the parent kills as soon as 3 states were saved.
    proc = subprocess.Popen([sys.executable, "-m", "detload.cli", *_cli_run(ds, path, "--save-state")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with open(state_path) as f:
                    if json.load(f)["step"] >= 3:
                        break
            except (OSError, ValueError):
                pass
            time.sleep(0.002)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    with open(state_path) as f:
        killed = json.load(f)
    assert (killed["epoch"], killed["step"]) < (1, 0)
    # A kill between writing the state's temp file and renaming it leaves the temp file;
    # the next run with --save-state removes such leftovers of dead processes.
    left = f"{state_path}.tmp{proc.pid}"
    with open(left, "w") as f:
        f.write("{")
    assert cli_main(_cli_run(ds, path, "--save-state", "--resume", path, "--workers", "2", "--pool", "process")) == 0
    assert not os.path.exists(left)
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]
    assert cli_main(["verify", full_path, path]) == 0
    with open(state_path) as f:
        assert json.load(f)["epoch"] == 1


def test_cli_resume_across_world_sizes(ds, tmp_path, capsys):
    base = ["run", ds, "--batch-size", "32", "--seed", "11", "--partitions", "4", "--manifest"]
    args = [*base, str(tmp_path / "full") + "/", "--rank", "0", "--world-size", "1"]
    args[args.index("32")] = "64"  # the same global batch at every world size
    assert cli_main(args) == 0
    # An interrupted 2-rank run: rank 0 got to step 6, rank 1 to step 4 (as saved states say).
    for r, stop in ((0, 6), (1, 4)):
        with Loader(ds, batch_size=32, seed=11, partitions=4, distributed=(r, 2),
                    manifest=str(tmp_path / "part1") + "/") as loader:
            for i, _ in enumerate(loader):
                if i + 1 == stop:
                    break
            with open(tmp_path / "part1" / f"rank-{r:05d}.state.json", "w") as f:
                json.dump(loader.state_dict(), f)
    for r in range(4):
        args = [*base, str(tmp_path / "part2") + "/", "--rank", str(r), "--world-size", "4",
                "--resume", str(tmp_path / "part1"), "--workers", "2"]
        args[args.index("32")] = "16"
        assert cli_main(args) == 0
    assert "resuming at epoch 0 step 4" in capsys.readouterr().out
    assert cli_main(["verify", str(tmp_path / "full"), str(tmp_path / "part1"), str(tmp_path / "part2")]) == 0
    assert cli_main([*base, str(tmp_path / "p3") + "/", "--resume", str(tmp_path / "empty")]) == 2
    assert "no saved state" in capsys.readouterr().err


def test_state_temp_sweep_takes_the_pid_from_the_file_name(tmp_path):
    """Only leftovers of dead processes go, whatever the path looks like (a doubled slash)."""
    import subprocess

    from detload.cli import _sweep_state_temps

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {f"m.state.json.tmp{os.getpid()}": True, f"m.state.json.tmp{dead.pid}": False,
             "m.state.json.tmpx": True, "other.state.json.tmp1": True}
    for n in names:
        (tmp_path / n).write_text("{")
    _sweep_state_temps(f"{tmp_path}//m.state.json")
    assert {n for n in os.listdir(tmp_path)} == {n for n, keep in names.items() if keep}
