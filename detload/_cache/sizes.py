"""Byte sizes: parsing a size option ("20GiB"), and the physical memory this process may use
(the machine's, or its cgroup's limit if lower)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from ..errors import OptionError


def parse_size(value: int | str | None, name: str, *, zero: bool = False,
               also: str = "") -> int | None:
    """A size option: bytes as an int, or a string such as "500MB", "20GiB", "1.5T".

    ``name`` is the option as the caller spelled it ("Cache.limit", or a command-line flag such
    as "--cache-limit"), for the messages.

    ``zero``: 0 is allowed (it turns the feature off) instead of refused. ``also``:
    appended to the messages that say what a size looks like (other accepted values).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(f"{name} must be a byte count or a size such as '20GiB', got {value!r}{also}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    elif isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        units = {"": 1, "B": 1}
        for i, p in enumerate("KMGT", start=1):
            units[p] = units[p + "B"] = 1000**i
            units[p + "I"] = units[p + "IB"] = 1024**i
        num = text.rstrip("KMGTIB")
        unit = text[len(num):]
        try:
            n = int(float(num) * units[unit])  # "inf" overflows, "nan" is a ValueError
        except (ValueError, KeyError, OverflowError):
            raise OptionError(f"{name} {value!r} is not a size; use bytes or e.g. '500MB', '20GiB'{also}") from None
    else:
        raise OptionError(f"{name} must be a byte count or a size such as '20GiB', got {value!r}{also}")
    if n < 0 or (n == 0 and not zero):
        raise OptionError(f"{name} must be {'0 or more' if zero else 'positive'}, got {value!r}")
    return n


def _cgroup_limits() -> Iterator[str]:
    """Memory limit files of this process's cgroup and of the groups above it (v2, then v1)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            root, name = "/sys/fs/cgroup", "memory.max"
        elif "memory" in controllers.split(","):
            root, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in rel.split("/") if p]
        for i in range(len(parts), -1, -1):
            yield os.path.join(root, *parts[:i], name)


def memory_available() -> int:
    """Physical memory this process may use: the machine's, or a cgroup's limit if lower."""
    total = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for path in _cgroup_limits():
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue  # a group above ours that this namespace does not show
        if text.isdigit():
            total = min(total, int(text))
    return total
