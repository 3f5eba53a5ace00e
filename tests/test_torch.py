"""The PyTorch adapter: zero-copy tensors, the background feeder, state that counts what the loop received.

There is no GPU here: the CUDA path's guard is tested, and its thread logic
runs with ``device="cpu"`` (same feeder thread, same hand-over).
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import _distdata
import numpy as np
import pytest
from leaks import wait_until

torch = pytest.importorskip("torch")

from testhooks import hooked  # noqa: E402

from detload import DetloadError, Loader, OptionError, StateError, WorkerError, hash_batch  # noqa: E402
from detload._engine.config import DebugHooks  # noqa: E402
from detload.torch import RaggedTensor, TorchLoader, to_torch  # noqa: E402

OPTS = dict(batch_size=40, seed=5, columns=["id", "s", "x"])
#: Blocks of whole row groups (the windowed order), for the tests that fail or stall one row
#: group's read: batches of the blocks before it are handed over first. The mixed order reads
#: a task's row groups before its first block, so with this small dataset nothing would come first.
BLOCKS = dict(OPTS, order="windowed")


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("torch") / "ds")
    _distdata.write(root)
    return root


def feeders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "detload-torch-feeder" and t.is_alive()]


def back_to_numpy(batch) -> dict:
    out = {}
    for k, v in batch.items():
        if isinstance(v, RaggedTensor):
            from detload import Ragged
            out[k] = Ragged(v.values.numpy(), v.offsets.numpy(), v.kind)
        else:
            out[k] = v.numpy()
    return out


def reference(ds: str, epoch: int = 0) -> list[str]:
    with Loader(ds, **OPTS) as loader:
        loader.set_epoch(epoch)
        return [hash_batch(b)[0] for b in loader]


def test_to_torch_shares_memory_and_maps_types():
    ids = np.arange(6, dtype=np.int64)
    vals = np.frombuffer(b"abcdef", dtype=np.uint8).copy()
    from detload import Ragged
    batch = {"id": ids, "s": Ragged(vals, np.array([0, 2, 2, 6], dtype=np.int64), "utf8"),
             "t": np.array([1, 2], dtype="datetime64[ms]")}
    t = to_torch(batch)
    assert t["id"].data_ptr() == ids.ctypes.data, "no copy on the CPU"
    assert t["s"].values.data_ptr() == vals.ctypes.data and t["s"].kind == "utf8"
    assert t["s"].rows == 3 and t["s"].lengths().tolist() == [2, 0, 4]
    assert t["t"].dtype == torch.int64 and t["t"].tolist() == [1, 2]
    moved = t["s"].to("cpu")
    assert isinstance(moved, RaggedTensor) and torch.equal(moved.offsets, t["s"].offsets)
    ro = np.arange(3.0)
    ro.setflags(write=False)
    assert to_torch({"r": ro})["r"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(OptionError, match="column 'u' has dtype <U1, which torch cannot hold"):
        to_torch({"u": np.array(["a"])})
    nested = RaggedTensor(torch.arange(5.0), torch.tensor([0, 2, 5]), "list").to_nested()
    assert [x.tolist() for x in nested.unbind()] == [[0.0, 1.0], [2.0, 3.0, 4.0]]


@pytest.mark.parametrize("device", [None, "cpu"])
def test_batches_are_the_loaders_batches(ds, device):
    with TorchLoader(Loader(ds, workers=2, **OPTS), device=device) as tl:
        assert len(tl) == len(reference(ds))
        got = [hash_batch(back_to_numpy(b))[0] for b in tl]
        assert got == reference(ds)
        tl.set_epoch(1)
        assert tl.epoch == 1 and [hash_batch(back_to_numpy(b))[0] for b in tl] == reference(ds, 1)
        batch = next(iter(tl))
        assert isinstance(batch["id"], torch.Tensor) and batch["id"].dtype == torch.int64
        assert isinstance(batch["s"], RaggedTensor) and batch["x"].dtype == torch.float32
    assert not feeders()


@pytest.mark.parametrize("device", [None, "cpu"])
def test_state_counts_batches_received_not_prefetched(ds, device):
    with TorchLoader(Loader(ds, **OPTS), device=device, prefetch=4) as tl:
        it = iter(tl)
        for _ in range(3):
            next(it)
        time.sleep(0.2)  # the feeder runs ahead
        state = json.loads(json.dumps(tl.state_dict()))
        assert state["step"] == 3
        if device is not None:
            assert tl.loader.position > 3, "the feeder prefetched"
    # That a saved state resumes is the contract of test_resume_contract.py.


def test_breaking_out_stops_the_feeder(ds):
    tl = TorchLoader(Loader(ds, **OPTS), device="cpu", prefetch=2)
    for i, _ in enumerate(tl):
        if i == 1:
            break
    gc.collect()
    deadline = time.monotonic() + 5
    while feeders() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not feeders()
    # A new iteration after an abandoned one starts the epoch over.
    assert sum(1 for _ in tl) == len(tl)
    tl.close()


def test_worker_errors_reach_the_training_loop(ds):
    bad = ("a.parquet", 1)
    hooks = DebugHooks(fail_unit=bad, fail_exc=OSError("disk on fire"))
    with TorchLoader(hooked(Loader, ds, debug=hooks, **OPTS), device="cpu") as tl, \
            pytest.raises(WorkerError, match="disk on fire"):
        for _ in tl:
            pass
    assert not feeders()


def test_guards(ds):
    if not torch.cuda.is_available():
        with pytest.raises(OptionError, match=r"device='cuda' but torch.cuda.is_available\(\) is False"):
            TorchLoader(Loader(ds, **OPTS), device="cuda")
        with pytest.warns(UserWarning, match="pin_memory=True but no accelerator"):
            tl = TorchLoader(Loader(ds, **OPTS), pin_memory=True)
        assert tl.pin_memory is False
    with pytest.raises(OptionError, match=r"^TorchLoader takes a detload\.Loader, got str: build the Loader with its "
                                          r"options and wrap it, TorchLoader\(detload\.Loader\(source, "):
        TorchLoader(ds)
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        TorchLoader(Loader(ds, **OPTS), seed=3)  # the Loader's options go to the Loader
    with pytest.raises(OptionError, match="prefetch must be an int >= 1"):
        TorchLoader(Loader(ds, **OPTS), prefetch=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_batches_match_and_arrive_on_the_device(ds):  # pragma: no cover - no GPU in CI
    with TorchLoader(Loader(ds, workers=2, **OPTS), device="cuda") as tl:
        got = []
        for b in tl:
            assert b["id"].is_cuda and b["s"].values.is_cuda
            got.append(hash_batch(back_to_numpy({k: v.to("cpu") for k, v in b.items()}))[0])
    assert got == reference(ds)


def _odd_batch() -> dict:
    from detload import Ragged
    strided = np.arange(20, dtype=np.float64)[::2]  # not contiguous
    return {
        "f": np.linspace(0, 1, 10, dtype=np.float32),
        "b": np.arange(10) % 3 == 0,
        "t": np.arange(10).astype("datetime64[ns]"),
        "m": np.arange(30, dtype=np.int16).reshape(10, 3),
        "e": np.empty(0, dtype=np.int64),
        "g": strided,
        "s": Ragged(np.frombuffer(b"abcdefg", dtype=np.uint8).copy(), np.array([0, 3, 3, 7], dtype=np.int64), "utf8"),
        "u8": np.arange(10, dtype=np.uint8),
    }


def test_slab_holds_every_column_aligned_in_its_memory():
    from detload.torch.tensors import ALIGN, pack, unpack_slab
    batch = _odd_batch()
    slab, layout = pack([batch, batch], pin=False)
    got = unpack_slab(slab, layout[0], {})
    again = unpack_slab(slab, layout[1], {})
    assert all(layout[1][i].offset > layout[0][-1].offset for i in range(len(layout[1])))  # one after the other
    assert list(got) == list(batch)
    want = to_torch(batch)
    base = slab.data_ptr()
    for k, v in want.items():
        g = got[k]
        pairs = [(g.values, v.values), (g.offsets, v.offsets)] if isinstance(v, RaggedTensor) else [(g, v)]
        if isinstance(v, RaggedTensor):
            assert g.kind == v.kind
        for a, b in pairs:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), k
            assert a.untyped_storage().data_ptr() == base  # in the slab's memory, no copy of its own
            if a.numel():  # an empty tensor's data_ptr() may be 0
                assert (a.data_ptr() - base) % ALIGN == 0
    assert all(torch.equal(again[k], got[k]) for k in ("f", "b", "m", "g"))
    # The slab is a copy: changing the NumPy batch afterwards changes nothing handed out.
    batch["f"][:] = -1
    assert got["f"][0] == 0


def test_slab_refuses_a_dtype_torch_cannot_hold():
    from detload.torch.tensors import pack
    with pytest.raises(OptionError, match=r"column 'o' has dtype object, which torch cannot hold"):
        pack([{"x": np.zeros(3), "o": np.array([None, 1, "a"], dtype=object)}], pin=False)


def test_feeder_slab_path_yields_the_same_batches(ds, monkeypatch):
    # Pinning needs an accelerator; the same feeder path runs here with an unpinned slab.
    import detload.torch.handoff as dt
    packed = []
    real = dt.pack

    def unpinned(batches, pin, stack=()):
        packed.append(len(batches))
        return real(batches, pin=False, stack=stack)

    monkeypatch.setattr(dt, "pack", unpinned)
    want = reference(ds)
    for group in (1, 3):
        packed.clear()
        with TorchLoader(Loader(ds, workers=2, pool="process", **OPTS), device="cpu", copy_batches=group) as tl:
            tl.pin_memory = True
            got = [hash_batch(back_to_numpy(b))[0] for b in tl]
        assert got == want
        # Full groups, then what is left of the epoch.
        assert packed == [group] * (len(want) // group) + ([len(want) % group] if len(want) % group else [])


def test_copy_batches_counts_what_the_loop_received(ds, monkeypatch):
    import detload.torch.handoff as dt
    real = dt.pack
    monkeypatch.setattr(dt, "pack", lambda batches, pin, stack=(): real(batches, pin=False, stack=stack))
    want = reference(ds)
    with TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=4) as tl:
        tl.pin_memory = True
        it = iter(tl)
        for _ in range(5):
            next(it)
        state = tl.state_dict()
    assert state["step"] == 5
    with TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=4) as tl:
        tl.pin_memory = True
        tl.load_state_dict(state)
        assert [hash_batch(back_to_numpy(b))[0] for b in tl] == want[5:]


def test_copy_batches_guards(ds):
    with pytest.raises(OptionError, match=r"copy_batches must be an int >= 1 \(batches per copy\), got 0"):
        TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=0)
    with pytest.raises(OptionError, match=r"copy_batches must be an int >= 1 \(batches per copy\), got True"):
        TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=True)
    with pytest.raises(OptionError, match=r"copy_batches=4 needs pin_memory=True or device=\.\.\.: it groups the "
                                          r"copies their background thread makes, and without them there is none"):
        TorchLoader(Loader(ds, **OPTS), copy_batches=4)
    tl = TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=np.int64(3), prefetch=np.int32(2))
    assert (tl.copy_batches, tl.prefetch) == (3, 2) and type(tl.copy_batches) is int
    tl.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_slab_and_per_column_paths_agree_and_kept_batches_hold(ds):  # pragma: no cover - no GPU in CI
    want = reference(ds)
    for slab, group in ((True, 1), (True, 4), (False, 1)):
        with hooked(TorchLoader, Loader(ds, workers=2, pool="process", **OPTS), device="cuda", prefetch=3, copy_batches=group, torch_per_column=not slab) as tl:
            kept = list(tl)
            torch.cuda.synchronize()
            got = [hash_batch(back_to_numpy({k: v.to("cpu") for k, v in b.items()}))[0] for b in kept]
        assert got == want, slab
    with TorchLoader(Loader(ds, workers=2, **OPTS), pin_memory=True) as tl:
        kept = list(tl)
        assert all(b["id"].is_pinned() and not b["id"].is_cuda for b in kept)
        assert [hash_batch(back_to_numpy(b))[0] for b in kept] == want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_registered_hand_off_matches_the_staged_path(ds):  # pragma: no cover - no GPU in CI
    # Process workers' segments registered with cudaHostRegister; blocks copied straight from them.
    from detload._hooks import Hooks, installed

    want = reference(ds)
    for staged in (False, True):
        with installed(Hooks(torch_staged=staged)):
            tl = TorchLoader(Loader(ds, workers=2, pool="process", **OPTS), device="cuda", prefetch=3)
        with tl:
            kept = list(tl)
            torch.cuda.synchronize()
            got = [hash_batch(back_to_numpy({k: v.to("cpu") for k, v in b.items()}))[0] for b in kept]
            stats = tl.handoff_stats()
            registry = tl._registry
        assert got == want, staged
        assert all(b["id"].is_cuda for b in kept)
        if staged:
            assert registry is None and stats["batches"] == 0
        else:
            assert stats["registrations"] > 0 and stats["registration_failures"] == 0
            assert stats["direct_batches"] > 0 and stats["registered_now"] == 0  # unregistered at close


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_batches_are_ready_on_the_stream_that_asked(ds, monkeypatch):  # pragma: no cover - no GPU in CI
    # Each host-to-device copy is queued behind a ~10 ms GPU sleep on the feeder's stream, the
    # asking stream switches within one buffer (copy_batches=4), batches are used at once
    # without a synchronize and dropped: a sum that did not wait for its copy reads wrong ids.
    real_stream = torch.cuda.stream

    class SlowCopies:
        def __init__(self, stream):
            self.ctx = real_stream(stream)

        def __enter__(self):
            entered = self.ctx.__enter__()
            torch.cuda._sleep(20_000_000)
            return entered

        def __exit__(self, *exc):
            return self.ctx.__exit__(*exc)

    with Loader(ds, **OPTS) as plain:
        want = [int(b["id"].sum()) for b in plain]
    side = torch.cuda.Stream()
    sums = []
    monkeypatch.setattr(torch.cuda, "stream", SlowCopies)  # only the feeder's copies use it
    with TorchLoader(Loader(ds, workers=2, pool="process", **OPTS), device="cuda", prefetch=3, copy_batches=4) as tl:
        it = iter(tl)
        for i in range(len(want)):
            with real_stream(side if i % 2 else torch.cuda.default_stream()):
                b = next(it)
                sums.append(b["id"].sum())
                del b
    torch.cuda.synchronize()
    assert [int(x) for x in sums] == want


@pytest.fixture(scope="module")
def tabular(tmp_path_factory) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq
    root = tmp_path_factory.mktemp("tab")
    n = 300
    rng = np.random.default_rng(1)
    t = pa.table({
        "a": rng.random(n, dtype=np.float32), "b": rng.random(n, dtype=np.float32),
        "c": rng.random(n, dtype=np.float32), "i": np.arange(n, dtype=np.int64),
        "j": np.arange(n, dtype=np.int64) * 7, "s": [f"r{k}" for k in range(n)],
        "ts": pa.array(np.arange(n).astype("datetime64[ms]")), "v": pa.array([[1.0, 2.0]] * n, pa.list_(pa.float32())),
        "fs": pa.array([[1.0, 2.0]] * n, pa.list_(pa.float32(), 2)),
    })
    pq.write_table(t, root / "t.parquet", row_group_size=64)
    return str(root)


TAB = dict(batch_size=50, seed=2, columns=["a", "b", "c", "i", "j", "s", "ts"])
STACK = {"dense": ["c", "a", "b"], "ids": ["i", "j"]}


@pytest.mark.parametrize("how", ["direct", "thread", "process"])
def test_stack_gives_one_matrix_per_group(tabular, how):
    with Loader(tabular, **TAB) as plain:
        want = list(plain)
    opts = dict(TAB, workers=2, pool="process") if how == "process" else TAB
    with TorchLoader(Loader(tabular, **opts), stack=STACK, device="cpu" if how != "direct" else None) as tl:
        got = list(tl)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == ["s", "ts", "dense", "ids"]  # unstacked columns first, then the groups
        assert g["dense"].shape == (len(w["a"]), 3) and g["dense"].dtype == torch.float32
        np.testing.assert_array_equal(g["dense"].numpy(), np.stack([w["c"], w["a"], w["b"]], axis=1))
        np.testing.assert_array_equal(g["ids"].numpy(), np.stack([w["i"], w["j"]], axis=1))
        assert g["ts"].dtype == torch.int64 and torch.equal(g["ts"], torch.from_numpy(w["ts"].view(np.int64)))
        assert bytes(g["s"].values.numpy()) == bytes(w["s"].values)


@pytest.mark.parametrize("stack, message", [
    (["a"], r"stack must map an output name to a list of column names, got list"),
    ({"d": "a"}, r"stack\['d'\] must be a non-empty list of column names, got 'a'"),
    ({"d": []}, r"stack\['d'\] must be a non-empty list of column names, got \[\]"),
    ({"d": ["a", "zz"]}, r"stack\['d'\] names column 'zz', which the loader does not deliver \(its columns: a, b, c"),
    ({"d": ["a", "s"]}, r"stack\['d'\]: column 's' is variable-length \(utf8\); only one-value-per-row columns can be stacked"),
    ({"d": ["a", "i"]}, r"stack\['d'\] mixes dtypes float32 \(a\) and int64 \(i\); stack columns of one dtype"),
    ({"d": ["a"], "e": ["b", "a"]}, r"column 'a' is in stack\['d'\] and stack\['e'\]; a column can be stacked once"),
    ({"i": ["a", "b"]}, r"stack name 'i' is also a column that is not stacked; pick another name"),
])
def test_stack_refuses_what_cannot_be_stacked(tabular, stack, message):
    with pytest.raises(OptionError, match=message):
        TorchLoader(Loader(tabular, **TAB), stack=stack)


def test_stack_refuses_a_list_column(tabular):
    with pytest.raises(OptionError, match=r"stack\['d'\]: column 'v' is variable-length \(list\); only one-value"):
        TorchLoader(Loader(tabular, batch_size=50, seed=2), stack={"d": ["v"]})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_stack(tabular):  # pragma: no cover - no GPU in CI
    with Loader(tabular, **TAB) as plain:
        want = list(plain)
    with TorchLoader(Loader(tabular, workers=2, pool="process", **TAB), stack=STACK, device="cuda", copy_batches=3) as tl:
        got = [{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in tl]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["dense"].numpy(), np.stack([w["c"], w["a"], w["b"]], axis=1))


# Dtypes and shapes a slab must carry unchanged, as a NumPy batch may hold them.
ODD = {
    "i8": np.arange(-5, 5, dtype=np.int8),
    "bool": np.arange(10) % 3 == 0,
    "f16": np.linspace(0, 1, 10).astype(np.float16),
    "c64": (np.arange(10) + 1j).astype(np.complex64),
    "u16": np.arange(10, dtype=np.uint16),
    "days": np.arange(10).astype("datetime64[D]"),
    "td": np.arange(10).astype("timedelta64[s]"),
    "fortran": np.asfortranarray(np.arange(30, dtype=np.float32).reshape(10, 3)),
    "reversed": np.arange(10, dtype=np.int32)[::-1],
    "broadcast": np.broadcast_to(np.int64(7), (10,)),
    "3d": np.arange(60, dtype=np.float64).reshape(10, 3, 2),
}


def test_slab_carries_odd_dtypes_and_layouts():
    from detload import Ragged
    from detload.torch.tensors import pack, unpack_slab
    batch = dict(ODD, empty_values=Ragged(np.empty(0, np.uint8), np.zeros(11, np.int64), "utf8"),
                 lists=Ragged(np.arange(5, dtype=np.float32), np.array([0, 1, 1, 1, 1, 1, 2, 2, 3, 4, 5]), "list"))
    zero = {"a": np.empty(0, np.float32), "m": np.empty((0, 3), np.int16),
            "s": Ragged(np.empty(0, np.uint8), np.zeros(1, np.int64), "utf8")}
    slab, layout = pack([batch, zero, batch], pin=False)
    for parts, src in zip(layout, (batch, zero, batch), strict=True):
        got = unpack_slab(slab, parts, {})
        want = to_torch({k: v if isinstance(v, Ragged) else np.ascontiguousarray(v) for k, v in src.items()})
        assert list(got) == list(want)
        for k, w in want.items():
            g = got[k]
            pairs = [(g.values, w.values), (g.offsets, w.offsets)] if isinstance(w, RaggedTensor) else [(g, w)]
            for x, y in pairs:
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), k


def test_slab_columns_do_not_share_autograd_versions(tabular):
    # Columns of one buffer share memory, not a view base: an in-place change of one column
    # must not bump another's version counter (views of one base share it), so backward()
    # through the other works and gives the gradient of the same step on copies.
    for opts in (dict(), dict(device="cpu", copy_batches=2)):
        with TorchLoader(Loader(tabular, **TAB), stack=STACK, **opts) as tl:
            steps = 0
            for b in tl:
                dense, ids = b["dense"], b["ids"]
                assert dense.untyped_storage().data_ptr() == ids.untyped_storage().data_ptr(), "one buffer"
                lin = torch.nn.Linear(3, 1)
                ref = torch.nn.Linear(3, 1)
                ref.load_state_dict(lin.state_dict())
                ref_loss = ((ref(dense.clone()).squeeze(1) - ids[:, 0].float()) ** 2).mean()
                out = lin(dense).squeeze(1)  # Linear saves its input for backward
                target = ids[:, 0].float()
                version, want_ids = dense._version, ids - 1
                ids.sub_(1)  # an in-place change of another tensor of the same buffer
                assert dense._version == version and torch.equal(ids, want_ids)
                loss = ((out - target) ** 2).mean()
                loss.backward()
                ref_loss.backward()
                assert torch.equal(loss, ref_loss)
                assert torch.equal(lin.weight.grad, ref.weight.grad) and torch.equal(lin.bias.grad, ref.bias.grad)
                steps += 1
            assert steps == len(tl), opts


def test_stack_with_copy_batches_on_the_cpu(tabular, monkeypatch):
    import detload.torch.handoff as dt
    real, calls = dt.pack, []
    monkeypatch.setattr(dt, "pack", lambda batches, pin, stack=(): calls.append(len(batches)) or real(
        batches, pin=pin, stack=stack))
    with Loader(tabular, **TAB) as plain:
        want = list(plain)
    with TorchLoader(Loader(tabular, **TAB), stack=STACK, device="cpu", copy_batches=3) as tl:
        got = list(tl)
    assert calls == [3] * (len(want) // 3) + ([len(want) % 3] if len(want) % 3 else [])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["dense"].numpy(), np.stack([w["c"], w["a"], w["b"]], axis=1))
        np.testing.assert_array_equal(g["ids"].numpy(), np.stack([w["i"], w["j"]], axis=1))


def test_copy_batches_groups_on_the_cpu_device_too(ds, monkeypatch):
    import detload.torch.handoff as dt
    real, calls = dt.pack, []
    monkeypatch.setattr(dt, "pack", lambda batches, pin, stack=(): calls.append(len(batches)) or real(
        batches, pin=pin, stack=stack))
    with TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=4) as tl:
        got = [hash_batch(back_to_numpy(b))[0] for b in tl]
    assert got == reference(ds)
    assert calls and max(calls) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without a GPU")
def test_copy_batches_with_pinning_dropped_only_warns(ds):
    with pytest.warns(UserWarning, match=r"pin_memory=True but no accelerator is available: batches are not "
                                         r"pinned \(and copy_batches=4 has no effect\)"):
        tl = TorchLoader(Loader(ds, **OPTS), pin_memory=True, copy_batches=4)
    assert tl.copy_batches == 1
    with tl:
        assert [hash_batch(back_to_numpy(b))[0] for b in tl] == reference(ds)


def test_copy_batches_hands_over_the_good_batches_before_an_error(ds):
    bad = ("a.parquet", 1)
    counts = {}
    for group in (1, 4):
        hooks = DebugHooks(fail_unit=bad, fail_exc=OSError("disk on fire"))
        got = 0
        with TorchLoader(hooked(Loader, ds, debug=hooks, **BLOCKS), device="cpu", copy_batches=group) as tl, \
                pytest.raises(WorkerError, match="disk on fire"):
            for _ in tl:
                got += 1
        counts[group] = got
    assert counts[4] == counts[1] > 0


class _SlowAfter(Loader):
    """Counts the batches taken from it; each one after the first ``fast`` takes 0.1 s (a slow read)."""

    pulled = 0
    fast = 0

    def __iter__(self):
        for b in super().__iter__():
            self.pulled += 1
            if self.pulled > self.fast:
                time.sleep(0.1)
            yield b


def test_copy_batches_stops_reading_when_the_loop_leaves(ds):
    # The loop takes one group and leaves while the feeder collects the next, slowly:
    # the feeder must not read the rest of that group.
    group = 6
    ld = _SlowAfter(ds, **OPTS)
    ld.fast = group
    assert len(ld) >= 2 * group
    with TorchLoader(ld, device="cpu", copy_batches=group) as tl:
        it = iter(tl)
        for _ in range(group):
            next(it)
        it.close()
        assert not feeders()
    assert ld.pulled <= group + 2, ld.pulled  # the rest of the group would make 2 * group


def test_stack_message_for_a_2d_column_and_bad_keys(tabular):
    with pytest.raises(OptionError, match=r"stack\['d'\]: column 'fs' is 2-D; only one-value-per-row columns"):
        TorchLoader(Loader(tabular, batch_size=50, seed=2), stack={"d": ["fs"]})
    with pytest.raises(OptionError, match=r"stack's keys are the names of the stacked tensors \(str\), got 1"):
        TorchLoader(Loader(tabular, **TAB), stack={1: ["a"]})
    with pytest.raises(OptionError, match=r"column 'a' is twice in stack\['d'\]; a column can be stacked once"):
        TorchLoader(Loader(tabular, **TAB), stack={"d": ["a", "b", "a"]})


def test_stack_without_a_thread_copies_only_the_groups(tabular):
    with TorchLoader(Loader(tabular, **TAB), stack=STACK) as tl:
        b = next(iter(tl))
        slab = b["dense"].untyped_storage().data_ptr()
        assert b["ids"].untyped_storage().data_ptr() == slab  # the groups share one buffer
        assert b["ts"].untyped_storage().data_ptr() != slab  # the rest is the batch's own memory
        assert b["s"].values.untyped_storage().data_ptr() != slab


def test_a_replaced_iterator_says_so_and_leaves_the_state_alone(ds):
    for group in (1, 4):
        with TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=group) as tl:
            old = iter(tl)
            for _ in range(5):
                next(old)
            time.sleep(0.2)  # the feeder fills its queue
            tl.set_epoch(1)
            with pytest.raises(DetloadError, match=r"this TorchLoader iteration was stopped: set_epoch\(\), "
                               r"load_state_dict\(\), close\(\) or a new iter\(\) was called since it began"):
                next(old)
            assert (tl.state_dict()["epoch"], tl.state_dict()["step"]) == (1, 0)
            assert [hash_batch(back_to_numpy(b))[0] for b in tl] == reference(ds, epoch=1)


def test_buffers_go_with_a_handled_error_without_the_cycle_collector(ds, monkeypatch):
    import weakref

    import detload.torch.handoff as dt
    real, slabs = dt.pack, []

    def tracked(batches, pin, stack=()):
        slab, layout = real(batches, pin=False, stack=stack)
        slabs.append(weakref.ref(slab))
        return slab, layout

    monkeypatch.setattr(dt, "pack", tracked)
    gc.collect()
    gc.disable()
    try:
        for group in (1, 4):
            slabs.clear()
            hooks = DebugHooks(fail_unit=("a.parquet", 1), fail_exc=OSError("disk on fire"))
            with TorchLoader(hooked(Loader, ds, debug=hooks, **BLOCKS), device="cpu", copy_batches=group) as tl:
                tl.pin_memory = True
                try:
                    for b in tl:
                        del b
                except WorkerError:
                    pass
            assert slabs and not [r for r in slabs if r() is not None], group
    finally:
        gc.enable()


def test_refused_set_epoch_and_state_leave_the_iteration_running(ds):
    want = reference(ds)
    with TorchLoader(Loader(ds, **OPTS), device="cpu", copy_batches=2) as tl:
        it = iter(tl)
        got = [hash_batch(back_to_numpy(next(it)))[0] for _ in range(3)]
        wait_until(lambda: tl._queue is not None and tl._queue.full(), 10.0)  # the feeder ran ahead
        for bad in (-1, "x", None, 2**32):
            with pytest.raises(OptionError, match=r"epoch must be an int in \[0, 2\*\*32\), got"):
                tl.set_epoch(bad)
        other = dict(tl.state_dict(), fingerprint="0" * 16)
        with pytest.raises(StateError, match="cannot resume: the state's plan fingerprint does not match"):
            tl.load_state_dict(other)
        assert tl.state_dict()["step"] == 3  # what the loop received, not what was read ahead
        got += [hash_batch(back_to_numpy(b))[0] for b in it]
    assert got == want


@contextlib.contextmanager
def _feeder_waiting_in_a_stalled_read(ds: str) -> Iterator[tuple[TorchLoader, Iterator[Any]]]:
    """A TorchLoader whose loop took the batches that need only epoch 0's first block, so its
    feeder now waits inside the loader for the second block, whose first read stalls 12 s."""
    with Loader(ds, **BLOCKS) as probe:
        second = probe.plan(0).schedule[1]
        u = second.sources[0]
        fi, rg = int(probe._unit_files[u]), int(probe._unit_rgs[u])
        rel = probe.dataset.files[fi].path
    hooks = DebugHooks(stall_unit=(rel, rg), stall_seconds=12.0, stall_epoch=0)
    with TorchLoader(hooked(Loader, ds, debug=hooks, **BLOCKS), device="cpu") as tl:
        it = iter(tl)
        for _ in range(second.first_step):
            next(it)
        status = tl.loader._pool.statuses[0]
        wait_until(lambda: tuple(status.get()[2:]) == (fi, rg) and tl._queue is not None and tl._queue.empty(),
                   10.0)
        yield tl, it


def test_break_during_a_stalled_read_is_prompt(ds):
    # Leaving the loop must not wait for the stalled read (a Loader's break does not either).
    with _feeder_waiting_in_a_stalled_read(ds) as (_, it):
        t0 = time.monotonic()
        it.close()
        left = time.monotonic() - t0
        assert not feeders()
    assert left < 6.0, left


def test_an_interrupt_while_stopping_strands_no_feeder(ds, monkeypatch):
    # A KeyboardInterrupt (a second Ctrl-C) landing while the loop stops the loader's pass
    # must still wake the feeder waiting in it, and leave nothing for the next call to wait on.
    from detload._engine.pool import WorkerPool
    real, armed = WorkerPool.drain, [False]

    def drain(self):
        if armed[0] and threading.current_thread() is threading.main_thread():
            armed[0] = False
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(WorkerPool, "drain", drain)
    with _feeder_waiting_in_a_stalled_read(ds) as (tl, it):
        armed[0] = True
        with pytest.raises(KeyboardInterrupt):
            it.close()
        assert not armed[0]  # the interrupt did land inside the stop
        wait_until(lambda: not feeders(), 5.0)
        t0 = time.monotonic()
        tl.set_epoch(1)
        assert time.monotonic() - t0 < 5.0


def test_an_iterator_never_started_starts_no_thread(ds):
    with TorchLoader(Loader(ds, **OPTS), device="cpu") as tl:
        it = iter(tl)
        time.sleep(0.1)
        assert not feeders()
        del it
        assert [hash_batch(back_to_numpy(b))[0] for b in tl] == reference(ds)


@pytest.mark.parametrize("device", ["mps", "meta", "gpu", 1.5, -1])
def test_device_must_be_the_cpu_or_cuda(ds, device):
    with pytest.raises(OptionError, match=r"device must be None, 'cpu', 'cuda', 'cuda:N' or a CUDA index, got"):
        TorchLoader(Loader(ds, **OPTS), device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_a_cuda_index_is_a_cuda_device(ds):
    with pytest.raises(OptionError, match=r"device='cuda:0' but torch.cuda.is_available\(\) is False"):
        TorchLoader(Loader(ds, **OPTS), device=0)


def test_torch_loader_uses_only_public_loader_methods():
    """What the adapter needs from Loader is public: no call of a Loader private remains."""
    import re
    from pathlib import Path

    import detload.torch

    files = sorted(Path(detload.torch.__file__).parent.glob("*.py"))
    assert {f.name for f in files} >= {"__init__.py", "loader.py", "handoff.py", "tensors.py"}
    for f in files:
        assert not re.findall(r"\bloader\._\w+", f.read_text()), f.name


def test_the_adapter_imports_at_module_level_only():
    """No import inside a function of detload/torch/ (one would hide an import cycle)."""
    import ast
    from pathlib import Path

    import detload.torch

    for f in sorted(Path(detload.torch.__file__).parent.glob("*.py")):
        tree = ast.parse(f.read_text())
        inner = [(f.name, node.lineno) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert not inner, inner
