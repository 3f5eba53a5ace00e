"""Slice reads: one segment (1 %), ten segments (10 %) and a segment x month of a 26-column table, read four ways.

(a) detload with ``filter=`` on the unsorted table; (b) detload with ``filter=`` after
``detload.layout.rewrite(..., sort_by=["segment", "day"])``; (c) ``pyarrow.parquet.read_table`` with
threads on the same cores, then a NumPy mask; (d) Petastorm with ``filters=`` and with a
vectorised ``predicate`` (its own venv, see make_petastorm_env.sh). Also (a0): detload as it
is without ``filter=``, reading everything and masking each batch. Each run is a fresh process.

Cold runs: the dataset's files are evicted from the page cache with
``posix_fadvise(POSIX_FADV_DONTNEED)`` before the run (dropping all caches needs root and
``/proc/sys/vm/drop_caches``, which this benchmark does not touch); each cold run's
``read_bytes`` shows whether the eviction took effect. (a) and (b) run cold twice: without a
cache (the same work as (c); the cold targets use this run), then filling their ``cache_dir``.
Warm runs repeat at once, so the page cache (and, for detload, its ``cache_dir`` with the cached
selection) is warm. Not a test: a script
that prints a table. ``--tiny`` is a quick check of the whole path.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))  # this tree's detload, in this process as in the children
from slices import DAY0, DAYS, SEGMENTS, SLICES, Slice  # noqa: E402

MARKER = "_done.json"
FORMAT_VERSION = 1
DEFAULT_ROOT = "/tmp/detload-bench-slice"
LAYOUT_SORT_BY = ["segment", "day"]
N_CAT = 6
N_F32 = 12
MARKETS = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA", "AU", "ES", "IT", "MX"]
QUERY_VOCAB = 20_000
WAYS = ("a", "a0", "b", "c", "d")
WAY_NAMES = {
    "a": "(a) detload filter=, unsorted",
    "a0": "(a0) detload, no filter=: read all, mask",
    "b": "(b) detload filter=, after layout",
    "c": "(c) pyarrow read_table + NumPy mask",
    "d-filters": "(d) petastorm filters=",
    "d-predicate": "(d) petastorm predicate=",
}


# -- the table ---------------------------------------------------------------------------------

def _vocab(rng: np.random.Generator) -> pa.Array:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lengths = rng.integers(6, 17, QUERY_VOCAB)
    chars = letters[rng.integers(0, 26, int(lengths.sum()))]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.StringArray.from_buffers(QUERY_VOCAB, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def _table(first_id: int, n: int, rng: np.random.Generator, vocab: pa.Array) -> pa.Table:
    cols: dict[str, Any] = {
        "id": np.arange(first_id, first_id + n, dtype=np.int64),
        # Uniform over every file, so an unsorted file has every segment in every row group.
        "segment": rng.integers(0, SEGMENTS, n, dtype=np.int32),
        "day": pa.array(np.datetime64(DAY0, "D") + rng.integers(0, DAYS, n).astype("timedelta64[D]"), pa.date32()),
        "market": pa.array(MARKETS).take(pa.array(rng.integers(0, len(MARKETS), n))),
        "query": vocab.take(pa.array(rng.zipf(1.3, n) % QUERY_VOCAB)),
        "clicks": rng.poisson(2.0, n).astype(np.int32),
    }
    for i in range(N_CAT):
        cols[f"cat_{i}"] = rng.integers(0, 10 ** (i % 5 + 1), n, dtype=np.int64)
    for i in range(N_F32):
        cols[f"f_{i}"] = rng.standard_normal(n, dtype=np.float32)
    cols["score"] = rng.random(n)
    cols["weight"] = rng.exponential(1.0, n)
    return pa.table(cols)


def make_table(path: Path, *, rows: int, files: int, row_group_rows: int, seed: int = 0) -> dict[str, Any]:
    """Write the table (or reuse it: a finished folder has a marker with the same parameters)."""
    params = {"version": FORMAT_VERSION, "rows": rows, "files": files, "row_group_rows": row_group_rows, "seed": seed}
    marker = path / MARKER
    if marker.is_file():
        done = json.loads(marker.read_text())
        if done.get("params") == params:
            return {**done, "reused": True}
        raise SystemExit(f"{path} holds a table made with {done.get('params')}, not {params}: pass another --data or remove it")
    if path.exists():
        shutil.rmtree(path)  # no marker: an interrupted run
    path.mkdir(parents=True)
    t0 = time.perf_counter()
    vocab = _vocab(np.random.default_rng([seed, 1 << 20]))
    edges = np.linspace(0, rows, files + 1).round().astype(np.int64)
    for i in range(files):
        rng = np.random.default_rng([seed, i])
        table = _table(int(edges[i]), int(edges[i + 1] - edges[i]), rng, vocab)
        tmp = path / f".part-{i:05d}.parquet.tmp"
        pq.write_table(table, tmp, row_group_size=row_group_rows, compression="snappy")
        os.replace(tmp, path / f"part-{i:05d}.parquet")
    done = {"params": params, "generate_s": time.perf_counter() - t0}
    marker.write_text(json.dumps(done))
    return {**done, "reused": False}


def data_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*.parquet") if not any(part.startswith((".", "_")) for part in p.relative_to(path).parts))


def describe(path: Path) -> dict[str, Any]:
    """Row groups and their column-chunk bytes (compressed, from the footers)."""
    groups = []
    for f in data_files(path):
        md = pq.read_metadata(f)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            groups.append({"file": str(f), "rg": g, "rows": rg.num_rows,
                           "bytes": sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))})
    return {"files": len(data_files(path)), "row_groups": len(groups), "rows": sum(g["rows"] for g in groups),
            "bytes": sum(g["bytes"] for g in groups), "file_bytes": sum(f.stat().st_size for f in data_files(path)),
            "groups": groups}


def predicted_groups(path: Path, sl: Slice) -> tuple[int, int]:
    """(row groups, bytes) that statistics cannot rule out for ``sl``, by detload's own pruning."""
    from detload._filters.canonical import parse_filter, row_group_stats

    files = data_files(path)
    schema = pq.read_schema(files[0])
    flt = parse_filter(sl.text, schema)
    n = size = 0
    for f in files:
        md = pq.read_metadata(f)
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            if flt.prune(row_group_stats(rg, schema), {}, rg.num_rows) != "none":
                n += 1
                size += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
    return n, size


def resident_bytes(path: Path) -> int:
    """Bytes of the dataset's files now in the page cache (mincore over an untouched mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for f in data_files(path):
        size = f.stat().st_size
        if not size:
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {f}")
            try:
                vec = np.zeros((size + page - 1) // page, dtype=np.uint8)
                if libc.mincore(addr, size, vec.ctypes.data) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore {f}")
                total += int(np.count_nonzero(vec & 1)) * page
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return total


def evict(path: Path, *, tries: int = 5) -> int:
    """Drop the dataset's files from the page cache; returns the bytes still resident after ``tries``.

    DONTNEED is advisory: it skips dirty pages (hence the fsync: without it the first cold run
    after generating a table read 351 of 571 MB from the cache) and pages still on a CPU's
    pending LRU list, so it is repeated until mincore finds (almost) nothing resident.
    """
    left = 0
    for attempt in range(tries):
        for f in data_files(path):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        left = resident_bytes(path)
        if left <= 1 << 20:
            break
        time.sleep(0.2 * (attempt + 1))
    return left


def layout(src: Path, dst: Path) -> dict[str, Any]:
    """Lay the table out sorted by LAYOUT_SORT_BY with detload's layout tool, if this build has one."""
    done = dst.with_name(dst.name + ".done.json")
    if done.is_file() and dst.is_dir():
        return {**json.loads(done.read_text()), "reused": True}
    try:
        import detload.layout
    except ImportError:
        return {"unavailable": "detload.layout not available in this build"}
    fn = getattr(detload.layout, "rewrite", None)
    if fn is None:
        return {"unavailable": "detload.layout not available in this build"}
    if dst.exists():
        shutil.rmtree(dst)
    t0 = time.perf_counter()
    try:
        report = fn(str(src), str(dst), sort_by=LAYOUT_SORT_BY)
    except Exception as e:  # a signature or behaviour this script does not know yet: say so, go on
        return {"unavailable": f"detload.layout.rewrite(src, dst, sort_by={LAYOUT_SORT_BY}) failed: {type(e).__name__}: {e}"}
    out = {"layout_s": time.perf_counter() - t0, "report": str(report)[:2000]}
    done.write_text(json.dumps(out))
    return {**out, "reused": False}


# -- one run, in a fresh process ---------------------------------------------------------------

def proc_io() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key.strip()] = int(value)
    return out


def _io_since(io0: dict[str, int]) -> dict[str, int]:
    io1 = proc_io()
    return {"read_bytes": io1["read_bytes"] - io0["read_bytes"], "rchar": io1["rchar"] - io0["rchar"]}


def _accounting(stats: Any) -> dict[str, Any]:
    """What the loader's stats() says it read, under whichever of these names it reports."""
    want = ("bytes_read", "row_groups_read", "row_groups_skipped", "rows_selected")
    found: dict[str, Any] = {}

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k in want and isinstance(v, (int, float)) and k not in found:
                    found[k] = v
                walk(v)

    walk(stats.as_dict() if hasattr(stats, "as_dict") else stats)
    return found


def child_detload(data: str, sl: Slice, *, workers: int, batch_size: int, use_filter: bool, cache_dir: str | None) -> dict[str, Any]:
    import detload
    from detload._filters.canonical import parse_filter

    kwargs: dict[str, Any] = {"batch_size": batch_size, "seed": 0, "workers": workers}
    io0 = proc_io()
    t0 = time.perf_counter()
    if use_filter:
        schema = pq.read_schema(data_files(Path(data))[0])
        kwargs["filter"] = parse_filter(sl.text, schema).expression()
        kwargs["cache"] = cache_dir
    try:
        loader = detload.Loader(data, **kwargs)
    except TypeError as e:
        if use_filter and "filter" in str(e):
            return {"unavailable": "detload filter= not available in this build"}
        raise
    delivered = selected = 0
    with loader:
        for batch in loader:
            n = len(batch["id"])
            delivered += n
            if use_filter:
                selected += n
                continue
            mask = sl.mask({c: batch[c] for c in sl.columns()})
            selected += int(mask.sum())
            # What a user holds afterwards: the slice's rows of every column.
            _ = {k: (v[mask] if isinstance(v, np.ndarray) else _ragged_take(v, mask)) for k, v in batch.items()}
        accounting = _accounting(loader.stats())
    return {"wall_s": time.perf_counter() - t0, "rows_delivered": delivered, "rows_selected": selected,
            **_io_since(io0), "detload_stats": accounting}


def _ragged_take(r: Any, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = np.flatnonzero(mask)
    starts, ends = r.offsets[idx], r.offsets[idx + 1]
    lengths = ends - starts
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return r.values[gather], offsets


def child_pyarrow(data: str, sl: Slice, *, workers: int) -> dict[str, Any]:
    pa.set_cpu_count(workers)
    pa.set_io_thread_count(workers)
    io0 = proc_io()
    t0 = time.perf_counter()
    table = pq.read_table(data, use_threads=True)
    mask = sl.mask({c: table.column(c).to_numpy() for c in sl.columns()})
    picked = table.filter(pa.array(mask))
    return {"wall_s": time.perf_counter() - t0, "rows_delivered": table.num_rows, "rows_selected": picked.num_rows,
            **_io_since(io0)}


def child_main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    sl = SLICES[args["slice"]]
    try:
        if args["way"] == "c":
            out = child_pyarrow(args["data"], sl, workers=args["workers"])
        else:
            out = child_detload(args["data"], sl, workers=args["workers"], batch_size=args["batch_size"],
                                use_filter=args["way"] != "a0", cache_dir=args.get("cache_dir"))
    except Exception as e:
        out = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    print(json.dumps(out))
    return 0


# -- the parent ---------------------------------------------------------------------------------

def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            out: dict[str, Any] = json.loads(line)
            return out
    return {"error": f"no result; output ended with {text[-300:]!r}"}


def run_way(way: str, data: Path, sl: Slice, args: argparse.Namespace, cache_dir: Path | None) -> dict[str, Any]:
    if way.startswith("d-"):
        cmd = [args.petastorm_python, str(HERE / "petastorm_slice_runner.py"), str(data),
               "--mode", way[2:], "--dnf", json.dumps(sl.dnf_json()), "--workers", str(args.workers)]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
    else:
        spec = {"way": way, "data": str(data), "slice": sl.name, "workers": args.workers,
                "batch_size": args.batch_size, "cache_dir": str(cache_dir) if cache_dir else None}
        cmd = [sys.executable, str(Path(__file__).resolve()), "_child", json.dumps(spec)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past --child-timeout {args.child_timeout} s"}
    out = _last_json(proc.stdout)
    if proc.returncode and "error" not in out:
        out["error"] = f"exit {proc.returncode}: {proc.stderr[-400:]}"
    return out


#: The cold run of a way with a cache: no cache at all (the same work as (c), which the cold
#: targets compare with), then the run that fills the cache the warm runs read.
COLD_NO_CACHE, COLD_FILL = "cold, no cache", "cold, fills the cache"


def measure(way: str, data: Path, sl: Slice, args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """``args.cold_runs`` cold runs and ``args.warm`` warm ones; for (a) and (b), which warm up
    through detload's cache, the cold runs are without it, then one more cold run fills it."""
    cache_dir = root / f".detload-cache-{way}-{sl.name}" if way in ("a", "b") else None
    if cache_dir is not None and cache_dir.exists():
        shutil.rmtree(cache_dir)
    plan: list[tuple[str, Path | None]] = (
        [(COLD_NO_CACHE, None)] * args.cold_runs + [(COLD_FILL, cache_dir)] if cache_dir else [("cold", None)] * args.cold_runs)
    plan += [("warm", cache_dir)] * args.warm
    runs = []
    for label, cache in plan:
        left = evict(data) if label != "warm" else None
        r = run_way(way, data, sl, args, cache)
        if left is not None:
            r["resident_before"] = left
        r["run"] = label
        runs.append(r)
        if "unavailable" in r or "error" in r:
            break
    if cache_dir is not None and cache_dir.exists():
        shutil.rmtree(cache_dir)
    return runs


def summarize(way: str, runs: list[dict[str, Any]], expected: int, meta: dict[str, Any],
              model: tuple[int, int]) -> list[dict[str, Any]]:
    """Table rows: each cold run, and the median of the warm runs."""
    rows = []
    bad = [r for r in runs if "unavailable" in r or "error" in r]
    if bad:
        return [{"way": way, "run": bad[0]["run"], "note": bad[0].get("unavailable") or bad[0].get("error")}]
    groups, size = model
    labels = list(dict.fromkeys(r["run"] for r in runs))  # in the order they ran
    for label in labels:
        group = [r for r in runs if r["run"] == label]
        mid = sorted(group, key=lambda r: r["wall_s"])[len(group) // 2]
        reported = mid.get("detload_stats") or {}
        rg_read = reported.get("row_groups_read", groups)
        bytes_read = reported.get("bytes_read", size)
        rows.append({
            "way": way, "run": label if len(group) == 1 else f"{label} (median of {len(group)})",
            "wall_s": mid["wall_s"], "walls": [r["wall_s"] for r in group], "rows_selected": mid["rows_selected"],
            "rows_ok": mid["rows_selected"] == expected, "rows_delivered": mid.get("rows_delivered"),
            "rows_per_s": mid["rows_selected"] / mid["wall_s"] if mid["wall_s"] > 0 else 0.0,
            "row_groups_read": rg_read, "bytes_meta": bytes_read,
            "bytes_source": "reported by detload" if "bytes_read" in reported else "model",
            "row_groups_total": meta["row_groups"], "share": bytes_read / meta["bytes"], "read_bytes": mid["read_bytes"], "rchar": mid["rchar"],
            "engine_filtered": mid.get("engine_filtered"),
            # A cold run that fetched less than it read was partly served by the page cache.
            "partly_cached": label.startswith("cold") and mid["read_bytes"] < 0.9 * bytes_read,
        })
    return rows


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def print_table(title: str, rows: list[dict[str, Any]], meta: dict[str, Any], expected: int) -> None:
    print(f"\n### {title}: {expected:,} of {meta['rows']:,} rows selected\n")
    print("| way | run | wall s | rows/s selected | rows ok | row groups read | column-chunk MB read | % of dataset | read_bytes MB | rchar MB |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        name = WAY_NAMES[r["way"]]
        if "note" in r:
            print(f"| {name} | {r['run']} | {r['note']} | | | | | | | |")
            continue
        ok = "yes" if r["rows_ok"] else f"NO ({r['rows_selected']:,})"
        run = r["run"] + (" (partly cached)" if r.get("partly_cached") else "")
        print(f"| {name} | {run} | {r['wall_s']:.2f} | {r['rows_per_s']:,.0f} | {ok} | "
              f"{r['row_groups_read']} / {r['row_groups_total']} | {_mb(r['bytes_meta'])} | {r['share']:.1%} | "
              f"{_mb(r['read_bytes'])} | {_mb(r['rchar'])} |")


def targets(results: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str]]:
    """The issue's targets on the 1 % slice: (target, verdict)."""
    def pick(way: str, run: str) -> dict[str, Any] | None:
        rows = [r for r in results.get(way, []) if "note" not in r]
        if run == "cold":  # the cold run without a cache where there is one: (c)'s work, no cache fill
            rows = sorted(rows, key=lambda r: not r["run"].startswith(COLD_NO_CACHE))
        for r in rows:
            if r["run"].startswith(run):
                return r
        return None

    def missing(*ways: str) -> str:
        notes = [r["note"] for w in ways for r in results.get(w, []) if "note" in r]
        return "not measured" + (f": {notes[0]}" if notes else "")

    out = []
    b, c, a = pick("b", "cold"), pick("c", "cold"), pick("a", "cold")
    aw, cw = pick("a", "warm"), pick("c", "warm")
    out.append(("after layout, a 1 % slice reads <= 3 % of the dataset's bytes",
                f"{'met' if b['share'] <= 0.03 else 'NOT met'} ({b['share']:.2%}, {b['bytes_source']})" if b else missing("b")))
    out.append(("after layout, a 1 % slice is >= 20x faster than (c), cold",
                f"{'met' if c['wall_s'] / b['wall_s'] >= 20 else 'NOT met'} ({c['wall_s'] / b['wall_s']:.1f}x)" if b and c else missing("b", "c")))
    out.append(("unsorted: (a) within 10 % of (c), cold",
                f"{'met' if a['wall_s'] <= 1.10 * c['wall_s'] else 'NOT met'} ((a)/(c) = {a['wall_s'] / c['wall_s']:.2f})" if a and c else missing("a", "c")))
    out.append(("unsorted: (a) not slower than (c) once the selection is cached (warm)",
                f"{'met' if aw['wall_s'] <= cw['wall_s'] else 'NOT met'} ((a)/(c) = {aw['wall_s'] / cw['wall_s']:.2f})" if aw and cw else missing("a", "c")))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--rows", type=int, default=20_000_000, help="table rows (default 20M, about 2 GB)")
    size.add_argument("--tiny", action="store_true", help="200k rows in 4 files of 16k-row groups: a quick check")
    ap.add_argument("--files", type=int, default=None, help="default: one per 1M rows")
    ap.add_argument("--row-group-rows", type=int, default=None, help="default 65536 (16384 with --tiny)")
    ap.add_argument("--data", type=Path, default=Path(DEFAULT_ROOT), help=f"folder for the tables (default {DEFAULT_ROOT})")
    ap.add_argument("--ways", default="a,a0,b,c,d", help=f"comma-separated, of {','.join(WAYS)} (d: both Petastorm modes)")
    ap.add_argument("--slices", default=",".join(SLICES), help=f"comma-separated, of {','.join(SLICES)}")
    ap.add_argument("--warm", type=int, default=2, help="warm runs after each cold one (default 2)")
    ap.add_argument("--cold-runs", type=int, default=1,
                    help="cold runs per way (the median is shown; (a)/(b): without a cache, plus one filling it)")
    ap.add_argument("--workers", type=int, default=2, help="detload workers, pyarrow threads, petastorm workers")
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--petastorm-python", default=os.environ.get("PETASTORM_PY", str(HERE / ".venv-petastorm/bin/python")))
    ap.add_argument("--child-timeout", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, default=None, help="also write every run's numbers here")
    args = ap.parse_args(argv)
    rows = 200_000 if args.tiny else args.rows
    files = args.files or (4 if args.tiny else max(1, rows // 1_000_000))
    rg_rows = args.row_group_rows or (16_384 if args.tiny else 65_536)
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        ap.error(f"--ways: unknown {unknown}; choose from {list(WAYS)}")
    slices = [SLICES[s] for s in args.slices.split(",")] if args.slices else []
    if "d" in ways:
        ways = [w for w in ways if w != "d"] + ["d-filters", "d-predicate"]

    root = args.data.resolve()  # the children run in another folder
    src = root / f"src-r{rows}-f{files}-g{rg_rows}"
    dst = root / f"sorted-r{rows}-f{files}-g{rg_rows}-by-{'-'.join(LAYOUT_SORT_BY)}"
    root.mkdir(parents=True, exist_ok=True)
    gen = make_table(src, rows=rows, files=files, row_group_rows=rg_rows)
    meta = describe(src)
    print(f"## Slice reads ({dt.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python {platform.python_version()}, "
          f"pyarrow {pa.__version__}; load average {os.getloadavg()[0]:.1f} at the start)\n")
    print(f"table: {meta['rows']:,} rows x {pq.read_schema(data_files(src)[0]).__len__()} columns, {meta['files']} files, "
          f"{meta['row_groups']} row groups of {rg_rows:,} rows, {_mb(meta['bytes'])} MB of column chunks "
          f"({_mb(meta['file_bytes'])} MB of files) at {src}; "
          + ("reused" if gen["reused"] else f"generated in {gen['generate_s']:.1f} s"))
    lay: dict[str, Any] = {}
    dmeta = None
    if "b" in ways:
        lay = layout(src, dst)
        if "unavailable" in lay:
            print(f"layout: {lay['unavailable']}")
        else:
            dmeta = describe(dst)
            print(f"layout (sorted by {','.join(LAYOUT_SORT_BY)}): {dmeta['row_groups']} row groups, "
                  f"{_mb(dmeta['bytes'])} MB; " + ("reused" if lay["reused"] else f"written in {lay['layout_s']:.1f} s"))
    if any(w.startswith("d-") for w in ways) and not Path(args.petastorm_python).exists():
        print(f"petastorm: no interpreter at {args.petastorm_python}; run experiments/bench/make_petastorm_env.sh")
        ways = [w for w in ways if not w.startswith("d-")]
    print(f"workers/threads: {args.workers}; detload batch_size {args.batch_size:,}; each run a fresh process; "
          f"cold = files evicted with posix_fadvise(DONTNEED) ((a) and (b): once without a cache, then filling it), "
          f"warm = repeated at once from that cache ({args.warm} warm runs, median shown)")

    truth = pq.read_table(src, columns=sorted({c for s in slices for c in s.columns()}))
    report: dict[str, Any] = {"rows": rows, "files": files, "row_group_rows": rg_rows, "generation": gen,
                              "layout": lay, "dataset_bytes": meta["bytes"], "slices": {}}
    for sl in slices:
        expected = int(sl.mask({c: truth.column(c).to_numpy() for c in sl.columns()}).sum())
        results: dict[str, list[dict[str, Any]]] = {}
        for way in ways:
            data = dst if way == "b" else src
            if way == "b" and dmeta is None:
                results[way] = [{"way": "b", "run": "cold", "note": lay.get("unavailable", "no layout")}]
                continue
            wmeta = dmeta if way == "b" else meta
            assert wmeta is not None
            all_groups = (wmeta["row_groups"], wmeta["bytes"])
            model = predicted_groups(data, sl) if way in ("a", "b") else all_groups
            runs = measure(way, data, sl, args, root)
            results[way] = summarize(way, runs, expected, wmeta, model)
            for r in runs:
                if r.get("engine_filtered") is False and way == "d-filters":
                    results[way][0]["note_filters"] = (
                        f"filters= delivered {r['rows_delivered']:,} of {meta['rows']:,} rows: it did not filter by "
                        "these (non-partition) columns; the runner masks each chunk, as a user must")
        print_table(sl.name + " slice: " + sl.text, [r for w in ways for r in results[w]], meta, expected)
        notes = {r["note_filters"] for w in ways for r in results[w] if "note_filters" in r}
        for n in sorted(notes):
            print(f"\n(d) petastorm: {n}")
        report["slices"][sl.name] = {"expected_rows": expected, "results": results}
        if sl.name == "1%":
            report["targets"] = targets(results)
    if "targets" in report:
        print("\n### Targets (1 % slice)\n")
        for what, verdict in report["targets"]:
            print(f"- {what}: **{verdict}**")
    print("\nModel bytes: every column chunk of the row groups a reader reads; for (a)/(b) the row groups that "
          "detload's statistics pruning keeps, unless detload's stats() reports its own. read_bytes counts what "
          "the process (and its reaped children) made the kernel fetch from storage; rchar counts read() calls, "
          "including page-cache hits, and misses mmap'd reads.")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
