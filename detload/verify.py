"""Comparing two runs' manifests step by step: the proof that two runs saw the same batches.

A side is one manifest file or a run directory of rank files
(``rank-00000.jsonl``, …). A global step is the tuple of partition hashes in
partition order, so runs at different world sizes compare when their
partitions and global batch size match.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

from .audit import NON_ORDER_FIELDS, Manifest, read_manifest
from .errors import ManifestError

__all__ = ["Run", "VerifyResult", "load_run", "verify"]


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
        return Run(path, manifests)
    return Run(path, [read_manifest(path)])


@dataclass
class VerifyResult:
    identical: bool
    message: str
    epoch: int | None = None
    step: int | None = None
    kind: str = "identical"  # identical | diverged | truncated | epochs
    columns: list[str] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    option_diffs: dict[str, list[Any]] = field(default_factory=dict)
    info: dict[str, list[Any]] = field(default_factory=dict)
    steps_compared: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _order(h: dict[str, Any]) -> dict[str, Any]:
    return {**h.get("order", {}), "fingerprint": h.get("fingerprint")}


def verify(a_path: str, b_path: str) -> VerifyResult:
    """Compare two runs. Raises ManifestError when either cannot be read."""
    a, b = load_run(a_path), load_run(b_path)
    oa, ob = _order(a.header), _order(b.header)
    option_diffs = {k: [oa.get(k), ob.get(k)] for k in sorted(set(oa) | set(ob)) if oa.get(k) != ob.get(k)}
    info = {k: [a.header.get(k), b.header.get(k)] for k in sorted(NON_ORDER_FIELDS | {"batch_size"})
            if k in a.header or k in b.header}
    res = VerifyResult(True, "", option_diffs=option_diffs, info=info)
    same_layout = a.header.get("world_size") == b.header.get("world_size")
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
                if same_layout:
                    cols: set[str] = set()
                    for la, lb in zip(sa[1], sb[1]):
                        ca, cb = la.get("columns", {}), lb.get("columns", {})
                        cols |= {c for c in set(ca) | set(cb) if ca.get(c) != cb.get(c)}
                    res.columns = sorted(cols)
                msg = f"diverged at epoch {e} step {s}"
                if res.columns:
                    msg += f": columns {', '.join(res.columns)} differ"
                elif res.partitions:
                    msg += f": partitions {res.partitions} differ"
                return _fail(res, "diverged", e, s, msg, compared)
            compared += 1
    res.steps_compared = compared
    res.message = f"identical: {compared} steps in {len(a.epochs())} epoch(s)"
    if option_diffs:
        res.message += " (order options differ in the headers, but every batch matched)"
    return res


def _fail(res: VerifyResult, kind: str, epoch: int, step: int, message: str, compared: int) -> VerifyResult:
    res.identical = False
    res.kind = kind
    res.epoch = epoch
    res.step = step
    res.steps_compared = compared
    if res.option_diffs:
        message += "; order options differ: " + ", ".join(
            f"{k} (A: {v[0]!r}, B: {v[1]!r})" for k, v in res.option_diffs.items()
        )
    res.message = message
    return res
