"""Side-by-side throughput benchmark: raw pyarrow, torch DataLoader, Petastorm and detload in one run.

Every (loader, run) executes in a fresh subprocess, so pools, allocators and peak RSS do not
leak between loaders. Prints one table (medians over --runs, ratios taken within each run) and,
with --write, puts it into docs/benchmarks.md with the date, machine and command.
    PYTHONPATH=. python experiments/bench/bench.py --runs 3 --write docs/benchmarks.md
    PYTHONPATH=. python experiments/bench/bench.py --tiny     # the whole path in a minute

Every row is also rated against the references of its own run: the decode limit (W x the
rows/s one thread decodes with `read_row_group` + NumPy), the same limit with each file read
through a memory map (as detload's process workers read local files by default,
Storage.memory_map="auto"), and Petastorm at its best, cold
(`convert_early_to_numpy=True` or its defaults, whichever is faster) and warm (its
`cache_type="local-disk"` cache, filled by a first epoch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

BATCH = 4096
W_SET = (1, 2)
#: The label suffix of the rows that run the windowed order (the others run the default, mixed one).
WINDOWED = "[windowed]"
#: The suffix of the mixed-order rows planned with four tasks an epoch (the CTR shape's 62 row
#: groups, 16 a task), as a dataset of more than `mix_window` row groups is: each epoch reads
#: every window again, where the default rows' single window is kept from epoch to epoch.
MANY_TASKS = "[mix_window=16]"
#: Timed epochs of detload's warm rows ("cache (warm)"), whatever --epochs says. A warm epoch of
#: the CTR shape takes about 0.1 s, so the default two timed epochs gave each ratio of a warm row
#: under 0.2 s of timing: one run's mixed/windowed ratio of the same warm row ranged over
#: 0.84-1.20x. Petastorm's warm epochs take seconds, and keep --epochs.
WARM_EPOCHS = 12

# A training script imports torch before it builds its loader. With DETLOAD_BENCH_MAIN_TORCH=1
# (the driver's default, see --main-imports) the measured process does the same. detload's
# process workers do not import the main module (detload/_engine/spawn.py), so they do not
# import torch; the torch DataLoader's workers, forked, inherit it. Every detload row reports
# what its workers imported (`heavy_imports`).
if os.environ.get("DETLOAD_BENCH_MAIN_TORCH") == "1":
    try:
        import torch  # noqa: F401
    except ImportError:
        pass


# -- one loader in this process (the subprocess side) ----------------------------------------
class RssSampler:
    """Peak of the summed PSS (proportional set size) of this process and its children,
    sampled every `period` s while sampling is on (`sample`). PSS splits a shared page between
    the processes mapping it, so shared-memory blocks count once; on systems without PSS it
    falls back to RSS.

    A sample is not free: the kernel walks every page table of every sampled process to sum
    /proc/PID/smaps_rollup. Sampling every 0.1 s through the timed epochs cost 7-10% of
    detload's process W=2 rows/s on the 2-core machine (sampler_cost.py; docs/benchmarks.md,
    "The memory sampler's own cost"), so the timed epochs run unsampled (`memory_epochs`), and
    the untimed epochs that are sampled can afford a short period."""

    def __init__(self, period: float = 0.02) -> None:
        import psutil

        self.proc = psutil.Process()
        self.period = period
        self.peak = 0
        self._kids: list = []
        self._listed = 0.0
        self._stop = threading.Event()
        self._on = threading.Event()
        self._on.set()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self, on: bool) -> None:
        """Turn the periodic sampling on or off (the peak so far is kept)."""
        if on:
            self._on.set()
        else:
            self._on.clear()

    def total(self, refresh: bool = True) -> int:
        # Listing children scans /proc: do it once a second, not at every sample.
        now = time.monotonic()
        if refresh or now - self._listed > 1.0:
            self._kids = self.proc.children(recursive=True)
            self._listed = now
        n = 0
        for p in [self.proc, *self._kids]:
            try:
                n += _pss(p)
            except Exception:  # a child that just exited
                pass
        return n

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            if self._on.is_set():
                self.peak = max(self.peak, self.total(refresh=False))

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *a: object) -> None:
        self._stop.set()
        self._t.join()


#: Libraries whose compiled modules show which heavy packages a process imported.
HEAVY = {"torch": "/torch/lib/", "pandas": "/pandas/_libs/"}


def heavy_imports(pids) -> list[str]:
    """The HEAVY packages any of these processes has mapped (read from /proc/PID/maps)."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read()
        except OSError:
            continue
        found |= {name for name, mark in HEAVY.items() if mark in text}
    return sorted(found)


def memory_epochs(sampler: RssSampler, epochs: int) -> tuple[int, Callable[[int], None]]:
    """(epochs to run, the measure_epochs `on_epoch` hook) for a sampled loader: the first
    epoch (warm-up, never in the steady-state rate) and one extra epoch after the `epochs`
    timed ones are sampled; the epochs in between, whose rows/s are reported, run unsampled.
    The result's `timed_epochs` (see `steady_rows_per_s`) leaves the extra epoch out."""

    def on_epoch(epoch: int) -> None:
        sampler.sample(epoch == 0 or epoch >= epochs)

    return epochs + 1, on_epoch


def settled_total(sampler: RssSampler, *, least: float = 0.3, most: float = 30.0) -> int:
    """The summed PSS once it stopped moving: worker processes finish starting (imports of
    the main module included) before the baseline is taken, or the bound would miss them."""
    t0 = time.monotonic()
    time.sleep(least)
    last = sampler.total()
    while time.monotonic() - t0 < most:
        time.sleep(0.25)
        now = sampler.total()
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last


def _pss(p) -> int:
    try:
        return int(p.memory_full_info().pss)
    except (AttributeError, OSError):
        return int(p.memory_info().rss)


# Blocks alive at once, per worker and overall (docs/benchmarks.md, "Peak memory").
PER_WORKER_BLOCKS = 6  # + prefetch: one being built, its decoded Arrow units, allocator slack
SHARED_BLOCKS = 4      # the merger's current and next block, the batches handed to the consumer thread


def rss_bound(loader, baseline: int) -> dict:
    """The documented bound: baseline + block_bytes x (W x (prefetch + 6) + 4) + 5 x batch_bytes
    + W x ragged_scratch + window_bytes. block_bytes = the largest block's rows (the windowed
    order: shuffle_window x the largest row group's rows) x bytes per row once converted
    (measured on the first row group: values plus offsets); ragged_scratch is the permutation's
    index arrays and temporaries for variable-length columns (24 bytes per value of a block,
    measured); window_bytes (the mixed order) = the largest task's window per owned partition,
    held once by workers that share it, by each without sharing."""
    import numpy as np

    from detload._engine.config import WorkerConfig
    from detload._engine.messages import Timings
    from detload._read import FileRef, UnitReader
    from detload._types import Ragged

    ds = loader.dataset
    files = tuple(FileRef(f.location, f.path, f.partition_values) for f in ds.files)
    reader = UnitReader(WorkerConfig(files, ds.filesystem, tuple(loader.specs), loader.null_fill, "thread"))
    f0, g0 = int(loader._unit_files[0]), int(loader._unit_rgs[0])
    cols = reader.read(f0, g0, Timings())
    reader.close()
    n = int(loader._unit_rows[0])
    rb = sum((c.values.nbytes + c.offsets.nbytes) if isinstance(c, Ragged) else c.nbytes for c in cols.values()) / n
    ragged_values = sum(c.values.shape[0] for c in cols.values() if isinstance(c, Ragged)) / n
    R = int(np.max(loader._unit_rows))
    W = loader.workers
    window = 0.0
    if loader.options.order == "windowed":
        block_rows = loader.options.shuffle_window * R
    else:
        # The mixed order: blocks of about block_rows rows, plus the task windows in flight (one
        # per owned partition), held once by workers that share them, by each without sharing.
        plan = loader.plan()
        block_rows = max(b.rows for b in plan.schedule)
        biggest = max(t.rows for p in plan.owned_partitions for t in plan.tasks[p])
        window = biggest * rb * len(plan.owned_partitions) * (1 if W > 1 else W)
    block = block_rows * rb
    scratch = 24 * ragged_values * block_rows
    data = (block * (W * (loader.prefetch + PER_WORKER_BLOCKS) + SHARED_BLOCKS) + 5 * BATCH * rb + W * scratch
            + window)
    return {"bound_bytes": int(baseline + data), "data_bound_bytes": int(data), "block_bytes": int(block),
            "window_bytes": int(window), "row_bytes": rb, "baseline_bytes": baseline}


def run_one(spec: dict) -> dict:
    from measure import dataset_rows, measure_epochs

    kind, path, epochs = spec["kind"], spec["path"], spec["epochs"]
    if kind == "decode_limit":
        from baselines import decode_limit

        return decode_limit(path, epochs=max(2, epochs), mapped=bool(spec.get("mapped")))
    if kind == "raw_pyarrow":
        from baselines import raw_pyarrow

        with RssSampler() as rs:
            n, on_epoch = memory_epochs(rs, epochs)
            res = raw_pyarrow(path, batch_size=BATCH, epochs=n, on_epoch=on_epoch)
        res.update(peak_rss=rs.peak, timed_epochs=epochs)
        return res
    if kind == "torch":
        from baselines import torch_dataloader

        with RssSampler() as rs:
            n, on_epoch = memory_epochs(rs, epochs)
            res = torch_dataloader(path, batch_size=BATCH, workers=spec["workers"], epochs=n, on_epoch=on_epoch)
        if res is None:
            return {"loader": "torch_dataloader", "skipped": "torch not importable"}
        res.update(peak_rss=rs.peak, timed_epochs=epochs)
        return res
    if kind == "petastorm":
        import shutil

        from baselines import petastorm_subprocess

        # The local-disk cache lives in a fresh temporary directory: the first epoch fills it,
        # the later (measured) epochs read from it; removed afterwards.
        cache_dir = tempfile.mkdtemp(prefix="detload-bench-petastorm-cache-") if spec.get("cache") else None
        try:
            res = petastorm_subprocess(path, batch_size=BATCH, workers=spec["workers"], epochs=epochs,
                                       python=spec.get("petastorm_python"),
                                       convert_early=bool(spec.get("convert_early")), cache_dir=cache_dir)
        finally:
            if cache_dir:
                shutil.rmtree(cache_dir, ignore_errors=True)
        return res or {"loader": "petastorm", "skipped": "petastorm venv missing"}
    if kind == "detload":
        from detload import Loader, Pool, Storage
        from detload._engine.config import DebugHooks
        from detload._hooks import Hooks, installed

        debug = DebugHooks(block_delay_max=spec["block_delay"], delay_seed=1) if spec.get("block_delay") else None
        state: dict = {}
        sampler = RssSampler()

        def open_loader():
            manifest = None
            if spec.get("manifest"):
                manifest = os.path.join(tempfile.mkdtemp(prefix="detload-bench-"), "manifest.jsonl")
            # The warm rows: detload's converted cache in a fresh directory, filled by the first
            # epoch (as Petastorm's local-disk cache is); the measured epochs read from it.
            if spec.get("cache"):
                state["cache_dir"] = tempfile.mkdtemp(prefix="detload-bench-cache-")
            # Benchmark hooks (never keywords): block delays and the unordered merge.
            with installed(Hooks(debug=debug, unordered=not spec.get("ordered", True))):
                # The order: the default (mixed) one, or the windowed one at its default window.
                order = spec.get("order", "mix")
                ld = Loader(path, batch_size=BATCH, seed=1234, workers=spec["workers"],
                            pool=Pool(kind=spec["pool"], prefetch=2), shuffle=True, order=order,
                            **({"shuffle_window": 4} if order == "windowed" else {}),
                            **({"mix_window": spec["mix_window"]} if spec.get("mix_window") else {}),
                            manifest=manifest, cache=state.get("cache_dir"),
                            storage=Storage(memory_map=spec.get("memory_map", "auto")))
            t0 = time.perf_counter()
            ld._ensure_pool()
            state["pool_start_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            state["baseline"] = settled_total(sampler)  # not timed
            state["settle_s"] = time.perf_counter() - t1
            state["worker_imports"] = heavy_imports(ld._pool.pids()) if spec["pool"] == "process" else []
            state["main_imports"] = heavy_imports([os.getpid()])
            return ld

        def epoch_batches(ld, epoch):
            ld.set_epoch(epoch)
            return iter(ld)

        def close(ld):
            state["stats"] = ld.stats()
            # The bound models blocks, not cache entries kept mapped (map_limit): none for warm rows.
            state["bound"] = {} if spec.get("cache") else rss_bound(ld, state["baseline"])
            ld.close()
            if state.get("cache_dir"):
                import shutil

                shutil.rmtree(state["cache_dir"], ignore_errors=True)

        with sampler:
            n, on_epoch = memory_epochs(sampler, epochs)
            res = measure_epochs(
                loader=f"detload_{spec['pool']}" + ("" if spec.get("ordered", True) else "_unordered")
                + ("_cache" if spec.get("cache") else ""),
                workers=spec["workers"], epochs=n, open_loader=open_loader,
                epoch_batches=epoch_batches, close_loader=close, expected_rows=dataset_rows(path),
                on_epoch=on_epoch)
        st = state["stats"]
        res["startup_s"] -= state["settle_s"]
        res.update(peak_rss=sampler.peak, timed_epochs=epochs, pool_start_s=state["pool_start_s"], **state["bound"],
                   worker_imports=state["worker_imports"], main_imports=state["main_imports"],
                   bottleneck=st.bottleneck, verdict=st.verdict, stage_table=st.table())
        if spec.get("trace"):
            st.write_trace(spec["trace"])
        return res
    raise SystemExit(f"unknown loader kind {kind}")


# -- the driver ------------------------------------------------------------------------------
def steady_rows_per_s(res: dict) -> float:
    """Rows/s over the epochs after the first (workers persist; the first epoch includes warm-up)
    and up to `timed_epochs` where the result has it (the unsampled ones, see `memory_epochs`)."""
    timed = res["epochs"][: res.get("timed_epochs")]
    eps = timed[1:] or timed
    return sum(e["timed_rows"] for e in eps) / sum(e["seconds"] for e in eps)


def spawn(spec: dict, timeout: float = 900, main_torch: bool = True) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DETLOAD_BENCH_MAIN_TORCH="1" if main_torch else "0")
    done = subprocess.run([sys.executable, __file__, "_one", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        return {"loader": spec["kind"], "error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


DECODE = "decode, one thread (read_row_group + to NumPy)"
DECODE_MAPPED = "decode, one thread, memory-mapped files (read_row_group + to NumPy)"
RAW = "raw pyarrow (sequential, default threads)"
#: Rows every run keeps, also with --only: the ratios are taken against them.
REFERENCE = (DECODE, DECODE_MAPPED, RAW)


def petastorm_label(w: int, convert_early: bool = False, cache: bool = False) -> str:
    how = ", convert_early_to_numpy" if convert_early else ""
    how += ", local-disk cache (warm)" if cache else ""
    return f"petastorm 0.13.1 W={w}{how}"


def specs_for(path: str, epochs: int, petastorm_python: str | None, shape: str) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [(DECODE, {"kind": "decode_limit"}),
                                   (DECODE_MAPPED, {"kind": "decode_limit", "mapped": True}),
                                   (RAW, {"kind": "raw_pyarrow"})]
    # The second shape shows the string/list path; W=2 only, to keep the whole run short.
    ws = W_SET if shape == "ctr" else (2,)
    for w in ws:
        out.append((f"torch DataLoader W={w}", {"kind": "torch", "workers": w}))
    if petastorm_python and shape == "ctr":
        # Its defaults (the old rows), then at its best: early NumPy conversion in the worker
        # threads, cold, and warm from its local-disk cache (filled by the first epoch).
        for convert_early, cache in ((False, False), (True, False), (True, True)):
            for w in W_SET:
                out.append((petastorm_label(w, convert_early, cache),
                            {"kind": "petastorm", "workers": w, "petastorm_python": petastorm_python,
                             "convert_early": convert_early, "cache": cache}))
    for pool in ("thread", "process"):
        for w in ws:
            out.append((f"detload {pool} W={w}", {"kind": "detload", "pool": pool, "workers": w}))
            # The windowed order (the default before the mixed one), side by side.
            out.append((f"detload {pool} W={w} {WINDOWED}", {"kind": "detload", "pool": pool, "workers": w,
                                                             "order": "windowed"}))
            if shape == "ctr":
                out.append((f"detload {pool} W={w} {MANY_TASKS}", {"kind": "detload", "pool": pool, "workers": w,
                                                                   "mix_window": 16}))
        if pool == "process" and shape == "ctr":
            # The default rows read through memory maps (Storage.memory_map="auto"); this one
            # reads plainly, so the maps' share shows within the run.
            out.append(("detload process W=2, plain reads (memory_map=False)",
                        {"kind": "detload", "pool": pool, "workers": 2, "memory_map": False}))
        # The audit's cost: every batch hashed and its manifest line written.
        out.append((f"detload {pool} W=2 + manifest", {"kind": "detload", "pool": pool, "workers": 2,
                                                       "manifest": True}))
        if shape == "ctr":
            # Warm, against Petastorm's warm rows: detload's cache filled by the first epoch.
            warm = {"kind": "detload", "pool": pool, "workers": 2, "cache": True, "epochs": 1 + WARM_EPOCHS}
            out.append((f"detload {pool} W=2, cache (warm)", warm))
            out.append((f"detload {pool} W=2, cache (warm) {WINDOWED}", {**warm, "order": "windowed"}))
    for _, s in out:
        s["path"] = path
        s.setdefault("epochs", epochs)
    return out


def order_lines(results: dict[str, dict[str, list[dict]]]) -> list[str]:
    """The mixed (default) order against the windowed one, row by row of the same run: rows/s and
    peak memory, each a median of per-run ratios (issue targets: rows/s >= 0.9x, memory <= 1x)."""
    lines = ["### The mixed order (default) vs the windowed order, same run", "",
             "| shape | rows | rows/s mixed / windowed | peak memory mixed / windowed |", "|---|---|---:|---:|"]
    for shape, per in results.items():
        for label, runs in per.items():
            other = per.get(f"{label.removesuffix(' ' + MANY_TASKS)} {WINDOWED}")
            if not label.startswith("detload") or WINDOWED in label or not other:
                continue
            pairs = [(x, y) for x, y in zip(runs, other) if _ok(x) and _ok(y)]
            if not pairs:
                continue
            speed = median([steady_rows_per_s(x) / steady_rows_per_s(y) for x, y in pairs])
            mem = [x["peak_rss"] / y["peak_rss"] for x, y in pairs if x.get("peak_rss") and y.get("peak_rss")]
            lines.append(f"| {shape} | {label} | {speed:.2f}x | {f'{median(mem):.2f}x' if mem else ''} |")
    return [*lines, ""]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "_one":
        print(json.dumps(run_one(json.loads(argv[1]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HERE / "data"), help="where the generated datasets go")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--tax-epochs", type=int, default=5)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--shapes", nargs="+", default=["ctr", "text_list"], choices=["ctr", "text_list"])
    ap.add_argument("--petastorm-python", default=str(HERE / ".venv-petastorm" / "bin" / "python"))
    ap.add_argument("--trace", default=None, help="write the Chrome trace of the last detload process W=2 run")
    ap.add_argument("--write", default=None, help="write the tables into this markdown file")
    ap.add_argument("--main-imports", choices=["torch", "nothing"], default="torch",
                    help="what the measured process imports at its top, as a training script would")
    ap.add_argument("--only", default=None, help="run only the loaders whose label contains this text "
                                                 "(the decode and raw pyarrow references always run)")
    ap.add_argument("--tiny", action="store_true", help="a quick check of the whole path: 20k rows, one run")
    a = ap.parse_args(argv)
    if a.tiny:
        a.rows, a.runs, a.tax_epochs = 20_000, 1, 3
    main_torch = a.main_imports == "torch"
    import datagen

    pet = a.petastorm_python if Path(a.petastorm_python).exists() else None
    if pet is None:
        print(f"note: {a.petastorm_python} missing, petastorm skipped (make_petastorm_env.sh)", file=sys.stderr)
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    results: dict[str, dict[str, list[dict]]] = {}
    for shape in a.shapes:
        path = str(Path(a.data) / shape)
        (datagen.make_ctr if shape == "ctr" else datagen.make_text_list)(path, rows=a.rows)
        results[shape] = {}
        for r in range(a.runs):
            for label, spec in specs_for(path, a.epochs, pet, shape):
                if a.only and a.only not in label and label not in REFERENCE:
                    continue
                if a.trace and label == "detload process W=2" and r == a.runs - 1 and shape == "ctr":
                    spec["trace"] = a.trace
                res = spawn(spec, main_torch=main_torch)
                results[shape].setdefault(label, []).append(res)
                print(f"[{shape} run {r + 1}/{a.runs}] {label}: " + (
                    f"{steady_rows_per_s(res):,.0f} rows/s" if "epochs" in res else str(res)[:300]),
                    file=sys.stderr, flush=True)
    tax: dict[str, list[dict]] = {}
    ctr = str(Path(a.data) / "ctr")
    for r in range(a.runs if not a.only else 0):
        for pool in ("thread", "process"):
            for ordered in (True, False):
                spec = {"kind": "detload", "pool": pool, "workers": 2, "ordered": ordered, "block_delay": 0.02,
                        "path": ctr, "epochs": a.tax_epochs}
                res = spawn(spec, main_torch=main_torch)
                tax.setdefault(f"{pool} {'ordered' if ordered else 'unordered'}", []).append(res)
                print(f"[tax run {r + 1}] {pool} ordered={ordered}: "
                      + (f"{steady_rows_per_s(res):,.0f} rows/s" if "epochs" in res else str(res)[:300]),
                      file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    text = report(results, tax, a, started, load, load_after)
    print(text)
    if a.write:
        write_doc(Path(a.write), text)
    return 0


def _ok(res: dict) -> bool:
    return "epochs" in res


#: The references every row is rated against, per run: the decode limit of the row's worker
#: count (W x one thread's decode rate; also with memory-mapped reads), and Petastorm's best
#: cold and best warm row.
REF_KINDS = ("decode", "decode_mapped", "petastorm_cold", "petastorm_warm")


def _row_workers(res: dict) -> int:
    return max(1, int(res.get("workers") or 1))


def references(per: dict[str, list[dict]], runs: int) -> dict[str, list[float | None]]:
    """Per run index: the one-thread decode rate, and the best Petastorm rows/s cold (no cache,
    any option, any W) and warm (from its local-disk cache); None where that run has none."""
    out: dict[str, list[float | None]] = {k: [None] * runs for k in REF_KINDS}
    for label, rs in per.items():
        for r, res in enumerate(rs[:runs]):
            if not _ok(res):
                continue
            rate = steady_rows_per_s(res)
            if label == DECODE:
                out["decode"][r] = rate
            elif label == DECODE_MAPPED:
                out["decode_mapped"][r] = rate
            elif label.startswith("petastorm"):
                kind = "petastorm_warm" if "cache" in label else "petastorm_cold"
                best = out[kind][r]
                out[kind][r] = rate if best is None else max(best, rate)
    return out


def per_run_ratios(runs: list[dict], refs: dict[str, list[float | None]], which: str) -> list[float]:
    """A row's rows/s over the reference ``which`` within each run (the decode limit scaled by
    the row's worker count)."""
    out = []
    for r, res in enumerate(runs):
        ref = refs[which][r] if r < len(refs[which]) else None
        if not _ok(res) or not ref:
            continue
        if which in ("decode", "decode_mapped"):
            ref *= _row_workers(res)
        out.append(steady_rows_per_s(res) / ref)
    return out


def _fmt_ratio(x: float) -> str:
    return "" if x != x else f"{x:.2f}"  # NaN: no reference in any run


def reference_notes(per: dict[str, list[dict]], refs: dict[str, list[float | None]]) -> list[str]:
    lines = []
    dec = [x for x in refs["decode"] if x]
    if dec:
        lines.append(f"Decode limit: one thread decodes {median(dec):,.0f} rows/s (median over runs; "
                     f"`read_row_group(use_threads=False)` + NumPy, epochs after the first), so W=1: "
                     f"{median(dec):,.0f}, W=2: {2 * median(dec):,.0f} rows/s.")
    mapped = [x for x in refs["decode_mapped"] if x]
    if mapped:
        lines.append(f"Decode limit with memory-mapped files (each file `pa.memory_map`ped once and kept mapped, "
                     f"`pre_buffer=False`: no page copied out of the page cache and, after the first epoch, no "
                     f"page faults; detload's process workers map files by default but give the pages back after "
                     f"each row group): one thread {median(mapped):,.0f} rows/s, W=2: {2 * median(mapped):,.0f} rows/s.")
    for kind, what in (("petastorm_cold", "cold (no cache)"), ("petastorm_warm", "warm (local-disk cache)")):
        best = [x for x in refs[kind] if x]
        if best:
            lines.append(f"Petastorm best {what}: {median(best):,.0f} rows/s (median over runs of the best "
                         "Petastorm row of each run).")
    return lines


#: The throughput targets (ratios within one run): reference, threshold.
TARGETS = (("decode", 0.8), ("petastorm_cold", 2.5), ("petastorm_warm", 2.5))


def target_lines(per: dict[str, list[dict]], refs: dict[str, list[float | None]]) -> list[str]:
    """Each detload W=2 row against each target, met or not, with the median of the per-run
    ratios as measured (not rounded toward it): the cold row (no cache, shuffle on, no
    manifest) against the decode limit and Petastorm's best cold row; the warm row (its cache
    filled by the first epoch) against Petastorm's best warm row."""
    lines = []
    for pool in ("thread", "process"):
        for which, threshold in TARGETS:
            # Cold targets rate the uncached row; the warm one detload's warm row (its cache).
            label = f"detload {pool} W=2" + (", cache (warm)" if which == "petastorm_warm" else "")
            runs = per.get(label)
            if not runs:
                continue
            rs = per_run_ratios(runs, refs, which)
            if not rs:
                continue
            m = median(rs)
            what = {"decode": "the decode limit (2 x one thread)", "petastorm_cold": "Petastorm best, cold",
                    "petastorm_warm": "Petastorm best, warm"}[which]
            lines.append(f"- target: {label} vs {what}: {m:.3f}x (runs: "
                         f"{', '.join(f'{x:.3f}' for x in rs)}); threshold >= {threshold}x: "
                         f"{'met' if m >= threshold else 'NOT met'}")
            if which == "decode":
                strict = per_run_ratios(runs, refs, "decode_mapped")
                if strict:
                    lines.append(f"  - not a target, the stricter limit: {label} vs 2 x one thread decoding "
                                 f"memory-mapped files: {median(strict):.3f}x (runs: "
                                 f"{', '.join(f'{x:.3f}' for x in strict)})")
    return lines


def report(results, tax, a, started, load, load_after) -> str:
    cmd = "PYTHONPATH=. python experiments/bench/bench.py " + " ".join(sys.argv[1:])
    lines = [
        f"Measured {started} on {platform.node() and 'this machine'}: {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), Python {platform.python_version()}, "
        f"load average {load[0]:.2f} before / {load_after[0]:.2f} after (the run itself keeps both cores busy).",
        f"Command: `{cmd}`", "",
        "The measured process imports " + ("torch at its top, as a training script does (detload's process "
                                           "workers do not import the main module, nor torch with it)"
                                           if a.main_imports == "torch" else "nothing extra")
        + f"; installed: {', '.join(_installed()) or 'none of torch, pandas, lightning'}.", "",
        f"Batches of {BATCH} rows; {a.epochs} epochs per loader; rows/s = steady state over epochs 2..{a.epochs} "
        f"(workers persist); medians of {a.runs} runs; ratios are per run, then the median.", "",
    ]
    for shape, per in results.items():
        raw = per.get(RAW, [])
        refs = references(per, a.runs)
        lines += [f"### {shape}", "",
                  "| loader | rows/s (median) | x raw pyarrow | x decode limit (W x one thread) "
                  "| x decode limit, mapped files | x petastorm best cold | x petastorm best warm | start-up s "
                  "| consumer CPU us/batch (median / mean) | rows/epoch ok | peak memory MiB (PSS) "
                  "| memory bound MiB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for label, runs in per.items():
            good = [x for x in runs if _ok(x)]
            if not good:
                why = runs[0].get("skipped") or (runs[0].get("error") or "")[-200:].replace("\n", " ")
                lines.append(f"| {label} | n/a ({why}) | | | | | | | | | | |")
                continue
            rps = median([steady_rows_per_s(x) for x in good])
            ratios = [steady_rows_per_s(x) / steady_rows_per_s(rr) for x, rr in zip(runs, raw)
                      if _ok(x) and _ok(rr)]
            ref_cols = [_fmt_ratio(median(per_run_ratios(runs, refs, which))) for which in REF_KINDS]
            su = median([x["startup_s"] for x in good])
            cms = [x["consumer_cpu_us_per_batch_median"] for x in good if x.get("consumer_cpu_us_per_batch_median")]
            cmeans = [x["consumer_cpu_us_per_batch_mean"] for x in good if x.get("consumer_cpu_us_per_batch_mean")]
            cpu = f"{median(cms):.1f} / {median(cmeans):.1f}" if cms else ""
            rows_ok = all(e["rows"] == x["dataset_rows"] for x in good for e in x["epochs"])
            peak = [x["peak_rss"] for x in good if x.get("peak_rss")]
            bound = [x["bound_bytes"] for x in good if x.get("bound_bytes")]
            lines.append(f"| {label} | {rps:,.0f} | {_fmt_ratio(median(ratios))} | {' | '.join(ref_cols)} | "
                         f"{su:.2f} | {cpu} | {'yes' if rows_ok else 'NO'} | "
                         f"{(f'{median(peak) / 2**20:.0f}' if peak else '')} | "
                         f"{(f'{median(bound) / 2**20:.0f}' if bound else '')} |")
        lines += ["", *reference_notes(per, refs), "", *target_lines(per, refs)]
        pet = per.get("petastorm 0.13.1 W=2")
        best = {}
        for pool in ("thread", "process"):
            rs = per.get(f"detload {pool} W=2")
            if rs:
                best[pool] = rs
        if pet and best and all(_ok(x) for x in pet):
            for pool, rs in best.items():
                rr = [steady_rows_per_s(x) / steady_rows_per_s(p) for x, p in zip(rs, pet) if _ok(x) and _ok(p)]
                lines.append(f"\ndetload {pool} W=2 / petastorm W=2 (median of per-run ratios): {median(rr):.2f}x")
        lines.append("")
        for label, runs in per.items():
            if label.startswith("detload") and _ok(runs[-1]) and "bottleneck" in runs[-1]:
                r = runs[-1]
                if "bound_bytes" not in r:
                    lines.append(f"- {label}: bound by `{r['bottleneck']}` -- {r['verdict']}. Memory: peak "
                                 f"{r['peak_rss'] / 2**20:.0f} MiB (cache entries kept mapped count; no bound "
                                 "is documented for them)")
                    continue
                held = all(x["peak_rss"] <= x["bound_bytes"] for x in runs if _ok(x))
                heavy = r.get("worker_imports") or []
                note = (f"; its worker processes import {', '.join(heavy)}, and the baseline, taken once they "
                        "have started, counts it") if heavy else ""
                lines.append(f"- {label}: bound by `{r['bottleneck']}` -- {r['verdict']}. Memory: peak "
                             f"{r['peak_rss'] / 2**20:.0f} MiB, bound {r['bound_bytes'] / 2**20:.0f} MiB = baseline "
                             f"{r['baseline_bytes'] / 2**20:.0f} + {r['data_bound_bytes'] / 2**20:.0f} "
                             f"(block {r['block_bytes'] / 2**20:.1f} MiB), "
                             f"{'held in every run' if held else 'EXCEEDED in a run'}{note}; start-up of the pool "
                             f"{r['pool_start_s']:.2f} s")
        lines.append("")
    lines += order_lines(results)
    if tax:
        lines += ["### Determinism tax", "",
                  f"W=2, random per-block delays of 0-20 ms, {a.tax_epochs} epochs, steady-state rows/s "
                  "(medians; ratio per run, then the median).", "",
                  "| pool | ordered rows/s | unordered rows/s | ordered / unordered |", "|---|---:|---:|---:|"]
        for pool in ("thread", "process"):
            o, u = tax.get(f"{pool} ordered", []), tax.get(f"{pool} unordered", [])
            pairs = [(x, y) for x, y in zip(o, u) if _ok(x) and _ok(y)]
            if not pairs:
                continue
            lines.append(f"| {pool} | {median([steady_rows_per_s(x) for x, _ in pairs]):,.0f} | "
                         f"{median([steady_rows_per_s(y) for _, y in pairs]):,.0f} | "
                         f"{median([steady_rows_per_s(x) / steady_rows_per_s(y) for x, y in pairs]):.3f} |")
        lines.append("")
    return "\n".join(lines)


def _installed() -> list[str]:
    import importlib.util

    return [m for m in ("torch", "pandas", "lightning") if importlib.util.find_spec(m) is not None]


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def write_doc(path: Path, text: str) -> None:
    """Replace the generated block of the document (or append one)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in old and END in old:
        new = old[: old.index(BEGIN)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.write_text(new)


if __name__ == "__main__":
    sys.exit(main())
