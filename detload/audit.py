"""Batch hashes and manifests: the audit trail that proves two runs saw the same batches.

The canonical form (docs/audit.md) is simple enough to recompute with numpy and
xxhash alone: a column digest is xxh3-128 over the column's name, kind, dtype
(with explicit byte order), shape and raw C-contiguous bytes; a batch digest is
xxh3-128 over a fixed tag and the column digests in batch order.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import xxhash

from ._types import Column, Ragged
from .errors import ManifestError
from .packed import Packed

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "Manifest",
    "ManifestWriter",
    "batch_digest",
    "column_digest",
    "hash_batch",
    "read_manifest",
]

MANIFEST_FORMAT = "detload-manifest"
MANIFEST_VERSION = 1
_BATCH_TAG = b"detload-batch-v1\x00"
_PACKED_TAG = b"detload-packed-v1\x00"
#: The name the group offsets of a packed batch are hashed under.
PACKED_OFFSETS = "[offsets]"


def _update_array(h: xxhash.xxh3_128, a: np.ndarray) -> None:
    a = np.ascontiguousarray(a)
    h.update(a.dtype.str.encode("ascii") + b"\x00")
    h.update(struct.pack(f"<{1 + a.ndim}q", a.ndim, *a.shape))
    # A byte view of the memory: no copy, and works for dtypes (datetime64)
    # that do not export the buffer protocol themselves.
    h.update(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def _update_ragged(h: xxhash.xxh3_128, col: Ragged) -> None:
    h.update(b"R" + col.kind.encode("ascii") + b"\x00")
    _update_array(h, col.offsets)
    if isinstance(col.values, Ragged):  # a list of strings: its strings' section in the same form
        _update_ragged(h, col.values)
    else:
        _update_array(h, col.values)


def column_digest(name: str, col: Column) -> bytes:
    """xxh3-128 of one column in canonical form (see docs/audit.md)."""
    h = xxhash.xxh3_128()
    h.update(name.encode("utf-8") + b"\x00")
    if isinstance(col, Ragged):
        _update_ragged(h, col)
    else:
        h.update(b"A\x00")
        _update_array(h, col)
    return h.digest()


def batch_digest(column_digests: list[bytes]) -> bytes:
    return xxhash.xxh3_128_digest(_BATCH_TAG + b"".join(column_digests))


def hash_batch(batch: Mapping[str, Column] | Packed) -> tuple[str, dict[str, str]]:
    """(batch hash, {column: hash}) as hex strings, columns in batch order.

    A `Packed` batch is hashed in its packed canonical form (docs/packing.md): its item
    columns, then its group columns (one row per group), then ``[offsets]``, the int64
    group offsets, under a tag of its own; ``group_index`` follows from the offsets.
    """
    if isinstance(batch, Packed):
        digests = {name: column_digest(name, col) for name, col in batch.items.items()}
        digests.update((name, column_digest(name, col)) for name, col in batch.groups.items())
        digests[PACKED_OFFSETS] = column_digest(PACKED_OFFSETS, np.asarray(batch.offsets, dtype="<i8"))
        whole = xxhash.xxh3_128_digest(_PACKED_TAG + b"".join(digests.values()))
        return whole.hex(), {k: v.hex() for k, v in digests.items()}
    digests = {name: column_digest(name, col) for name, col in batch.items()}
    return batch_digest(list(digests.values())).hex(), {k: v.hex() for k, v in digests.items()}


class ManifestWriter:
    """Appends manifest lines as the run goes, so a crash leaves a valid prefix.

    A fresh run truncates the file and writes the header; ``cut_to`` removes
    everything from a given (epoch, step) on, for restarted or resumed epochs.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any], *, resume: bool = False) -> None:
        self.path = os.fspath(path)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self.header = header
        self._continued = False
        if resume and os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            existing = read_manifest(self.path)
            _check_header_compatible(existing.header, header, self.path)
            self._f: IO[bytes] = open(self.path, "r+b")  # noqa: SIM115 - lives as long as the loader
            # Drop a torn last line (a crash mid-write) before appending after it.
            self._f.truncate(existing.valid_bytes)
            self._f.seek(0, os.SEEK_END)
            self._offsets = existing.offsets
            self._continued = True
        else:
            self._f = open(self.path, "wb")  # noqa: SIM115
            self._offsets = {}
            self._write_raw(json.dumps({"type": "header", **header}, sort_keys=True))
        # The greatest (epoch, step) written: a run's every epoch start asks for a cut, and
        # nearly always there is nothing after it to cut; without this, each start scanned
        # every line written so far (quadratic over a long run's many epochs).
        self._top: tuple[int, int] | None = max(self._offsets, default=None)

    def _write_raw(self, line: str) -> None:
        self._f.write(line.encode("utf-8") + b"\n")
        self._f.flush()

    def cut_to(self, epoch: int, step: int) -> None:
        """Drop the lines of (epoch, step) and everything after them."""
        if self._top is None or self._top < (epoch, step):
            return
        pos = None
        for (e, s), off in self._offsets.items():
            if (e, s) >= (epoch, step) and (pos is None or off < pos):
                pos = off
        if pos is not None:
            self._f.flush()
            self._f.truncate(pos)
            self._f.seek(pos)
            self._offsets = {k: v for k, v in self._offsets.items() if v < pos}
        self._top = max(self._offsets, default=None)

    def start_epoch(self, epoch: int, steps: int, dropped_rows: int, plan_fingerprint: str, start_step: int) -> None:
        if self._continued and start_step > 0 and (epoch, start_step - 1) not in self._offsets:
            have = sorted(s for e, s in self._offsets if e == epoch and s >= 0)
            where = f"its epoch {epoch} ends at step {have[-1]}" if have else f"it has no batch of epoch {epoch}"
            raise ManifestError(
                f"cannot continue manifest {self.path} at epoch {epoch} step {start_step}: {where}, so "
                "the continued record would have a gap. Is this the manifest the interrupted run wrote? "
                "Otherwise write the resumed run to a new manifest path."
            )
        self.cut_to(epoch, start_step if start_step > 0 else -1)
        if start_step == 0 or (epoch, -1) not in self._offsets:
            self._note(epoch, -1)
            self._write_raw(json.dumps({
                "type": "epoch", "epoch": epoch, "steps": steps,
                "dropped_rows": dropped_rows, "plan": plan_fingerprint,
            }, sort_keys=True))

    def write_batch(self, epoch: int, step: int, line: str) -> None:
        self._note(epoch, step)
        self._write_raw(line)

    def _note(self, epoch: int, step: int) -> None:
        """Record that the line of (epoch, step) starts here, the next to be written."""
        key = (epoch, step)
        self._offsets[key] = self._f.tell()
        if self._top is None or self._top < key:
            self._top = key

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def batch_line(epoch: int, step: int, rows: int, digest: str, columns: dict[str, str], parts: list[str]) -> str:
    return json.dumps(
        {"type": "batch", "epoch": epoch, "step": step, "rows": rows, "hash": digest,
         "columns": columns, "parts": parts},
        separators=(",", ":"),
    )


# Header fields that record how a run executed, not what it yielded.
NON_ORDER_FIELDS = frozenset({"detload_version", "workers", "pool", "rank", "world_size", "created", "prefetch"})


def _check_header_compatible(old: Mapping[str, Any], new: Mapping[str, Any], path: str) -> None:
    diffs = [k for k in sorted(set(old) | set(new))
             if k not in NON_ORDER_FIELDS and k != "type" and old.get(k) != new.get(k)]
    if diffs:
        raise ManifestError(
            f"cannot continue manifest {path}: it was written by a run with different "
            + ", ".join(f"{k} ({old.get(k)!r} there, {new.get(k)!r} here)" for k in diffs)
            + ". Write to a new manifest path."
        )


@dataclass
class EpochRecord:
    epoch: int
    steps: int
    dropped_rows: int
    plan: str
    batches: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Manifest:
    """A parsed manifest: header, epochs in file order, and byte offsets of lines."""

    path: str
    header: dict[str, Any]
    epochs: dict[int, EpochRecord]
    offsets: dict[tuple[int, int], int]
    torn_tail: bool = False
    valid_bytes: int = 0  # length of the complete lines

    def batches(self) -> Iterator[dict[str, Any]]:
        for rec in self.epochs.values():
            yield from rec.batches


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Parse a manifest. A last line without its newline (a crash mid-write) is ignored."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    torn = lines[-1] != b""
    lines = lines[:-1]
    if not lines:
        raise ManifestError(f"{path} is empty, not a detload manifest")
    header: dict[str, Any] | None = None
    epochs: dict[int, EpochRecord] = {}
    offsets: dict[tuple[int, int], int] = {}
    pos = 0
    current: EpochRecord | None = None
    for n, raw in enumerate(lines, 1):
        off = pos
        pos += len(raw) + 1
        try:
            obj = json.loads(raw)
        except ValueError:
            raise ManifestError(f"{path} line {n} is not valid JSON") from None
        if not isinstance(obj, dict) or "type" not in obj:
            raise ManifestError(f"{path} line {n} is not a manifest record")
        kind = obj["type"]
        if n == 1:
            if kind != "header" or obj.get("format") != MANIFEST_FORMAT:
                raise ManifestError(f"{path} does not start with a detload manifest header")
            if obj.get("version") != MANIFEST_VERSION:
                raise ManifestError(f"{path} has manifest version {obj.get('version')}, this detload reads {MANIFEST_VERSION}")
            header = obj
            continue
        try:
            if kind == "epoch":
                current = EpochRecord(int(obj["epoch"]), int(obj["steps"]), int(obj["dropped_rows"]), str(obj["plan"]))
                epochs[current.epoch] = current
                offsets[(current.epoch, -1)] = off
            elif kind == "batch":
                if current is None or obj["epoch"] != current.epoch:
                    raise ManifestError(f"{path} line {n}: a batch outside its epoch's section")
                expected = len(current.batches)
                if obj["step"] != expected and not current.batches and obj["step"] > 0:
                    pass  # a resumed section may start later only if the earlier steps were cut away
                current.batches.append(obj)
                offsets[(current.epoch, int(obj["step"]))] = off
                _ = obj["hash"], obj["rows"], obj["columns"]
            else:
                raise ManifestError(f"{path} line {n}: unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"{path} line {n}: malformed {kind} record ({exc})") from None
    assert header is not None
    return Manifest(path, header, epochs, offsets, torn, pos)
