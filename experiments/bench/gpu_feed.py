"""GPU feed measurement: how much of a CTR model's training throughput each loader keeps.

A CTR model (one EmbeddingBag per categorical column + a 3-layer MLP, AdamW) is trained fed by:
pinned in-memory tensors (the upper bound), a torch DataLoader over row groups, and detload
(thread and process pools), at several worker counts and two model sizes. Feed efficiency =
a feeder's rows/s / the in-memory loop's rows/s with the same model in the same run.

detload feeds through `detload.torch.TorchLoader(Loader(...), device=..., stack=...)`. With
process workers (`detload-process`) that is the registered hand-off (`Registered` in
detload/torch/handoff.py): workers' shared-memory segments registered once as pinned memory, one
host-to-device copy per block straight from them, the model's matrices stacked on the device;
`detload-process-staged` is the path before it (a benchmark hook: `PinnedSlab`, a background
thread packs each batch into one pinned buffer and copies that; `-stackK` feeders: K batches per
buffer, copy_batches=K). Every row also reports the CPU time of every thread of the
training process per batch (/proc/self/task), so the two hand-offs compare within one run. Variants, with the first model only: `-slab` (no stack=: columns stacked
on the device), `-columns` (per-column pin and copy), `-numpy` (NumPy batches staged by the
training thread), `torch-columns` (the DataLoader yielding a dict of columns per row group).
The in-memory bound is measured again after every feeder; each feeder is rated against the two
measurements beside it. Without CUDA the same loop runs on the CPU (use --tiny there; CI does).
experiments/bench/gpu_all.sh runs the adapter's tests and this script in one invocation.

    PYTHONPATH=. python experiments/bench/gpu_feed.py              # CUDA, ~4 min on one H200
    PYTHONPATH=. python experiments/bench/gpu_feed.py --tiny       # CPU smoke run, seconds
Needs only torch, pyarrow, numpy, xxhash and detload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from baselines import RowGroupDataset  # noqa: E402  (after the path insert above)

N_DENSE, N_CAT = 32, 8
# The registered hand-off's stand-in on the CPU: every buffer "registers" and nothing is pinned.
CPU_STANDIN = (lambda address, nbytes: True, lambda address: None)


def build_model(torch, hidden: int, cardinality: int, dim: int):
    nn = torch.nn

    class CTR(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.ModuleList(nn.EmbeddingBag(cardinality, dim, mode="sum") for _ in range(N_CAT))
            self.mlp = nn.Sequential(
                nn.Linear(N_DENSE + N_CAT * dim, hidden), nn.ReLU(),
                nn.Linear(hidden, hidden), nn.ReLU(),
                nn.Linear(hidden, 1),
            )

        def forward(self, dense, cats):
            # One id per row and table: EmbeddingBag with a 2-D input bags each row on its own.
            embs = [e(cats[:, i : i + 1]) for i, e in enumerate(self.emb)]
            return self.mlp(torch.cat([dense, *embs], dim=1)).squeeze(1)

    return CTR()


class Trainer:
    """One training step from host tensors; the host->device copy is pinned and non-blocking."""

    def __init__(self, torch, model, device):
        self.torch = torch
        self.model = model.to(device)
        self.device = device
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.loss = torch.nn.BCEWithLogitsLoss()

    def step(self, dense, cats, label):
        d = self.device
        nb = d.type == "cuda"
        dense, cats, label = (t.to(d, non_blocking=nb) for t in (dense, cats, label))
        self.opt.zero_grad(set_to_none=True)
        out = self.loss(self.model(dense, cats), label)
        out.backward()
        self.opt.step()

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def _fold(cardinality: int) -> int:
    """The generated ids lie in [0, 100000); smaller tables (--tiny) fold them modulo this (0: no fold)."""
    return cardinality if cardinality < 100_000 else 0


class Staging:
    """Turns a dict-of-columns batch into (dense, cats, label) host tensors with one copy each,
    straight into a ring of pinned buffers (on CUDA); a slot is reused only after the copy that
    read it has finished (an event per slot)."""

    def __init__(self, torch, batch: int, device, cardinality: int, slots: int = 4):
        self.torch = torch
        self.fold = _fold(cardinality)
        pin = device.type == "cuda"
        self.bufs = [(torch.empty((batch, N_DENSE), dtype=torch.float32, pin_memory=pin),
                      torch.empty((batch, N_CAT), dtype=torch.int64, pin_memory=pin),
                      torch.empty((batch,), dtype=torch.float32, pin_memory=pin)) for _ in range(slots)]
        self.events = [None] * slots
        self.cuda = pin
        self.i = 0

    def __call__(self, b: dict):
        i = self.i = (self.i + 1) % len(self.bufs)
        if self.events[i] is not None:
            self.events[i].synchronize()
        dense, cats, label = self.bufs[i]
        n = len(b["label"])
        dn, cn, ln = dense[:n].numpy(), cats[:n].numpy(), label[:n].numpy()
        for j in range(N_DENSE):
            dn[:, j] = b[f"dense_{j}"]
        for j in range(N_CAT):
            cn[:, j] = b[f"cat_{j}"]
        if self.fold:
            np.remainder(cn, self.fold, out=cn)
        ln[:] = b["label"]
        return dense[:n], cats[:n], label[:n], i

    def done(self, i):
        if self.cuda:
            ev = self.torch.cuda.Event()
            ev.record()
            self.events[i] = ev


class DeviceStack:
    """For batches that arrive as tensors (TorchLoader): stack the columns into the model's
    inputs where they already are (on the GPU: two stack kernels and one cast per step)."""

    def __init__(self, torch, cardinality: int):
        self.torch = torch
        self.fold = _fold(cardinality)

    def __call__(self, b: dict):
        stack = self.torch.stack
        dense = stack([b[f"dense_{j}"] for j in range(N_DENSE)], dim=1)
        cats = stack([b[f"cat_{j}"] for j in range(N_CAT)], dim=1)
        if self.fold:
            cats = cats % self.fold
        return dense, cats, b["label"].float(), 0

    def done(self, i):
        pass


class NamedStaging:
    """For TorchLoader batches with stack=: the model's inputs are already there."""

    def __init__(self, cardinality: int):
        self.fold = _fold(cardinality)

    def __call__(self, b: dict):
        cats = b["cats"] % self.fold if self.fold else b["cats"]
        return b["dense"], cats, b["label"].float(), 0

    def done(self, i):
        pass


class TupleStaging:
    """For (dense, cats, label) tensors that are the model's inputs already: the in-memory
    bound's slices, and the torch DataLoader baseline's (stacked, folded and pinned by it)."""

    def __call__(self, b):
        return (*b, 0)

    def done(self, i):
        pass


class StackedRowGroups(RowGroupDataset):
    """Item i: one row group as (dense float32 [n, 32], cats int64 [n, 8], label float32 [n])."""

    def __init__(self, path, columns, cardinality):
        super().__init__(path, columns)
        self.fold = _fold(cardinality)

    def __getitem__(self, i):
        b = super().__getitem__(i)
        dense = np.stack([b[f"dense_{j}"] for j in range(N_DENSE)], axis=1)
        cats = np.stack([b[f"cat_{j}"] for j in range(N_CAT)], axis=1).astype(np.int64, copy=False)
        if self.fold:
            np.remainder(cats, self.fold, out=cats)
        return dense, cats, b["label"].astype(np.float32)


class ThreadCPU:
    """CPU time of every thread of this (the training) process, read from /proc/self/task:
    ``schedstat``'s first field (nanoseconds on the CPU) where the kernel keeps it, else
    ``stat``'s utime + stime (clock ticks). Threads are named by their Python thread (matched
    by native id); the others (CUDA's, Arrow's, the allocator's) as "other (native)". The
    process's own CPU time (``time.process_time``) also counts threads that ended meanwhile."""

    TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")

    @classmethod
    def snapshot(cls) -> dict:
        import threading

        names = {t.native_id: t.name for t in threading.enumerate()}
        main = threading.main_thread().native_id
        per: dict[int, tuple[str, float]] = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                ns = cls._ns(int(tid))
            except (OSError, ValueError, IndexError):
                continue  # a thread that just ended
            name = "training thread" if int(tid) == main else names.get(int(tid), "other (native)")
            per[int(tid)] = (name, ns)
        return {"threads": per, "process_s": time.process_time()}

    @classmethod
    def _ns(cls, tid: int) -> float:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                return float(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) * cls.TICK_NS  # utime, stime (fields 14, 15)

    @staticmethod
    def per_batch(before: dict, after: dict, steps: int) -> dict:
        """CPU microseconds per batch: the process's, and each thread's (grouped by name)."""
        by_name: dict[str, float] = {}
        for tid, (name, ns) in after["threads"].items():
            start = before["threads"].get(tid, (name, 0.0))[1]  # a thread started in the window
            by_name[name] = by_name.get(name, 0.0) + (ns - start)
        steps = max(steps, 1)
        threads = {k: v / 1e3 / steps for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])}
        return {"process_cpu_us_per_batch": (after["process_s"] - before["process_s"]) * 1e6 / steps,
                "threads_cpu_us_per_batch": sum(threads.values()), "thread_cpu_us_per_batch": threads}


def columns(path) -> list[str]:
    return ["label", *[f"dense_{j}" for j in range(N_DENSE)], *[f"cat_{j}" for j in range(N_CAT)]]


def run_feeder(torch, trainer, make_iter, staging, warmup: int, seconds: float, max_steps: int) -> dict:
    """Warm up, then train until `seconds` or `max_steps`; time in next() is the data wait."""
    it = make_iter()
    for _ in range(warmup):
        dense, cats, label, i = staging(next(it))
        trainer.step(dense, cats, label)
        staging.done(i)
    trainer.sync()
    clock = time.perf_counter
    waited = 0.0
    rows = steps = 0
    cpu0 = ThreadCPU.snapshot()
    t0 = clock()
    while steps < max_steps and clock() - t0 < seconds:
        a = clock()
        try:
            b = next(it)
        except StopIteration:
            it = make_iter()
            b = next(it)
        waited += clock() - a
        dense, cats, label, i = staging(b)
        trainer.step(dense, cats, label)
        staging.done(i)
        rows += len(label)
        steps += 1
    trainer.sync()
    wall = clock() - t0
    cpu = ThreadCPU.per_batch(cpu0, ThreadCPU.snapshot(), steps)
    close = getattr(it, "close", None)
    if close:
        close()
    return {"rows_per_s": rows / wall, "steps_per_s": steps / wall, "wait_fraction": waited / wall,
            "steps": steps, **cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE / "data" / "gpu_ctr"))
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--hidden", type=int, nargs="+", default=[1024, 4096], help="light and heavy MLP widths")
    ap.add_argument("--cardinality", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per feeder")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--max-steps", type=int, default=100_000)
    ap.add_argument("--feeders", nargs="+", default=["torch", "detload-thread", "detload-process",
                                                     "detload-process-staged"],
                    help="detload-process: the registered hand-off (shared memory pinned once, one copy per "
                         "block); detload-process-staged: the path before it (every batch packed into a "
                         "pinned buffer in the training process), a benchmark hook")
    ap.add_argument("--variants", nargs="*", default=["detload-process-slab", "detload-process-columns",
                                                      "torch-columns"],
                    help="comparison feeders (FEEDER or FEEDER@W), run with the first model only, "
                         "at the middle worker count unless @W names one")
    ap.add_argument("--budget", type=float, default=1e9,
                    help="start no feeder after this many seconds (the table still prints)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke configuration (CI)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    a = ap.parse_args(argv)
    if a.tiny:
        a.rows, a.workers, a.hidden, a.cardinality, a.dim = 20_000, [1, 2], [16, 32], 1000, 4
        a.batch_size, a.seconds, a.warmup, a.max_steps = 512, 0.3, 2, 5
        if a.data == str(HERE / "data" / "gpu_ctr"):
            a.data = str(HERE / "data" / "gpu_ctr_tiny")

    import datagen
    import torch
    from measure import rebatch

    from detload import Loader, Pool
    from detload._hooks import Hooks, installed
    from detload.torch import TorchLoader

    device = torch.device("cuda" if a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    t_start = time.perf_counter()
    dev_name = torch.cuda.get_device_name(0) if device.type == "cuda" else (platform.processor() or platform.machine())
    config = {"device": f"{device.type} ({dev_name})", "cores": os.cpu_count(), "torch": torch.__version__,
              "python": platform.python_version(), "rows": a.rows, "batch_size": a.batch_size,
              "seconds": a.seconds, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    datagen.make_ctr(a.data, rows=a.rows, files=8, row_group_rows=min(16384, max(a.rows // 64, 256)))
    cols = columns(a.data)

    # The upper bound: the whole dataset as pinned tensors, sliced per batch.
    import pyarrow.parquet as pq
    from measure import parquet_files

    tables = [pq.read_table(f, columns=cols) for f in parquet_files(a.data)]
    pin = device.type == "cuda"

    def cat_col(name, dtype, tables=tables):
        return torch.from_numpy(np.concatenate([t.column(name).to_numpy() for t in tables]).astype(dtype))

    mem_dense = torch.stack([cat_col(f"dense_{j}", np.float32) for j in range(N_DENSE)], dim=1)
    mem_cats = torch.stack([cat_col(f"cat_{j}", np.int64) for j in range(N_CAT)], dim=1)
    if _fold(a.cardinality):
        mem_cats %= _fold(a.cardinality)
    mem_label = cat_col("label", np.float32)
    if pin:
        mem_dense, mem_cats, mem_label = mem_dense.pin_memory(), mem_cats.pin_memory(), mem_label.pin_memory()
    del tables
    N, B = len(mem_label), a.batch_size

    results: list[dict] = []
    errors: list[str] = []
    skipped: list[str] = []

    def save():
        # Written after every row, so a run cut short still leaves what it measured.
        if a.json:
            Path(a.json).write_text(json.dumps({"results": results, "errors": errors, "skipped": skipped,
                                                "config": config}, indent=1))

    def make_feeder(feeder: str, w: int):
        """(iterator factory, staging, closer, label) for one feeder at `w` workers."""
        if feeder in ("torch", "torch-columns"):
            from torch.utils.data import DataLoader

            if feeder == "torch":
                # A hand-rolled loader done well: workers stack each row group into the model's
                # inputs, the DataLoader pins them, the training loop slices batches.
                dl = DataLoader(StackedRowGroups(a.data, cols, a.cardinality), batch_size=None, shuffle=True,
                                generator=torch.Generator().manual_seed(0), num_workers=w,
                                persistent_workers=True, pin_memory=pin)

                def make(dl=dl):
                    return (tuple(t[s : s + B] for t in item) for item in dl
                            for s in range(0, len(item[2]), B))

                stage, label = tuples, f"torch DataLoader W={w}"
            else:
                # Columns as the workers read them, re-batched and staged by the training thread.
                dl = DataLoader(RowGroupDataset(a.data, cols), batch_size=None, shuffle=True,
                                generator=torch.Generator().manual_seed(0), num_workers=w,
                                persistent_workers=True)

                def make(dl=dl):
                    return rebatch(({k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in item.items()}
                                    for item in dl), B)

                stage, label = staging, f"torch DataLoader W={w} (columns)"

            def close(dl=dl):
                it = getattr(dl, "_iterator", None)
                if it is not None and hasattr(it, "_shutdown_workers"):
                    it._shutdown_workers()

            return make, stage, close, label, dict
        # detload-POOL[-stackK]: TorchLoader with stack= (one pinned slab, the model's input matrices packed
        # on the host). Variants: -slab (TorchLoader, no stack=: columns stacked on the device),
        # -columns (TorchLoader's per-column pin + copy), -numpy (Loader, staged by the training thread).
        # -stackK: with stack= and copy_batches=K.
        _, pool, *how = feeder.split("-")
        how_s = how[0] if how else "stack"
        group = int(how_s[5:]) if how_s.startswith("stack") and how_s[5:] else 1
        staged = how_s == "staged"
        ld = Loader(a.data, batch_size=B, seed=0, workers=w, pool=Pool(kind=pool, prefetch=2), columns=cols,
                    order="windowed", shuffle_window=4)
        if how_s == "numpy":
            src, stage = ld, staging
        else:
            stacked = how_s.startswith("stack") or staged
            # Benchmark hooks (never keywords): -columns measures the per-column path, -staged the
            # pinned buffer packed per batch; on the CPU a stand-in registrar runs the registered
            # hand-off's code (its "device copy" is a clone), so --tiny exercises it.
            hooks = Hooks(torch_per_column=how_s == "columns", torch_staged=staged,
                          torch_registrar=CPU_STANDIN if device.type == "cpu" else None)
            with installed(hooks):
                src = TorchLoader(ld, device=device, stack=stack if stacked else None,
                                  copy_batches=group)
            stage = named if stacked else stacking
        epoch = [0]

        def make(src=src, epoch=epoch):
            src.set_epoch(epoch[0])
            epoch[0] += 1
            return iter(src)

        note = "" if how_s == "stack" else (f" (copy_batches={group})" if group > 1 else f" ({how_s})")
        info = getattr(src, "handoff_stats", dict)
        return make, stage, src.close, f"detload {pool} W={w}{note}", lambda: {"handoff": info()}

    stack = {"dense": [f"dense_{j}" for j in range(N_DENSE)], "cats": [f"cat_{j}" for j in range(N_CAT)]}
    tuples = TupleStaging()
    for n_model, hidden in enumerate(a.hidden):
        torch.manual_seed(0)
        trainer = Trainer(torch, build_model(torch, hidden, a.cardinality, a.dim), device)
        nparams = sum(p.numel() for p in trainer.model.parameters())

        def mem_iter():
            for s in range(0, N - B + 1, B):
                yield mem_dense[s : s + B], mem_cats[s : s + B], mem_label[s : s + B]

        def bound(trainer=trainer):
            return run_feeder(torch, trainer, mem_iter, tuples, a.warmup, a.seconds, a.max_steps)

        # The in-memory bound is measured before the first feeder and again after every feeder; each
        # feeder's efficiency is against the mean of the two measured beside it (the host's speed drifts).
        refs = [bound()]
        staging = Staging(torch, B, device, a.cardinality)
        stacking = DeviceStack(torch, a.cardinality)
        named = NamedStaging(a.cardinality)
        runs = [(f, w) for f in a.feeders for w in a.workers]
        if n_model == 0:
            # The comparison variants run with the first model, at the middle worker count
            # unless named as FEEDER@W.
            mid = a.workers[len(a.workers) // 2]
            runs += [(f.partition("@")[0], int(f.partition("@")[2] or mid)) for f in a.variants]
        for feeder, w in runs:
            if time.perf_counter() - t_start > a.budget:
                print(f"skipped {feeder} W={w}: past --budget {a.budget:g} s", file=sys.stderr, flush=True)
                skipped.append(f"hidden {hidden}: {feeder} W={w}")
                continue
            label = f"{feeder} W={w}"
            closer = None
            try:
                make, stage, closer, label, info = make_feeder(feeder, w)
                r = run_feeder(torch, trainer, make, stage, a.warmup, a.seconds, a.max_steps)
                r.update(info())
            except Exception as exc:  # noqa: BLE001 - one feeder failing must not lose the others' rows
                traceback.print_exc()
                errors.append(f"hidden {hidden}: {label}: {type(exc).__name__}: {exc}")
                continue
            finally:
                if closer:
                    closer()
            refs.append(bound())
            ref_rate = (refs[-2]["rows_per_s"] + refs[-1]["rows_per_s"]) / 2
            results.append({"hidden": hidden, "params": nparams, "feeder": label, "workers": w, **r,
                            "bound_rows_per_s": ref_rate, "efficiency": r["rows_per_s"] / ref_rate})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
            save()
        rates = [x["rows_per_s"] for x in refs]
        results.append({"hidden": hidden, "params": nparams, "feeder": "in-memory pinned tensors", "workers": 0,
                        **refs[0], "rows_per_s": float(np.median(rates)), "bound_min": min(rates),
                        "bound_max": max(rates), "bound_runs": len(rates), "efficiency": 1.0,
                        "steps_per_s": float(np.median([x["steps_per_s"] for x in refs])),
                        "wait_fraction": float(np.median([x["wait_fraction"] for x in refs]))})
        save()

    save()
    print(f"device: {config['device']}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{N:,} rows, batch {B}, {a.seconds:g} s per feeder, total {time.perf_counter() - t_start:.0f} s")
    print("| hidden | params | feeder | rows/s | steps/s | feed efficiency | data-wait fraction |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    order = sorted(results, key=lambda r: (a.hidden.index(r["hidden"]), r["workers"] != 0))
    for r in order:
        feeder = r["feeder"]
        if "bound_runs" in r:
            feeder += f" (median of {r['bound_runs']}: {r['bound_min']:,.0f}-{r['bound_max']:,.0f})"
        print(f"| {r['hidden']} | {r['params'] / 1e6:.1f}M | {feeder} | {r['rows_per_s']:,.0f} | "
              f"{r['steps_per_s']:,.1f} | {r['efficiency']:.3f} | {r['wait_fraction']:.3f} |")
    print()
    print(*summary(results, a.hidden), sep="\n")
    for line in errors:
        print(f"FAILED {line}")
    for line in skipped:
        print(f"SKIPPED {line}")
    return 1 if errors else 0


def summary(results: list[dict], hidden: list[int]) -> list[str]:
    """The training process's CPU per batch with and without the registered hand-off (same run,
    same W), and the targets: feed efficiency >= 0.97 (light model), detload ahead of the best
    torch DataLoader row, CPU per batch at most half of the staged path's."""
    lines = ["CPU time of every thread of the training process per batch (us; /proc/self/task, "
             "the process's own CPU time beside it):", "",
             "| hidden | feeder | process CPU us/batch | all threads us/batch | training thread | "
             "busiest other threads |", "|---:|---|---:|---:|---:|---|"]
    for r in results:
        if "thread_cpu_us_per_batch" not in r or r["workers"] == 0:
            continue
        th = r["thread_cpu_us_per_batch"]
        others = ", ".join(f"{k} {v:,.0f}" for k, v in list((k, v) for k, v in th.items()
                                                             if k != "training thread")[:3])
        lines.append(f"| {r['hidden']} | {r['feeder']} | {r['process_cpu_us_per_batch']:,.0f} | "
                     f"{r['threads_cpu_us_per_batch']:,.0f} | {th.get('training thread', 0.0):,.0f} | {others} |")
    lines.append("")
    by = {(r["hidden"], r["feeder"]): r for r in results}
    for h in hidden:
        for r in results:
            if r["hidden"] != h or not r["feeder"].startswith("detload process W=") or "(" in r["feeder"]:
                continue
            old = by.get((h, r["feeder"] + " (staged)"))
            if old is None:
                continue
            ratio = r["process_cpu_us_per_batch"] / old["process_cpu_us_per_batch"]
            hs = r.get("handoff", {})
            lines.append(f"- hidden {h}, {r['feeder']}: training-process CPU per batch, registered hand-off / "
                         f"staged = {r['process_cpu_us_per_batch']:,.0f} / {old['process_cpu_us_per_batch']:,.0f} "
                         f"= {ratio:.3f} (target <= 0.5: {'met' if ratio <= 0.5 else 'NOT met'}); hand-off: "
                         f"{hs.get('direct_batches', 0)} of {hs.get('batches', 0)} batches without a host copy, "
                         f"{hs.get('stitched_batches', 0)} stitched, {hs.get('rebased_offsets', 0)} rebased "
                         f"offsets, {hs.get('block_copies', 0)} block copies, "
                         f"{hs.get('registrations', 0)} registrations, "
                         f"{hs.get('registration_failures', 0)} failed ({hs.get('unregistered_batches', 0)} "
                         "batches copied for it)")
    light = min(hidden)
    rows = [r for r in results if r["hidden"] == light and r["workers"] >= 4]
    det = [r for r in rows if r["feeder"].startswith("detload")]
    tor = [r for r in results if r["hidden"] == light and r["feeder"].startswith("torch DataLoader")]
    if det:
        best = max(det, key=lambda r: r["efficiency"])
        lines.append(f"- target: light model (hidden {light}), W 4-16: best detload feed efficiency "
                     f"{best['efficiency']:.3f} ({best['feeder']}); >= 0.97: "
                     f"{'met' if best['efficiency'] >= 0.97 else 'NOT met'}")
        if tor:
            bt = max(tor, key=lambda r: r["rows_per_s"])
            lines.append(f"- target: detload ahead of the best torch DataLoader row ({bt['feeder']}, "
                         f"{bt['rows_per_s']:,.0f} rows/s): best detload {best['rows_per_s']:,.0f} rows/s, "
                         f"ratio {best['rows_per_s'] / bt['rows_per_s']:.3f}: "
                         f"{'met' if best['rows_per_s'] > bt['rows_per_s'] else 'NOT met'}")
    elif rows == []:
        lines.append(f"- (no row with W >= 4 for hidden {light}: the feed-efficiency target is not rated)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
