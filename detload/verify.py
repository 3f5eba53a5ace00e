"""Comparing two runs' manifests step by step: the proof that two runs saw the same batches.

A side is one manifest file or a run directory of rank files
(``rank-00000.jsonl``, …). A global step is the tuple of partition hashes in
partition order, so runs at different world sizes compare when their
partitions and global batch size match.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .audit import NON_ORDER_FIELDS, Manifest, read_manifest
from .errors import ManifestError

__all__ = ["Continued", "Run", "VerifyResult", "load_run", "load_side", "verify"]


@dataclass
class Run:
    """One side of a comparison: its rank manifests in rank order."""

    path: str
    manifests: list[Manifest]

    @property
    def header(self) -> dict[str, Any]:
        return self.manifests[0].header

    def epochs(self) -> list[int]:
        return sorted({e for m in self.manifests for e in m.epochs})

    def announced(self, epoch: int) -> int | None:
        for m in self.manifests:
            if epoch in m.epochs:
                return m.epochs[epoch].steps
        return None

    def step(self, epoch: int, step: int) -> tuple[list[str], list[dict[str, Any]]] | None:
        """(partition hashes in partition order, rank lines) of a global step, or None if missing."""
        parts: list[str] = []
        lines: list[dict[str, Any]] = []
        for m in self.manifests:
            rec = m.epochs.get(epoch)
            if rec is None:
                return None
            first = rec.batches[0]["step"] if rec.batches else 0
            i = step - first
            if not 0 <= i < len(rec.batches) or rec.batches[i]["step"] != step:
                return None
            line = rec.batches[i]
            parts.extend(line.get("parts") or [line["hash"]])
            lines.append(line)
        return parts, lines


def load_run(path: str) -> Run:
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "rank-*.jsonl")))
        if not files:
            raise ManifestError(f"{path} is a directory without rank-*.jsonl manifests")
        manifests = [read_manifest(f) for f in files]
        ranks = [m.header.get("rank") for m in manifests]
        world = manifests[0].header.get("world_size")
        if ranks != list(range(len(files))) or world != len(files):
            raise ManifestError(
                f"{path} holds manifests of ranks {ranks} for world size {world}; every rank "
                "0..world_size-1 must have its file"
            )
        prints = [m.header.get("fingerprint") for m in manifests]
        if len(set(prints)) > 1:
            odd = [r for r, p in enumerate(prints) if p != prints[0]]
            raise ManifestError(
                f"{path}: the rank manifests disagree on the order (ranks {odd} have another "
                "fingerprint than rank 0): its ranks ran with different options"
            )
        return Run(path, manifests)
    return Run(path, [read_manifest(path)])


class Continued:
    """A run that was interrupted and resumed: segments in the order they ran.

    Each segment (a manifest or a run directory, at any world size) starts at
    its first recorded (epoch, step); from there on it replaces everything the
    earlier segments recorded, as a resumed run that continues the same file
    cuts what came after the resumed step.
    """

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.path = " + ".join(r.path for r in runs)
        self.starts = [_start(r) for r in runs]
        self.manifests = runs[0].manifests

    @property
    def header(self) -> dict[str, Any]:
        return self.runs[0].header

    def _segment(self, epoch: int, step: int) -> Run | None:
        chosen = None
        for run, start in zip(self.runs, self.starts):
            if start is not None and start <= (epoch, step):
                chosen = run
        return chosen

    def epochs(self) -> list[int]:
        return sorted({e for r in self.runs for e in r.epochs()})

    def announced(self, epoch: int) -> int | None:
        for run in reversed(self.runs):
            n = run.announced(epoch)
            if n is not None:
                return n
        return None

    def step(self, epoch: int, step: int) -> tuple[list[str], list[dict[str, Any]]] | None:
        run = self._segment(epoch, step)
        return None if run is None else run.step(epoch, step)


def _start(run: Run) -> tuple[int, int] | None:
    """The first (epoch, step) every rank of ``run`` recorded, None when it holds no batch."""
    firsts = []
    for m in run.manifests:
        batches = [(rec.epoch, rec.batches[0]["step"]) for rec in m.epochs.values() if rec.batches]
        if not batches:
            return None
        firsts.append(min(batches))
    return max(firsts)


def load_side(paths: str | Sequence[str]) -> Run | Continued:
    """One side of a comparison: a path, or several paths of one run resumed in new places."""
    if isinstance(paths, (str, os.PathLike)):
        return load_run(os.fspath(paths))
    runs = [load_run(os.fspath(p)) for p in paths]
    if not runs:
        raise ManifestError("no manifest given")
    if len(runs) == 1:
        return runs[0]
    prints = {r.header.get("fingerprint") for r in runs}
    if len(prints) > 1:
        raise ManifestError(
            f"{' + '.join(r.path for r in runs)} cannot be one resumed run: their manifests were "
            "written with different order options (fingerprints differ)"
        )
    return Continued(runs)


@dataclass
class VerifyResult:
    identical: bool
    message: str
    epoch: int | None = None
    step: int | None = None
    kind: str = "identical"  # identical | diverged | truncated | epochs | formats
    columns: list[str] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    option_diffs: dict[str, list[Any]] = field(default_factory=dict)
    info: dict[str, list[Any]] = field(default_factory=dict)
    steps_compared: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _order(side: Run | Continued) -> dict[str, Any]:
    order = side.header.get("order", {})
    if not isinstance(order, dict):
        raise ManifestError(f"{side.path}: the header's 'order' is {type(order).__name__} {order!r}, not an "
                            "object of options: the file is not a detload manifest, or it was edited")
    return {**order, "fingerprint": side.header.get("fingerprint")}


def _plan_format(side: Run | Continued) -> Any:
    """The plan format a side was planned with (headers before format 2 only had it in ``order``)."""
    h = side.header
    return h.get("plan_format", _order(side).get("plan_format", 1))


def verify(a_path: str | Sequence[str], b_path: str | Sequence[str]) -> VerifyResult:
    """Compare two runs. Raises ManifestError when either cannot be read.

    Either side may be a list of paths: an interrupted run followed by the
    places its resumed continuations wrote to (see ``Continued``).
    """
    try:
        return _compare(load_side(a_path), load_side(b_path))
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        if isinstance(exc, ManifestError):
            raise
        # A field of the wrong type (a step that is a string, columns that are a list...):
        # the files parse as JSON Lines but are not what detload writes.
        names = " or ".join(_side_name(p) for p in (a_path, b_path))
        raise ManifestError(f"{names} holds a malformed manifest record ({type(exc).__name__}: {exc}); "
                            "was it written by detload, or edited?") from None


def _side_name(paths: str | Sequence[str]) -> str:
    if isinstance(paths, (str, os.PathLike)):
        return os.fspath(paths)
    return " + ".join(os.fspath(p) for p in paths)


def _compare(a: Run | Continued, b: Run | Continued) -> VerifyResult:
    a_path, b_path = a.path, b.path
    oa, ob = _order(a), _order(b)
    # The options first, their fingerprint (which follows from them) last.
    keys = sorted(set(oa) | set(ob), key=lambda k: (k == "fingerprint", k))
    option_diffs = {k: [oa.get(k), ob.get(k)] for k in keys if oa.get(k) != ob.get(k)}
    info = {k: [a.header.get(k), b.header.get(k)] for k in sorted(NON_ORDER_FIELDS | {"batch_size"})
            if k in a.header or k in b.header}
    res = VerifyResult(True, "", option_diffs=option_diffs, info=info)
    fa, fb = _plan_format(a), _plan_format(b)
    if fa != fb:
        # Another plan format orders every batch differently: a batch-by-batch comparison
        # would only report a divergence at step 0, which says nothing about either run.
        res.identical, res.kind = False, "formats"
        if {fa, fb} == {2, 3}:
            old = oa if fa == 2 else ob
            res.message = (
                f"plan formats differ ({fa} vs {fb}): {'A' if fa == 2 else 'B'} was planned with plan format 2 (the "
                f"windowed order) and {'B' if fa == 2 else 'A'} with plan format 3 (the mixed order), "
                "which order batches differently, so their batches are not compared. To compare, rerun the "
                f"format-3 side with the windowed order (order=\"windowed\", shuffle_window="
                f"{old.get('shuffle_window', 4)}; `detload run --order windowed --shuffle-window "
                f"{old.get('shuffle_window', 4)}`), or the format-2 side with the mixed order")
            return res
        res.message = (f"plan formats differ ({fa} vs {fb}): A was planned with plan format {fa} and B with "
                       f"{fb}, which order batches differently, so their batches are not compared. Rerun the "
                       "older side with this detload to compare them")
        return res
    compared = 0
    for e in sorted(set(a.epochs()) | set(b.epochs())):
        na, nb = a.announced(e), b.announced(e)
        if na is None or nb is None:
            side = "B" if nb is None else "A"
            return _fail(res, "epochs", e, 0, f"epoch {e} is in {'A' if side == 'B' else 'B'} only: {side} stops before it", compared)
        if na != nb:
            return _fail(res, "diverged", e, 0, f"epoch {e} has {na} steps in A but {nb} in B", compared)
        for s in range(na):
            sa, sb = a.step(e, s), b.step(e, s)
            if sa is None or sb is None:
                side = "A" if sa is None else "B"
                other = b_path if side == "B" else a_path
                return _fail(res, "truncated", e, s,
                             f"{side} ({other if side == 'B' else a_path}) is truncated: it stops at epoch {e} "
                             f"step {s} of the {na} steps its header announces", compared)
            pa_, pb_ = sa[0], sb[0]
            if pa_ != pb_:
                res.partitions = [i for i, (x, y) in enumerate(zip(pa_, pb_)) if x != y]
                if len(pa_) != len(pb_):
                    res.partitions = list(range(max(len(pa_), len(pb_))))
                if len(sa[1]) == len(sb[1]):  # same world size: rank lines compare column by column
                    cols: set[str] = set()
                    for la, lb in zip(sa[1], sb[1]):
                        ca, cb = la.get("columns", {}), lb.get("columns", {})
                        cols |= {c for c in set(ca) | set(cb) if ca.get(c) != cb.get(c)}
                    res.columns = sorted(cols, key=_natural)
                detail = ""
                if res.columns:
                    shown = ", ".join(res.columns[:_SHOW])
                    more = f" and {len(res.columns) - _SHOW} more" if len(res.columns) > _SHOW else ""
                    detail = f"columns {shown}{more} differ"
                elif res.partitions:
                    detail = f"partitions {res.partitions} differ"
                return _fail(res, "diverged", e, s, f"diverged at epoch {e} step {s}", compared, detail)
            compared += 1
    res.steps_compared = compared
    res.message = f"identical: {compared} steps in {len(a.epochs())} epoch(s)"
    if option_diffs:
        res.message += "; every batch matched, although order options differ in the headers: " + ", ".join(
            f"{k} (A: {v[0]!r}, B: {v[1]!r})" for k, v in option_diffs.items()
        )
    return res


_SHOW = 8  # differing columns named in the message (all are in VerifyResult.columns)


def _natural(name: str) -> list[Any]:
    """Sort key putting dense_2 before dense_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _fail(res: VerifyResult, kind: str, epoch: int, step: int, message: str, compared: int,
          detail: str = "") -> VerifyResult:
    res.identical = False
    res.kind = kind
    res.epoch = epoch
    res.step = step
    res.steps_compared = compared
    if res.option_diffs:
        # The likely cause comes first, before the list of what differs.
        message += ", and the runs used different order options: " + ", ".join(
            f"{k} (A: {v[0]!r}, B: {v[1]!r})" for k, v in res.option_diffs.items()
        )
    if detail:
        message += ("; " if res.option_diffs else ": ") + detail
    res.message = message
    return res
