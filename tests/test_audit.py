"""Batch hashes and manifests.

The canonical form is re-implemented here with numpy, struct and xxhash only
(no detload.audit), and every manifest hash is recomputed from the arrays the
loader yielded. Also: the manifest's JSONL structure, and torn-tail reading.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import detload
from detload import Loader, ManifestError, Ragged, read_manifest

# -- the documented canonical form, written again ------------------------------------

BATCH_TAG = b"detload-batch-v1\x00"


def _array_part(a: np.ndarray) -> bytes:
    """dtype with explicit byte order, NUL, ndim and shape as little-endian int64, raw C-order bytes."""
    a = np.ascontiguousarray(a)
    return (a.dtype.str.encode("ascii") + b"\x00"
            + struct.pack("<q", a.ndim) + b"".join(struct.pack("<q", d) for d in a.shape)
            + a.tobytes(order="C"))


def ref_column_hash(name: str, col) -> bytes:
    if isinstance(col, Ragged):
        body = b"R" + col.kind.encode("ascii") + b"\x00" + _array_part(col.offsets) + _array_part(col.values)
    else:
        body = b"A\x00" + _array_part(col)
    return xxhash.xxh3_128_digest(name.encode("utf-8") + b"\x00" + body)


def ref_batch_hash(batch) -> tuple[str, dict[str, str]]:
    cols = {name: ref_column_hash(name, col) for name, col in batch.items()}
    return xxhash.xxh3_128_hexdigest(BATCH_TAG + b"".join(cols.values())), {k: v.hex() for k, v in cols.items()}


# -- recomputation ------------------------------------------------------------------

def _typed_dataset(root) -> None:
    n = 41
    ids = np.arange(n)
    t = pa.table({
        "id": ids,
        "flag": ids % 3 == 0,
        "ts": pa.array(ids * 7, pa.timestamp("us", tz="UTC")),
        "day": pa.array(ids.astype(np.int32), pa.date32()),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * n, dtype=np.float64)), 2),
        "blob": pa.array([bytes(range(i % 5)) for i in ids], pa.binary()),
        "u8": pa.array(ids % 256, pa.uint8()),
    })
    pq.write_table(t, root / "t.parquet", row_group_size=9)


@pytest.mark.parametrize("which", ["standard", "typed"])
def test_every_hash_recomputes_from_the_yielded_arrays(small_dataset, tmp_path, pool, which):
    if which == "typed":
        (tmp_path / "typed").mkdir()
        _typed_dataset(tmp_path / "typed")
        root = str(tmp_path / "typed")
    else:
        root = small_dataset.root
    man = tmp_path / "m.jsonl"
    with Loader(root, batch_size=17, seed=5, workers=2, pool=pool, manifest=str(man)) as loader:
        got = [ref_batch_hash(b) + (len(next(iter(b.values()))), detload.hash_batch(b)) for b in loader]
        steps = len(loader)
    lines = list(read_manifest(man).batches())
    assert len(lines) == len(got) == steps
    for step, (line, (h, cols, rows, api)) in enumerate(zip(lines, got)):
        assert line["step"] == step and line["rows"] == rows
        assert line["hash"] == h
        assert line["columns"] == cols
        assert list(line["columns"]) == list(cols)  # batch order
        assert line["parts"] == [h]
        assert api == (h, cols)
    assert len({h for h, *_ in got}) == len(got)


def test_partition_parts_hash_the_micro_batches(small_dataset, tmp_path):
    """With P partitions, ``parts`` hashes each owned partition's micro-batch; ``hash`` the whole batch."""
    man = tmp_path / "m.jsonl"
    with Loader(small_dataset.root, batch_size=30, seed=1, partitions=3, manifest=str(man), workers=2) as loader:
        plan = loader.plan()
        got = []
        for step, b in enumerate(loader):
            sizes = [hi - lo for lo, hi in (plan.micro_range(p, step) for p in range(3))]
            cuts = np.cumsum([0, *sizes])
            parts = [ref_batch_hash({k: _rows(v, cuts[i], cuts[i + 1]) for k, v in b.items()})[0] for i in range(3)]
            got.append((ref_batch_hash(b)[0], parts))
    lines = list(read_manifest(man).batches())
    assert [(x["hash"], x["parts"]) for x in lines] == got
    assert all(len(p) == 3 for _, p in got)


def _rows(col, lo: int, hi: int):
    if isinstance(col, Ragged):
        a, b = int(col.offsets[lo]), int(col.offsets[hi])
        return Ragged(col.values[a:b], col.offsets[lo : hi + 1] - a, col.kind)
    return col[lo:hi]


def test_hash_form_details():
    a = np.arange(6, dtype=np.int64)
    base = detload.hash_batch({"a": a})[0]
    assert base == ref_batch_hash({"a": a})[0]
    # non-contiguous input hashes as its C-contiguous copy
    strided = np.arange(12, dtype=np.int64)[::2] // 2
    assert detload.hash_batch({"a": strided})[0] == base
    # every part of the form matters: name, dtype, byte order, shape, bytes, kind, column order
    variants = [
        {"b": a},
        {"a": a.astype(np.int32)},
        {"a": a.astype(">i8")},
        {"a": a.reshape(2, 3)},
        {"a": a + (np.arange(6) == 5)},
        {"a": a.view(np.float64)},
    ]
    hashes = {detload.hash_batch(v)[0] for v in variants}
    assert base not in hashes and len(hashes) == len(variants)
    r = Ragged(np.frombuffer(b"abc", np.uint8), np.array([0, 1, 3]), "utf8")
    others = [Ragged(r.values, np.array([0, 2, 3]), "utf8"), Ragged(r.values, r.offsets, "binary")]
    assert len({detload.hash_batch({"r": x})[0] for x in [r, *others]}) == 3
    assert detload.hash_batch({"r": r})[0] == ref_batch_hash({"r": r})[0]
    two = {"x": a, "y": a}
    assert detload.hash_batch(two)[0] != detload.hash_batch({"y": a, "x": a})[0]


# -- the manifest file ---------------------------------------------------------------

def test_manifest_is_jsonl_with_header_epoch_and_batch_lines(small_dataset, tmp_path):
    man = tmp_path / "sub" / "m.jsonl"
    with Loader(small_dataset.root, batch_size=100, seed=8, drop_last=True, workers=3, manifest=str(man),
                columns=["s", "id"]) as loader:
        n0 = sum(1 for _ in loader)
        loader.set_epoch(1)
        n1 = sum(1 for _ in loader)
        assert n0 == n1 == len(loader) == 12
        fingerprint = loader.fingerprint
    raw = man.read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    header, rest = records[0], records[1:]
    assert header["type"] == "header"
    assert header["format"] == "detload-manifest" and header["version"] == 1
    assert header["detload_version"] == detload.__version__
    assert header["fingerprint"] == fingerprint
    assert (header["workers"], header["pool"], header["rank"], header["world_size"], header["partitions"]) == (
        3, "thread", 0, 1, 1)
    order = header["order"]
    assert {k: order[k] for k in ("seed", "global_batch_size", "shuffle", "order", "mix_window", "drop_last",
                                  "partitions", "columns")} == {
        "seed": 8, "global_batch_size": 100, "shuffle": True, "order": "mix",
        "mix_window": loader.options.mix_window, "drop_last": True, "partitions": 1, "columns": ["s", "id"]}
    # Both resolved from the row groups' rows, and recorded as resolved.
    assert isinstance(order["mix_window"], int) and order["mix_window"] >= 64
    assert order["block_rows"] == loader.options.block_rows and "shuffle_window" not in order
    assert isinstance(order["dataset"], str) and order["dataset"]
    kinds = [r["type"] for r in rest]
    assert kinds == ["epoch"] + ["batch"] * 12 + ["epoch"] + ["batch"] * 12
    for e, rec in ((0, rest[0]), (1, rest[13])):
        assert rec["epoch"] == e and rec["steps"] == 12 and rec["dropped_rows"] == 1211 - 1200
        assert isinstance(rec["plan"], str)
    for i, rec in enumerate(r for r in rest if r["type"] == "batch"):
        assert (rec["epoch"], rec["step"], rec["rows"]) == (i // 12, i % 12, 100)
        assert len(rec["hash"]) == 32 and list(rec["columns"]) == ["s", "id"]
    m = read_manifest(man)
    assert sorted(m.epochs) == [0, 1] and not m.torn_tail
    assert [b["hash"] for b in m.epochs[0].batches] != [b["hash"] for b in m.epochs[1].batches]


def test_truncated_manifest_reads_as_its_complete_lines(small_dataset, tmp_path):
    man = tmp_path / "m.jsonl"
    with Loader(small_dataset.root, batch_size=300, seed=8, manifest=str(man)) as loader:
        for _ in loader:
            pass
    data = man.read_bytes()
    full = read_manifest(man)
    all_batches = list(full.batches())
    assert len(all_batches) == 5
    header_end = data.index(b"\n") + 1
    cut_file = tmp_path / "cut.jsonl"
    for cut in range(len(data) + 1):
        cut_file.write_bytes(data[:cut])
        if cut < header_end:
            with pytest.raises(ManifestError):
                read_manifest(cut_file)
            continue
        m = read_manifest(cut_file)
        complete = data[:cut].count(b"\n")
        assert m.torn_tail == (cut != len(data) and not data[:cut].endswith(b"\n"))
        assert m.header == full.header
        # lines: header, epoch, batches
        n_batches = max(0, complete - 2)
        got = list(m.batches())
        assert got == all_batches[:n_batches], f"cut at byte {cut}"
        if complete >= 2:
            assert m.epochs[0].steps == 5


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "empty"),
        (b"not json\n", "not valid JSON"),
        (b'{"type": "batch"}\n', "header"),
        (b'{"type": "header", "format": "detload-manifest", "version": 99}\n', "version 99"),
    ],
)
def test_unreadable_manifests_raise_manifest_error(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    with pytest.raises(ManifestError, match=match):
        read_manifest(p)


def test_missing_manifest_raises_manifest_error(tmp_path):
    with pytest.raises(ManifestError, match="cannot read manifest"):
        read_manifest(tmp_path / "nope.jsonl")


def test_documented_worked_example():
    """The example in docs/audit.md, byte for byte and digest for digest."""
    col = np.array([5, 7], dtype=np.int64)
    s = Ragged(np.frombuffer(b"abc", np.uint8), np.array([0, 1, 3], dtype=np.int64), "utf8")
    assert b"id\x00A\x00" + _array_part(col) == bytes.fromhex(
        "6964004100 3c693800 0100000000000000 0200000000000000 0500000000000000 0700000000000000".replace(" ", ""))
    assert ref_column_hash("id", col).hex() == "5009ecacc31556483247844b3d16fb7b"
    assert ref_column_hash("s", s).hex() == "1a63aea8c458fbc7a55974cba4a1475d"
    batch = {"id": col, "s": s}
    assert ref_batch_hash(batch)[0] == "efe88408c5bcae31e5db7fb388215eb5"
    assert detload.hash_batch(batch) == ref_batch_hash(batch)


def _wide_manifest(tmp_path, name, seed, tamper=None):
    """A manifest of a 12-column table (c0..c11); ``tamper`` = (step, column) changes one hash."""
    root = tmp_path / "wide"
    if not root.exists():
        root.mkdir()
        pq.write_table(pa.table({f"c{i}": np.arange(300, dtype=np.int64) * (i + 1) for i in range(12)}),
                       root / "a.parquet", row_group_size=50)
    man = tmp_path / name
    with Loader(str(root), batch_size=40, seed=seed, manifest=str(man)) as ld:
        for _ in ld:
            pass
    if tamper is not None:
        step, col = tamper
        lines = man.read_text().splitlines()
        for i, line in enumerate(lines):
            rec = json.loads(line)
            if rec["type"] == "batch" and rec["step"] == step:
                rec["columns"][col] = "0" * 32
                rec["hash"] = rec["parts"][0] = "0" * 32
                lines[i] = json.dumps(rec)
        man.write_text("\n".join(lines) + "\n")
    return str(man)


def test_verify_names_the_differing_columns_in_natural_order(tmp_path, capsys):
    from detload.cli import main
    from detload.verify import verify

    a = _wide_manifest(tmp_path, "a.jsonl", 1)
    b = _wide_manifest(tmp_path, "b.jsonl", 1, tamper=(3, "c10"))
    res = verify(a, b)
    assert not res.identical and res.kind == "diverged" and (res.epoch, res.step) == (0, 3)
    assert res.message == "diverged at epoch 0 step 3: columns c10 differ"
    assert main(["verify", a, b]) == 1
    assert "diverged at epoch 0 step 3: columns c10 differ" in capsys.readouterr().out


def test_verify_puts_differing_order_options_before_the_columns(tmp_path):
    from detload.verify import verify

    a = _wide_manifest(tmp_path, "a.jsonl", 1)
    c = _wide_manifest(tmp_path, "c.jsonl", 2)
    res = verify(a, c)
    assert res.kind == "diverged" and res.step == 0
    assert res.columns == [f"c{i}" for i in range(12)]  # all of them, in natural order
    head = "diverged at epoch 0 step 0, and the runs used different order options: seed (A: 1, B: 2), fingerprint ("
    assert res.message.startswith(head), res.message
    assert res.message.endswith("; columns c0, c1, c2, c3, c4, c5, c6, c7 and 4 more differ")


def test_python_dash_m_runs_the_command_line(small_dataset, tmp_path):
    # Where the `detload` script is not on PATH (a venv not activated), `python -m detload` works.
    m = tmp_path / "m.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "detload", "run", str(small_dataset.root), "--batch-size", "64",
                          "--seed", "1", "--manifest", str(m)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    same = subprocess.run([sys.executable, "-m", "detload", "verify", str(m), str(m)], capture_output=True,
                          text=True, env=env)
    assert same.returncode == 0 and same.stdout.startswith("identical"), same.stdout + same.stderr
    bad = subprocess.run([sys.executable, "-m", "detload", "verify", str(m)], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "usage: detload" in bad.stderr


# -- ManifestWriter: what is kept when epochs restart --------------------------------

_runs = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 4)),  # epoch, start, batches
                 max_size=12)


@settings(max_examples=150, deadline=None)
@given(runs=_runs, resume_at=st.integers(0, 12))
def test_manifest_writer_keeps_exactly_the_lines_before_each_cut(tmp_path_factory, runs, resume_at):
    """Against a model: a list of (key, line) where starting epoch e at step s drops the first
    line whose key is at or after (e, s) (the epoch's own line for s = 0) and everything written
    after it, as a rerun or resumed epoch does. Reopening the file with resume=True between two
    passes must not change what the rest leave."""
    from detload.audit import MANIFEST_FORMAT, MANIFEST_VERSION, ManifestWriter, batch_line

    header = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION}
    path = tmp_path_factory.mktemp("mw") / "m.jsonl"
    model: list[tuple[tuple[int, int], str]] = []
    writer = ManifestWriter(path, header)
    for i, (epoch, start, n) in enumerate(runs):
        if i == resume_at:
            writer.close()
            writer = ManifestWriter(path, header, resume=True)
        at = (epoch, start if start > 0 else -1)
        cut = next((j for j, (k, _) in enumerate(model) if k >= at), len(model))
        if start > 0 and (epoch, start - 1) not in {k for k, _ in model[:cut]}:
            continue  # a gap: refused on resume (tested elsewhere); not part of this model
        del model[cut:]
        writer.start_epoch(epoch, 9, 0, "fp", start)
        if (epoch, -1) not in {k for k, _ in model}:
            model.append(((epoch, -1), json.dumps({"type": "epoch", "epoch": epoch, "steps": 9,
                                                   "dropped_rows": 0, "plan": "fp"}, sort_keys=True)))
        for step in range(start, start + n):
            line = batch_line(epoch, step, 1, f"h{i}", {}, [])
            writer.write_batch(epoch, step, line)
            model.append(((epoch, step), line))
    writer.close()
    lines = path.read_text().splitlines()
    assert lines[1:] == [line for _, line in model]
