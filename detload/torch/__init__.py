"""PyTorch adapter: detload batches as ``torch.Tensor``, pinned in a background thread, copied to the GPU ahead of the step.

``TorchLoader(detload.Loader(...), device=...)`` is what a training loop iterates. Import it only
where torch is installed (``import detload`` never imports torch). See docs/distributed.md for DDP,
resume and PyTorch Lightning.

How a batch flows (each module's docstring has the details):

    Loader (detload/loader.py) -- yields NumPy batches (views of a worker's block) to -->
    loader.py    TorchLoader: picks the iteration's hand-off, runs the feeder thread that takes
                 the Loader's batches (``copy_batches`` at a time), and the training loop's side
    handoff.py   `Handoff`, one class per copy path, turning host batches into tensors:
                   ZeroCopy    tensors over the batch's own memory (no thread, or device="cpu")
                   PinnedSlab  one pinned buffer and one device copy per batch (per k batches)
                   Registered  process workers' segments page-locked once, each block copied
                               straight from its segment, its batches views of that copy
                   PerColumn   each column pinned and copied on its own (a benchmark hook)
      registry.py  the page-locking of segments (cudaHostRegister) and the hand-off's counters
    tensors.py   to_torch, RaggedTensor, PackedTensors, and the slab packing and its views

Messages: the feeder thread puts one `Ready` per batch on a queue of ``prefetch`` (the tensors,
the loader position after the batch, and the CUDA event and memory the loop waits for), then
`End`, or `Failed` carrying the error, which the loop raises after the batches before it.

Memory: the feeder owns a batch until its `Ready` is queued; the training loop's tensors then
keep their buffer (the worker's block, a slab, a block's device copy) alive, and a hand-off's
`wait` tells the CUDA allocator the training stream uses it. Nothing outlives close().
"""

from __future__ import annotations

try:
    import torch
    import torch.utils.data
except ModuleNotFoundError as exc:
    if exc.name not in ("torch", "torch.utils", "torch.utils.data"):
        raise  # torch is there but broken (one of its own dependencies is missing): say so as it is
    raise ModuleNotFoundError(
        'detload.torch needs PyTorch, which is not installed: pip install "detload[torch]". '
        "An unpinned torch from PyPI pulls a multi-GB CUDA build; for the CPU build, install torch first "
        "with pip install torch --index-url https://download.pytorch.org/whl/cpu",
        name="torch",
    ) from None

from .loader import TorchLoader, local_device
from .tensors import PackedTensors, RaggedTensor, TorchBatch, TorchColumn, to_torch

__all__ = ["PackedTensors", "RaggedTensor", "TorchBatch", "TorchColumn", "TorchLoader", "local_device", "to_torch"]

del torch  # imported above only to say what is missing; each module imports what it uses
