"""Option checks shared by every entry point: integers, durations and paths detload will write.

Each check returns the plain Python value or raises `OptionError` with a message
that names the option, the accepted range and the value given.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .errors import OptionError

__all__ = ["check_cache_dir", "check_int", "check_no_nul", "check_path", "check_seconds", "check_writable_file",
           "folder_problem", "folder_text"]


def check_int(name: str, value: Any, lo: int, hi: int | None = None, *, below: int | None = None,
              what: str = "", shown: str = "") -> int:
    """``value`` as an int in ``[lo, hi]`` (or ``[lo, below)``), else OptionError.

    bool is refused (``True`` is an int to Python, never a count to a user); NumPy
    integers are accepted. ``what`` says in a few words what the number counts;
    ``shown`` writes the range in the message another way ("[0, 2**32)").
    """
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if ok and value >= lo and (hi is None or value <= hi) and (below is None or value < below):
        return int(value)
    if shown:
        bound = f"in {shown}"
    elif below is not None:
        bound = f"in [{lo}, {below})"
    elif hi is not None:
        bound = f"in [{lo}, {hi}]"
    else:
        bound = f">= {lo}"
    got = repr(value) if ok else f"{type(value).__name__} {value!r}"
    note = f" ({what})" if what else ""
    raise OptionError(f"{name} must be an int {bound}{note}, got {got}")


def check_seconds(name: str, value: Any, *, most: float, none_means: str) -> float | None:
    """A positive duration in seconds up to ``most``, or None (``none_means`` says what None does)."""
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
    if ok:
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond the float range
            seconds = math.inf
        if 0 < seconds <= most:
            return seconds
    raise OptionError(f"{name} must be a positive number of seconds up to {most:g}, or None ({none_means}), "
                      f"got {type(value).__name__} {value!r}")


def check_path(name: str, value: Any) -> str:
    """A filesystem path given as str or os.PathLike[str]; bytes are refused by name."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str):
            check_no_nul(name, path)
            return path
        value = path
    if isinstance(value, (bytes, bytearray)):
        raise OptionError(f"{name} must be a str or os.PathLike path, got bytes {bytes(value)!r}: "
                          f"decode it first ({name}={bytes(value).decode('utf-8', 'replace')!r})")
    raise OptionError(f"{name} must be a str or os.PathLike path, got {type(value).__name__} {value!r}")


def check_writable_file(name: str, path: str) -> None:
    """Refuse, before anything runs, a file path that cannot be created or written.

    Nothing is created: the nearest existing folder above ``path`` must be a folder
    this process may write into (``os.access`` also reports a read-only file system),
    and ``path`` itself, when it exists, a writable regular file.
    """
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise OptionError(f"{name} {path} is a directory; give a file path")
    if os.path.exists(full):
        if not os.access(full, os.W_OK):
            raise OptionError(f"{name} {path} is not writable (permissions, or a read-only file system)")
        return
    problem = _uncreatable(os.path.dirname(full))
    if problem is not None:
        raise OptionError(f"{name} {path} cannot be created: {problem}")


def folder_problem(path: str) -> str | None:
    """Why a folder at ``path`` could not be made or written into, or None where it could
    (it is one this process may write into, or the nearest existing folder above it is).
    Nothing is created: `detload plan` asks what a run's `Cache.dir` would do."""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        return None if os.access(full, os.W_OK | os.X_OK) else (
            f"{full} is not writable (permissions, or a read-only file system)")
    return _uncreatable(full)


def _uncreatable(full: str) -> str | None:
    """Why ``full`` (absolute, not an existing folder) could not be created: the nearest
    existing path above it is a file, or a folder this process may not write into."""
    parent = full
    while not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.path.isdir(parent):
        return f"{parent} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable (permissions, or a read-only file system)"
    return None


def check_no_nul(name: str, path: str) -> None:
    """Refuse a path or URI holding a NUL character: no file system can name one, and the OS
    interfaces would fail later with a message about an "embedded null byte" that names nothing."""
    at = path.find("\x00")
    if at >= 0:
        raise OptionError(f"{name} {path!r} holds a NUL character (\\x00) at position {at}, which no path "
                          "or URI can contain; remove it")


def check_cache_dir(name: str, dir: Any) -> str:
    """A cache folder ``dir`` as text, refused (`OptionError`, naming ``name``) where it is no
    path, empty, or names a file. Checked where the option is given and again where the cache
    is opened (`_cache.open_cache`: a file may have come there since), so that `detload plan`,
    which does not open the cache, refuses what `detload run` would."""
    text = folder_text(name, dir, "a path (str or os.PathLike)")
    base = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(base) and not os.path.isdir(base):
        raise OptionError(f"{name} {base!r} exists and is not a directory")
    return text


def folder_text(name: str, value: Any, kinds: str) -> str:
    """A folder option's path as text, refused (`OptionError`, naming ``name``) where it is no
    path (the message says it must be ``kinds``), blank, or holds a NUL. Blank is refused: ""
    would make the current directory the folder (an unset $CACHE_DIR in a script)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise OptionError(f"{name} must be {kinds}, got {value!r}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text.strip():
        raise OptionError(f"{name} must name a folder, got {value!r}")
    check_no_nul(name, text)
    return text
