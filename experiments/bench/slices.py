"""The slices of the slice-read benchmark, each in every spelling a reader under test takes.

A slice is detload filter text, a pyarrow DNF list (Petastorm's ``filters=``) and a NumPy mask
built from that DNF (the pyarrow baseline, and Petastorm's vectorised ``predicate``). Imports
only numpy and the standard library: bench_slice.py and petastorm_slice_runner.py (in the
Petastorm venv) both load it, so every reader selects by the same definition.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The table's date column spans this year, uniformly: a month is about 8.5 % of the rows.
DAY0 = dt.date(2025, 1, 1)
DAYS = 365
SEGMENTS = 100

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


@dataclass(frozen=True)
class Slice:
    name: str
    share: float  # expected fraction of rows
    text: str     # detload's filter text
    dnf: tuple[tuple[str, str, Any], ...]  # one conjunction, pyarrow's spelling

    def columns(self) -> list[str]:
        return sorted({c for c, _, _ in self.dnf})

    def mask(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """Rows of ``columns`` (NumPy arrays; dates as datetime64[D]) the slice selects."""
        return dnf_mask(self.dnf, columns)

    def dnf_json(self) -> list[list[Any]]:
        """The DNF with dates as {"date": "YYYY-MM-DD"}, to hand to another process."""
        return [[c, op, {"date": v.isoformat()} if isinstance(v, dt.date) else v] for c, op, v in self.dnf]


def dnf_from_json(items: Sequence[Sequence[Any]]) -> tuple[tuple[str, str, Any], ...]:
    def value(v: Any) -> Any:
        return dt.date.fromisoformat(v["date"]) if isinstance(v, dict) else v

    return tuple((str(c), str(op), value(v)) for c, op, v in items)


def dnf_mask(dnf: Sequence[tuple[str, str, Any]], columns: Mapping[str, np.ndarray]) -> np.ndarray:
    mask: np.ndarray | None = None
    for col, op, value in dnf:
        arr = np.asarray(columns[col])
        if isinstance(value, dt.date) and arr.dtype != object:
            value = np.datetime64(value, "D")
        # Petastorm hands dates over as datetime.date objects: comparing those directly is
        # 25x faster than astype("datetime64[D]"), which converts one object at a time.
        m = _OPS[op](arr, value)
        mask = m if mask is None else mask & m
    assert mask is not None
    return mask


_MARCH = (dt.date(2025, 3, 1), dt.date(2025, 4, 1))

SLICES: dict[str, Slice] = {
    "1%": Slice("1%", 0.01, "segment == 7", (("segment", "==", 7),)),
    "10%": Slice("10%", 0.10, "10 <= segment < 20", (("segment", ">=", 10), ("segment", "<", 20))),
    "two-key": Slice(
        "two-key", 0.01 * 31 / 365,
        f'segment == 7 and date("{_MARCH[0]}") <= day < date("{_MARCH[1]}")',
        (("segment", "==", 7), ("day", ">=", _MARCH[0]), ("day", "<", _MARCH[1])),
    ),
}
