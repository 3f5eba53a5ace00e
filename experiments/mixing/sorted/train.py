"""The sorted-data AUC experiment's model and training loop (run.py drives them).

A hashed wide-and-deep CTR model, trained on one thread for 2 epochs of 512-row batches in one of
three orders: ``mix`` (detload's default order), ``windowed`` (detload's ``order="windowed"``,
``shuffle_window=4``) and ``iid`` (a NumPy permutation per epoch of the training table in memory).
The model's initial weights are the same for every order and seed, so only the batch order
differs between runs. Not meant to be run on its own:

    PYTHONPATH=. python experiments/mixing/sorted/run.py --help
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import detload

BATCH, EPOCHS, LR = 512, 2, 2e-3
INIT_SEED = 777  # the same initial weights for every run: the seed only changes the order
BUCKETS = 1 << 16
ORDERS = ("mix", "windowed", "iid")


class WideDeep(nn.Module):
    """Wide: hashed per-field ids and hashed pairwise crosses -> one weight each (a logistic
    regression). Deep: hashed per-field ids -> a shared 8-d embedding table, with the numerics
    -> MLP(32) -> 1. The output is the sum of both logits."""

    def __init__(self, n_cat: int, n_num: int, dim: int = 8) -> None:
        super().__init__()
        self.n_cat = n_cat
        pairs = [(i, j) for i in range(n_cat) for j in range(i + 1, n_cat)]
        self.register_buffer("pair_i", torch.tensor([p[0] for p in pairs]), persistent=False)
        self.register_buffer("pair_j", torch.tensor([p[1] for p in pairs]), persistent=False)
        self.wide = nn.EmbeddingBag(BUCKETS, 1, mode="sum")
        self.emb = nn.Embedding(BUCKETS, dim)
        self.mlp = nn.Sequential(nn.Linear(n_cat * dim + n_num, 32), nn.ReLU(), nn.Linear(32, 1))
        nn.init.zeros_(self.wide.weight)
        nn.init.normal_(self.emb.weight, 0, 0.05)

    def hashes(self, cats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cats (B, C) int64 -> field ids (B, C) and cross ids (B, C(C-1)/2), all in [0, BUCKETS)."""
        f = torch.arange(self.n_cat, dtype=torch.int64)
        h = (cats * 2654435761 + f * 1000003 + 12345) % BUCKETS  # the field in the hash: equal values differ
        i, j = self.pair_i, self.pair_j
        x = (cats[:, i] * 40503 + cats[:, j] * 69069 + (i * 31 + j) * 7919 + 1) % BUCKETS
        return h, (x * 2654435761 + 97) % BUCKETS

    def forward(self, cats: torch.Tensor, nums: torch.Tensor) -> torch.Tensor:
        h, x = self.hashes(cats)
        wide = self.wide(torch.cat([h, x], dim=1)).squeeze(1)
        deep = self.mlp(torch.cat([self.emb(h).flatten(1), nums], dim=1)).squeeze(1)
        return wide + deep


def tensors(batch: dict, cats: list[str], nums: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    c = torch.from_numpy(np.stack([np.asarray(batch[k], dtype=np.int64) for k in cats], 1))
    x = torch.from_numpy(np.stack([np.asarray(batch[k], dtype=np.float32) for k in nums], 1))
    y = torch.from_numpy(np.asarray(batch["label"]).astype(np.float32))
    return c, x, y


def roc_auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC AUC by the rank-sum formula, ties given their mean rank (no scikit-learn needed)."""
    y = np.asarray(y).astype(bool)
    _, inv, cnt = np.unique(np.asarray(s, dtype=np.float64), return_inverse=True, return_counts=True)
    before = np.concatenate(([0], np.cumsum(cnt)[:-1])).astype(np.float64)
    ranks = (before + (cnt + 1) / 2.0)[inv]
    npos = int(y.sum())
    nneg = y.size - npos
    return float((ranks[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def read_table(folder: Path) -> dict[str, np.ndarray]:
    """All rows of ``folder`` in the loader's canonical order (files by name; `_`/`.` files skipped),
    so that row i here is the loader's global row id i."""
    files = sorted(p for p in Path(folder).glob("*.parquet") if not p.name.startswith(("_", ".")))
    t = pa.concat_tables(pq.read_table(f) for f in files)
    return {n: t.column(n).to_numpy() for n in t.column_names}


def loader_options(order: str) -> dict:
    if order == "windowed":
        return {"order": "windowed", "shuffle_window": 4}
    return {}  # mix: detload's default order, whatever its current options are


def iid_rows(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def batches(order: str, train_dir: Path, table: dict[str, np.ndarray] | None, cols: list[str],
            seed: int) -> Iterator[dict]:
    """EPOCHS epochs of BATCH-row batches (the last of an epoch may be short)."""
    if order == "iid":
        assert table is not None
        n = len(table["label"])
        for epoch in range(EPOCHS):
            perm = iid_rows(n, seed, epoch)
            for lo in range(0, n, BATCH):
                idx = perm[lo:lo + BATCH]
                yield {k: table[k][idx] for k in cols}
        return
    # one worker thread: the loader's output does not depend on the workers, and the machine's
    # other core stays free for whatever else runs
    with detload.Loader(str(train_dir), batch_size=BATCH, seed=seed, workers=1, pool="thread", columns=cols,
                        **loader_options(order)) as loader:
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            yield from loader


def train_one(dataset: Path, order: str, seed: int, table: dict[str, np.ndarray] | None,
              held_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor], schema: dict) -> dict:
    """Train from INIT_SEED's weights on ``order`` with ``seed``; the held-out AUC and a few counts.
    ``table`` (the training rows in memory) is needed for ``iid`` only."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cats, nums = schema["cats"], schema["nums"]
    t0 = time.perf_counter()
    torch.manual_seed(INIT_SEED)
    model = WideDeep(len(cats), len(nums))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    lossf = nn.BCEWithLogitsLoss()
    steps = rows = 0
    pos_rates = []
    for b in batches(order, dataset / "train", table, cats + nums + ["label"], seed):
        c, x, y = tensors(b, cats, nums)
        opt.zero_grad(set_to_none=True)
        lossf(model(c, x), y).backward()
        opt.step()
        steps += 1
        rows += len(y)
        if len(y) == BATCH:
            pos_rates.append(float(y.mean()))
    model.eval()
    ec, ex, ey = held_out
    with torch.no_grad():
        auc = roc_auc(ey.numpy(), model(ec, ex).numpy())
    return {"dataset": dataset.name, "order": order, "seed": seed, "auc": auc, "steps": steps, "rows": rows,
            "batch_pos_rate_std": float(np.std(pos_rates)), "secs": round(time.perf_counter() - t0, 2)}
