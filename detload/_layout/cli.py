"""The `digest`, `layout` and `check-layout` commands: argparse definitions and thin calls into the library.

`detload.cli` registers them with ``add_parsers`` and dispatches through ``COMMANDS``. Exit codes
follow the CLI's: 0 success, 1 a check found a difference (digests differ, not sorted), 2 bad input.
As in detload/cli.py, each command imports the library when it runs, for start-up time.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

from .._signals import Terminated, interruptible


def _names(s: str) -> list[str]:
    return [c for c in s.split(",") if c]


def add_parsers(sub: Any, formatter_class: Any = argparse.HelpFormatter) -> None:
    """Add the three commands to the subparsers action of ``detload``'s parser."""
    p = sub.add_parser("digest", formatter_class=formatter_class,
                       help="order-independent content digest of a dataset (rows and 128 bits)",
                       description="Print the row count and the 128-bit content digest of SOURCE: equal for any "
                                   "order of its rows, row groups and files; different when a row is changed, "
                                   "lost or duplicated (definition: docs/layout.md).")
    p.add_argument("source", help="a Parquet file, directory, glob or URI")
    p.add_argument("--columns", type=_names, default=None, metavar="A,B",
                   help="digest only these columns (default: all, Hive partition columns included)")
    p.add_argument("--threads", type=int, default=None, help="threads reading and hashing (default: one per CPU)")
    p.add_argument("--json", action="store_true", help="print the digest as JSON")

    p = sub.add_parser("layout", formatter_class=formatter_class,
                       help="rewrite a dataset sorted by keys, so slices read few row groups",
                       description="Rewrite SRC into the new folder DST sorted by --sort-by (and grouped by "
                                   "--group-by), keeping SRC's Arrow schema, with statistics, the page index, "
                                   "sorting_columns and optional bloom filters; then compare the digests of "
                                   "SRC and DST (exit 1 if they differ). DST appears, by a rename, only once the "
                                   "digests match; an interrupted run leaves none. Needs pip install 'detload[layout]'.")
    p.add_argument("src", help="the dataset to rewrite (never modified)")
    p.add_argument("dst", help="a new or empty folder")
    p.add_argument("--sort-by", type=_names, default=[], metavar="K1,K2", help="sort keys, leading key first (default: none; with --group-by, groups keep their order)")
    p.add_argument("--group-by", default=None, metavar="KEY",
                   help="keep each KEY's rows together, in one file (groups ordered by --sort-by, then KEY; default: no grouping)")
    p.add_argument("--row-group-rows", type=int, default=65_536,
                   help="rows per row group (default 65,536); the pruning a slice gets depends on it")
    p.add_argument("--bloom-filter", type=_names, action="append", default=[], metavar="COLUMN",
                   help="write a bloom filter for COLUMN (comma-separated or repeated; default: none)")
    p.add_argument("--files", type=int, default=1, help="number of output files (default 1)")
    p.add_argument("--memory-limit", default=None, help="DuckDB's memory limit while sorting: bytes or e.g. 4GB, 512MiB (default: DuckDB's own, 80%% of the memory)")
    p.add_argument("--temp-dir", default=None, help="where the sort spills (default: a folder inside the output being written, removed after)")
    p.add_argument("--threads", type=int, default=None, help="DuckDB threads (default: one per CPU)")
    p.add_argument("--compression", default="snappy", help="Parquet codec (default snappy)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (shown only on a terminal anyway)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = sub.add_parser("check-layout", formatter_class=formatter_class,
                       help="check that a dataset is sorted by keys and has the statistics pruning needs",
                       description="Check that SOURCE (written by any tool) is sorted by --sort-by within each file "
                                   "and across files in file-name order, with min/max statistics for the keys in "
                                   "every row group; report the page index, bloom filters and sorting_columns. "
                                   "Exit 0 when sorted with statistics, 1 otherwise.")
    p.add_argument("source", help="a Parquet file, directory, glob or URI")
    p.add_argument("--sort-by", type=_names, required=True, metavar="K1,K2", help="the keys the data should be sorted by, leading key first")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _cmd_digest(a: argparse.Namespace) -> int:
    from .digest import digest

    d = digest(a.source, columns=a.columns, threads=a.threads)
    print(json.dumps(d.to_dict()) if a.json else f"{d.rows} rows, digest {d.value}")
    return 0


#: The flags layout's options are given as, for its messages ("--threads must be an int >= 1 ...").
_LAYOUT_FLAGS = {"memory_limit": "--memory-limit", "threads": "--threads", "compression": "--compression",
                 "temp_directory": "--temp-dir", "row_group_rows": "--row-group-rows", "files": "--files"}


def _cmd_layout(a: argparse.Namespace) -> int:
    from .rewrite import DigestMismatchError, layout, named, prepare

    try:
        prepare()
    except ImportError as exc:
        print(f"detload layout: error: {exc}", file=sys.stderr)
        return 2
    try:
        # Ctrl-C and SIGTERM raise here, so the folder beside DST is removed before the exit (130, 143).
        with interruptible(), named(_LAYOUT_FLAGS):
            report = layout(a.src, a.dst, sort_by=a.sort_by, group_by=a.group_by, row_group_rows=a.row_group_rows,
                            bloom_filter=[c for group in a.bloom_filter for c in group], files=a.files,
                            memory_limit=a.memory_limit, temp_directory=a.temp_dir, threads=a.threads,
                            compression=a.compression, progress=False if a.no_progress else None)
    except KeyboardInterrupt as exc:
        if getattr(exc, "signum", None) == signal.SIGTERM and not isinstance(exc, Terminated):
            raise Terminated from None  # a SIGTERM that reached DuckDB first: exit 143, not 130
        raise
    except DigestMismatchError as exc:
        print(json.dumps(exc.report.to_dict(), indent=2) if a.json else exc.report)
        print(f"detload layout: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict(), indent=2) if a.json else report)
    return 0


def _cmd_check_layout(a: argparse.Namespace) -> int:
    from .check import check_layout

    res = check_layout(a.source, sort_by=a.sort_by)
    print(json.dumps(res.to_dict(), indent=2) if a.json else res)
    return 0 if res.ok else 1


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "digest": _cmd_digest,
    "layout": _cmd_layout,
    "check-layout": _cmd_check_layout,
}
