"""Transform functions the transform tests hand to loaders: module-level, so process workers can
import them; `Counted` counts calls in a file (one line per call), shared by threads and processes."""

from __future__ import annotations

import numpy as np

from detload import Ragged, Transform


class Counted:
    """``fn`` that appends a line to ``path`` per call (a forkserver's workers do not see a test's
    environment variables, so the path travels with the function)."""

    def __init__(self, fn, path: str) -> None:
        self.fn = fn
        self.path = path

    def __call__(self, cols, ctx):
        with open(self.path, "a") as f:
            f.write("x\n")
        return self.fn(cols, ctx)


def calls(path: str) -> int:
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def hashed(cols, ctx):
    """Deterministic: bucketize the id, log-normalise a float, a crossed feature, a string kept."""
    ids = cols["id"]
    return {
        "id": np.array(ids),
        "bucket": (ids * 2654435761 % 97).astype(np.int32),
        "logf": np.log1p(np.abs(cols["f32"].astype(np.float64))),
        "cross": np.stack([ids % 7, ids % 11], axis=1).astype(np.int16),
        "s": cols["s"],
    }


def hashed_v2(cols, ctx):
    out = hashed(cols, ctx)
    out["bucket"] = out["bucket"] + np.int32(1)
    return out


def dropout(cols, ctx):
    """Random: feature dropout, a random negative id and a permuted copy, from ctx's streams."""
    n = ctx.rows
    keep = ctx.rng.random(n) >= 0.3
    return {
        "id": np.array(cols["id"]),
        "f32": np.where(keep, cols["f32"], np.float32(0)),
        "neg": ctx.integers(n, 1_000_000),
        "u": ctx.uniform(n),
        "perm": cols["id"][ctx.permutation(n)],
        "s": cols["s"],
    }


def evens(cols, ctx):
    """rows='changes': keep even ids, and repeat ids divisible by 3 (filter and explode)."""
    ids = cols["id"]
    keep = ids[ids % 2 == 0]
    out = np.repeat(keep, np.where(keep % 3 == 0, 2, 1))
    return {"id": out, "half": out // 2}


def ragged_words(cols, ctx):
    """A Ragged output built by the transform (the string's bytes, reversed)."""
    s = cols["s"]
    lengths = np.diff(s.offsets)
    values = np.ascontiguousarray(s.values[::-1])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths[::-1], out=offsets[1:])
    return {"id": np.array(cols["id"]), "rev": Ragged(values, offsets, "binary")}


def writes_input(cols, ctx):
    cols["id"][0] = -1
    return dict(cols)


def raises_late(cols, ctx):
    if ctx.file_index == 1:
        raise KeyError("no such feature")
    return {"id": np.array(cols["id"])}


def dtype_drifts(cols, ctx):
    ids = cols["id"]
    return {"id": ids.astype(np.int32) if ctx.file_index == 1 else ids.astype(np.int64)}


def unequal_late(cols, ctx):
    ids = cols["id"]
    return {"id": ids, "half": ids[: len(ids) - (1 if ctx.file_index == 1 else 0)]}


def not_a_dict(cols, ctx):
    return [cols["id"]]


def not_arrays(cols, ctx):
    return {"id": list(cols["id"])}


def sneaky_random(cols, ctx):
    return {"id": np.array(cols["id"]), "noise": np.random.random(ctx.rows)}


def rng_undeclared(cols, ctx):
    return {"id": np.array(cols["id"]), "noise": ctx.rng.random(ctx.rows)}


def changes_count(cols, ctx):
    """rows='same' declared, but a row dropped."""
    return {"id": cols["id"][1:]}


HASHED = Transform(hashed, name="hash", version="1")
DROPOUT = Transform(dropout, name="dropout", version="1", random=True)
EVENS = Transform(evens, name="evens", version="1", rows="changes")


class FewerOnRerun:
    """rows='changes', and one row fewer for row groups other than the first on every call after the
    first (a transform that is not deterministic): the workers' run disagrees with planning's."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, cols, ctx):
        ids = cols["id"]
        key = f"{ctx.file_index}/{ctx.row_group}\n"
        with open(self.path, "a+") as f:
            f.seek(0)
            seen = f.read().count(key)
            f.write(key)
        cut = 1 if seen and (ctx.file_index, ctx.row_group) != (0, 0) else 0
        return {"id": ids[: len(ids) - cut]}


def where_from(cols, ctx):
    """Each delivered row's index among its row group's stored rows (ctx.selected, else 0..rows)."""
    stored = ctx.selected if ctx.selected is not None else np.arange(ctx.rows)
    return {"id": np.array(cols["id"]), "stored": np.asarray(stored, dtype=np.int64),
            "rg": np.full(ctx.rows, ctx.file_index * 100 + ctx.row_group, dtype=np.int64)}


def writes_input_late(cols, ctx):
    """Writes into its input, but only on the second file's row groups (so in a worker, not at planning)."""
    if ctx.file_index == 1:
        cols["f32"][:] = 0
    return {"id": np.array(cols["id"]), "f32": np.array(cols["f32"])}


def doubled_price(cols, ctx):
    """Under group_by: keeps the key (and every row), adds a column."""
    return {"q": cols["q"], "item": np.array(cols["item"]), "price2": cols["price"] * np.float32(2)}


def moved_key(cols, ctx):
    return {"q": cols["q"][::-1].copy(), "item": np.array(cols["item"])}


def dropped_key(cols, ctx):
    return {"item": np.array(cols["item"])}


class evens_of:  # noqa: N801 - used like a function
    """rows='changes': keep the rows whose column ``name`` is even."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, cols, ctx):
        keep = cols[self.name] % 2 == 0
        return {k: np.asarray(v)[keep] for k, v in cols.items()}
