"""The ``detload`` command line: a thin layer over the library (argparse, no hand-rolled parsing).

Commands: run, verify, inspect, plan, demo, cache (info, clear), bench. Exit codes: 0 success, 1 a
verification found a difference, 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import __version__, _layout_cli
from .errors import DetloadError, ManifestError, SchemaMismatchError

_MAP_HELP = ("cache entries kept memory-mapped between epochs (thread workers together, or each worker "
             "process), e.g. 8GB; 0 maps them anew each epoch (default: auto, a quarter of the memory)")


def _fill(s: str) -> tuple[str, Any]:
    """COLUMN=VALUE; VALUE is read as JSON when it parses (-1, 0.5, "7"), else as text."""
    name, sep, raw = s.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected COLUMN=VALUE, got {s!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, (list, dict)):
        raise argparse.ArgumentTypeError(f"the fill value for {name!r} must be a number or text, got {raw!r}")
    return name, value


def _add_null_fill(p: argparse.ArgumentParser) -> None:
    p.add_argument("--null-fill", type=_fill, action="append", default=[], metavar="COLUMN=VALUE",
                   help="replace nulls of COLUMN with VALUE (read as JSON when it parses, else text: "
                        "id=-1, score=0.5, name=, code='\"7\"'); repeat for more columns")


def _cast(s: str) -> tuple[str, str]:
    """COLUMN=DTYPE, e.g. price=float64, amount=int64-scaled, ts=datetime64[ns]."""
    name, sep, dtype = s.partition("=")
    if not sep or not name or not dtype:
        raise argparse.ArgumentTypeError(f"expected COLUMN=DTYPE (e.g. price=float64), got {s!r}")
    return name, dtype


def _add_cast(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cast", type=_cast, action="append", default=[], metavar="COLUMN=DTYPE",
                   help="deliver COLUMN as DTYPE, checked value by value: float64 or float32 for a decimal, "
                        "int64-scaled for a decimal's unscaled integer, datetime64[ns|us|ms|s] for a timestamp, "
                        "a narrower integer or float type (int32, float32); repeat for more columns "
                        "(default: none; see docs/types.md)")


def _common_loader_args(p: argparse.ArgumentParser, *, need_seed: bool = True) -> None:
    p.add_argument("source", help="a Parquet file, directory, glob or URI (s3://bucket/prefix)")
    p.add_argument("--batch-size", type=int, required=True, help="rows per batch (per rank)")
    p.add_argument("--seed", type=int, required=need_seed, help="the seed that fixes the order")
    p.add_argument("--columns", type=lambda s: [c for c in s.split(",") if c],
                   help="comma-separated columns (default: all, schema order)")
    p.add_argument("--shuffle-window", type=int, default=4, help="row groups whose rows are mixed together (default 4)")
    p.add_argument("--no-shuffle", action="store_true", help="canonical order: files, then row groups, then rows")
    p.add_argument("--drop-last", action="store_true",
                   help="drop the ragged tail (the last incomplete batch; with partitions, the rows past the shortest partition's last full micro-batch)")
    p.add_argument("--partitions", type=int, default=None, help="canonical partitions (default: world size)")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    _add_null_fill(p)
    _add_cast(p)


def _loader_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(
        batch_size=a.batch_size, seed=a.seed, columns=a.columns, shuffle=not a.no_shuffle,
        shuffle_window=a.shuffle_window, drop_last=a.drop_last, partitions=a.partitions,
        rank=a.rank, world_size=a.world_size, null_fill=dict(a.null_fill), cast=dict(a.cast) or None,
    )


def _workers(s: str) -> int | str:
    return s if s == "auto" else int(s)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="detload", description="Deterministic, audited Parquet loading for ML training.")
    ap.add_argument("--version", action="version", version=f"detload {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="iterate a dataset and write the manifest of every batch",
                       description="Iterate SOURCE for --epochs epochs as a training job would, writing the manifest.")
    _common_loader_args(p)
    p.add_argument("--workers", type=_workers, default=1, help="worker count or 'auto' (default 1)")
    p.add_argument("--pool", choices=["thread", "process"], default="thread")
    p.add_argument("--prefetch", type=int, default=2, help="blocks queued per worker (default 2)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("--manifest", required=True, help="manifest file, or a directory for rank-NNNNN.jsonl files")
    p.add_argument("--save-state", action="store_true",
                   help="after every batch, write the resume state beside the manifest (m.jsonl -> m.state.json, "
                        "rank-00000.jsonl -> rank-00000.state.json)")
    p.add_argument("--resume", metavar="FROM",
                   help="continue an interrupted run: FROM is a state file, or the manifest / run directory of a "
                        "run made with --save-state (a directory resumes at the step every rank reached). Give the "
                        "same --start-epoch/--epochs as the first run; at another world size keep --partitions and "
                        "the global batch, and write --manifest to a new directory")
    p.add_argument("--cache-dir", default=None, help="row-group cache directory (local SSD); see docs/remote.md")
    p.add_argument("--cache-limit", default=None, help="cache size limit, e.g. 50GB (default: no limit)")
    p.add_argument("--cache-map-limit", default="auto", help=_MAP_HELP)

    p = sub.add_parser("verify", help="compare two manifests or run directories step by step",
                       description="Exit 0 when identical, 1 at the first difference or truncation, 2 on unreadable input.")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("b_continued", nargs="*", metavar="B_RESUMED",
                   help="where B's resumed continuations wrote (run directories or manifests, in order): each "
                        "replaces B from its first recorded step on")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("inspect", help="files, row groups, rows, schema and fingerprint of a dataset")
    p.add_argument("source")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("plan", help="print an epoch's plan: units, blocks and per-worker schedules")
    _common_loader_args(p)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--workers", type=_workers, default=1)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("cache", help="look at or empty a row-group cache directory")
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    c = csub.add_parser("info", help="entries, bytes and objects in a cache directory")
    c.add_argument("dir")
    c.add_argument("--verify", action="store_true", help="check every entry's checksum")
    c.add_argument("--json", action="store_true")
    c = csub.add_parser("clear", help="delete every entry of a cache directory")
    c.add_argument("dir")

    p = sub.add_parser("demo", help="generate an example dataset, load it at 1 and 4 process workers, verify")
    p.add_argument("--dir", default="detload-demo", help="where the dataset and manifests go (default ./detload-demo)")
    p.add_argument("--rows", type=int, default=200_000)

    p = sub.add_parser("bench", help="measure throughput per stage and name the stage that bounds it",
                       description="Iterate SOURCE as fast as possible (no training step), print rows/s per "
                                   "epoch and the per-stage table naming the bounding stage; optionally write "
                                   "a Chrome trace-event file (open it in https://ui.perfetto.dev or chrome://tracing).")
    p.add_argument("source", help="a Parquet file, directory, glob or URI")
    p.add_argument("--workers", type=_workers, default="auto", help="worker count or 'auto' (default auto)")
    p.add_argument("--pool", choices=["thread", "process"], default="thread")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=2, help="epochs; workers persist across them (default 2)")
    p.add_argument("--shuffle-window", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--columns", type=lambda s: [c for c in s.split(",") if c])
    p.add_argument("--seed", type=int, default=0)
    _add_null_fill(p)
    _add_cast(p)
    p.add_argument("--cache-dir", default=None,
                   help="row-group cache folder: epoch 0 fills it, later epochs show warm-cache throughput")
    p.add_argument("--cache-limit", default=None, help="cache size limit, e.g. 50GB (default: no limit)")
    p.add_argument("--cache-map-limit", default="auto", help=_MAP_HELP)
    p.add_argument("--trace", help="write the Chrome trace-event JSON here")
    p.add_argument("--json", action="store_true", help="print the stats as JSON")
    _layout_cli.add_parsers(sub)  # digest, layout, check-layout
    return ap


def _cmd_run(a: argparse.Namespace) -> int:
    from .loader import Loader

    t0 = time.perf_counter()
    with Loader(a.source, workers=a.workers, pool=a.pool, prefetch=a.prefetch, manifest=a.manifest,
                cache_dir=a.cache_dir, cache_limit=a.cache_limit, cache_map_limit=a.cache_map_limit,
                **_loader_kwargs(a)) as loader:
        print(f"{loader!r}")
        first = a.start_epoch
        if a.resume:
            state = read_resume_state(a.resume)
            loader.load_state_dict(state)
            first = state["epoch"]
            print(f"resuming at epoch {state['epoch']} step {state['step']} (from {a.resume})")
        state_path = state_file(loader.manifest_path) if a.save_state and loader.manifest_path else None
        if state_path is not None:
            _sweep_state_temps(state_path)
        for epoch in range(first, a.start_epoch + a.epochs):
            loader.set_epoch(epoch)
            t = time.perf_counter()
            rows = batches = 0
            for batch in loader:
                rows += len(next(iter(batch.values()))) if batch else 0
                batches += 1
                if state_path is not None:
                    _write_json_atomic(state_path, loader.state_dict())
            if state_path is not None:  # an epoch without batches to go still records its end
                _write_json_atomic(state_path, loader.state_dict())
            dt = time.perf_counter() - t
            plan = loader.plan()
            print(f"epoch {epoch}: {batches} batches, {rows} rows, {plan.dropped_rows} dropped, "
                  f"{rows / dt if dt > 0 else float('inf'):,.0f} rows/s")
        print(f"manifest: {loader.manifest_path}  ({time.perf_counter() - t0:.2f} s)")
    return 0


def state_file(manifest_path: str) -> str:
    """Where ``run --save-state`` keeps the state of the run writing ``manifest_path``."""
    stem = manifest_path[: -len(".jsonl")] if manifest_path.endswith(".jsonl") else manifest_path
    return stem + ".state.json"


def read_resume_state(where: str) -> dict[str, Any]:
    """The state to resume from: a state file, or the saved states of a manifest or run directory.

    Ranks of a directory may have been killed at different steps; the run
    resumes at the earliest, which every rank reached.
    """
    import glob

    if os.path.isdir(where):
        paths = sorted(glob.glob(os.path.join(where, "rank-*.state.json")))
    elif where.endswith(".jsonl"):
        paths = [state_file(where)]
    else:
        paths = [where]
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        raise FileNotFoundError(f"no saved state in {where} (was the run started with --save-state?)")
    states = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                states.append(json.load(f))
        except (OSError, ValueError) as exc:
            raise ManifestError(f"cannot read the state {p}: {exc}") from None
    for st in states:
        if not isinstance(st, dict) or "epoch" not in st or "step" not in st:
            raise ManifestError(f"{where} does not hold detload states")
    if len({json.dumps(st.get("order"), sort_keys=True) for st in states}) > 1:
        raise ManifestError(f"the states in {where} were saved with different options")
    return min(states, key=lambda st: (st["epoch"], st["step"]))


def _sweep_state_temps(path: str) -> None:
    """Remove the temp files a killed run left beside its state (``path.tmpPID``, PID gone)."""
    from ._shm import pid_alive

    folder, base = os.path.split(path)
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return
    for name in names:
        m = re.fullmatch(re.escape(base) + r"\.tmp([0-9]+)", name)
        if m and not pid_alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)  # a kill leaves the old state or the new one, never half of one


def _cmd_bench(a: argparse.Namespace) -> int:
    from .loader import Loader

    t0 = time.perf_counter()
    with Loader(a.source, batch_size=a.batch_size, seed=a.seed, workers=a.workers, pool=a.pool,
                prefetch=a.prefetch, shuffle_window=a.shuffle_window, columns=a.columns,
                null_fill=dict(a.null_fill), cast=dict(a.cast) or None, cache_dir=a.cache_dir,
                cache_limit=a.cache_limit,
                cache_map_limit=a.cache_map_limit) as loader:
        hits_before = 0
        for epoch in range(a.epochs):
            loader.set_epoch(epoch)
            t = time.perf_counter()
            rows = 0
            for batch in loader:
                rows += len(next(iter(batch.values()))) if batch else 0
            dt = time.perf_counter() - t
            what = " (includes worker start-up)" if epoch == 0 else ""
            if a.cache_dir:
                # Row groups this epoch served from the cache (each hit is a traced cache_read).
                hits = loader.stats().stages["cache_read"].count
                what += f", {hits - hits_before} of its row groups from the cache"
                hits_before = hits
            print(f"epoch {epoch}: {rows:,} rows in {dt:.2f} s, {rows / dt if dt > 0 else 0:,.0f} rows/s{what}")
        st = loader.stats()
        if a.json:
            print(json.dumps(st.as_dict(), indent=2, default=str))
        else:
            print(st.table())
        if a.trace:
            st.write_trace(a.trace)
            print(f"trace: {a.trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    print(f"total {time.perf_counter() - t0:.2f} s")
    return 0


def _cmd_verify(a: argparse.Namespace) -> int:
    from .verify import verify

    try:
        res = verify(a.a, [a.b, *a.b_continued] if a.b_continued else a.b)
    except ManifestError as exc:
        if a.json:
            print(json.dumps({"identical": False, "kind": "unreadable", "message": str(exc)}))
        else:
            print(f"detload verify: {exc}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(res.to_dict(), indent=2, default=str))
    else:
        print(res.message)
        for k, (va, vb) in res.info.items():
            if va != vb:
                print(f"  (not order-determining) {k}: A={va!r} B={vb!r}")
    return 0 if res.identical else 1


def _cmd_inspect(a: argparse.Namespace) -> int:
    from ._dataset import discover
    from ._types import SCALED, allowed_casts

    ds = discover(a.source)
    specs = ds.specs(None) if _all_mappable(ds) else None
    info = {
        "root": ds.root,
        "fingerprint": ds.fingerprint,
        "files": [{"path": f.path, "size": f.size, "row_groups": list(f.row_groups), "rows": sum(f.row_groups)}
                  for f in ds.files],
        "rows": ds.rows,
        "row_groups": sum(len(f.row_groups) for f in ds.files),
        "schema": [{"name": fld.name, "arrow": str(fld.type)} for fld in ds.schema],
        "partitions": [{"key": k, "type": t} for k, t in ds.partition_types],
    }
    delivered = {}
    for fld in ds.schema:
        try:
            delivered[fld.name] = ds.specs([fld.name])[0].describe()
        except SchemaMismatchError as exc:
            delivered[fld.name] = f"files disagree ({exc})"
        except DetloadError as exc:
            casts = allowed_casts(fld.type)
            if casts:  # a decimal: delivered when a cast says how
                scale = f"; scale {fld.type.scale}" if SCALED in casts else ""
                delivered[fld.name] = f"only with cast= ({', '.join(casts)}{scale})"
            else:
                delivered[fld.name] = f"unsupported: {exc}".split(".")[0]
    for k, _ in ds.partition_types:
        delivered[k] = ds.specs([k])[0].describe() + " (Hive partition)"
    info["numpy"] = delivered
    del specs
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"dataset {ds.root}")
    print(f"  fingerprint {ds.fingerprint}")
    print(f"  {len(ds.files)} files, {info['row_groups']} row groups, {ds.rows:,} rows")
    for f in ds.files:
        rg = list(f.row_groups)
        shown = ", ".join(map(str, rg[:8])) + (", ..." if len(rg) > 8 else "")
        print(f"  {f.path}  {f.size:,} B  {sum(rg):,} rows in {len(rg)} row groups [{shown}]")
    print("  columns:")
    for fld in ds.schema:
        print(f"    {fld.name}: {fld.type} -> {delivered[fld.name]}")
    for k, t in ds.partition_types:
        print(f"    {k}: {t} -> {delivered[k]}")
    return 0


def _all_mappable(ds: Any) -> bool:
    try:
        ds.specs(None)
        return True
    except DetloadError:
        return False


def _cmd_plan(a: argparse.Namespace) -> int:
    from .loader import Loader, resolve_workers

    # A Loader plans exactly as a run would (same fingerprint); it starts no worker.
    loader = Loader(a.source, **_loader_kwargs(a))
    ds = loader.dataset
    opts = loader.options
    files, rgs, _rows = ds.units()
    plan = loader.plan(a.epoch)
    workers = resolve_workers(a.workers)
    d: dict[str, Any] = plan.to_dict(workers)
    names = [f"{ds.files[f].path}#{g}" for f, g in zip(files, rgs)]
    d["unit_names"] = names
    if a.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"plan {plan.fingerprint} (format {d['plan_format']}) epoch {plan.epoch} rank {plan.rank}")
    print(f"  {d['units']} units, {d['rows']:,} rows -> {plan.steps} steps of {opts.batch_size} rows, "
          f"{plan.dropped_rows} dropped; partitions {opts.partitions}, rows per partition {list(plan.partition_rows)}")
    print("  unit order: " + " ".join(str(u) for u in plan.unit_order[:32]) + (" ..." if d["units"] > 32 else ""))
    for blk in d["blocks"]:
        units = ", ".join(names[u] for u in blk["units"])
        print(f"  block k={blk['k']:<4} partition {blk['partition']} #{blk['number']:<3} worker {blk['worker']:<3} "
              f"rows {blk['rows']:<7} steps {blk['steps'][0]}-{blk['steps'][1]}  [{units}]")
    for w, sched in enumerate(plan.worker_schedules(workers)):
        print(f"  worker {w}: blocks " + " ".join(f"p{b.partition}#{b.number}" for b in sched))
    return 0


def _cmd_cache(a: argparse.Namespace) -> int:
    from ._cache import cache_info, clear_cache

    if a.cache_command == "clear":
        freed = clear_cache(a.dir)
        print(f"cleared {a.dir}: freed {freed:,} bytes")
        return 0
    info = cache_info(a.dir, verify=a.verify)
    # Damage found by --verify exits 1, so a script can act on it (a loader would
    # discard and refetch those entries anyway).
    status = 1 if a.verify and info["corrupt"] else 0
    if a.json:
        print(json.dumps(info, indent=2))
        return status
    print(f"cache {info['dir']} (format v{info['format']}; formats present: {', '.join(info['formats_present'])})")
    print(f"  {info['entries']} entries of {info['objects']} files, {info['bytes']:,} bytes"
          f" (usage counter {info['usage_counter']:,}), {info['temp_files']} temp files")
    if a.verify:
        bad = info["corrupt"]
        print(f"  checksums: {'all good' if not bad else f'{len(bad)} damaged'}")
        for path in bad:
            print(f"    damaged: {path}")
    return status


def _cmd_demo(a: argparse.Namespace) -> int:
    from ._demo import write_demo_dataset
    from .loader import Loader
    from .verify import verify

    data = os.path.join(a.dir, "data")
    print(f"1. writing an example dataset ({a.rows:,} rows, 6 files with odd row-group sizes, one empty) to {data}")
    write_demo_dataset(data, rows=a.rows)
    manifests = []
    for workers in (1, 4):
        path = os.path.join(a.dir, f"manifest-w{workers}.jsonl")
        t = time.perf_counter()
        rows = 0
        with Loader(data, batch_size=4096, seed=42, workers=workers, pool="process", shuffle_window=4,
                    manifest=path) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                for batch in loader:
                    rows += len(batch["id"])
        dt = time.perf_counter() - t
        print(f"2. loaded 2 epochs with {workers} process worker(s): {rows:,} rows in {dt:.2f} s -> {path}")
        manifests.append(path)
    res = verify(*manifests)
    print(f"3. detload verify {manifests[0]} {manifests[1]}: {res.message}")
    if not res.identical:
        return 1
    print("   Same seed, different worker counts: byte-identical batches, step by step.")
    print(f"   Try: detload verify {manifests[0]} {manifests[1]}   |   detload inspect {data}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    cmd = {"run": _cmd_run, "verify": _cmd_verify, "inspect": _cmd_inspect, "plan": _cmd_plan, "demo": _cmd_demo,
            "cache": _cmd_cache, "bench": _cmd_bench, **_layout_cli.COMMANDS}
    try:
        return cmd[a.command](a)
    except (DetloadError, FileNotFoundError, ValueError) as exc:
        print(f"detload {a.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
