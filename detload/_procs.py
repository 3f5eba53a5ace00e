"""Whether a process that left something behind (a shared-memory segment, a cache temp file)
is still alive: one rule, below both the engine and the cache."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed process nobody reaped yet).

    The one rule for "is the process that left this alive", for shared-memory
    segments (_engine.shm) and for the row-group cache's temp files (`_cache._dead_writer`).
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # no procfs (or it just went): signal 0 reached it
        return True
    # "pid (comm) S ...": the state follows the last ')', since comm may hold one.
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z"
