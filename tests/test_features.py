"""detload.features: the vectorised XXH3-64 against the xxhash library value by value, hash_buckets and
vocabulary on every column shape (integers, strings, binaries, lists), chain, the same batches in every
cell of the determinism matrix, cached output read back on later epochs, and every error message.
"""

from __future__ import annotations

import hashlib
import os
import pickle

import _xformdata as X
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from matrix import check_matrix
from strategies import expected_string, write_dataset

import detload.features as F
from detload import DataError, Loader, OptionError, Ragged, Transform, WorkerError
from detload._xxh3 import MIDSIZE_MAX, hash_bytes, hash_words
from detload.transform import TransformContext

LAYOUT = {"a.parquet": [300, 200, 17], "b.parquet": [250, 0, 99], "c/d.parquet": [210, 90, 33, 120]}
SEEDS = st.integers(0, 2**64 - 1)


@pytest.fixture(scope="module")
def info(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp("features") / "ds"), LAYOUT, seed=5)


@pytest.fixture(scope="module")
def root(info) -> str:
    return info.root


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> str:
    """Every 3rd id of the dataset, as decimal text, one per line (ids 1..)."""
    path = str(tmp_path_factory.mktemp("vocab") / "ids.txt")
    total = sum(sum(v) for v in LAYOUT.values())
    with open(path, "w") as f:
        f.write("".join(f"{i}\n" for i in range(1000, 1000 + total, 3)))
    return path


def _ragged(items: list[bytes], kind: str = "binary") -> Ragged:
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in items], out=offsets[1:])
    return Ragged(np.frombuffer(b"".join(items), dtype=np.uint8), offsets, kind)  # type: ignore[arg-type]


def _ctx(rows: int) -> TransformContext:
    return TransformContext(file="f.parquet", file_index=0, row_group=0, rows=rows, selected=None, seed=0,
                            epoch=0, random=False)


def _want(items: list[bytes], seed: int) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(x, seed) for x in items], dtype=np.uint64)


def _le8(v: int) -> bytes:
    return (v % 2**64).to_bytes(8, "little")


# -- the hash, value by value ------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 7, 2**32 - 1, 2**32, 0xDEADBEEF12345678, 2**64 - 1])
def test_every_length_from_0_to_300_matches_xxhash(seed):
    rng = np.random.default_rng(seed % 2**32)
    items = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in range(301) for _ in range(3)]
    got = hash_bytes(*_parts(items), seed)
    want = _want(items, seed)
    bad = [len(items[i]) for i in np.flatnonzero(got != want)]
    assert not bad, f"lengths that differ from xxhash: {sorted(set(bad))}"


def _parts(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    r = _ragged(items)
    return r.values, r.offsets


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.binary(max_size=300), max_size=40), seed=SEEDS)
def test_random_bytes_match_xxhash(items, seed):
    assert np.array_equal(hash_bytes(*_parts(items), seed), _want(items, seed))


@settings(max_examples=40, deadline=None)
@given(length=st.integers(0, 300), data=st.data(), seed=SEEDS)
def test_one_value_of_each_length_alone_matches_xxhash(length, data, seed):
    """A buffer that holds just one value (no neighbour bytes to read past into)."""
    item = data.draw(st.binary(min_size=length, max_size=length))
    assert hash_bytes(*_parts([item]), seed).tolist() == [xxhash.xxh3_64_intdigest(item, seed)]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50), seed=SEEDS)
def test_integers_hash_their_8_little_endian_bytes(values, seed):
    a = np.array(values, dtype=np.int64)
    assert hash_words(a.view(np.uint64), seed).tolist() == [xxhash.xxh3_64_intdigest(_le8(v), seed) for v in values]
    assert np.array_equal(F.hash64(a, seed), _want([_le8(v) for v in values], seed))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
def test_every_integer_width_hashes_its_int64_value(dtype):
    info = np.iinfo(dtype)
    values = sorted({int(info.min), -1 if info.min < 0 else 0, 0, 1, 100, int(info.max)})
    got = F.hash64(np.array(values, dtype=dtype), seed=9)
    assert got.dtype == np.uint64
    assert got.tolist() == [xxhash.xxh3_64_intdigest(_le8(v), 9) for v in values]


def test_uint64_beyond_int64_hashes_its_own_bytes():
    v = np.array([2**63, 2**64 - 1], dtype=np.uint64)
    assert F.hash64(v).tolist() == [xxhash.xxh3_64_intdigest(_le8(2**63)), xxhash.xxh3_64_intdigest(_le8(-1))]


def test_strings_hash_their_utf8_bytes_and_the_default_seed_is_0():
    words = ["", "a", "é", "user_1234", "naïve résumé " * 30]
    r = _ragged([w.encode() for w in words], "utf8")
    assert F.DEFAULT_SEED == 0
    assert F.hash64(r).tolist() == [xxhash.xxh3_64_intdigest(w.encode("utf-8"), 0) for w in words]
    assert len(words[-1].encode()) > MIDSIZE_MAX  # the library's path too


def test_the_hash_is_pinned():
    """Values of the documented definition (xxh3-64, seed 0), fixed here whatever library computes them."""
    assert F.hash64(_ragged([b"user_42"], "utf8")).tolist() == [1647113857750896165]
    assert F.hash64(np.array([42], dtype=np.int8)).tolist() == [15395265915043915720]
    assert xxhash.xxh3_64_intdigest(b"*\0\0\0\0\0\0\0") == 15395265915043915720


def test_a_read_only_sliced_buffer_is_hashed_in_place():
    want = [b"hello", b" ", b"world", b", a longer string for the 17-128 path"]
    big = np.frombuffer(b"xxx" + b"".join(want) + b"yyy", dtype=np.uint8)
    big.flags.writeable = False
    r = Ragged(big[3:-3], _ragged(want).offsets, "utf8")
    assert F.hash64(r, seed=3).tolist() == [xxhash.xxh3_64_intdigest(w, 3) for w in want]


# -- hash_buckets on every column shape --------------------------------------------------

def test_hash_buckets_replaces_the_named_columns_only():
    t = F.hash_buckets({"s": 1000, "id": 7}, seed=11)
    words = [b"a", b"bb", b"", b"user_99"]
    ids = np.array([5, -5, 2**31 - 1, 0], dtype=np.int32)
    other = np.arange(4.0)
    cols = {"id": ids, "x": other, "s": _ragged(words, "utf8")}
    out = t.fn(cols, _ctx(4))
    assert list(out) == ["id", "x", "s"]  # the input's order
    assert out["x"] is other
    assert out["s"].dtype == np.int64 and out["id"].dtype == np.int64
    assert out["s"].tolist() == [xxhash.xxh3_64_intdigest(w, 11) % 1000 for w in words]
    assert out["id"].tolist() == [xxhash.xxh3_64_intdigest(_le8(int(v)), 11) % 7 for v in ids]


def test_binary_and_list_columns_keep_their_offsets():
    t = F.hash_buckets({"b": 2**18, "tags": 50, "grid": 10, "nested": 1000})
    lists = Ragged(np.array([3, 1, 4, 1, 5], dtype=np.int64), np.array([0, 2, 2, 5], dtype=np.int64), "list")
    words = [b"x", b"yy", b"\x00\xff", b"", b"zzzz"]
    nested = Ragged(_ragged(words, "utf8"), np.array([0, 3, 3, 5], dtype=np.int64), "list")  # type: ignore[arg-type]
    grid = np.arange(6, dtype=np.uint16).reshape(3, 2)
    cols = {"b": _ragged([b"\x00", b"\x01\x02", b"abc"]), "tags": lists, "grid": grid, "nested": nested}
    out = t.fn(cols, _ctx(3))
    assert out["b"].tolist() == [xxhash.xxh3_64_intdigest(w) % 2**18 for w in (b"\x00", b"\x01\x02", b"abc")]
    assert isinstance(out["tags"], Ragged) and out["tags"].kind == "list"
    assert np.array_equal(out["tags"].offsets, lists.offsets)
    assert out["tags"].values.tolist() == [xxhash.xxh3_64_intdigest(_le8(v)) % 50 for v in [3, 1, 4, 1, 5]]
    assert out["grid"].shape == (3, 2)
    assert out["grid"].ravel().tolist() == [xxhash.xxh3_64_intdigest(_le8(v)) % 10 for v in range(6)]
    assert np.array_equal(out["nested"].offsets, nested.offsets)
    assert out["nested"].values.tolist() == [xxhash.xxh3_64_intdigest(w) % 1000 for w in words]


def test_one_bucket_and_2_63_buckets():
    t = F.hash_buckets({"a": 1, "b": 2**63})
    v = np.array([1, 2, 3])
    out = t.fn({"a": v, "b": v}, _ctx(3))
    assert out["a"].tolist() == [0, 0, 0]
    assert out["b"].tolist() == [xxhash.xxh3_64_intdigest(_le8(i)) % 2**63 for i in (1, 2, 3)]


def test_hash_buckets_identity_is_its_parameters():
    t = F.hash_buckets({"user_id": 1_000_000, "tags": 2**18}, seed=3)
    assert t.name == "detload.features.hash_buckets"
    assert t.cached and not t.random and t.rows == "same"
    assert t.version == F.hash_buckets({"tags": 2**18, "user_id": 1_000_000}, seed=3).version  # order-free
    others = [F.hash_buckets({"user_id": 1_000_000, "tags": 2**18}, seed=4),
              F.hash_buckets({"user_id": 999_999, "tags": 2**18}, seed=3),
              F.hash_buckets({"user_id": 1_000_000}, seed=3)]
    assert len({t.version, *(o.version for o in others)}) == 4
    assert f'"format":{F.FORMAT}' in (t.version or "")
    assert not F.hash_buckets({"a": 2}, cache=False).cached


def test_builtins_pickle_by_reference():
    t = F.hash_buckets({"s": 10})
    back = pickle.loads(pickle.dumps(t))
    assert back.identity == t.identity and type(back.fn).__module__ == "detload.features"


# -- in a loader -------------------------------------------------------------------------

def _all(loader):
    cols: dict[str, list] = {}
    for b in loader:
        for k, v in b.items():
            cols.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in cols.items()}


def test_a_loader_delivers_the_buckets_of_every_row(root):
    t = F.hash_buckets({"s": 1000, "ni": 64}, seed=7)
    with Loader(root, batch_size=100, seed=2, columns=["id", "s", "ni"], transform=t, workers=2) as ld:
        assert [(s.name, s.describe()) for s in ld.column_specs] == [
            ("id", "ndarray <i8 (rows)"), ("s", "ndarray <i8 (rows)"), ("ni", "ndarray <i8 (rows)")]
        assert ld.order["transform"] == t.identity
        got = _all(ld)
    assert len(got["id"]) == sum(sum(v) for v in LAYOUT.values())
    want_s = [xxhash.xxh3_64_intdigest(expected_string(int(i)).encode(), 7) % 1000 for i in got["id"]]
    want_ni = [xxhash.xxh3_64_intdigest(_le8(int(i) * 3), 7) % 64 for i in got["id"]]
    assert got["s"].tolist() == want_s and got["ni"].tolist() == want_ni


def test_another_seed_is_another_order(root):
    fps = []
    for seed in (0, 1):
        with Loader(root, batch_size=64, seed=2, columns=["id", "s"],
                    transform=F.hash_buckets({"s": 100}, seed=seed)) as ld:
            fps.append((ld.order["transform"]["version"], ld.state_dict()["fingerprint"]))
    assert fps[0][0] != fps[1][0] and fps[0][1] != fps[1][1]


def test_vocabulary_chained_with_hash_buckets_gives_the_reference_batches_in_every_cell(root, vocab, tmp_path):
    t = F.chain(Transform(X.hashed, name="ctr", version="1"), F.hash_buckets({"s": 4096, "cross": 100}, seed=5),
                F.vocabulary("id", vocab, oov=-1))
    check_matrix(root, dict(batch_size=64, seed=3, columns=["id", "f32", "s"], transform=t),
                 str(tmp_path))


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_later_epochs_read_the_cached_output(root, vocab, tmp_path, pool):
    t = F.chain(F.hash_buckets({"s": 1000}), F.vocabulary("id", vocab))
    opts = dict(batch_size=64, seed=1, columns=["id", "s"], cache=tmp_path / "c", workers=2, pool=pool, transform=t)
    with Loader(root, **opts) as ld:
        first = _all(ld)
        mark = ld.stats_mark()
        ld.set_epoch(1)
        second = _all(ld)
        stages = ld.stats(since=mark).stages
        assert stages["transform"].count == 0 and stages["read"].count == 0
        assert stages["cache_read"].count == 9  # one per non-empty row group
    assert sorted(first["id"].tolist()) == sorted(second["id"].tolist())
    with Loader(root, **opts) as warm:
        mark = warm.stats_mark()
        again = _all(warm)
        assert warm.stats(since=mark).stages["transform"].count == 0
    assert np.array_equal(again["id"], first["id"]) and np.array_equal(again["s"], first["s"])


# -- vocabulary --------------------------------------------------------------------------

def _vocab_file(tmp_path, content: bytes, name: str = "v.txt") -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


def test_vocabulary_ids_are_line_numbers_and_oov(tmp_path):
    path = _vocab_file(tmp_path, "apple\r\nbanana\n\nkiwi\né\n42\n-7\n007\n".encode())
    t = F.vocabulary("item", path)
    words = ["banana", "kiwi", "", "apple", "pear", "é", "Apple", "banana\r", "42"]
    out = t.fn({"item": _ragged([w.encode() for w in words], "utf8"), "x": np.zeros(9)}, _ctx(9))
    assert out["item"].tolist() == [2, 4, 3, 1, 0, 5, 0, 0, 6]
    assert np.array_equal(out["x"], np.zeros(9))
    ints = t.fn({"item": np.array([42, -7, 7, 1, 42], dtype=np.int16)}, _ctx(5))["item"]
    assert ints.tolist() == [6, 7, 0, 0, 6]  # '007' is not 7's decimal text
    big = t.fn({"item": np.array([42, 2**64 - 1], dtype=np.uint64)}, _ctx(2))["item"]
    assert big.tolist() == [6, 0]


def test_vocabulary_on_lists_and_large_vocabularies(tmp_path):
    tokens = [f"tok{i}" for i in range(20_000)] + ["x" * n for n in range(1, 300)]
    path = _vocab_file(tmp_path, ("\n".join(tokens)).encode())  # no final newline
    t = F.vocabulary("tags", path, oov=-1)
    words = ["tok5", "tok19999", "nope", "x" * 250, "x" * 17, "tok", "x" * 299]
    lists = Ragged(_ragged([w.encode() for w in words], "utf8"), np.array([0, 2, 2, 7]), "list")  # type: ignore[arg-type]
    out = t.fn({"tags": lists}, _ctx(3))["tags"]
    assert np.array_equal(out.offsets, lists.offsets)
    assert out.values.tolist() == [6, 20_000, -1, 20_000 + 250, 20_000 + 17, -1, 20_000 + 299]


def test_vocabulary_compares_bytes_when_hashes_agree(tmp_path, monkeypatch):
    """A weak hash (the length) makes every same-length token share a hash: bytes decide, and the
    rows whose hash several tokens share are looked up exactly."""
    import detload.features as mod

    def by_length(values, offsets, seed):
        return np.diff(np.asarray(offsets)).astype(np.uint64)

    monkeypatch.setattr(mod, "hash_bytes", by_length)
    path = _vocab_file(tmp_path, b"ab\ncd\nxyz\nq\n")
    t = F.vocabulary("s", path)
    words = [b"cd", b"ab", b"zz", b"xyz", b"xya", b"q", b"r", b""]
    assert t.fn({"s": _ragged(words)}, _ctx(8))["s"].tolist() == [2, 1, 0, 3, 0, 4, 0, 0]
    path1 = _vocab_file(tmp_path, b"abc\nq\n", "one.txt")  # no shared hash: the vectorised byte check alone
    t1 = F.vocabulary("s", path1)
    assert t1.fn({"s": _ragged([b"abc", b"abd", b"q", b"r"])}, _ctx(4))["s"].tolist() == [1, 0, 2, 0]


def test_vocabulary_identity_is_the_file_content(tmp_path):
    a = F.vocabulary("item", _vocab_file(tmp_path, b"x\ny\n", "a.txt"))
    b = F.vocabulary("item", _vocab_file(tmp_path, b"x\ny\n", "b.txt"))
    c = F.vocabulary("item", _vocab_file(tmp_path, b"x\nz\n", "c.txt"))
    assert a.name == "detload.features.vocabulary" and a.cached
    assert a.version == b.version != c.version
    assert hashlib.sha256(b"x\ny\n").hexdigest() in (a.version or "")
    assert F.vocabulary("item", str(tmp_path / "a.txt"), oov=-1).version != a.version
    assert F.vocabulary("other", str(tmp_path / "a.txt")).version != a.version


def test_vocabulary_reads_the_file_once(tmp_path):
    path = _vocab_file(tmp_path, b"x\ny\n")
    t = F.vocabulary("s", path)
    os.remove(path)
    back = pickle.loads(pickle.dumps(t))  # as a worker process gets it: the content travels along
    assert back.fn({"s": _ragged([b"y", b"x", b"w"])}, _ctx(3))["s"].tolist() == [2, 1, 0]


def test_vocabulary_content_change_changes_the_order(root, tmp_path):
    path = _vocab_file(tmp_path, "".join(f"{expected_string(i)}\n" for i in range(1001, 1006)).encode())
    opts = dict(batch_size=64, seed=2, columns=["id", "s"])
    with Loader(root, transform=F.vocabulary("s", path), **opts) as ld:
        before = (ld.order["transform"], ld.state_dict()["fingerprint"])
        got = _all(ld)
    assert set(np.unique(got["s"]).tolist()) <= {0, 1, 2, 3, 4, 5} and (got["s"] > 0).sum() >= 4
    with open(path, "a") as f:
        f.write("another\n")
    with Loader(root, transform=F.vocabulary("s", path), **opts) as ld:
        assert ld.order["transform"] != before[0] and ld.state_dict()["fingerprint"] != before[1]


# -- chain -------------------------------------------------------------------------------

def _double(cols, ctx):
    return {k: np.concatenate([v, v]) for k, v in cols.items()}


def _plus_one(cols, ctx):
    return {k: np.asarray(v) + 1 for k, v in cols.items()}


def test_chain_runs_its_members_in_order():
    t = F.chain(Transform(_plus_one, name="p", version="1"), F.hash_buckets({"a": 10}))
    out = t.fn({"a": np.array([1, 2])}, _ctx(2))
    assert out["a"].tolist() == [xxhash.xxh3_64_intdigest(_le8(v)) % 10 for v in (2, 3)]
    assert t.name == "detload.features.chain" and t.cached and t.rows == "same" and not t.random
    other = F.chain(F.hash_buckets({"a": 10}), Transform(_plus_one, name="p", version="1"))
    assert other.version != t.version  # the members' order is part of the identity
    assert '"name":"p"' in (t.version or "") and '"version":"1"' in (t.version or "")


def test_chain_combines_the_members_declarations():
    rand = Transform(_plus_one, name="r", version="1", random=True)
    grow = Transform(_double, name="g", version="1", rows="changes")
    assert F.chain(rand, F.hash_buckets({"a": 2})).random
    assert F.chain(grow, F.hash_buckets({"a": 2})).rows == "changes"
    bare = F.chain(_plus_one, F.hash_buckets({"a": 2}))
    assert bare.version is None and not bare.cached  # a plain callable has no version
    assert not F.chain(Transform(_plus_one, name="p", version="1", cache=False)).cached
    assert not F.chain(F.hash_buckets({"a": 2}), cache=False).cached


def test_chain_tells_later_members_the_new_row_count():
    seen = []

    def count(cols, ctx):
        seen.append((ctx.rows, ctx.selected))
        return dict(cols)

    t = F.chain(Transform(_double, name="g", version="1", rows="changes"), count)
    ctx = TransformContext(file="f", file_index=0, row_group=0, rows=2, selected=np.array([3, 5]), seed=0,
                           epoch=0, random=False)
    out = t.fn({"a": np.array([1, 2])}, ctx)
    assert out["a"].tolist() == [1, 2, 1, 2] and seen == [(4, None)]
    assert ctx.rows == 2 and ctx.selected is not None  # given back as it came


def test_chain_hands_later_members_read_only_columns():
    def write(cols, ctx):
        cols["a"][0] = 9
        return cols

    t = F.chain(Transform(_plus_one, name="p", version="1"), write)
    with pytest.raises(ValueError, match="read-only"):
        t.fn({"a": np.array([1, 2])}, _ctx(2))


# -- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "message"), [
    (lambda: F.hash_buckets({}), r"hash_buckets needs a non-empty dict \{column: number of buckets\}, got dict \{\}"),
    (lambda: F.hash_buckets(["s"]), r"hash_buckets needs a non-empty dict .* got list \['s'\]"),
    (lambda: F.hash_buckets({"": 10}), "hash_buckets: column names must be non-empty strings, got ''"),
    (lambda: F.hash_buckets({3: 10}), "hash_buckets: column names must be non-empty strings, got 3"),
    (lambda: F.hash_buckets({"s": 0}), r"hash_buckets: column 's' asks for 0 buckets; give an int from 1 to 2\*\*63"),
    (lambda: F.hash_buckets({"s": -5}), "column 's' asks for -5 buckets"),
    (lambda: F.hash_buckets({"s": 2**63 + 1}), f"column 's' asks for {2**63 + 1} buckets"),
    (lambda: F.hash_buckets({"s": 10.0}), r"column 's' asks for 10.0 buckets; give an int"),
    (lambda: F.hash_buckets({"s": True}), "column 's' asks for True buckets"),
    (lambda: F.hash_buckets({"s": 10}, seed=-1), r"hash_buckets: seed must be an int in \[0, 2\*\*64\), got int -1"),
    (lambda: F.hash_buckets({"s": 10}, seed=2**64), r"seed must be an int in \[0, 2\*\*64\), got int 18446744073709551616"),
    (lambda: F.hash_buckets({"s": 10}, seed="0"), r"seed must be an int in \[0, 2\*\*64\), got str '0'"),
    (lambda: F.hash_buckets({"s": 10}, seed=True), "seed must be an int .* got bool True"),
    (lambda: F.hash64(np.array([1]), seed=1.5), r"hash64: seed must be an int in \[0, 2\*\*64\), got float 1.5"),
    (lambda: F.vocabulary("", "v.txt"), "vocabulary: column must be a non-empty str, got ''"),
    (lambda: F.vocabulary("item", 3), r"vocabulary\('item'\): path must be a str or os.PathLike, got int 3"),
    (lambda: F.vocabulary("item", "/nonexistent/vocab.txt"),
     r"vocabulary\('item'\): cannot read the vocabulary file '/nonexistent/vocab.txt' \(FileNotFoundError: No such "
     r"file or directory\); give the path of a text file with one token per line"),
    (lambda: F.chain(), "chain needs at least one transform"),
    (lambda: F.chain(F.hash_buckets({"a": 2}), 5),
     r"chain: member 2 must be a detload.Transform or a callable fn\(columns, ctx\) -> dict, got int 5"),
    (lambda: F.chain(Transform(_plus_one, name="r", version="1", random=True),
                     Transform(_double, name="g", version="1", rows="changes")),
     "chain: member 'r' is random and member 'g' changes row counts; a transform cannot be both"),
])
def test_option_errors(make, message):
    with pytest.raises(OptionError, match=message):
        make()


@pytest.mark.parametrize(("content", "kw", "message"), [
    (b"", {}, r"vocabulary\('item'\): the vocabulary file '.*v.txt' is empty; it needs one token per line"),
    (b"a\nb\na\n", {}, r"the vocabulary file '.*v.txt' holds the token 'a' twice, on lines 1 and 3; each token "
                       "must appear once"),
    (b"a\n\xff\n\xff", {}, r"holds the token b'\\xff' twice, on lines 2 and 3"),
    (b"a\r\nb\na\n", {}, "holds the token 'a' twice, on lines 1 and 3"),
    (b"a\nb\n", {"oov": 2}, r"oov=2 is the id of line 2 of '.*v.txt' \(ids are 1 to 2\); pick 0, a negative id or "
                            "one above 2"),
    (b"a\nb\n", {"oov": 1.0}, r"vocabulary\('item'\): oov must be an int64, got float 1.0"),
    (b"a\nb\n", {"oov": 2**63}, "oov must be an int64, got int 9223372036854775808"),
])
def test_vocabulary_file_errors(tmp_path, content, kw, message):
    path = _vocab_file(tmp_path, content)
    with pytest.raises(OptionError, match=message):
        F.vocabulary("item", path, **kw)


def test_a_vocabulary_path_that_is_a_folder(tmp_path):
    with pytest.raises(OptionError, match=r"cannot read the vocabulary file '.*' \(IsADirectoryError: Is a "
                                          r"directory\)"):
        F.vocabulary("item", tmp_path)


@pytest.mark.parametrize(("t", "cols", "message"), [
    (F.hash_buckets({"user": 10}), {"s": np.zeros(2, np.int64)},
     r"hash_buckets: column 'user' is not among the columns it was given \('s'\); add it to the Loader's columns= "
     "or correct the name"),
    (F.hash_buckets({"f": 10}), {"f": np.zeros(2, np.float32)},
     r"hash_buckets: column 'f' holds float32 values; it takes integers \(any width\), strings \(UTF-8\) and binary "
     r"values, or lists of them. Leave 'f' out, or turn it into integers in a transform of your own run first "
     r"\(detload.features.chain\)"),
    (F.hash_buckets({"f": 10}), {"f": np.zeros((2, 3), bool)}, r"column 'f' holds bool values \(shape \(2, 3\)\)"),
    (F.hash_buckets({"f": 10}), {"f": np.array(["a", None], dtype=object)}, "column 'f' holds Python objects"),
    (F.hash_buckets({"f": 10}), {"f": Ragged(np.zeros(3, np.float64), np.array([0, 1, 3]), "list")},
     "hash_buckets: column 'f' holds float64 values"),
    (F.hash_buckets({"f": 10}), {"f": [1, 2]},
     r"hash_buckets: column 'f' is a list, not a NumPy array or a detload.Ragged; it takes integers"),
])
def test_hash_buckets_input_errors_name_the_column(t, cols, message):
    with pytest.raises(DataError, match=message):
        t.fn(cols, _ctx(2))


def test_hash64_names_the_column_it_cannot_hash():
    with pytest.raises(DataError, match=r"hash64: column 'price' holds float64 values; it takes integers"):
        F.hash64(np.zeros(3), name="price")
    with pytest.raises(DataError, match=r"hash64: column 'column' holds datetime64\[s\] values"):
        F.hash64(np.zeros(3, "datetime64[s]"))


def test_vocabulary_input_errors_name_the_column_and_the_file(tmp_path):
    path = _vocab_file(tmp_path, b"a\n")
    t = F.vocabulary("item", path)
    with pytest.raises(DataError, match=r"vocabulary\('.*v.txt'\): column 'item' is not among the columns it was "
                                        r"given \('s'\)"):
        t.fn({"s": np.zeros(1, np.int64)}, _ctx(1))
    with pytest.raises(DataError, match=r"vocabulary\('.*v.txt'\): column 'item' holds float64 values"):
        t.fn({"item": np.zeros(1)}, _ctx(1))


def test_chain_member_errors():
    t = F.chain(lambda cols, ctx: [1], F.hash_buckets({"a": 2}))
    with pytest.raises(DataError, match=r"chain member 1 \('.*<lambda>'\) returned list; each member must return a "
                                        "non-empty dict of columns"):
        t.fn({"a": np.array([1])}, _ctx(1))
    t = F.chain(lambda cols, ctx: {}, F.hash_buckets({"a": 2}))
    with pytest.raises(DataError, match="chain member 1 .* returned an empty dict"):
        t.fn({"a": np.array([1])}, _ctx(1))
    t = F.chain(F.hash_buckets({"a": 2}), Transform(_double, name="d", version="1"))
    with pytest.raises(DataError, match=r"chain member 2 \('d'\) returned 4 rows, which it was given 2 rows of: "
                                        "declare rows='changes' for a transform that filters or adds rows"):
        t.fn({"a": np.array([1, 2])}, _ctx(2))


@pytest.mark.parametrize(("columns", "t", "message"), [
    (["id", "s"], F.hash_buckets({"user": 10}), r"planning failed: transform 'detload.features.hash_buckets' raised "
     r"DataError: hash_buckets: column 'user' is not among the columns it was given \('id', 's'\)"),
    (["id", "f32"], F.hash_buckets({"f32": 10}), r"transform 'detload.features.hash_buckets' raised DataError: "
     "hash_buckets: column 'f32' holds float32 values"),
    (["id", "lf"], F.hash_buckets({"lf": 10}), "hash_buckets: column 'lf' holds float32 values"),
])
def test_a_loader_refuses_a_column_it_cannot_hash_when_built(root, columns, t, message):
    with pytest.raises(WorkerError, match=message) as e:
        Loader(root, batch_size=64, seed=1, columns=columns, transform=t)
    assert isinstance(e.value.__cause__, DataError)


def test_hash_buckets_on_a_parquet_list_of_ints_and_binary(tmp_path):
    table = pa.table({"tags": pa.array([[1, 2], [], [3]], pa.list_(pa.int32())),
                      "raw": pa.array([b"\x00", b"ab", b""], pa.binary())})
    pq.write_table(table, tmp_path / "x.parquet")
    t = F.hash_buckets({"tags": 100, "raw": 1000}, seed=1)
    with Loader(str(tmp_path), batch_size=3, seed=0, shuffle=False, transform=t) as ld:
        (b,) = list(ld)
    assert isinstance(b["tags"], Ragged) and b["tags"].offsets.tolist() == [0, 2, 2, 3]
    assert b["tags"].values.tolist() == [xxhash.xxh3_64_intdigest(_le8(v), 1) % 100 for v in (1, 2, 3)]
    assert b["raw"].tolist() == [xxhash.xxh3_64_intdigest(w, 1) % 1000 for w in (b"\x00", b"ab", b"")]
