"""Whether, and from where, another process can import this process's main module.

Worker processes import it to find the functions their configuration names, and a
`Transform` whose function lives in an unimportable main module (stdin, ``python -c``,
a notebook) is sent by value instead; both ask here.
"""

from __future__ import annotations

import os
import pickletools
import sys
from typing import Any

__all__ = ["MainSource", "main_references", "main_source", "unimportable_main"]

#: How a worker imports the main module: ("init_main_from_name", module) or ("init_main_from_path", file),
#: as multiprocessing's preparation data names it.
MainSource = tuple[str, str]


def main_references(data: bytes) -> list[str]:
    """The names of module ``__main__`` (classes, functions) that the pickle ``data`` refers to."""
    if b"__main__" not in data:  # the common case, at the speed of a bytes search
        return []
    found: list[str] = []
    memo: dict[int, Any] = {}
    tops: list[Any] = []  # the values the last ops put on top of the stack (strings, else None)
    for op, arg, _ in pickletools.genops(data):
        name = op.name
        if name in ("GLOBAL", "INST"):
            module, _, qualname = str(arg).partition(" ")
            if module == "__main__":
                found.append(qualname)
            tops.append(None)
        elif name == "STACK_GLOBAL":
            # Its module and name are the two values pushed just before.
            if len(tops) >= 2 and tops[-2] == "__main__":
                found.append(str(tops[-1]))
            tops.append(None)
        elif name == "MEMOIZE":
            memo[len(memo)] = tops[-1] if tops else None
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = tops[-1] if tops else None  # type: ignore[index]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            tops.append(memo.get(arg))  # type: ignore[arg-type]
        elif name not in ("PROTO", "FRAME", "STOP"):
            tops.append(arg if isinstance(arg, str) else None)
        del tops[:-2]
    return sorted(set(found))


def main_source() -> MainSource | None:
    """Where a worker process can import this process's main module from; None if it cannot."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str) and name != "__main__" and not name.endswith(".__main__"):
        return ("init_main_from_name", name)  # python -m module
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and os.path.isfile(path):  # stdin's is '<stdin>'; -c and notebooks have none
        from multiprocessing import process

        origin = getattr(process, "ORIGINAL_DIR", None)  # where the program started
        if not os.path.isabs(path) and origin is not None:
            path = os.path.join(origin, path)
        return ("init_main_from_path", os.path.normpath(path))
    return None


def unimportable_main() -> str:
    """Why the main module has no file a worker could import (for messages)."""
    main = sys.modules.get("__main__")
    if getattr(main, "__file__", None) == "<stdin>":
        return "the program was read from standard input"
    if sys.argv[:1] == ["-c"]:
        return "the program was given with python -c"
    return "this is an interactive session (a notebook, IPython or the Python prompt)"
