"""Built-in feature transforms for recommendation models: a stable hash of strings, binaries and
integers to N buckets, vocabulary lookup from a file, and `chain` to run several transforms as one.
Each is a deterministic, versioned `detload.Transform` (run in the workers, an order option, cached).
See docs/transforms.md, "Built-in feature transforms".
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._types import Ragged
from ._xxh3 import hash_bytes, hash_words
from .errors import DataError, OptionError
from .transform import RowsMode, Transform, TransformContext

__all__ = ["DEFAULT_SEED", "FORMAT", "chain", "hash64", "hash_buckets", "vocabulary"]

#: The seed `hash_buckets` and `hash64` use unless told otherwise.
DEFAULT_SEED = 0

#: Part of every built-in transform's version: bumped whenever one of them returns other values
#: for the same parameters, so that cached outputs and saved states of the old ones are not reused.
FORMAT = 1

_HASHABLE = "integers (any width), strings (UTF-8) and binary values, or lists of them"


# -- hashing ----------------------------------------------------------------------------

def _check_seed(seed: Any, where: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise OptionError(f"{where}: seed must be an int in [0, 2**64), got {type(seed).__name__} {seed!r}")
    return int(seed)


def _words(a: np.ndarray) -> np.ndarray:
    """An integer array's values as the uint64 bits of their int64 (or, for uint64, their own) value."""
    if a.dtype.kind == "u" and a.dtype.itemsize == 8:
        return a.astype(np.uint64, copy=False)
    return a.astype(np.int64, copy=False).view(np.uint64)


def _hash_ints(seed: int, a: np.ndarray) -> np.ndarray:
    return hash_words(_words(a), seed)


def _bytes_of(r: Ragged) -> np.ndarray:
    """A string or binary column's bytes (its values; a list column's are another Ragged)."""
    assert isinstance(r.values, np.ndarray), "a string or binary Ragged holds its bytes as values"
    return r.values


def _hash_text(seed: int, r: Ragged) -> np.ndarray:
    return hash_bytes(_bytes_of(r), r.offsets, seed)


def _bucket_ints(seed: int, m: np.uint64, a: np.ndarray) -> np.ndarray:
    return (hash_words(_words(a), seed) % m).astype(np.int64)


def _bucket_text(seed: int, m: np.uint64, r: Ragged) -> np.ndarray:
    return (hash_bytes(_bytes_of(r), r.offsets, seed) % m).astype(np.int64)


def _map(name: str, col: Any, leaf: Callable[[np.ndarray], np.ndarray],
         text: Callable[[Ragged], np.ndarray], who: str) -> Any:
    """``col`` with each value replaced: ``leaf`` maps an integer array (any shape), ``text`` a
    Ragged of strings or binaries (one result per row); a list column keeps its offsets."""
    if isinstance(col, Ragged):
        if col.kind in ("utf8", "binary"):
            return text(col)
        inner = _map(name, col.values, leaf, text, who)
        return Ragged(inner, col.offsets, "list")
    if isinstance(col, np.ndarray):
        if col.dtype.kind in "iu":
            return leaf(col)
        what = f"{col.dtype} values" if col.dtype.kind != "O" else "Python objects"
        inside = "" if col.ndim == 1 else f" (shape {col.shape})"
        raise DataError(f"{who}: column {name!r} holds {what}{inside}; it takes {_HASHABLE}. Leave {name!r} "
                        "out, or turn it into integers in a transform of your own run first "
                        "(detload.features.chain)")
    raise DataError(f"{who}: column {name!r} is a {type(col).__name__}, not a NumPy array or a detload.Ragged; "
                    f"it takes {_HASHABLE}")


def hash64(column: Any, seed: int = DEFAULT_SEED, *, name: str = "column") -> Any:
    """XXH3-64 with ``seed`` of every value of ``column``, as uint64 (the hash `hash_buckets` reduces).

    An integer array (any width, any shape) hashes each value's 8 little-endian bytes after widening
    to int64 (uint64: its own 8 bytes), keeping the shape; a `Ragged` of strings or binaries hashes
    each row's bytes (UTF-8 for strings) into a 1-D array; a `Ragged` list keeps its offsets and
    hashes its values. The same value as ``xxhash.xxh3_64_intdigest(bytes, seed)`` on every platform.
    """
    seed = _check_seed(seed, "hash64")
    return _map(name, column, functools.partial(_hash_ints, seed), functools.partial(_hash_text, seed), "hash64")


def _identity_version(params: Mapping[str, Any]) -> str:
    return json.dumps({"format": FORMAT, **params}, sort_keys=True, separators=(",", ":"))


class _HashBuckets:
    """The function of `hash_buckets` (a class, so that worker processes import it by name)."""

    def __init__(self, buckets: dict[str, int], seed: int) -> None:
        self.buckets = buckets
        self.seed = seed

    def __call__(self, columns: Mapping[str, Any], ctx: TransformContext) -> dict[str, Any]:
        _require(columns, self.buckets, "hash_buckets")
        out: dict[str, Any] = {}
        for name, col in columns.items():
            n = self.buckets.get(name)
            if n is None:
                out[name] = col
                continue
            m = np.uint64(n)
            out[name] = _map(name, col, functools.partial(_bucket_ints, self.seed, m),
                             functools.partial(_bucket_text, self.seed, m), "hash_buckets")
        return out


def _require(columns: Mapping[str, Any], names: Mapping[str, Any] | list[str], who: str) -> None:
    missing = [c for c in names if c not in columns]
    if missing:
        raise DataError(f"{who}: column {missing[0]!r} is not among the columns it was given "
                        f"({', '.join(map(repr, columns)) or 'none'}); add it to the Loader's columns= "
                        "or correct the name")


def hash_buckets(buckets: Mapping[str, int], *, seed: int = DEFAULT_SEED, cache: bool = True) -> Transform:
    """A `Transform` replacing each column named in ``buckets`` by int64 bucket ids in [0, N).

    ``bucket = xxh3_64(canonical bytes, seed) % N``: UTF-8 bytes for a string, the bytes themselves
    for a binary value, the 8 little-endian bytes of the int64 value for an integer of any width
    (uint64: its own 8 bytes). A string or binary column becomes a 1-D int64 array; an integer
    array keeps its shape; a list column keeps its offsets. Other columns pass through unchanged.
    Deterministic and versioned by its parameters, so it is an order option and its output is cached.
    """
    who = "hash_buckets"
    if not isinstance(buckets, Mapping) or not buckets:
        raise OptionError(f"{who} needs a non-empty dict {{column: number of buckets}}, got "
                          f"{type(buckets).__name__} {buckets!r}")
    checked: dict[str, int] = {}
    for name, n in buckets.items():
        if not isinstance(name, str) or not name:
            raise OptionError(f"{who}: column names must be non-empty strings, got {name!r}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 2**63:
            raise OptionError(f"{who}: column {name!r} asks for {n!r} buckets; give an int from 1 to 2**63")
        checked[name] = int(n)
    seed = _check_seed(seed, who)
    version = _identity_version({"buckets": checked, "seed": seed})
    return Transform(_HashBuckets(checked, seed), name="detload.features.hash_buckets", version=version,
                     cache=cache)


# -- vocabulary -------------------------------------------------------------------------

class _Table:
    """A vocabulary's lookup structures, built once per process on first use."""

    def __init__(self, tokens: list[bytes]) -> None:
        lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        self.offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.values = np.frombuffer(b"".join(tokens), dtype=np.uint8)
        h = hash_bytes(self.values, self.offsets, 0)
        self.order = np.argsort(h, kind="stable")
        self.sorted = h[self.order]
        # Two tokens sharing a 64-bit hash: the rows with that hash are looked up exactly, in Python.
        dup = self.sorted[1:] == self.sorted[:-1]
        self.shared = np.unique(self.sorted[1:][dup])
        self.exact = {t: i + 1 for i, t in enumerate(tokens)} if self.shared.size else None
        # Integer values are looked up by their decimal text: the tokens that are such texts.
        signed, unsigned = [], []
        for i, t in enumerate(tokens):
            try:
                v = int(t)
            except ValueError:
                continue
            if str(v).encode() != t:
                continue  # '+5', '007', ' 5', '1_0': never an integer's text
            if -(2**63) <= v < 2**63:
                signed.append((v, i + 1))
            if 0 <= v < 2**64:
                unsigned.append((v, i + 1))
        self.ints = {
            "i": _sorted_pairs(signed, np.int64),
            "u": _sorted_pairs(unsigned, np.uint64),
        }

    def lookup_bytes(self, r: Ragged, oov: int) -> np.ndarray:
        n = len(r)
        out = np.full(n, oov, dtype=np.int64)
        if n == 0 or self.sorted.size == 0:
            return out
        data = _bytes_of(r)
        h = hash_bytes(data, r.offsets, 0)
        pos = np.minimum(np.searchsorted(self.sorted, h), self.sorted.size - 1)
        hit = np.flatnonzero(self.sorted[pos] == h)
        cand = self.order[pos[hit]]  # token indices, 0-based
        lengths = r.lengths
        same = lengths[hit] == (self.offsets[cand + 1] - self.offsets[cand])
        hit, cand = hit[same], cand[same]
        # Equal hashes and lengths: compare the bytes too, all of them at once.
        ln = lengths[hit]
        total = int(ln.sum())
        if total:
            row = np.repeat(np.arange(hit.size), ln)
            within = np.arange(total) - np.repeat(np.cumsum(ln) - ln, ln)
            differ = (data[np.repeat(r.offsets[hit], ln) + within]
                      != self.values[np.repeat(self.offsets[cand], ln) + within])
            ok = np.ones(hit.size, dtype=bool)
            ok[row[differ]] = False
            hit, cand = hit[ok], cand[ok]
        out[hit] = cand + 1
        if self.exact is not None:
            for i in np.flatnonzero(np.isin(h, self.shared)).tolist():
                out[i] = self.exact.get(bytes(data[r.offsets[i]:r.offsets[i + 1]]), oov)
        return out

    def lookup_ints(self, a: np.ndarray, oov: int) -> np.ndarray:
        keys, ids = self.ints["u" if a.dtype == np.uint64 else "i"]
        vals = a.astype(keys.dtype, copy=False)
        out = np.full(a.shape, oov, dtype=np.int64)
        if keys.size == 0:
            return out
        pos = np.minimum(np.searchsorted(keys, vals), keys.size - 1)
        hit = keys[pos] == vals
        out[hit] = ids[pos[hit]]
        return out


def _sorted_pairs(pairs: list[tuple[int, int]], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    pairs.sort()
    keys = np.array([p[0] for p in pairs], dtype=dtype)
    ids = np.array([p[1] for p in pairs], dtype=np.int64)
    return keys, ids


def _tokens(content: bytes) -> list[bytes]:
    lines = content.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    return [t[:-1] if t.endswith(b"\r") else t for t in lines]


def _shown(token: bytes) -> str:
    try:
        return repr(token.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(token)


class _Vocabulary:
    """The function of `vocabulary`: it carries the file's content, so workers never reread the file."""

    def __init__(self, column: str, content: bytes, oov: int, path: str) -> None:
        self.column = column
        self.content = content
        self.oov = oov
        self.path = path
        self._table: _Table | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"column": self.column, "content": self.content, "oov": self.oov, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table = None

    def table(self) -> _Table:
        t = self._table
        if t is None:  # threads that race here build equal tables; either one is kept
            t = self._table = _Table(_tokens(self.content))
        return t

    def __call__(self, columns: Mapping[str, Any], ctx: TransformContext) -> dict[str, Any]:
        _require(columns, [self.column], f"vocabulary({self.path!r})")
        out = dict(columns)
        table = self.table()
        out[self.column] = _map(self.column, columns[self.column], lambda a: table.lookup_ints(a, self.oov),
                                lambda r: table.lookup_bytes(r, self.oov), f"vocabulary({self.path!r})")
        return out


def vocabulary(column: str, path: str | os.PathLike[str], *, oov: int = 0, cache: bool = True) -> Transform:
    """A `Transform` replacing ``column`` by the int64 id of each value in the vocabulary file ``path``.

    The file holds one token per line (split on ``\\n``; a trailing ``\\r`` is dropped, and so is the
    empty text after a final newline); the token on line ``i`` (counting from 1) has id ``i``, a value
    not in the file gets ``oov``. Strings and binaries match a token's bytes exactly; an integer
    matches the token that is its decimal text (``str(v)``). Read once, here: its SHA-256 enters the
    transform's version, so another content is another order option and another cache entry.
    """
    who = "vocabulary"
    if not isinstance(column, str) or not column:
        raise OptionError(f"{who}: column must be a non-empty str, got {column!r}")
    if not isinstance(path, (str, os.PathLike)):
        raise OptionError(f"{who}({column!r}): path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
    shown = os.fspath(path)
    try:
        with open(path, "rb") as f:
            content = f.read()
    except OSError as exc:
        raise OptionError(f"{who}({column!r}): cannot read the vocabulary file {shown!r} "
                          f"({type(exc).__name__}: {exc.strerror or exc}); give the path of a text file "
                          "with one token per line") from None
    tokens = _tokens(content)
    if not tokens:
        raise OptionError(f"{who}({column!r}): the vocabulary file {shown!r} is empty; it needs one token per line")
    seen: dict[bytes, int] = {}
    for i, t in enumerate(tokens, 1):
        first = seen.setdefault(t, i)
        if first != i:
            raise OptionError(f"{who}({column!r}): the vocabulary file {shown!r} holds the token {_shown(t)} twice, "
                              f"on lines {first} and {i}; each token must appear once")
    if isinstance(oov, bool) or not isinstance(oov, (int, np.integer)) or not -(2**63) <= oov < 2**63:
        raise OptionError(f"{who}({column!r}): oov must be an int64, got {type(oov).__name__} {oov!r}")
    if 1 <= oov <= len(tokens):
        raise OptionError(f"{who}({column!r}): oov={oov} is the id of line {oov} of {shown!r} "
                          f"(ids are 1 to {len(tokens)}); pick 0, a negative id or one above {len(tokens)}")
    version = _identity_version({"column": column, "oov": int(oov), "sha256": hashlib.sha256(content).hexdigest(),
                                 "tokens": len(tokens)})
    return Transform(_Vocabulary(column, content, int(oov), shown), name="detload.features.vocabulary",
                     version=version, cache=cache)


# -- chain ------------------------------------------------------------------------------

class _Chain:
    """The function of `chain`: each member's function on the previous one's output."""

    def __init__(self, members: tuple[Transform, ...]) -> None:
        self.members = members

    def __call__(self, columns: Mapping[str, Any], ctx: TransformContext) -> dict[str, Any]:
        from ._xform import _readonly

        cols: Mapping[str, Any] = columns
        rows, selected = ctx.rows, ctx.selected
        try:
            for i, m in enumerate(self.members, 1):
                out = m.fn(cols, ctx)
                where = f"chain member {i} ({m.name!r})"
                if not isinstance(out, Mapping) or not out:
                    shown = "an empty dict" if isinstance(out, Mapping) else type(out).__name__
                    raise DataError(f"{where} returned {shown}; each member must return a non-empty dict of "
                                    "columns")
                n = len(next(iter(out.values())))
                if n != ctx.rows:
                    if m.rows == "same":
                        raise DataError(f"{where} returned {n:,} rows, which it was given {ctx.rows:,} rows "
                                        "of: declare rows='changes' for a transform that filters or adds rows")
                    ctx.rows, ctx.selected = n, None  # later members see the new rows
                # Later members get read-only views, as the first one does.
                cols = {k: _readonly(v) if isinstance(v, (np.ndarray, Ragged)) else v for k, v in out.items()}
            return dict(out)
        finally:
            ctx.rows, ctx.selected = rows, selected


def chain(*transforms: Any, cache: bool = True) -> Transform:
    """One `Transform` running ``transforms`` in order, each on the previous one's output.

    Its name is ``"detload.features.chain"`` and its version the list of the members' identities
    (None, so never cached, when a member has no version or is a plain callable); it is random if
    any member is, changes rows if any member does, and is cached when every member allows it.
    """
    if not transforms:
        raise OptionError("chain needs at least one transform")
    members: list[Transform] = []
    for i, t in enumerate(transforms, 1):
        if not isinstance(t, Transform) and not callable(t):
            raise OptionError(f"chain: member {i} must be a detload.Transform or a callable fn(columns, ctx) -> dict, "
                              f"got {type(t).__name__} {t!r}")
        member = Transform.of(t)
        assert member is not None
        members.append(member)
    versioned = all(m.version is not None and not m.bare for m in members)
    version = json.dumps({"format": FORMAT, "members": [m.identity for m in members]}, sort_keys=True,
                         separators=(",", ":")) if versioned else None
    random = any(m.random for m in members)
    rows: RowsMode = "changes" if any(m.rows == "changes" for m in members) else "same"
    if random and rows == "changes":
        changing = next(m.name for m in members if m.rows == "changes")
        drawing = next(m.name for m in members if m.random)
        raise OptionError(f"chain: member {drawing!r} is random and member {changing!r} changes row counts; a "
                          "transform cannot be both (the plan counts every row group's rows before the epoch). "
                          "Keep the random member at rows='same', or run it without the row-changing one")
    return Transform(_Chain(tuple(members)), name="detload.features.chain", version=version, random=random,
                     rows=rows, cache=cache and all(m.cache for m in members))
