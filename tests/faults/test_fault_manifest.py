"""A run killed mid-epoch leaves a manifest whose complete lines are valid; verify calls it truncated.

Also: the orphaned workers of a SIGKILLed run exit on their own and remove
their /dev/shm segments; a torn last line is ignored; a damaged line is
reported as unreadable input (exit 2), not a crash.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
from faultkit import pid_alive, shm_segments, wait_until

from detload import read_manifest
from detload.cli import main as cli

RUN_ARGS = ["--batch-size", "10", "--seed", "4", "--mix-window", "2", "--block-rows", "40"]


def _batch_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b'"type":"batch"')
    except FileNotFoundError:
        return 0


# `detload run` with a consumer slower than the workers, so that every worker's
# queue holds blocks in /dev/shm when the process is killed.
SLOW_RUN = """
import sys, time
from detload import Loader
if __name__ == "__main__":
    root, workers, pool, manifest = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    with Loader(root, batch_size=10, seed=4, mix_window=2, block_rows=40, workers=workers, pool=pool,
                manifest=manifest) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                time.sleep(0.004)
"""


@pytest.fixture
def full_run(fault_data, tmp_path):
    data = fault_data()
    full = str(tmp_path / "full.jsonl")
    assert cli(["run", data.root, *RUN_ARGS, "--epochs", "2", "--manifest", full]) == 0
    return data, full


@pytest.mark.parametrize("pool,workers", [("process", 3), ("thread", 2)])
def test_sigkill_mid_run_leaves_valid_prefix(full_run, tmp_path, capsys, pool, workers):
    data, full = full_run
    part = str(tmp_path / "killed.jsonl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_RUN, data.root, str(workers), pool, part],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True,
    )
    try:
        wait_until(lambda: _batch_lines(part) >= 25 or proc.poll() is not None, 60, step=0.002)
        assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read().decode()
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(proc.pid, signal.SIGKILL)
        # Orphaned workers notice their parent is gone, leave, and take their segments
        # along, even while the killed process is a zombie nobody reaped yet: a
        # supervisor that reads its child's stderr to the end before reaping it would
        # otherwise wait forever on workers holding that pipe.
        wait_until(lambda: not any(pid_alive(p) for p in family), 5.0)
        wait_until(lambda: not shm_segments(proc.pid), 5.0)
        assert proc.stderr.read() is not None  # every holder of the pipe is gone: no hang
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    with open(part, "rb") as f:
        raw = f.read()
    complete = raw.split(b"\n")[:-1]  # a line without its newline was being written
    for line in complete:
        json.loads(line)
    m = read_manifest(part)
    batches = list(m.batches())
    assert len(batches) >= 25 and len(complete) == 1 + len(m.epochs) + len(batches)
    ref = read_manifest(full)
    ref_batches = list(ref.batches())
    assert [b["hash"] for b in batches] == [b["hash"] for b in ref_batches[: len(batches)]]

    capsys.readouterr()
    assert cli(["verify", full, part]) == 1
    out = capsys.readouterr().out
    last = batches[-1]
    e, s = last["epoch"], last["step"] + 1
    steps = ref.epochs[e].steps
    if s == steps:  # killed right at an epoch boundary
        assert "stops before it" in out
    else:
        assert f"is truncated: it stops at epoch {e} step {s} of the {steps} steps" in out


# A consumer that forks a long-lived child (as torch DataLoader workers are forked)
# and is then SIGKILLed: the child inherits the pipe its workers watch.
FORKING_RUN = """
import os, signal, sys, time
from detload import Loader
if __name__ == "__main__":
    with Loader(sys.argv[1], batch_size=10, seed=4, workers=2, pool="process") as loader:
        it = iter(loader)
        next(it)
        print(" ".join(map(str, loader._pool.pids())), flush=True)
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_orphaned_workers_leave_while_a_forked_child_of_the_consumer_lives(fault_data):
    data = fault_data()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", FORKING_RUN, data.root], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True, text=True)
    child = 0
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        child = int(proc.stdout.readline())
        proc.wait(timeout=30)
        assert len(workers) == 2 and proc.returncode == -signal.SIGKILL
        wait_until(lambda: not any(pid_alive(p) for p in workers), 5.0)
        wait_until(lambda: not shm_segments(proc.pid), 5.0)
        assert pid_alive(child)  # it still holds the consumer's end of the pipe
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_torn_and_damaged_lines(full_run, tmp_path, capsys):
    _, full = full_run
    with open(full, "rb") as f:
        lines = f.read().split(b"\n")[:-1]
    torn = str(tmp_path / "torn.jsonl")
    with open(torn, "wb") as f:
        f.write(b"\n".join(lines[:12]) + b"\n" + lines[12][: len(lines[12]) // 2])
    m = read_manifest(torn)
    assert m.torn_tail and len(list(m.batches())) == 10  # header + epoch line + 10 batches
    capsys.readouterr()
    assert cli(["verify", full, torn]) == 1
    assert "is truncated: it stops at epoch 0 step 10" in capsys.readouterr().out

    damaged = str(tmp_path / "damaged.jsonl")
    with open(damaged, "wb") as f:
        f.write(b"\n".join(lines[:5] + [lines[5][:20]] + lines[6:]) + b"\n")
    assert cli(["verify", full, damaged]) == 2
    assert "line 6 is not valid JSON" in capsys.readouterr().err

    empty = str(tmp_path / "empty.jsonl")
    open(empty, "wb").close()
    assert cli(["verify", full, empty]) == 2
    assert cli(["verify", full, str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "is empty, not a detload manifest" in err and "cannot read manifest" in err
