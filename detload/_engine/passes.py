"""The pass-number ("generation") rules: which pass's work is wanted, and who moves the number.

Every pass of the loader (an epoch, or the rest of one after a resume) gets a
number from the pool's `Passes`; tasks, blocks and statuses carry it. One
shared value, the *oldest wanted* number, decides what is stale: workers read it
(thread workers this object, process workers the same rules over a slot of
`_spawn.SharedInts`), the consumer's thread and the merger move it, only ever up.
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["CLOSED", "EVERY", "Counter", "Passes", "concerns"]

#: The oldest wanted number of a closing pool: every pass is stale, also those queued ahead.
CLOSED = 2**62
#: The number of a worker's message that concerns every pass (it could not start, or its loop failed).
EVERY = -1


class Value(Protocol):
    """An int with a ``value``: `Counter` here, a `_spawn.Slot` shared with worker processes."""

    value: int


class Counter:
    """The oldest wanted number when nothing outside this process reads it (thread workers)."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = value


class Passes:
    """The pass-number rules of one pool.

    - `begin` (a new pass) makes its number the oldest wanted; `fresh` gives that
      number, newer than any handed out, so whatever was built for a pass that did
      not come is stale.
    - `ahead` numbers the pass built ahead of pass ``n``: ``n + 1``, queued behind
      pass ``n`` and wanted while it runs (`is_stale` is false for newer numbers).
    - `stop` says what a stop cancels: pass ``n`` alone once its every block was
      taken (what was built ahead stays wanted), else pass ``n`` and the one built
      ahead of it. `cancel` makes a number and all older ones stale.
    - `close` makes every number stale, also those queued ahead; workers then leave.

    The merger (on a failure) and the consumer's thread (stopping a run) may move
    the number at once; it only ever grows, or blocks built ahead that one of them
    had freed could look wanted again. Worker processes only read it (`is_stale`,
    `closed`) through the slot they map, wrapped in a `Passes` of their own.
    """

    __slots__ = ("_issued", "_lock", "_wanted")

    def __init__(self, wanted: Value | None = None) -> None:
        self._wanted: Value = wanted if wanted is not None else Counter(0)
        self._lock = threading.Lock()
        self._issued = 0  # the newest number handed out by fresh() or ahead()

    @property
    def oldest(self) -> int:
        """The oldest wanted number: work of an older pass is stale."""
        return self._wanted.value

    def is_stale(self, n: int) -> bool:
        """Whether work of pass ``n`` is to be dropped (a newer one, built ahead, is not)."""
        return self._wanted.value > n

    @property
    def closed(self) -> bool:
        return self._wanted.value >= CLOSED

    def fresh(self) -> int:
        """The number of a pass that was not built ahead: newer than any wanted or handed out."""
        with self._lock:
            n = self._issued = max(self._wanted.value, self._issued) + 1
            return n

    def ahead(self, n: int) -> int:
        """The number of the pass built ahead while pass ``n`` runs."""
        with self._lock:
            self._issued = max(self._issued, n + 1)
            return n + 1

    def begin(self, n: int) -> None:
        """Pass ``n`` starts: older passes are stale (a late begin of an older pass changes nothing)."""
        self._raise_to(n)

    def cancel(self, n: int) -> None:
        """Make pass ``n`` and every older one stale: workers drop their remaining tasks."""
        self._raise_to(n + 1)

    def stop(self, n: int, *, merged: bool) -> None:
        """Pass ``n`` stops: only it when ``merged`` (the merger took its every block, so the
        queues hold only what was built ahead, which stays wanted), else it and the pass
        built ahead of it (its blocks would wait in the queues behind this pass's)."""
        self.cancel(n if merged else n + 1)

    def close(self) -> None:
        """Every pass is stale, those queued ahead too."""
        self._raise_to(CLOSED)

    def _raise_to(self, n: int) -> None:
        with self._lock:
            if self._wanted.value < n:
                self._wanted.value = n

    def __repr__(self) -> str:
        return f"Passes(oldest={self.oldest}, issued={self._issued})"


def concerns(message: int, n: int) -> bool:
    """Whether a worker's message numbered ``message`` belongs to pass ``n`` (or to every pass)."""
    return message in (n, EVERY)
