"""Test and benchmark hooks, kept out of every public signature: fault injection (`DebugHooks`,
which workers obey), a cache write failure, the benchmark's unordered merge and the torch
adapter's per-column copy path.

A `Loader` or `TorchLoader` takes the hooks in force when it is built (``with installed(Hooks(...)):``);
production code never sets them. tests/testhooks.py wraps this for the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = ["NO_HOOKS", "DebugHooks", "Hooks", "current", "installed"]


@dataclass(frozen=True)
class DebugHooks:
    """Test hooks (never set in production): random per-unit delays and injected failures.

    ``delay_max`` seconds of delay, pseudo-random per (seed, epoch, unit) from
    ``delay_seed``; ``fail_unit`` a (relative path, row group) whose read raises
    ``fail_exc`` (an exception instance); ``stall_unit`` a unit whose read blocks
    for ``stall_seconds`` (only in epoch ``stall_epoch`` when that is set);
    ``die_unit`` a unit whose read kills the process (with ``die_signal``).
    """

    delay_max: float = 0.0
    delay_seed: int = 0
    fail_unit: tuple[str, int] | None = None
    fail_exc: BaseException | None = None
    stall_unit: tuple[str, int] | None = None
    stall_seconds: float = 3600.0
    stall_epoch: int | None = None
    die_unit: tuple[str, int] | None = None
    block_delay_max: float = 0.0  # benchmark/test: pseudo-random sleep before each block
    #: A unit whose file the reader truncates to half right after its pre-read size check,
    #: as a rewrite racing that read would (through a memory map: a real SIGBUS).
    shrink_unit: tuple[str, int] | None = None
    die_signal: int = 9  # the signal die_unit kills with


@dataclass(frozen=True)
class Hooks:
    """What a test or benchmark changes in a loader built while these are installed.

    - ``debug``: worker delays and injected failures (`DebugHooks`), handed to every worker.
    - ``cache_fail_after_bytes``: each worker's cache writes fail as if the disk filled up
      after this many bytes.
    - ``unordered``: the merger takes blocks in completion order, so batches depend on
      timing (the determinism-tax measurement); refused with a manifest.
    - ``torch_per_column``: `TorchLoader` pins and copies column by column (the path
      before the one-slab copy), to measure the slab against it.
    - ``torch_staged``: `TorchLoader` with ``device="cuda"`` and process workers packs every
      batch into a pinned buffer in its feeder thread (the path before the registered hand-off
      of detload/torch/handoff.py), so one benchmark run measures both.
    - ``torch_registrar``: a ``(register(address, nbytes) -> bool, unregister(address))`` pair
      standing in for ``cudaHostRegister``: `TorchLoader` then takes the registered hand-off on
      the CPU too (``device="cpu"``, process workers; the "device copy" is a clone), so tests and
      the GPU script's CPU run exercise it.
    """

    debug: DebugHooks | None = None
    cache_fail_after_bytes: int | None = None
    unordered: bool = False
    torch_per_column: bool = False
    torch_staged: bool = False
    torch_registrar: Any = None


NO_HOOKS = Hooks()
_current: ContextVar[Hooks] = ContextVar("detload_hooks", default=NO_HOOKS)


def current() -> Hooks:
    """The hooks in force here (`NO_HOOKS` outside any `installed`)."""
    return _current.get()


@contextmanager
def installed(hooks: Hooks) -> Iterator[Hooks]:
    """Loaders built inside this block take ``hooks``."""
    token = _current.set(hooks)
    try:
        yield hooks
    finally:
        _current.reset(token)
