"""The layout tool, as a library: rewrite a dataset sorted or grouped by keys so that filters
prune it (`rewrite`), prove with an order-independent content digest that nothing was lost or
changed (`digest`), and check how well any writer's files prune (`check`).

The command line has the same three: ``detload layout``, ``detload digest`` and
``detload check-layout`` (docs/layout.md). The sort runs out of core in DuckDB, the
``layout`` extra (``pip install "detload[layout]"``).
"""

from __future__ import annotations

from ._layout.check import LayoutCheck
from ._layout.check import check_layout as check
from ._layout.digest import Digest, digest
from ._layout.rewrite import LayoutReport
from ._layout.rewrite import layout as rewrite
from .errors import DigestMismatchError, LayoutError, UnfinishedLayoutWarning

__all__ = [
    "Digest",
    "DigestMismatchError",
    "LayoutCheck",
    "LayoutError",
    "LayoutReport",
    "UnfinishedLayoutWarning",
    "check",
    "digest",
    "rewrite",
]
