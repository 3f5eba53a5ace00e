"""The registered hand-off of TorchLoader (detload/torch/handoff.py, registry.py), on the CPU with a stand-in registrar.

With device="cuda" and process workers, TorchLoader registers every shared-memory segment
once as pinned memory and copies each block to the device straight from it. There is no GPU
here: a fake registrar takes cudaHostRegister's place (a test hook), the "device copy" is a
clone, and what is checked is the bookkeeping (register on add, once per segment, again when a
segment is remapped bigger at the same address, unregister before unmap and before close) and
that the batches are the loader's, byte for byte, with the remaining host copies counted.
"""

from __future__ import annotations

import os

import _distdata
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from detload import Loader, hash_batch  # noqa: E402
from detload._hooks import Hooks, installed  # noqa: E402
from detload.torch import RaggedTensor, TorchLoader  # noqa: E402
from detload.torch.registry import HandoffStats, HostRegistry  # noqa: E402

OPTS = dict(batch_size=40, seed=5, columns=["id", "s", "x"])


def _mapped(address: int) -> bool:
    """Whether ``address`` lies in one of this process's mappings (read from /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return True
    return False


class FakeRegistrar:
    """Stands in for cudaHostRegister / cudaHostUnregister and checks how it is called."""

    def __init__(self, fail_every: int = 0) -> None:
        self.live: dict[int, int] = {}
        self.log: list[tuple[str, int, int]] = []
        self.fail_every = fail_every
        self.calls = 0

    def register(self, address: int, nbytes: int) -> bool:
        assert address not in self.live, "registered twice without an unregister between"
        assert _mapped(address) and _mapped(address + nbytes - 1), "registered memory that is not mapped"
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            return False
        self.live[address] = nbytes
        self.log.append(("register", address, nbytes))
        return True

    def unregister(self, address: int) -> None:
        assert address in self.live, "unregistered what was never registered"
        assert _mapped(address), "unregistered after the memory was unmapped"
        self.log.append(("unregister", address, self.live.pop(address)))

    @property
    def pair(self):
        return (self.register, self.unregister)


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("pinned") / "ds")
    _distdata.write(root)
    return root


def back_to_numpy(batch) -> dict:
    from detload import Ragged

    return {k: Ragged(v.values.numpy(), v.offsets.numpy(), v.kind) if isinstance(v, RaggedTensor) else v.numpy()
            for k, v in batch.items()}


def reference(ds: str, epoch: int = 0, **opts) -> list[str]:
    with Loader(ds, **{**OPTS, **opts}) as loader:
        loader.set_epoch(epoch)
        return [hash_batch(b)[0] for b in loader]


def registered_loader(ds, fake: FakeRegistrar, **opts):
    with installed(Hooks(torch_registrar=fake.pair)):
        return TorchLoader(Loader(ds, workers=2, pool="process", **{**OPTS, **opts}), device="cpu")


# -- the registry on its own ------------------------------------------------------------------
def test_a_segment_is_registered_once_and_again_when_it_grows():
    fake_log: list = []
    stats = HandoffStats()
    reg = HostRegistry(lambda a, n: fake_log.append(("reg", a, n)) or True,
                       lambda a: fake_log.append(("unreg", a)), stats,
                       before_unregister=lambda: fake_log.append(("drain",)))
    reg.added(4096, 100)
    reg.added(4096, 100)  # announced again (a second listener, a new pass): not registered twice
    assert fake_log == [("reg", 4096, 100)]
    reg.added(4096, 300)  # remapped bigger at the same address
    assert fake_log[1:] == [("drain",), ("unreg", 4096), ("reg", 4096, 300)]
    assert reg.find(4096 + 250, 50) and not reg.find(4096 + 250, 51) and not reg.find(4000, 10)
    reg.removed(4096, 300)
    assert fake_log[-2:] == [("drain",), ("unreg", 4096)], "the copies in flight are waited for first"
    assert not reg.find(4096, 1)
    reg.removed(4096, 300)  # withdrawn twice: nothing more
    assert fake_log[-1] == ("unreg", 4096) and len(fake_log) == 6
    assert (stats["registrations"], stats["unregistrations"], stats["registered_now"]) == (2, 2, 0)


def test_a_failed_registration_is_counted_and_leaves_the_buffer_to_the_copy_path():
    stats = HandoffStats()
    unregs: list[int] = []
    reg = HostRegistry(lambda a, n: a != 8192, unregs.append, stats)
    reg.added(4096, 10)
    reg.added(8192, 10)
    assert reg.find(4096, 10) and not reg.find(8192, 10)
    assert (stats["registrations"], stats["registration_failures"]) == (1, 1)
    reg.removed(8192, 10)
    assert unregs == []  # never registered: never unregistered
    reg.close()
    assert unregs == [4096] and stats["registered_now"] == 0


events = st.lists(st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 3), st.sampled_from([64, 128, 256])),
                  max_size=40)


@settings(max_examples=200, deadline=None)
@given(events)
def test_the_registry_mirrors_the_live_buffers(seq):
    # Whatever the order of announcements, each address is registered at most once at a time,
    # with the size last announced, and unregistered exactly as often as it was registered.
    live: dict[int, int] = {}
    calls: list[tuple[str, int, int]] = []

    def register(a, n):
        assert a not in live
        live[a] = n
        calls.append(("reg", a, n))
        return True

    def unregister(a):
        calls.append(("unreg", a, live.pop(a)))

    model: dict[int, int] = {}
    reg = HostRegistry(register, unregister, HandoffStats())
    for op, slot, size in seq:
        address = 1 << 20 | slot << 12
        if op == "add":
            reg.added(address, size)
            model[address] = size
        else:
            reg.removed(address, size)
            model.pop(address, None)
        assert live == model == reg.live
    reg.close()
    assert live == {}
    assert sum(c[0] == "reg" for c in calls) == sum(c[0] == "unreg" for c in calls)


# -- in a loader --------------------------------------------------------------------------------
def test_batches_are_the_loaders_and_every_segment_is_registered_once_then_unregistered_before_unmap(ds):
    fake = FakeRegistrar()
    want = [reference(ds, e) for e in range(2)]
    with registered_loader(ds, fake) as tl:
        for epoch in range(2):
            tl.set_epoch(epoch)
            got = [hash_batch(back_to_numpy(b))[0] for b in tl]
            assert got == want[epoch]
        stats = tl.handoff_stats()
        assert fake.live, "segments are registered while the loader lives"
        registered = [(a, n) for what, a, n in fake.log if what == "register"]
        # Once per segment: no address is registered again while the same mapping lives.
        assert len(registered) == len(set(registered)) == stats["registrations"]
    assert fake.live == {}, "close() unregisters every segment"
    assert stats["batches"] == len(want[0]) * 2
    assert stats["direct_batches"] > 0 and stats["block_copies"] > 0
    # The string column's offsets are rebased by the merger (a copy, counted) unless a batch
    # starts its block, where they already start at 0 and stay a view.
    assert 0 < stats["rebased_offsets"] < stats["batches"]
    # Blocks of uneven row groups do not divide into batches of 40: some batches are stitched.
    assert stats["stitched_batches"] > 0
    assert stats["copied_arrays"] >= stats["rebased_offsets"] + stats["stitched_batches"]
    assert stats["direct_batches"] + stats["stitched_batches"] <= stats["batches"]


def test_a_failed_registration_still_delivers_the_same_batches(ds):
    fake = FakeRegistrar(fail_every=2)
    with registered_loader(ds, fake) as tl:
        got = [hash_batch(back_to_numpy(b))[0] for b in tl]
        stats = tl.handoff_stats()
    assert got == reference(ds)
    assert stats["registration_failures"] > 0 and fake.live == {}
    # Batches in a segment that failed to register are copied, and said to be so.
    assert stats["unregistered_batches"] > 0
    assert stats["direct_batches"] + stats["stitched_batches"] + stats["unregistered_batches"] <= stats["batches"]


def test_kept_batches_stay_correct_after_their_blocks_went_back(ds):
    # The device copy is the batch's memory: a worker reusing the segment changes nothing in it.
    fake = FakeRegistrar()
    with registered_loader(ds, fake) as tl:
        kept = list(tl)
    assert [hash_batch(back_to_numpy(b))[0] for b in kept] == reference(ds)


def test_not_used_without_the_registrar_on_the_cpu_nor_with_the_staged_switch_or_thread_workers(ds):
    with TorchLoader(Loader(ds, workers=2, pool="process", **OPTS), device="cpu") as tl:
        assert [hash_batch(back_to_numpy(b))[0] for b in tl] == reference(ds)
        assert tl._registry is None and set(tl.handoff_stats().values()) == {0}
    fake = FakeRegistrar()
    with installed(Hooks(torch_registrar=fake.pair, torch_staged=True)):
        tl = TorchLoader(Loader(ds, workers=2, pool="process", **OPTS), device="cpu")
    with tl:
        list(tl)
        assert tl._registry is None and fake.log == []
    with installed(Hooks(torch_registrar=fake.pair)):
        tl = TorchLoader(Loader(ds, workers=2, pool="thread", **OPTS), device="cpu")
    with tl:
        list(tl)
        assert tl._registry is None and fake.log == []


@pytest.fixture(scope="module")
def tabular(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("pinned_tab")
    rng = np.random.default_rng(0)
    for f in range(2):
        n = 230 + 70 * f
        pq.write_table(pa.table({
            "a": rng.random(n).astype(np.float32), "b": rng.random(n).astype(np.float32),
            "c": rng.random(n).astype(np.float32), "i": rng.integers(0, 9, n), "j": rng.integers(0, 9, n),
            "s": pa.array([f"v{k}" * (k % 4) for k in range(n)]),
            "ts": pa.array(np.arange(n).astype("datetime64[ms]")),
            "l": pa.array([list(range(k % 3)) for k in range(n)], pa.list_(pa.int32())),
        }), os.path.join(root, f"p{f}.parquet"), row_group_size=60)
    return str(root)


def test_stack_and_every_column_kind_match_the_staged_path(tabular):
    opts = dict(batch_size=50, seed=2, order="windowed", shuffle_window=2)
    stack = {"dense": ["c", "a", "b"], "ids": ["i", "j"]}
    with installed(Hooks(torch_staged=True)):
        staged = TorchLoader(Loader(tabular, workers=2, pool="process", **opts), device="cpu", stack=stack)
    with staged:
        want = [back_to_numpy(b) for b in staged]
    fake = FakeRegistrar()
    with installed(Hooks(torch_registrar=fake.pair)):
        tl = TorchLoader(Loader(tabular, workers=2, pool="process", **opts), device="cpu", stack=stack)
    with tl:
        got = [back_to_numpy(b) for b in tl]
        stats = tl.handoff_stats()
    assert len(got) == len(want) and stats["direct_batches"] > 0
    # "ids" (i, j) lie one after the other in a block: one strided view; "dense" (c, a, b) is not
    # in block order: per-column views and a stack. Both give the staged path's matrices.
    assert 0 < stats["strided_groups"] < 2 * stats["batches"]
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)  # same columns in the same order: unstacked first, then the groups
        for k in w:
            if hasattr(w[k], "offsets"):
                assert np.array_equal(g[k].values, w[k].values) and np.array_equal(g[k].offsets, w[k].offsets)
            else:
                assert g[k].dtype == w[k].dtype and np.array_equal(g[k], w[k]), k
    assert fake.live == {}


def test_a_new_torch_loader_over_the_same_loader_reuses_its_registrations(ds):
    # A training script may wrap the same Loader anew each epoch: its segments are registered
    # once (a buffer cannot be registered twice), and the counters cover both.
    fake = FakeRegistrar()
    loader = Loader(ds, workers=2, pool="process", **OPTS)
    with installed(Hooks(torch_registrar=fake.pair)):
        first = TorchLoader(loader, device="cpu")
    got0 = [hash_batch(back_to_numpy(b))[0] for b in first]
    registered = fake.log.count(fake.log[0])
    with installed(Hooks(torch_registrar=fake.pair)):
        second = TorchLoader(loader, device="cpu")
    second.set_epoch(1)
    got1 = [hash_batch(back_to_numpy(b))[0] for b in second]
    assert second._registry is first._registry and registered == 1
    assert got0 == reference(ds, 0) and got1 == reference(ds, 1)
    stats = second.handoff_stats()
    assert stats["batches"] == len(got0) + len(got1) and stats["registration_failures"] == 0
    second.close()
    assert fake.live == {}


@pytest.fixture(scope="module")
def queries(tmp_path_factory) -> str:
    from _groupdata import write_queries

    root = str(tmp_path_factory.mktemp("pinned_q") / "q")
    write_queries(root, [[5, 3, 7, 2, 4, 6, 1, 9, 3], [1, 8, 3, 2, 6, 11]], 7)
    return root


@pytest.mark.parametrize("unpack", [None, "host"])
def test_grouped_batches_come_out_packed_or_flat_as_asked(queries, unpack):
    # A group_by loader's batches travel with their group index and offsets beside the columns;
    # the registered hand-off hands out what unpack= asks for, as the other paths do.
    from detload.torch import PackedTensors

    kw = dict(batch_size=32, seed=3, order="windowed", shuffle_window=2, group_by="q", group_columns=["qf", "emb", "qtext"],
              columns=["q", "qf", "emb", "qtext", "item", "price", "tags"], workers=2, pool="process")

    def run(tl):
        with tl:
            got = [b.unpack() if isinstance(b, PackedTensors) else b for b in tl]
            kinds = {type(b) for b in tl}
            return [back_to_numpy(b) for b in got], kinds, tl.handoff_stats()

    want, want_kinds, _ = run(TorchLoader(Loader(queries, **kw), device="cpu", unpack=unpack))
    fake = FakeRegistrar()
    with installed(Hooks(torch_registrar=fake.pair)):
        tl = TorchLoader(Loader(queries, **kw), device="cpu", unpack=unpack)
    got, kinds, stats = run(tl)
    assert kinds == want_kinds == {PackedTensors if unpack is None else dict}
    assert stats["batches"] == 2 * len(want) and stats["block_copies"] > 0  # the registered path ran
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)
        for k in w:
            if hasattr(w[k], "offsets"):
                assert g[k].values.tobytes() == w[k].values.tobytes(), k
                assert g[k].offsets.tobytes() == w[k].offsets.tobytes(), k
            else:  # the same bytes (NaNs included)
                assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape and g[k].tobytes() == w[k].tobytes(), k
