"""TorchLoader over a group_by Loader: packed tensors, unpacked on the host or on the device.

No GPU here: ``device="cpu"`` runs the feeder thread's path (slab, copy, expansion), and
``unpack="device"`` with the CPU is the host expansion, as documented.
"""

from __future__ import annotations

import numpy as np
import pytest
from _groupdata import write_queries

torch = pytest.importorskip("torch")

from detload import Loader, OptionError  # noqa: E402
from detload.torch import PackedTensors, RaggedTensor, TorchLoader  # noqa: E402

KW = dict(batch_size=32, seed=3, order="windowed", shuffle_window=2, group_by="q", group_columns=["qf", "emb", "qtext"],
          columns=["q", "qf", "emb", "qtext", "item", "price", "tags"])


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    r = str(tmp_path_factory.mktemp("tq") / "q")
    write_queries(r, [[5, 3, 7, 2, 4, 6, 1, 9, 3], [1, 8, 3, 2, 6, 11]], 7)
    return r


def _flat_numpy(root: str) -> list[dict[str, object]]:
    with Loader(root, **KW) as loader:
        return [b.unpack() for b in loader]


def _same(t: object, a: object) -> None:
    if isinstance(t, RaggedTensor):
        assert np.array_equal(t.values.numpy(), a.values) and np.array_equal(t.offsets.numpy(), a.offsets)
    else:
        assert t.numpy().tobytes() == np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("unpack", ["auto", "host", None])
def test_every_unpack_mode_gives_the_stored_rows(root, device, unpack):
    want = _flat_numpy(root)
    kw = {} if unpack == "auto" else {"unpack": unpack}
    with TorchLoader(Loader(root, **KW), device=device, **kw) as tl:
        got = list(tl)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if unpack is None:
            assert isinstance(g, PackedTensors)
            assert set(g.groups) == {"q", "qf", "emb", "qtext"} and g.n_items == len(w["item"])
            assert g.group_index.dtype == torch.int64 and g.offsets.dtype == torch.int64
            assert len(g.groups["q"]) == g.n_groups  # group columns travel once per group
            g = g.unpack()
        assert list(g) == list(w)
        for k in w:
            _same(g[k], w[k])


def test_device_unpack_with_the_cpu_is_the_host_expansion(root):
    with TorchLoader(Loader(root, **KW), device="cpu", unpack="device") as tl:
        assert tl.unpack == "host"
        assert [b["item"].tolist() for b in tl] == [w["item"].tolist() for w in _flat_numpy(root)]


def test_stack_keeps_group_and_item_columns_apart(root):
    kw = dict(KW, columns=["q", "qf", "qf2", "item", "price", "p2"])
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    src = os.path.join(os.path.dirname(root), "q2")
    os.makedirs(src, exist_ok=True)
    for f in sorted(os.listdir(root)):
        t = pq.read_table(os.path.join(root, f))
        t = t.append_column("qf2", pa.compute.multiply(t.column("qf"), 2)).append_column(
            "p2", pa.compute.add(t.column("price"), 1))
        pq.write_table(t, os.path.join(src, f), row_group_size=7)
    kw["group_columns"] = ["qf", "qf2"]
    with pytest.raises(OptionError, match=r"stack\['m'\] mixes group columns \['qf'\] with item columns"):
        TorchLoader(Loader(src, **kw), stack={"m": ["qf", "price"]})
    with TorchLoader(Loader(src, **kw), stack={"query": ["qf", "qf2"], "dense": ["price", "p2"]},
                     unpack=None) as tl:
        for b in tl:
            assert b.groups["query"].shape == (b.n_groups, 2) and b.items["dense"].shape == (b.n_items, 2)
            flat = b.unpack()
            assert flat["query"].shape == (b.n_items, 2)
            assert torch.allclose(flat["query"][:, 1], flat["query"][:, 0] * 2, equal_nan=True)
            assert torch.allclose(flat["query"][:, 0], b.groups["query"][b.group_index, 0], equal_nan=True)


def test_unpack_errors(root, tmp_path):
    with pytest.raises(OptionError, match=r"unpack='device' needs device= \(e.g. device='cuda'\)"):
        TorchLoader(Loader(root, **KW), unpack="device")
    with pytest.raises(OptionError, match=r"unpack must be 'device', 'host' or None, got 'gpu'"):
        TorchLoader(Loader(root, **KW), unpack="gpu")
    with pytest.raises(OptionError, match=r"unpack='host' applies to a Loader with group_by="):
        TorchLoader(Loader(root, batch_size=8, seed=0), unpack="host")


def test_ragged_group_columns_expand_on_the_tensor_side():
    from detload.torch.tensors import expand

    col = RaggedTensor(torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.uint8), torch.tensor([0, 2, 2, 6]), "binary")
    out = expand(col, torch.tensor([2, 0, 0, 1, 2]))
    assert out.offsets.tolist() == [0, 4, 6, 8, 8, 12]
    assert out.values.tolist() == [3, 4, 5, 6, 1, 2, 1, 2, 3, 4, 5, 6]
    empty = expand(col, torch.zeros(0, dtype=torch.int64))
    assert empty.offsets.tolist() == [0] and empty.values.numel() == 0
