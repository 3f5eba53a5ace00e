"""The ``detload`` command line: a thin layer over the library (argparse, no hand-rolled parsing).

Commands: run, verify, inspect, plan, demo, cache (info, clear), bench. Exit codes: 0 success, 1 a
verification found a difference, 2 bad input or usage (one ``detload CMD: error: ...`` line),
130 interrupted (Ctrl-C), 143 terminated (SIGTERM).

Each command imports the library modules it uses inside its function, when it runs: `detload
--help`, a usage error or a Ctrl-C at start-up then never load NumPy or pyarrow (no import here
breaks a cycle: tests/test_import_graph.py checks the module graph).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from . import __version__
from ._check import check_int, check_writable_file, folder_problem
from ._layout import cli as _layout_cli
from ._signals import Terminated, hold_signals, interruptible
from .errors import DetloadError, ManifestError, OptionError, SchemaMismatchError

_MAP_HELP = ("cache entries kept memory-mapped between epochs (thread workers together, or each worker "
             "process), e.g. 8GB; 0 maps them anew each epoch (default: auto, a quarter of the memory)")
_LAST_EPOCH = 2**32 - 1
_SPILL_HELP = ("where a mixed-order window's fixed-width 1-D columns, 32 MiB or more, are spilled: a folder, 'on' (the system's "
               "temporary folder unless it is in memory) or 'off' (held in memory) (default: on)")


class CommandError(Exception):
    """A bad command-line input found by the command itself: one error line, exit 2."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" unless the help already says its default; flags are off by
    default and options without a value (None) say in words what happens without them."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "default" in text or d is None or d is False or d is argparse.SUPPRESS or d == []:
            return text
        return super()._get_help_string(action) or text


class _Sections:
    """A command's options in titled sections of its help (order, selection, workers, cache, run),
    made on first use in the order first asked for; `rare` keeps an option out of the short help
    (``--help``) while ``--help-all`` shows it, so the short help lists what most runs set."""

    TITLES = {
        "order": "what decides the batches (recorded in the manifest; change one and the batches change)",
        "select": "which rows and columns, and how they are typed (also decide the batches)",
        "dist": "distributed runs",
        "workers": "workers (never change the batches)",
        "cache": "row-group cache (never changes the batches)",
        "run": "the run and its output",
    }

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        self._made: dict[str, Any] = {}
        parser.add_argument("--help-all", action=_HelpAll)

    def __getitem__(self, key: str) -> Any:
        if key not in self._made:
            self._made[key] = self.parser.add_argument_group(self.TITLES[key])
        return self._made[key]


def rare(action: argparse.Action) -> argparse.Action:
    """Hide a rarely used option from the short help; ``--help-all`` shows it (with its text)."""
    action.full_help = action.help  # type: ignore[attr-defined]
    action.help = argparse.SUPPRESS
    return action


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every option, the rarely used ones too."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show every option, the rarely used ones too, and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        for action in parser._actions:
            full = getattr(action, "full_help", None)
            if full is not None:
                action.help = full
        parser.print_help()
        parser.exit()


def _positive(name: str) -> Any:
    def parse(s: str) -> int:
        try:
            n = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}") from None
        try:
            return check_int(name, n, 1)
        except OptionError as exc:  # argparse shows only this type's message
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _epoch_number(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}") from None
    if not 0 <= n <= _LAST_EPOCH:
        raise argparse.ArgumentTypeError(f"epochs are numbered 0 to {_LAST_EPOCH}, got {n}")
    return n


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


def _add_null_fill(p: Any) -> argparse.Action:
    return p.add_argument("--null-fill", type=_fill, action="append", default=[], metavar="COLUMN=VALUE",
                          help="replace nulls of COLUMN with VALUE (read as JSON when it parses, else text: "
                               "id=-1, score=0.5, name=, code='\"7\"'); repeat for more columns (default: none, "
                               "a null in an integer column is an error)")


def _columns(s: str) -> list[str]:
    return [c for c in s.split(",") if c]


def _add_quiet(p: Any) -> None:
    p.add_argument("--quiet", action="store_true",
                   help="no progress display (shown on stderr only when it is a terminal)")


def _cast(s: str) -> tuple[str, str]:
    """COLUMN=DTYPE, e.g. price=float64, amount=int64-scaled, ts=datetime64[ns]."""
    name, sep, dtype = s.partition("=")
    if not sep or not name or not dtype:
        raise argparse.ArgumentTypeError(f"expected COLUMN=DTYPE (e.g. price=float64), got {s!r}")
    return name, dtype


def _add_cast(p: Any) -> argparse.Action:
    return p.add_argument("--cast", type=_cast, action="append", default=[], metavar="COLUMN=DTYPE",
                          help="deliver COLUMN as DTYPE, checked value by value: float64 or float32 for a decimal, "
                               "int64-scaled for a decimal's unscaled integer, datetime64[ns|us|ms|s] for a "
                               "timestamp, a narrower integer or float type (int32, float32), a dtype with a shape "
                               "(float32[16]) for a list column as a dense (rows, 16) array; repeat for more "
                               "columns (default: none; see docs/types.md)")


def _add_order(g: Any) -> None:
    g.add_argument("--order", choices=["mix", "windowed"], default=None,
                   help="the batch order: mix (plan format 3: every batch draws from the whole partition) or "
                        "windowed (plan format 2, the default before: blocks of --shuffle-window row groups); "
                        "default: mix, or windowed with --group-by (the mixed order does not pack groups yet)")
    g.add_argument("--shuffle-window", type=int, default=None,
                   help="with --order windowed: row groups whose rows are mixed together (default: 4)")
    rare(g.add_argument("--mix-window", type=int, default=None,
                        help="with --order mix: row groups one task reads and mixes together "
                             "(default: 64, or more row groups averaging under 16,384 rows: about 2**20 rows)"))
    rare(g.add_argument("--block-rows", type=int, default=None,
                        help="with --order mix: rows per block at most (default: 4 x the median row group, "
                             "or a sixteenth of a task of more than 64 row groups)"))


def _order_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(order=a.order, shuffle_window=a.shuffle_window, mix_window=a.mix_window, block_rows=a.block_rows)


def _add_selection(g: Any) -> None:
    """Which rows and columns, and how they are typed: the same flags for run, plan and bench."""
    g.add_argument("--columns", type=_columns, metavar="A,B,...",
                   help="comma-separated columns (default: all, in schema order)")
    rare(_add_null_fill(g))
    rare(_add_cast(g))
    _add_filter(g)
    _add_group(g)


def _common_loader_args(p: argparse.ArgumentParser, s: _Sections, *, need_seed: bool = True) -> None:
    p.add_argument("source", help="a Parquet file, directory, glob or URI (s3://bucket/prefix)")
    s["order"].add_argument("--batch-size", type=int, required=True, help="rows per batch (per rank)")
    s["order"].add_argument("--seed", type=int, required=need_seed, help="the seed that fixes the order")
    _add_order(s["order"])
    s["order"].add_argument("--no-shuffle", action="store_true",
                            help="canonical order: files, then row groups, then rows")
    s["order"].add_argument("--drop-last", action="store_true",
                            help="drop the ragged tail (the last incomplete batch; with partitions, the rows past "
                                 "the shortest partition's last full micro-batch)")
    s["order"].add_argument("--partitions", type=int, default=None,
                            help="canonical partitions (default: the world size)")
    _add_selection(s["select"])
    s["dist"].add_argument("--rank", type=int, default=None,
                           help="this process's rank (default: from torch.distributed, else $RANK, else 0)")
    s["dist"].add_argument("--world-size", type=int, default=None,
                           help="ranks in the job (default: from torch.distributed, else $WORLD_SIZE, else 1)")


def _add_filter(p: Any) -> None:
    p.add_argument("--filter", default=None, metavar="FILTER",
                   help="deliver only the rows a filter keeps: a JSON DNF ('[[\"market\", \"==\", \"US\"]]') "
                        "or filter text ('market == \"US\" and day >= 20260101'); see docs/filters.md (default: none, every row)")


def _add_group(p: Any) -> None:
    p.add_argument("--group-by", default=None, metavar="KEY",
                   help="batches of whole groups of rows sharing KEY, each a detload.Packed; see docs/packing.md "
                        "(default: none, flat batches)")
    rare(p.add_argument("--group-columns", type=_columns, default=None, metavar="C1,C2",
                        help="with --group-by: the columns held once per group (default: the key alone)"))
    rare(p.add_argument("--max-group-items", type=int, default=None, metavar="N",
                        help="with --group-by: split groups longer than N items into chunks (default: never)"))


def _group_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    # Only when given, as the filter's: the Loader's keywords stay those of earlier runs.
    return {n: getattr(a, n) for n in ("group_by", "group_columns", "max_group_items") if getattr(a, n) is not None}


def _filter_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    # Only when given: the Loader's keywords stay those of earlier runs.
    return {"filter": a.filter} if a.filter is not None else {}


def _loader_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    return dict(
        batch_size=a.batch_size, seed=a.seed, columns=a.columns, shuffle=not a.no_shuffle,
        **_order_kwargs(a), drop_last=a.drop_last, partitions=a.partitions,
        null_fill=dict(a.null_fill), cast=dict(a.cast) or None,
        **_groups(rank=a.rank, world_size=a.world_size),
    )


def _groups(*, pool: str | None = None, prefetch: int | None = None, cache_dir: str | None = None,
            cache_limit: str | None = None, cache_map_limit: str | None = None, rank: int | None = None,
            world_size: int | None = None, spill: str | None = None) -> dict[str, Any]:
    """The Loader's option groups (`Pool`, `Cache`, `Distributed`) from the flags given; a bad
    value's message names its flag ("--cache-limit needs --cache-dir"). Flags left out leave
    their group to the Loader's default."""
    # Imported here for start-up time (they import NumPy): `detload --help` does not need them.
    from .loader import _distributed_defaults
    from .options import (
        MAX_PREFETCH,
        Cache,
        Distributed,
        Pool,
        _check_cache,
        _check_distributed,
        _check_sizes,
        _is_auto,
        check_spill,
    )

    out: dict[str, Any] = {}
    if pool is not None or prefetch is not None or spill is not None:
        more: dict[str, Any] = {} if prefetch is None else {
            "prefetch": check_int("--prefetch", prefetch, 1, MAX_PREFETCH, what="blocks queued per worker")}
        if spill is not None:
            more["spill"] = {"on": True, "off": False}[spill] if spill in ("on", "off") else check_spill("--spill", spill)
        out["pool"] = Pool(kind=pool or "thread", **more)  # type: ignore[arg-type]  # argparse's choices
    map_limit = "auto" if cache_map_limit is None else cache_map_limit
    if cache_dir is not None or cache_limit is not None or not _is_auto(map_limit):  # --cache-map-limit: auto
        names = {"dir": "--cache-dir", "limit": "--cache-limit", "map_limit": "--cache-map-limit"}
        _check_sizes(cache_limit, map_limit, names)  # a bad size first, even without --cache-dir
        if cache_dir is None:
            raise OptionError(f"{'--cache-limit' if cache_limit is not None else '--cache-map-limit'} "
                              "needs --cache-dir")
        out["cache"] = Cache(*_check_cache(cache_dir, cache_limit, map_limit, names))
    if rank is not None or world_size is not None:
        r, w = _distributed_defaults(rank, world_size)
        # A flag's name where the flag gave the value; else it came from torch.distributed or $RANK/$WORLD_SIZE.
        shown = {"rank": "--rank" if rank is not None else "rank",
                 "world_size": "--world-size" if world_size is not None else "world_size"}
        out["distributed"] = Distributed(*_check_distributed(r, w, shown))
    return out


def _workers(s: str) -> int | str:
    if s == "auto":
        return s
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a worker count or 'auto', got {s!r}") from None


def _parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    ap = argparse.ArgumentParser(prog="detload", description="Deterministic, audited Parquet loading for ML training.",
                                 formatter_class=fmt)
    ap.add_argument("--version", action="version", version=f"detload {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="iterate a dataset and write the manifest of every batch", formatter_class=fmt,
                       description="Iterate SOURCE for --epochs epochs as a training job would, writing the manifest. "
                                   "--help-all also shows the rarely used options.")
    s = _Sections(p)
    _common_loader_args(p, s)
    s["workers"].add_argument("--workers", type=_workers, default=1,
                              help="worker count or 'auto' (one per core, at most 16)")
    s["workers"].add_argument("--pool", choices=["thread", "process"], default="thread", help="what the workers are")
    rare(s["workers"].add_argument("--prefetch", type=int, default=2, help="blocks queued per worker"))
    rare(s["workers"].add_argument("--spill", default=None, help=_SPILL_HELP))
    s["cache"].add_argument("--cache-dir", default=None,
                            help="row-group cache directory (local SSD); see docs/remote.md (default: no cache)")
    rare(s["cache"].add_argument("--cache-limit", default=None,
                                 help="cache size limit, e.g. 50GB (default: no limit)"))
    rare(s["cache"].add_argument("--cache-map-limit", default="auto", help=_MAP_HELP))
    s["run"].add_argument("--manifest", required=True,
                          help="manifest file, or a directory for rank-NNNNN.jsonl files (outside the dataset folder)")
    s["run"].add_argument("--epochs", type=_positive("--epochs"), default=1,
                          help="epochs to run, from --start-epoch on (at least 1)")
    rare(s["run"].add_argument("--start-epoch", type=_epoch_number, default=0, help="the first epoch's number"))
    s["run"].add_argument("--save-state", action="store_true",
                          help="after every batch, write the resume state beside the manifest (m.jsonl -> "
                               "m.state.json, rank-00000.jsonl -> rank-00000.state.json)")
    s["run"].add_argument("--resume", metavar="FROM",
                          help="continue an interrupted run: FROM is a state file, or the manifest / run directory "
                               "of a run made with --save-state (a directory resumes at the step every rank "
                               "reached). Give the same --start-epoch/--epochs as the first run; at another world "
                               "size keep --partitions and the global batch, and write --manifest to a new "
                               "directory (default: start afresh)")
    _add_quiet(s["run"])

    p = sub.add_parser("verify", help="compare two manifests or run directories step by step", formatter_class=fmt,
                       description="Exit 0 when identical, 1 at the first difference or truncation, "
                                   "2 on unreadable input.")
    p.add_argument("a", metavar="A", help="a manifest file or run directory")
    p.add_argument("b", metavar="B", help="the manifest file or run directory to compare A with")
    p.add_argument("b_continued", nargs="*", default=[], metavar="B_RESUMED",
                   help="optional: where B's resumed continuations wrote (run directories or manifests, in "
                        "order); each replaces B from its first recorded step on")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("inspect", help="files, row groups, rows, schema and fingerprint of a dataset",
                       formatter_class=fmt,
                       description="Print a dataset's files, row groups, rows, fingerprint and each column's "
                                   "Arrow type with the NumPy form it is delivered in; list skipped files.")
    p.add_argument("source", help="a Parquet file, directory, glob or URI")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    _add_cast(p)

    p = sub.add_parser("plan", help="print an epoch's plan: units, blocks and per-worker schedules",
                       formatter_class=fmt,
                       description="Plan an epoch as a run would (same fingerprint) without starting a worker. "
                                   "--help-all also shows the rarely used options.")
    s = _Sections(p)
    _common_loader_args(p, s)
    s["run"].add_argument("--epoch", type=_epoch_number, default=0, help="the epoch to plan")
    s["workers"].add_argument("--workers", type=_workers, default=1, help="worker count or 'auto', for the schedules")
    s["workers"].add_argument("--pool", choices=["thread", "process"], default="thread",
                              help="what the workers are, for the schedules: under the mixed order it decides "
                                   "whether they share task windows")
    s["cache"].add_argument("--cache-dir", default=None,
                            help="the run's row-group cache, for the schedules: with a cache of no --cache-limit "
                                 "the workers share every task window (the folder is not opened nor made) "
                                 "(default: no cache)")
    rare(s["cache"].add_argument("--cache-limit", default=None,
                                 help="the run's cache size limit, e.g. 50GB (default: no limit)"))
    s["run"].add_argument("--json", action="store_true", help="print the plan as JSON")
    s["run"].add_argument("--mixing", action="store_true",
                          help="also measure how well the epoch's batches mix, beside an i.i.d. shuffle of the "
                               "same rows (Loader.plan_stats)")
    s["run"].add_argument("--mix-column", metavar="NAME",
                          help="with --mixing (implied): also measure this column's mix per batch, e.g. a day "
                               "(only it is read) (default: none)")

    p = sub.add_parser("cache", help="look at or empty a row-group cache directory", formatter_class=fmt,
                       description="Look at (info) or empty (clear) a row-group cache directory.")
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    c = csub.add_parser("info", help="entries, bytes and objects in a cache directory", formatter_class=fmt,
                        description="Count a cache directory's entries, bytes and objects; --verify also "
                                    "checks every entry's checksum (exit 1 when one is damaged).")
    c.add_argument("dir", help="the cache directory (the Cache.dir of the loaders)")
    c.add_argument("--verify", action="store_true", help="check every entry's checksum")
    c.add_argument("--json", action="store_true", help="print it as JSON")
    _add_quiet(c)
    c = csub.add_parser("clear", help="delete every entry of a cache directory", formatter_class=fmt,
                        description="Delete every entry of a cache directory (safe while no loader writes to it).")
    c.add_argument("dir", help="the cache directory (the Cache.dir of the loaders)")

    p = sub.add_parser("demo", help="generate an example dataset, load it at 1 and 4 process workers, verify",
                       formatter_class=fmt,
                       description="Write an example dataset, load it for 2 epochs with 1 and with 4 process "
                                   "workers, and verify that both runs saw byte-identical batches.")
    p.add_argument("--dir", default="detload-demo", help="where the dataset and manifests go")
    p.add_argument("--rows", type=_positive("--rows"), default=200_000, help="rows of the example dataset")

    p = sub.add_parser("bench", help="measure throughput per stage and name the stage that bounds it",
                       formatter_class=fmt,
                       description="Iterate SOURCE as fast as possible (no training step), print rows/s per "
                                   "epoch and the per-stage table naming the bounding stage; optionally write "
                                   "a Chrome trace-event file (open it in https://ui.perfetto.dev or chrome://tracing). "
                                   "--help-all also shows the rarely used options.")
    s = _Sections(p)
    p.add_argument("source", help="a Parquet file, directory, glob or URI")
    s["order"].add_argument("--batch-size", type=int, default=4096, help="rows per batch")
    _add_order(s["order"])
    s["order"].add_argument("--seed", type=int, default=0, help="the seed that fixes the order")
    _add_selection(s["select"])
    s["workers"].add_argument("--workers", type=_workers, default="auto",
                              help="worker count or 'auto' (one per core, at most 16)")
    s["workers"].add_argument("--pool", choices=["thread", "process"], default="thread", help="what the workers are")
    rare(s["workers"].add_argument("--prefetch", type=int, default=2, help="blocks queued per worker"))
    rare(s["workers"].add_argument("--spill", default=None, help=_SPILL_HELP))
    s["cache"].add_argument("--cache-dir", default=None,
                            help="row-group cache folder: epoch 0 fills it, later epochs show warm-cache throughput "
                                 "(default: no cache)")
    rare(s["cache"].add_argument("--cache-limit", default=None,
                                 help="cache size limit, e.g. 50GB (default: no limit)"))
    rare(s["cache"].add_argument("--cache-map-limit", default="auto", help=_MAP_HELP))
    s["run"].add_argument("--epochs", type=_positive("--epochs"), default=2, help="epochs; workers persist across them")
    s["run"].add_argument("--trace", metavar="PATH",
                          help="write the Chrome trace-event JSON here; checked for writing before the run "
                               "(default: no trace file)")
    s["run"].add_argument("--json", action="store_true", help="print the stats as JSON")
    _add_quiet(s["run"])
    _layout_cli.add_parsers(sub, fmt)  # digest, layout, check-layout
    return ap


# -- progress display --------------------------------------------------------------

def progress_wanted(a: argparse.Namespace, stream: Any = None) -> bool:
    """Show a progress display: only on a terminal, and never with --quiet or --json."""
    if getattr(a, "quiet", False) or getattr(a, "json", False):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(a: argparse.Namespace, *, total: int | None, desc: str, unit: str, scale: bool = False) -> Any:
    """A tqdm bar on stderr, or a stand-in doing nothing (see progress_wanted)."""
    if not progress_wanted(a):
        return _NoBar()
    from tqdm import tqdm

    # leave=False: the bar is erased when it closes, and the epoch's line takes its place.
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, file=sys.stderr, leave=False,
                dynamic_ncols=True, mininterval=0.2)


def _epochs(loader: Any, a: argparse.Namespace, epochs: range, per_batch: Any = None) -> Iterator[tuple[int, int, int, float]]:
    """Run ``epochs`` of ``loader``: yields (epoch, batches, rows, seconds) after each one."""
    for epoch in epochs:
        loader.set_epoch(epoch)
        bar = _bar(a, total=len(loader) - loader.position, desc=f"epoch {epoch}", unit="batch")
        t = time.perf_counter()
        rows = batches = 0
        try:
            for batch in loader:
                n_items = getattr(batch, "n_items", None)  # a detload.Packed (--group-by)
                rows += n_items if n_items is not None else (len(next(iter(batch.values()))) if batch else 0)
                batches += 1
                bar.update()
                if per_batch is not None:
                    per_batch()
        finally:
            bar.close()
        yield epoch, batches, rows, time.perf_counter() - t


def _preload(a: argparse.Namespace) -> None:
    """Import now what an `interruptible` part would import on first use (see there)."""
    import multiprocessing.forkserver  # noqa: F401
    import multiprocessing.synchronize  # noqa: F401

    if progress_wanted(a):
        import tqdm  # noqa: F401


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds if seconds > 0 else float('inf'):,.0f}"


# -- commands ------------------------------------------------------------------------

def _cmd_run(a: argparse.Namespace) -> int:
    from .loader import Loader

    last = a.start_epoch + a.epochs - 1
    if last > _LAST_EPOCH:  # found now, not after a whole epoch
        raise CommandError(f"--start-epoch {a.start_epoch} --epochs {a.epochs} would run epochs up to {last}; "
                           f"epochs are numbered 0 to {_LAST_EPOCH}")
    _preload(a)
    t0 = time.perf_counter()
    kwargs = {**_loader_kwargs(a), **_groups(pool=a.pool, prefetch=a.prefetch, cache_dir=a.cache_dir,
                                            cache_limit=a.cache_limit, cache_map_limit=a.cache_map_limit,
                                            spill=a.spill)}
    kwargs.update(_filter_kwargs(a))
    kwargs.update(_group_kwargs(a))
    with interruptible(), Loader(a.source, workers=a.workers, manifest=a.manifest, **kwargs) as loader:
        _check_outside_dataset(loader, a.source, "--manifest", loader.manifest_path)
        _check_outside_dataset(loader, a.source, "--cache-dir", a.cache_dir)
        print(f"{loader!r}")
        first = a.start_epoch
        if a.resume:
            state = read_resume_state(a.resume)
            loader.load_state_dict(state)
            first = state["epoch"]
            print(f"resuming at epoch {state['epoch']} step {state['step']} (from {a.resume})")
        state_path = state_file(loader.manifest_path) if a.save_state and loader.manifest_path else None
        save = None
        if state_path is not None:
            _sweep_state_temps(state_path)

            def save() -> None:
                _write_json_atomic(state_path, loader.state_dict())

        for epoch, batches, rows, dt in _epochs(loader, a, range(first, a.start_epoch + a.epochs), save):
            if save is not None:  # an epoch without batches to go still records its end
                save()
            plan = loader.plan()
            print(f"epoch {epoch}: {batches:,} batches, {rows:,} rows, {plan.dropped_rows:,} dropped, "
                  f"{_rate(rows, dt)} rows/s", flush=True)
        print(f"manifest: {loader.manifest_path}  ({time.perf_counter() - t0:.2f} s)")
    return 0


def _check_outside_dataset(loader: Any, source: str, option: str, path: str | None) -> None:
    """Refuse to write into the dataset folder: the file would become part of what is listed next time."""
    ds = loader.dataset
    if path is None or ds.filesystem.type_name != "local" or os.path.isfile(source):
        return  # a single-file source: its folder is not the dataset
    root = os.path.realpath(ds.root)
    where = os.path.realpath(path)
    if where == root or where.startswith(root.rstrip(os.sep) + os.sep):
        raise CommandError(f"{option} {path} is inside the dataset folder {ds.root}; write it elsewhere")


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
    from ._procs import pid_alive

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
    from .stats import size_text

    if a.trace:
        check_writable_file("--trace", a.trace)  # before the run, not after it
    _preload(a)
    t0 = time.perf_counter()
    with interruptible(), Loader(a.source, batch_size=a.batch_size, seed=a.seed, workers=a.workers,
                                 **_order_kwargs(a), columns=a.columns, null_fill=dict(a.null_fill),
                                 cast=dict(a.cast) or None, **_filter_kwargs(a), **_group_kwargs(a),
                                 **_groups(pool=a.pool, prefetch=a.prefetch, cache_dir=a.cache_dir,
                                           cache_limit=a.cache_limit, cache_map_limit=a.cache_map_limit,
                                           spill=a.spill)) as loader:
        _check_outside_dataset(loader, a.source, "--trace", a.trace)
        _check_outside_dataset(loader, a.source, "--cache-dir", a.cache_dir)
        if a.trace:
            loader._tracer.keep_events(1_000_000)  # the whole benchmark in the trace file
        if loader.filter is not None:
            print(f"filter {loader.filter.canonical_json}: {_filter_line(loader.filter_stats or {})}", flush=True)
        for epoch, _batches, rows, dt in _epochs(loader, a, range(a.epochs)):
            what = " (includes worker start-up)" if epoch == 0 else ""
            done = next((e for e in loader.stats().reads.epochs if e.epoch == epoch), None)
            if done is not None:
                what += (f"; read {done.row_groups_read:,} row group(s) from the source "
                         f"({size_text(done.bytes_read)} of column chunks)")
            if a.cache_dir:
                what += f", {done.row_groups_cached if done else 0:,} of its row groups from the cache"
            if (epoch and rows and loader.options.order == "mix" and done is not None
                    and not done.row_groups_read and not done.row_groups_cached):
                what += " (the mixed order's window, kept from the epoch before)"
            print(f"epoch {epoch}: {rows:,} rows in {dt:.2f} s, {_rate(rows, dt)} rows/s{what}", flush=True)
        st = loader.stats()
        if a.json:
            print(json.dumps(st.as_dict(), indent=2, default=str))
        else:
            print(st.table())
        if a.trace:
            try:
                st.write_trace(a.trace)
            except OSError as exc:
                raise OptionError(f"cannot write --trace {a.trace}: {exc.strerror or exc}") from None
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
            print(f"detload verify: error: {exc}", file=sys.stderr)
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
    import pyarrow as pa

    from ._discovery import describe_skipped, discover, skipped_why
    from ._storage import display_uri
    from ._types import SCALED, allowed_casts, normalize_cast
    from .loader import _check_source

    _check_source(a.source)
    # Shows the form a cast column is delivered in ("float32[16]": a dense (rows, 16) array).
    cast = {name: normalize_cast(name, dtype) for name, dtype in a.cast}
    ds = discover(a.source)
    names = [*ds.schema.names, *ds.later_columns()]
    unknown = sorted(set(cast) - set(names))
    if unknown:
        raise OptionError(f"cast names {unknown}, which are not columns stored in the files {names}")
    info: dict[str, Any] = {
        "root": display_uri(ds.filesystem, ds.root),  # s3://bucket/prefix, as the source is written
        "fingerprint": ds.fingerprint,
        "files": [{"path": f.path, "size": f.size, "row_groups": list(f.row_groups), "rows": sum(f.row_groups)}
                  for f in ds.files],
        "rows": ds.rows,
        "row_groups": sum(len(f.row_groups) for f in ds.files),
        "schema": [{"name": fld.name, "arrow": str(fld.type)} for fld in ds.schema],
        "partitions": [{"key": k, "type": t} for k, t in ds.partition_types],
        "skipped": list(ds.skipped),
    }
    delivered = {}
    drift = {}
    stored = [*ds.schema, *(pa.field(n, ds.column_type(n)) for n in ds.later_columns())]
    for fld in stored:
        d = ds.drift(fld.name)
        if d is not None:
            drift[fld.name] = d
        try:
            delivered[fld.name] = ds.specs([fld.name], {fld.name: cast[fld.name]} if fld.name in cast
                                           else None, filled=[fld.name])[0].describe()
        except SchemaMismatchError as exc:
            delivered[fld.name] = f"files disagree ({exc})"
        except DetloadError as exc:
            if fld.name in cast:
                raise  # the cast asked for does not apply: say so, as run and plan do
            casts = allowed_casts(fld.type)
            if casts:  # a decimal: delivered when a cast says how
                scale = f"; scale {fld.type.scale}" if SCALED in casts else ""
                delivered[fld.name] = f"only with cast= ({', '.join(casts)}{scale})"
            else:
                delivered[fld.name] = f"unsupported: {exc}".split(".")[0]
    for k, _ in ds.partition_types:
        delivered[k] = ds.specs([k])[0].describe() + " (Hive partition)"
    info["numpy"] = delivered
    # Per drifted column: the types seen (files each), the files that lack it, and the type
    # every file is read as (None: refused).
    info["drift"] = [{"name": name, "types": [{"arrow": str(t), "files": n, "first": p} for t, n, p in d.types],
                      "missing_files": len(d.missing),
                      "promoted": str(d.promoted) if d.promoted is not None else None}
                     for name, d in drift.items()]
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"dataset {info['root']}")
    print(f"  fingerprint {ds.fingerprint}")
    print(f"  {len(ds.files):,} files, {info['row_groups']:,} row groups, {ds.rows:,} rows")
    for f in ds.files:
        rg = list(f.row_groups)
        shown = ", ".join(f"{n:,}" for n in rg[:8]) + (", ..." if len(rg) > 8 else "")
        print(f"  {f.path}  {f.size:,} B  {sum(rg):,} rows in {len(rg)} row groups [{shown}]")
    if ds.skipped:
        print(f"  {describe_skipped(ds.skipped)} ({skipped_why(ds.skipped)}):")
        for rel in ds.skipped:
            print(f"    {rel}")
    print("  columns:")
    for fld in stored:
        print(f"    {fld.name}: {fld.type} -> {delivered[fld.name]}")
    for k, t in ds.partition_types:
        print(f"    {k}: {t} -> {delivered[k]}")
    if drift:
        print("  schema drift (files with rows that disagree on a column; docs/types.md, \"Schema drift\"):")
        for name, d in drift.items():
            fill = " (load it with null_fill)" if d.missing and d.promoted is not None else ""
            print(f"    {name}: {d.describe()}{fill}")
    return 0


def _cmd_plan(a: argparse.Namespace) -> int:
    import warnings

    from ._discovery import SkippedFilesWarning
    from .loader import Loader
    from .plan import MixPlan

    # A Loader plans exactly as a run would (same fingerprint); it starts no worker. The cache
    # flags are checked as run's are but not given to it: they only decide the schedules, and
    # opening the cache would make its folder.
    groups = _groups(pool=a.pool, cache_dir=a.cache_dir, cache_limit=a.cache_limit)
    cache = groups.pop("cache", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedFilesWarning)  # `detload inspect` lists them
        loader = Loader(a.source, **_loader_kwargs(a), **_filter_kwargs(a), **_group_kwargs(a),
                        workers=a.workers, **groups)
    ds = loader.dataset
    opts = loader.options
    files, rgs, _rows = ds.units()
    plan = loader.plan(a.epoch)
    # The schedules the engine would use: whether workers share windows follows the pool and
    # the cache too. A cache folder that cannot be made or written makes a run load without
    # one (with a warning): the plan shows that run's schedules, and says why.
    cached = cache is not None and cache.limit is None
    problem = folder_problem(os.path.expanduser(a.cache_dir)) if cache is not None else None
    if problem is not None:
        warnings.warn(f"--cache-dir {a.cache_dir!r} cannot be used ({problem}); a run would load "
                      "without a cache, and these are its schedules", stacklevel=1)
        cached = False
    shared = loader._shares_windows(loader.pool_kind, cached=cached)
    d: dict[str, Any] = (plan.to_dict(loader.workers, shared=shared)
                         if isinstance(plan, MixPlan) else plan.to_dict(loader.workers))
    names = [f"{ds.files[f].path}#{g}" for f, g in zip(files, rgs)]
    d["unit_names"] = names
    if loader.filter is not None:
        d["filter"] = {"canonical": json.loads(loader.filter.canonical_json), "planning": loader.filter_stats}
    if loader.group_stats is not None:
        d["groups"] = {"group_by": loader.group_by, "group_columns": list(loader.group_columns),
                       **loader.group_stats}
    if a.mixing or a.mix_column is not None:
        d["mixing"] = loader.plan_stats(a.epoch, a.mix_column)
    if a.json:
        print(json.dumps(d, indent=2))
        return 0
    print(f"plan {plan.fingerprint} (format {d['plan_format']}) epoch {plan.epoch} rank {plan.rank}")
    print(f"  {d['units']:,} units, {d['rows']:,} rows -> {plan.steps:,} steps of {opts.batch_size:,} rows, "
          f"{plan.dropped_rows:,} dropped; partitions {opts.partitions}, rows per partition "
          f"[{', '.join(f'{n:,}' for n in plan.partition_rows)}]")
    print(f"  redundant reads: {plan.redundant_reads} (row groups that a partition boundary cuts, "
          "read by both partitions)")
    print("  unit order: " + " ".join(str(u) for u in plan.unit_order[:32]) + (" ..." if d["units"] > 32 else ""))
    if loader.filter is not None:
        _print_filter_plan(loader.filter.canonical_json, loader.filter_stats or {})
    if loader.group_stats is not None and plan.step_starts is not None:
        gs = loader.group_stats
        print(f"  groups by {d['groups']['group_by']!r} (group columns {', '.join(d['groups']['group_columns'])}): "
              f"{gs['groups']:,} groups in {gs['chunks']:,} chunks, the largest {gs['largest']:,} items; "
              f"micro-batches per partition [{', '.join(f'{len(s) - 1:,}' for s in plan.step_starts)}]")
    if "mixing" in d:
        from .planning.mixing import report_lines

        print("\n".join(f"  {line}" for line in report_lines(d["mixing"])))

    def show(rng: list[int]) -> str:
        f, g, first, rows = rng
        whole = first == 0 and rows == ds.files[f].row_groups[g]
        return f"{ds.files[f].path}#{g}" + ("" if whole else f"[{first:,}:{first + rows:,}]")

    def show_unit(ranges: list[list[int]]) -> str:
        # A unit a group joined holds many whole row groups of one file: shown as a span, path#a-b.
        out: list[list[int]] = []  # [file, first row group, last row group] of whole row groups
        parts: list[str] = []
        for r in ranges:
            f, g, first, rows = r
            if first == 0 and rows == ds.files[f].row_groups[g] and out and out[-1][0] == f and out[-1][2] == g - 1:
                out[-1][2] = g
                parts[-1] = f"{ds.files[f].path}#{out[-1][1]}-{g}"
                continue
            out.append([f, g, g] if first == 0 and rows == ds.files[f].row_groups[g] else [f, g, -2])
            parts.append(show(r))
        return "+".join(parts)

    if "tasks" in d:  # the mixed order: tasks of pieces, each cut into blocks
        for tk in d["tasks"]:
            pieces = ", ".join(show_unit(u["ranges"]) for u in tk["units"])
            sizes = [b - a for a, b in zip(tk["block_bounds"], tk["block_bounds"][1:])]
            who = f" worker {tk['worker']:<3}" if "worker" in tk else ""
            print(f"  task partition {tk['partition']} #{tk['number']:<3}{who} rows {tk['rows']:<8,} "
                  f"blocks {len(sizes)} of {min(sizes):,}-{max(sizes):,} rows, steps {tk['steps'][0]}-"
                  f"{tk['steps'][1]}  [{pieces}]")
        return 0
    for blk in d["blocks"]:
        units = ", ".join(show_unit(u["ranges"]) for u in blk["units"])
        print(f"  block k={blk['k']:<4} partition {blk['partition']} #{blk['number']:<3} worker {blk['worker']:<3} "
              f"rows {blk['rows']:<7,} steps {blk['steps'][0]}-{blk['steps'][1]}  [{units}]")
    for w, sched in enumerate(plan.worker_schedules(loader.workers)):
        print(f"  worker {w}: blocks " + " ".join(f"p{b.partition}#{b.number}" for b in sched))
    return 0


# Why a row group was or was not read, in `FilterStats.examples`' verdicts, in the order shown.
_VERDICTS = (
    ("partition", "pruned by Hive partition values (not read)"),
    ("statistics", "pruned by row-group statistics, min/max and null counts (not read)"),
    ("bloom", "pruned by bloom filters (not read)"),
    ("all_rows", "every row matches, by statistics (read whole, no selection pass)"),
    ("selection_pass", "selection pass: the filter's columns read at planning, matching rows kept"),
    ("selection_cached", "selection pass answered by the cache (nothing read)"),
    ("selected_empty", "of those, no row matched (not read by the workers)"),
)


def _filter_line(fs: dict[str, Any]) -> str:
    from .stats import size_text

    pruned = fs.get("pruned", {})
    return (f"{fs.get('rows_selected', 0):,} of {fs.get('rows_total', 0):,} rows selected; of "
            f"{fs.get('row_groups', 0):,} row groups, {fs.get('row_groups_skipped', 0):,} skipped (partition "
            f"{pruned.get('partition', 0):,}, statistics {pruned.get('statistics', 0):,}, bloom "
            f"{pruned.get('bloom', 0):,}, no matching row {fs.get('selected_empty', 0):,}); selection pass "
            f"{fs.get('selection_pass', 0):,} row group(s), {size_text(fs.get('bytes_read', 0))}, "
            f"{fs.get('selection_cached', 0):,} from the cache; planning {fs.get('seconds', 0.0):.2f} s")


def _print_filter_plan(canonical: str, fs: dict[str, Any]) -> None:
    print(f"  filter {canonical}")
    print(f"    {_filter_line(fs)}")
    counts = {**fs.get("pruned", {}), **{k: fs.get(k, 0) for k in
                                         ("all_rows", "selection_pass", "selection_cached", "selected_empty")}}
    examples = fs.get("examples", {})
    for key, why in _VERDICTS:
        n = counts.get(key, 0)
        if not n:
            continue
        shown = ", ".join(f"{p}#{g}" + ("" if key in ("partition", "statistics", "bloom", "all_rows",
                                                        "selected_empty") else f" ({sel:,} of {rows:,} rows)")
                          for p, g, rows, sel in examples.get(key, []))
        more = " ..." if n > len(examples.get(key, [])) else ""
        print(f"    {n:>7,} {why}: {shown}{more}")


def _cmd_cache(a: argparse.Namespace) -> int:
    from ._cache import cache_info, clear_cache

    try:
        if a.cache_command == "clear":
            freed = clear_cache(a.dir)
            print(f"cleared {a.dir}: freed {freed:,} bytes")
            return 0
        bar = _bar(a, total=None, desc="verifying" if a.verify else "counting", unit="B", scale=True)
        try:
            info = cache_info(a.dir, verify=a.verify, progress=bar.update)
        finally:
            bar.close()
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and not os.path.exists(a.dir):
            raise
        raise CommandError(f"{a.dir} is not a usable cache directory: {exc}") from None
    # Damage found by --verify exits 1, so a script can act on it (a loader would
    # discard and refetch those entries anyway).
    status = 1 if a.verify and info["corrupt"] else 0
    if a.json:
        print(json.dumps(info, indent=2))
        return status
    print(f"cache {info['dir']} (format v{info['format']}; formats present: {', '.join(info['formats_present'])})")
    print(f"  {info['entries']:,} entries of {info['objects']:,} files, {info['bytes']:,} bytes"
          f" (usage counter {info['usage_counter']:,}), {info['temp_files']:,} temp files")
    if a.verify:
        bad = info["corrupt"]
        print(f"  checksums: {'all good' if not bad else f'{len(bad):,} damaged'}")
        for path in bad:
            print(f"    damaged: {path}")
    return status


def _cmd_demo(a: argparse.Namespace) -> int:
    from ._demo import write_demo_dataset
    from .loader import Loader
    from .verify import verify

    _check_writable_dir("--dir", a.dir)
    data = os.path.join(a.dir, "data")
    print(f"1. writing an example dataset ({a.rows:,} rows, 6 files with odd row-group sizes, one empty) to {data}")
    write_demo_dataset(data, rows=a.rows)
    manifests = []
    for workers in (1, 4):
        path = os.path.join(a.dir, f"manifest-w{workers}.jsonl")
        t = time.perf_counter()
        rows = 0
        with interruptible(), Loader(data, batch_size=4096, seed=42, workers=workers, pool="process",
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


def _check_writable_dir(option: str, path: str) -> None:
    """A folder that exists and is writable, or can be created: refused now, with its reason."""
    full = os.path.abspath(path)
    probe = full
    while not os.path.exists(probe):
        up = os.path.dirname(probe)
        if up == probe:
            break
        probe = up
    if not os.path.isdir(probe):
        what = "is a file" if probe == full else f"is under {probe}, which is a file"
        raise CommandError(f"{option} {path} {what}, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise CommandError(f"{option} {path}: {probe} is not writable (permissions, or a read-only file system)")


_COMMANDS = {"run": _cmd_run, "verify": _cmd_verify, "inspect": _cmd_inspect, "plan": _cmd_plan, "demo": _cmd_demo,
             "cache": _cmd_cache, "bench": _cmd_bench, **_layout_cli.COMMANDS}


def main(argv: Sequence[str] | None = None, *, _process: bool = False) -> int:
    """Run one command; returns its exit status (argparse exits 2 itself on a bad command line).

    A Ctrl-C or SIGTERM inside a command's `interruptible` part ends it with one line on
    stderr, ``interrupted`` (exit 130) or ``terminated`` (143), after its loaders closed.
    ``_process`` (the console script): argparse's exits become the returned status too,
    and the signals stay ignored from the return on, through the process's exit.
    """
    try:
        code = _run_command(argv)
    except Terminated:
        hold_signals()
        print("terminated", file=sys.stderr)
        code = 143
    except KeyboardInterrupt:
        hold_signals()
        print("interrupted", file=sys.stderr)
        code = 130
    except SystemExit as exc:  # argparse: a usage error, --help or --version
        if not _process:
            raise
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    if _process:
        hold_signals()
    return code


def _run_command(argv: Sequence[str] | None) -> int:
    import warnings

    a = _parser().parse_args(argv)

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        # One line, like the errors: the command's name, not the library's source line.
        print(f"detload {a.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            return _COMMANDS[a.command](a)
    except BrokenPipeError:  # output piped into `head` and closed early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (DetloadError, CommandError, OSError, ValueError) as exc:
        print(f"detload {a.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """The message on one line (a worker's traceback, when carried, stays out of it)."""
    text = str(exc).split("\n\nWorker traceback:")[0]
    return " ".join(text.split("\n")) if text else type(exc).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
