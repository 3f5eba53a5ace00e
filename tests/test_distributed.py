"""Distributed runs: canonical partitions, elastic world sizes, per-rank reads, rank agreement, torchrun.

Ranks are simulated in one process (explicit rank/world_size) for the fast
cases; one real ``torchrun --nproc_per_node=2`` job (gloo, CPU) covers DDP,
the rank-agreement collective and an elastic resume. ``DETLOAD_FULL=1`` adds a
4-process job.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import _distdata
import numpy as np
import pytest

from detload import Loader, ManifestError, OptionError
from detload.cli import main as cli_main
from detload.loader import _distributed_defaults, compare_ranks
from detload.plan import MixPlan
from detload.verify import verify

FULL = os.environ.get("DETLOAD_FULL") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("dist") / "ds")
    _distdata.write(root)
    return root


def run_ranks(ds: str, R: int, *, P: int, global_batch: int, out: str | None = None, **kw) -> list[list[np.ndarray]]:
    """Every rank's ids per step, ranks simulated one after another."""
    res = []
    for r in range(R):
        with Loader(ds, batch_size=global_batch // R, seed=7, partitions=P, distributed=(r, R),
                    manifest=(out + "/") if out else None, columns=["id", "s"], **kw) as loader:
            res.append([b["id"].copy() for b in loader])
    return res


@pytest.mark.parametrize("drop_last", [False, True])
def test_elastic_world_sizes_give_identical_global_steps(ds, tmp_path, drop_last):
    runs = {R: run_ranks(ds, R, P=4, global_batch=64, out=str(tmp_path / f"r{R}"), drop_last=drop_last, workers=2)
            for R in (1, 2, 4)}
    steps = len(runs[1][0])
    for R, ranks in runs.items():
        assert [len(r) for r in ranks] == [steps] * R, "every rank gets the same number of steps"
        for i in range(steps):
            union = np.concatenate([ranks[r][i] for r in range(R)])
            # Same rows in the same order: rank r's batch is its partitions' micro-batches.
            np.testing.assert_array_equal(union, runs[1][0][i])
    for R in (2, 4):
        assert cli_main(["verify", str(tmp_path / "r1"), str(tmp_path / f"r{R}")]) == 0
    ids = np.concatenate(runs[4][0] + runs[4][1] + runs[4][2] + runs[4][3])
    assert len(np.unique(ids)) == len(ids), "ranks' batches are disjoint"
    total = sum(map(sum, _distdata.LAYOUT.values()))
    if drop_last:
        header = json.loads((tmp_path / "r4" / "rank-00000.jsonl").read_text().split("\n")[0])
        assert header["world_size"] == 4
        plan = Loader(ds, batch_size=16, seed=7, partitions=4, distributed=(0, 4), drop_last=True).plan()
        assert len(ids) + plan.dropped_rows == total
    else:
        assert len(ids) == total, "drop_last=False delivers every row exactly once"


def test_drop_last_false_tail_gives_short_or_empty_batches(ds):
    ranks = run_ranks(ds, 4, P=4, global_batch=256, workers=1)
    sizes = np.array([[len(b) for b in r] for r in ranks])
    assert (sizes[:, :-1].sum(axis=0) == 256).all() or (sizes[:, -1] < 64).any()
    assert (sizes[:, -1] <= 64).all() and sizes.sum() == sum(map(sum, _distdata.LAYOUT.values()))
    # Format 2 balances partitions by rows (to within one), so every step but the last is
    # full on every rank, and the last one's rank shares differ by at most one row.
    assert (sizes[:, :-1] == 64).all()
    assert sizes[:, -1].max() - sizes[:, -1].min() <= 1


@pytest.mark.parametrize("order", ["mix", "windowed"])
def test_each_rank_reads_only_its_partitions(ds, unit_log, order):
    R, P = 2, 4
    seen = []
    for r in range(R):
        unit_log.clear()
        with Loader(ds, batch_size=32, seed=7, partitions=P, distributed=(r, R), order=order) as loader:
            plan = loader.plan()
            for _ in loader:
                pass
            files = [f.path for f in loader.dataset.files]
        # What the plan says the rank reads: its tasks' ranges (mixed order), its blocks' (windowed).
        parts = plan.tasks if isinstance(plan, MixPlan) else plan.blocks
        ranges = [r for p in plan.owned_partitions for b in parts[p] for r in b.ranges]
        mine = {(files[r.file], r.row_group) for r in ranges}
        assert set(unit_log) == mine and len(unit_log) == len(ranges), "reads its own ranges, once each"
        seen.append(mine)
    # Partitions balanced by rows (formats 2 and 3): a row group cut by the partition boundary
    # between the ranks is read by both (at most R - 1 = 1 here; at most P - 1 over all
    # partitions); no other is shared.
    assert len(seen[0] & seen[1]) <= R - 1 and len(seen[0] | seen[1]) == 14
    if order == "windowed":
        return  # the option errors below are the same for both orders


def test_one_partition_is_the_single_process_plan(ds):
    with Loader(ds, batch_size=50, seed=3, columns=["id"]) as a, \
            Loader(ds, batch_size=50, seed=3, columns=["id"], partitions=1, distributed=(0, 1)) as b:
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x["id"], y["id"])


def test_defaults_from_environment(ds, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = Loader(ds, batch_size=8, seed=0)
    assert (loader.rank, loader.options.world_size, loader.options.partitions) == (1, 2, 2)
    assert _distributed_defaults(0, None) == (0, 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(OptionError, match="RANK='x'"):
        Loader(ds, batch_size=8, seed=0)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert _distributed_defaults(None, None) == (0, 1)


def test_bad_distributed_options_are_explained(ds):
    with pytest.raises(OptionError, match=r"partitions=4 must be a multiple of the world size 3"):
        Loader(ds, batch_size=8, seed=0, partitions=4, distributed=(0, 3))
    with pytest.raises(OptionError, match=r"global batch .* 2 x world size 2 = 4\) must divide by partitions=8"):
        Loader(ds, batch_size=2, seed=0, partitions=8, distributed=(0, 2))
    with pytest.raises(OptionError, match=r"^Distributed.rank must be an int in \[0, 2\), got 2$"):
        Loader(ds, batch_size=8, seed=0, distributed=(2, 2))
    # Boundaries cut row groups (partitions balanced by rows), but there are at most as many
    # partitions as row groups: the planner's work grows with them.
    plan = Loader(ds, batch_size=14, seed=0, partitions=14, distributed=(0, 1)).plan()
    assert max(plan.partition_rows) - min(plan.partition_rows) <= 1 and plan.redundant_reads <= 13
    with pytest.raises(OptionError, match=r"^partitions=16 exceeds the 14 non-empty row groups of the dataset"):
        Loader(ds, batch_size=16, seed=0, partitions=16, distributed=(0, 1))


def test_mismatched_ranks_are_named(ds):
    loaders = [Loader(ds, batch_size=8, seed=1, distributed=(0, 2), order="windowed"),
               Loader(ds, batch_size=8, seed=2, distributed=(1, 2), order="windowed", shuffle_window=2)]
    infos = [x.rank_info() for x in loaders]
    with pytest.raises(OptionError) as err:
        loaders[0].check_ranks(lambda _obj: infos)
    msg = str(err.value)
    assert "seed differs: 1 on ranks [0], 2 on ranks [1]" in msg
    assert "shuffle_window differs: 4 on ranks [0], 2 on ranks [1]" in msg
    # A rank left at the default (the mixed order) and one given the windowed order: the plan
    # format and each order's options are named.
    infos = [Loader(ds, batch_size=8, seed=1, distributed=(0, 2)).rank_info(), infos[1]]
    with pytest.raises(OptionError) as err:
        loaders[0].check_ranks(lambda _obj: infos)
    msg = str(err.value)
    assert "plan_format differs: 3 on ranks [0], 2 on ranks [1]" in msg
    assert "shuffle_window differs: null on ranks [0], 2 on ranks [1]" in msg
    assert 'order differs: "mix" on ranks [0], null on ranks [1]' in msg
    same = [Loader(ds, batch_size=8, seed=1, distributed=(r, 2)) for r in range(2)]
    same[0].check_ranks(lambda _obj: [x.rank_info() for x in same])  # agrees: no error
    with pytest.raises(OptionError, match=r"ranks are \[0, 0\] for 2 processes \(expected 0..1\): pass "
                                          r"distributed=detload.Distributed\(rank, world_size\) from "
                                          r"torch.distributed, or leave it unset"):
        compare_ranks([same[0].rank_info(), same[0].rank_info()])
    other = Loader(ds, batch_size=16, seed=1, distributed=(1, 2))
    with pytest.raises(OptionError, match=r"batch_size differs: 8 on ranks \[0\], 16 on ranks \[1\]"):
        compare_ranks([same[0].rank_info(), other.rank_info()])
    # Without a process group there is nothing to gather from: no error, no torch import needed.
    same[0].check_ranks()


def test_verify_rejects_a_run_directory_whose_ranks_disagree(ds, tmp_path):
    for r, seed in enumerate((1, 2)):
        with Loader(ds, batch_size=8, seed=seed, distributed=(r, 2), manifest=str(tmp_path / "run") + "/") as x:
            next(iter(x))
    with pytest.raises(ManifestError, match=r"ranks \[1\] have another fingerprint"):
        verify(str(tmp_path / "run"), str(tmp_path / "run"))


def test_import_detload_never_imports_torch():
    code = "import sys, detload, detload.cli, detload.verify, detload.loader; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.stdout.strip() == "False"


# -- real torchrun jobs ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{_free_port()}",
           os.path.join(HERE, "_ddp_worker.py"), *args]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"torchrun failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-8000:]}"
    return out


def _interrupted_state(ds: str, out: str, *, R: int, P: int, global_batch: int, stop: int) -> dict:
    """A run at world size R killed after ``stop`` steps: its run directory and its state."""
    states = []
    for r in range(R):
        with Loader(ds, batch_size=global_batch // R, seed=7, partitions=P, distributed=(r, R),
                    columns=["id", "s"], manifest=out + "/", pool="thread", workers=2) as loader:
            for i, _ in enumerate(loader):
                if i + 1 == stop:
                    break
            states.append(loader.state_dict())
    assert all(s == states[0] for s in states), "the state holds no rank"
    return states[0]


@pytest.mark.parametrize("nproc", [2, 4] if FULL else [2])
def test_torchrun_ddp_ranks_and_elastic_resume(ds, tmp_path, nproc):
    P = 4
    # The interrupted job ran at a world size other than this one, and with thread workers.
    killed_at = 5
    first_R = 4 if nproc == 2 else 2
    state = _interrupted_state(ds, str(tmp_path / "interrupted"), R=first_R, P=P, global_batch=64, stop=killed_at)
    (tmp_path / "state.json").write_text(json.dumps(state))
    torchrun(nproc, ds, str(tmp_path))

    # 1. DDP with default partitions (P = R): equal steps, disjoint, the epoch covered, and
    #    step i's union equals the single-process run with P = R.
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(nproc)]
    steps = [len(g.files) for g in got]
    assert len(set(steps)) == 1
    single = run_ranks(ds, 1, P=nproc, global_batch=16 * nproc)[0]
    assert len(single) == steps[0]
    for i in range(steps[0]):
        np.testing.assert_array_equal(np.concatenate([g[f"s{i}"] for g in got]), single[i])
    ids = np.concatenate([g[f"s{i}"] for g in got for i in range(steps[0])])
    assert len(ids) == len(np.unique(ids)) == sum(map(sum, _distdata.LAYOUT.values()))

    # 2. The rank-agreement collective named the differing option on every rank.
    for r in range(nproc):
        msg = (tmp_path / f"mismatch{r}.txt").read_text()
        assert "seed differs" in msg and "on ranks [0]" in msg, msg

    # 3. Resumed at another world size and worker count: interrupted + resumed == uninterrupted.
    run_ranks(ds, 1, P=P, global_batch=64, out=str(tmp_path / "full"))
    args = ["verify", str(tmp_path / "full"), str(tmp_path / "interrupted"), str(tmp_path / "resumed")]
    assert cli_main(args) == 0
    first = json.loads((tmp_path / "resumed" / "rank-00000.jsonl").read_text().split("\n")[2])
    assert first["step"] == killed_at

