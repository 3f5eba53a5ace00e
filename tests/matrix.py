"""The determinism matrix: one loader configuration run every way it can execute, every cell equal to the reference.

Axes (DESIGN.md, "The contract"): workers x pool x cache state (none, cold,
warm, limited) x resume point x world size, with the partition count fixed. A
limited cache is a cold one capped at half of what the whole data takes there:
it fills with the first row groups read and serves those warm while the rest are
read from the source, so one run mixes both paths (and, in the mixed order,
windows part mapped entries, part converted reads). A cell's
batch hashes (what the loader yielded, by `detload.audit.hash_batch`) and its
manifest (every line after the header; the header less what records how the
run executed) must equal those of the reference cell: 1 thread worker, no
cache, no resume, world size 1. At world sizes above 1 each rank's batches
differ from the reference's, so there the per-partition hashes of each global
step are compared instead (what `detload verify` compares), and each rank's
yielded hashes must be the ones its manifest records.

CI runs a few cells chosen so that every value of every axis appears
(`CI_CELLS`); ``DETLOAD_FULL=1`` runs the whole product. A new order option
(filters, packing, transforms) gets its matrix by calling `check_matrix` with a
configuration that uses it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import detload
from detload import Loader, read_manifest
from detload.audit import hash_batch
from detload.verify import load_run

FULL = os.environ.get("DETLOAD_FULL") == "1"
EPOCHS = 2
WORKERS = (1, 3)
POOLS = ("thread", "process")
CACHES = ("none", "cold", "warm", "limited")
# Where a run is stopped and resumed, in batches: none, half an epoch, an epoch's end, a third into the next.
RESUMES = ("none", "mid-epoch", "epoch-end", "next-epoch")
WORLDS = (1, 2)
# Header fields that record how a run executed, not what it delivered.
EXECUTION_FIELDS = frozenset({"workers", "pool", "detload_version", "rank", "world_size"})


@dataclass(frozen=True)
class Cell:
    workers: int
    pool: str
    cache: str
    resume: str
    world: int

    @property
    def name(self) -> str:
        return f"w{self.workers}-{self.pool}-cache_{self.cache}-resume_{self.resume}-world{self.world}"


REFERENCE = Cell(1, "thread", "none", "none", 1)
# Every axis value at least once, process pools (the slow start) in two cells only.
CI_CELLS = (
    REFERENCE,
    Cell(3, "thread", "cold", "mid-epoch", 1),
    Cell(3, "process", "warm", "none", 1),
    Cell(1, "thread", "warm", "epoch-end", 2),
    Cell(3, "thread", "none", "next-epoch", 2),
    Cell(1, "process", "limited", "none", 2),
)


def cells(full: bool = FULL) -> list[Cell]:
    """The cells to run: the CI profile, or the whole product (reference first)."""
    if not full:
        return list(CI_CELLS)
    product = [Cell(*c) for c in itertools.product(WORKERS, POOLS, CACHES, RESUMES, WORLDS)]
    return [REFERENCE] + [c for c in product if c != REFERENCE]


def _stop_at(resume: str, steps: list[int]) -> int | None:
    """Batches before the stop; ``steps``: the steps of each epoch (with partitions they differ)."""
    return {"none": None, "mid-epoch": steps[0] // 2, "epoch-end": steps[0],
            "next-epoch": steps[0] + steps[1] // 3}[resume]


def _execution(cell: Cell, rank: int, cache: detload.Cache | None, manifest: str) -> dict[str, Any]:
    """The Loader keywords of how a cell executes (none of them may change a byte)."""
    kw: dict[str, Any] = dict(workers=cell.workers, pool=cell.pool, manifest=manifest)
    if cell.world > 1:
        kw.update(distributed=detload.Distributed(rank, cell.world))
    if cache is not None:
        kw.update(cache=cache)
    return kw


def _batches(loader: Loader) -> Iterator[dict[str, Any]]:
    for e in range(loader.epoch, EPOCHS):
        loader.set_epoch(e)  # the same epoch keeps a loaded position
        yield from loader


@dataclass
class _Result:
    hashes: list[list[str]]  # per rank, what the loader yielded
    out: str                 # the run directory of its manifests


def _run(root: str, options: Mapping[str, Any], cell: Cell, out: str, cache: detload.Cache | None,
         steps: list[int]) -> _Result:
    """Run a cell's ranks one after another (each stopped and resumed as the cell says)."""
    opts = dict(options)
    opts["batch_size"] = options["batch_size"] // cell.world  # per rank, so the global batch stays
    stop = _stop_at(cell.resume, steps)
    hashes: list[list[str]] = []
    for rank in range(cell.world):
        kw = _execution(cell, rank, cache, out + os.sep)
        got: list[str] = []
        with Loader(root, **opts, **kw) as loader:
            if stop != 0:
                for batch in _batches(loader):
                    got.append(hash_batch(batch)[0])
                    if len(got) == stop:
                        break  # here, not at the next batch: the loader would have yielded it
            state = loader.state_dict() if stop is not None else None
        if state is not None:
            with Loader(root, **opts, **kw) as loader:
                loader.load_state_dict(state)
                got += [hash_batch(b)[0] for b in _batches(loader)]
        hashes.append(got)
    return _Result(hashes, out)


def _manifest(path: str) -> tuple[dict[str, Any], bytes]:
    """A manifest's header less the execution fields, and the bytes of every line after it."""
    with open(path, "rb") as f:
        data = f.read()
    header = {k: v for k, v in read_manifest(path).header.items() if k not in EXECUTION_FIELDS}
    return header, data[data.index(b"\n") + 1:]


def _steps(out: str) -> list[tuple[int, int, list[str]]]:
    """Every global step of a run directory: (epoch, step, partition hashes in partition order)."""
    run = load_run(out)
    got = []
    for e in run.epochs():
        for s in range(run.announced(e) or 0):
            step = run.step(e, s)
            assert step is not None, f"{out}: epoch {e} step {s} is missing"
            got.append((e, s, step[0]))
    return got


def _entries(cache_dir: str) -> dict[str, tuple[int, int, int]]:
    """The cache's entry files, (inode, mtime, size) by path (not its usage counter, which every
    loader recounts)."""
    out = {}
    for dirpath, _, names in os.walk(os.path.join(cache_dir, "v1", "objects")):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            out[os.path.join(dirpath, n)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def spill_every_window(monkeypatch: Any, folder: str) -> None:
    """Spill every mixed-order window from here on (``Pool.spill``'s threshold of 32 MiB of
    fixed columns is never reached by test data), to ``folder`` (the system's temporary
    folder may be a tmpfs, where nothing is spilled). The threshold travels to worker
    processes in their configuration, so process cells spill too."""
    import detload._engine.spill as spill

    os.makedirs(folder, exist_ok=True)
    monkeypatch.setattr(spill, "SPILL_MIN_BYTES", 0)
    real = spill.spill_folder
    monkeypatch.setattr(spill, "spill_folder", lambda choice: folder if choice is True else real(choice))


def check_matrix(root: str, options: Mapping[str, Any], tmp: str, *, full: bool = FULL) -> list[Cell]:
    """Run ``options`` (Loader keywords that decide the batches) over ``root`` in every cell; assert
    each equals the reference cell. ``tmp`` is an empty directory for manifests and caches.

    World sizes need a fixed partition count: without ``partitions`` the whole matrix,
    reference included, runs with ``partitions=max(WORLDS)``. ``batch_size`` is the
    global batch (each rank gets ``batch_size / world``). Returns the cells it ran.
    """
    opts = dict(options)
    opts.setdefault("partitions", max(WORLDS))
    for key in ("workers", "pool", "manifest", "rank", "world_size", "cache_dir"):
        assert key not in opts, f"{key} is an axis of the matrix, not part of the configuration"
    with Loader(root, **opts) as probe:
        steps = []
        for e in range(EPOCHS):
            probe.set_epoch(e)
            steps.append(len(probe))
    warm = os.path.join(tmp, "warm-cache")
    _run(root, opts, REFERENCE, os.path.join(tmp, "warm-up"), detload.Cache(warm), steps)  # fills the warm cache
    whole = sum(size for *_, size in _entries(warm).values())
    limit = max(1, whole // 2)
    todo = cells(full)
    assert todo[0] == REFERENCE
    ref: _Result | None = None
    for cell in todo:
        out = os.path.join(tmp, cell.name)
        own = os.path.join(out, "cache")
        cache = {"none": None, "cold": detload.Cache(own), "warm": detload.Cache(warm),
                 "limited": detload.Cache(own, limit=limit)}[cell.cache]
        before = _entries(warm) if cell.cache == "warm" else None
        res = _run(root, opts, cell, out, cache, steps)
        where = f"cell {cell.name}"
        if before is not None:
            assert _entries(warm) == before, f"{where}: a warm cache was written to"
        if cell.cache == "cold":
            assert _entries(own), f"{where}: the cold cache stayed empty"
        if cell.cache == "limited":
            held = sum(size for *_, size in _entries(own).values())
            # (A dataset of one row group bigger than half of it caches nothing: still a cell.)
            assert held <= limit, f"{where}: the limited cache holds {held} bytes, over its limit of {limit}"
        for rank, got in enumerate(res.hashes):
            lines = [b["hash"] for b in read_manifest(os.path.join(out, f"rank-{rank:05d}.jsonl")).batches()]
            assert got == lines, f"{where} rank {rank}: yielded batches are not the ones its manifest records"
        if ref is None:
            ref = res
            assert len(ref.hashes[0]) == sum(steps)
            continue
        if cell.world == 1:
            assert res.hashes == ref.hashes, f"{where}: batches differ from the reference cell's"
            want, got_m = _manifest(os.path.join(ref.out, "rank-00000.jsonl")), \
                _manifest(os.path.join(out, "rank-00000.jsonl"))
            assert got_m == want, f"{where}: manifest differs from the reference cell's"
        else:
            assert _steps(out) == _steps(ref.out), f"{where}: partition hashes differ from the reference cell's"
    return todo
