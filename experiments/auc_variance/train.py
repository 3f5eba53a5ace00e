"""Model, training loop and metrics for the AUC variance experiment.

Training is made deterministic (one thread, deterministic algorithms, a fixed initialisation
seed), so two runs that see the same batches in the same order end with bit-identical weights:
the only thing left that can change the AUC is the order the loader delivered.
ROC AUC and log loss are computed with NumPy (no scikit-learn dependency).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import xxhash
from data import CAT_CARDINALITY, N_CAT, N_DENSE, cat_names, dense_names
from torch import nn

INIT_SEED = 20240601


def make_deterministic() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


class ClickModel(nn.Module):
    """One EmbeddingBag per categorical field (sum pooling) + the dense features, then an MLP."""

    def __init__(self, dim: int = 8, hidden: tuple[int, ...] = (64, 32)) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(CAT_CARDINALITY, dim, mode="sum") for _ in range(N_CAT))
        layers: list[nn.Module] = []
        width = N_DENSE + N_CAT * dim
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, dense: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        # cats is (batch, fields); column j as a (batch, 1) input is a bag of one id per row.
        embs = [bag(cats[:, j : j + 1]) for j, bag in enumerate(self.bags)]
        return self.mlp(torch.cat([dense, *embs], dim=1)).squeeze(1)


def to_tensors(batch: Mapping[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense float32 [B, D], cats int64 [B, C], label float32 [B]) from a batch of columns."""
    dense = torch.from_numpy(np.stack([np.asarray(batch[c]) for c in dense_names()], axis=1))
    cats = torch.from_numpy(np.stack([np.asarray(batch[c], dtype=np.int64) for c in cat_names()], axis=1))
    label = torch.from_numpy(np.asarray(batch["label"]).astype(np.float32))
    return dense, cats, label


@dataclass
class TrainResult:
    auc: float
    log_loss: float
    model_hash: str


def train_and_evaluate(
    batches: Iterable[Mapping[str, np.ndarray]], eval_data: Mapping[str, np.ndarray], lr: float = 2e-3
) -> TrainResult:
    """Trains a fresh model on `batches` (all epochs, in the order given), then scores `eval_data`."""
    make_deterministic()
    torch.manual_seed(INIT_SEED)
    model = ClickModel()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    model.train()
    for batch in batches:
        dense, cats, label = to_tensors(batch)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, cats), label)
        loss.backward()
        opt.step()
    logits = predict(model, eval_data)
    labels = np.asarray(eval_data["label"])
    h = xxhash.xxh3_128()
    for p in model.state_dict().values():
        h.update(p.detach().contiguous().numpy().view(np.uint8))
    return TrainResult(roc_auc(labels, logits), log_loss(labels, logits), h.hexdigest())


@torch.no_grad()
def predict(model: nn.Module, data: Mapping[str, np.ndarray], chunk: int = 16384) -> np.ndarray:
    model.eval()
    n = len(data["label"])
    out = []
    for lo in range(0, n, chunk):
        part = {k: v[lo : lo + chunk] for k, v in data.items()}
        dense, cats, _ = to_tensors(part)
        out.append(model(dense, cats).numpy().astype(np.float64))
    return np.concatenate(out)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney U / (n_pos * n_neg), with tied scores given their average rank."""
    y = np.asarray(labels).astype(bool)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC AUC needs both classes in the labels")
    uniq, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # Ranks are 1-based; a group of c ties starting after `before` values gets before + (c + 1) / 2.
    before = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.float64)
    avg_rank = before + (counts + 1) / 2.0
    rank_sum_pos = float(avg_rank[inverse][y].sum())
    return (rank_sum_pos - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def log_loss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy computed from logits, stable for large |logit|."""
    y = np.asarray(labels, dtype=np.float64)
    z = np.asarray(logits, dtype=np.float64)
    return float(np.mean(np.maximum(z, 0.0) - y * z + np.log1p(np.exp(-np.abs(z)))))
