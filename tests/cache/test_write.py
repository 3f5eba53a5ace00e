"""The entry write: one vectored call where the system allows, correct across short writes."""

from __future__ import annotations

import os

import numpy as np

from detload._cache import write


def test_entry_writes_survive_short_writes_and_many_buffers(tmp_path, monkeypatch):
    # An entry is written with one vectored call (the page cache then holds it in large
    # folios, cheap to map); the system may write less than asked, or take fewer buffers.
    calls = []
    real = os.pwritev

    def short(fd, bufs, at):
        calls.append(len(bufs))
        # Writes a prefix of what it was given: at most 3 buffers, often ending inside one.
        head = b"".join(bytes(b) for b in bufs[:3])
        return real(fd, [head[: max(1, len(head) * 2 // 3)]], at)

    monkeypatch.setattr(write.os, "pwritev", short)
    rng = np.random.default_rng(0)
    bufs = [rng.integers(0, 255, size=int(n), dtype=np.uint8) for n in rng.integers(0, 40, size=3000)]
    bufs.insert(7, b"")
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        write._pwritev_all(fd, bufs, 10)
    finally:
        os.close(fd)
    want = b"\0" * 10 + b"".join(bytes(b) for b in bufs)
    assert path.read_bytes() == want
    assert len(calls) > 1 and max(calls) <= write._IOV_MAX
