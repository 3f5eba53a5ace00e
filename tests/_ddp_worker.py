"""One DDP rank (gloo, CPU), launched by ``torchrun`` from tests/test_distributed.py.

Usage: ``torchrun --nproc_per_node=N tests/_ddp_worker.py DATASET OUT``. Writes
``OUT/rank{r}.npz`` (ids per step), ``OUT/ddp/`` (run directory),
``OUT/mismatch{r}.txt`` (the rank-agreement error) and ``OUT/resumed/`` (a
resume of the state in ``OUT/state.json`` at this world size, partitions=4).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist


def main(ds: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from detload import Loader, OptionError
    from detload.torch import TorchLoader

    # 1. Ranks and world size come from torch.distributed; partitions default to the world size.
    steps: dict[str, np.ndarray] = {}
    with TorchLoader(Loader(ds, batch_size=16, seed=7, columns=["id", "s"], workers=2, pool="process", manifest=f"{out}/ddp/")) as tl:
        assert (tl.loader.rank, tl.loader.options.world_size) == (rank, world)
        for i, batch in enumerate(tl):
            assert isinstance(batch["id"], torch.Tensor) and batch["s"].kind == "utf8"
            steps[f"s{i}"] = batch["id"].numpy().copy()
        assert len(steps) == len(tl)
    np.savez(f"{out}/rank{rank}.npz", **steps)

    # 2. Rank 0 was given another seed: every rank must fail at the start, naming it.
    try:
        with TorchLoader(Loader(ds, batch_size=16, seed=8 if rank == 0 else 7, columns=["id"])) as bad:
            next(iter(bad))
        msg = "no error"
    except OptionError as exc:
        msg = str(exc)
    with open(f"{out}/mismatch{rank}.txt", "w") as f:
        f.write(msg)

    # 3. Elastic resume: the state of a run at another world size, global batch 64, P = 4.
    with open(f"{out}/state.json") as f:
        state = json.load(f)
    with TorchLoader(Loader(ds, batch_size=64 // world, seed=7, partitions=4, columns=["id", "s"], workers=1, manifest=f"{out}/resumed/"), device="cpu") as tl:
        tl.load_state_dict(state)
        n = sum(1 for _ in tl)
        assert n == len(tl) - state["step"], (n, len(tl), state["step"])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
