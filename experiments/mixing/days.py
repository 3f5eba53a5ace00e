"""Days per batch through the real planner: a day-partitioned CTR layout (14 days, sorted by day)
and the same rows rewritten by `detload layout --sort-by market,day`, measured with
`Loader.plan_stats(mix_column="day")` for the default (mixed) order and the windowed one.

    PYTHONPATH=. python experiments/mixing/days.py [--rows-per-day N] [--out DIR]

The issue's targets: 4,096-row batches hold all 14 days at the 5th percentile, on both layouts.
Only the plan is measured (no batch is read): the report reads the ``day`` column once.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import detload
from detload.layout import rewrite

DAYS = 14


def write_days(root: Path, rows_per_day: int, row_group_rows: int, markets: int, seed: int) -> None:
    """Three files per day, rows in day order; each row a market drawn with skewed shares."""
    rng = np.random.default_rng(seed)
    shares = 1.0 / np.arange(1, markets + 1) ** 0.8
    root.mkdir(parents=True, exist_ok=True)
    first = 0
    for day in range(DAYS):
        n = int(rows_per_day * rng.uniform(0.85, 1.15))
        cuts = np.linspace(0, n, 4).astype(int)
        for f in range(3):
            m = int(cuts[f + 1] - cuts[f])
            t = pa.table({"id": np.arange(first, first + m, dtype=np.int64),
                          "day": np.full(m, day, dtype=np.int16),
                          "market": rng.choice(markets, m, p=shares / shares.sum()).astype(np.int16),
                          "label": (rng.random(m) < 0.03 + 0.002 * day).astype(np.int8)})
            pq.write_table(t, root / f"day={day:02d}-part-{f}.parquet", row_group_size=row_group_rows)
            first += m


def measure(source: Path, order: str, seed: int) -> dict:
    kw = {"shuffle_window": 4} if order == "windowed" else {}
    with detload.Loader(str(source), batch_size=4096, seed=seed, order=order, **kw) as loader:
        rep = loader.plan_stats(mix_column="day")
    mc = rep["mix_column"]
    return {"order": order, "row_groups": rep["row_groups"],
            "row_groups_per_batch": [rep["row_groups_per_batch"]["median"], rep["row_groups_per_batch"]["p5"]],
            "days_per_batch": [mc["values_per_batch"]["median"], mc["values_per_batch"]["p5"]],
            "iid_days_per_batch": [mc["values_per_batch"]["iid_median"], mc["values_per_batch"]["iid_p5"]],
            "tvd_median": mc["tvd"]["median"], "iid_tvd_median": mc["tvd"]["iid_median"],
            "spread": rep["spread"]["median"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows-per-day", type=int, default=770_000, help="about 10.8 M rows in all, as the simulation")
    ap.add_argument("--row-group-rows", type=int, default=65_536)
    ap.add_argument("--markets", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="where the datasets go (default: a temporary folder)")
    args = ap.parse_args(argv)
    base = args.out or Path(tempfile.mkdtemp(prefix="detload-days-"))
    by_day = base / "by_day"
    if not by_day.exists():
        write_days(by_day, args.rows_per_day, args.row_group_rows, args.markets, args.seed)
    by_market = base / "by_market_day"
    if not by_market.exists():
        rewrite(str(by_day), str(by_market), sort_by=["market", "day"], row_group_rows=args.row_group_rows, files=6,
                progress=False)
    rows = []
    for layout, path in (("sorted by day", by_day), ("detload layout --sort-by market,day", by_market)):
        for order in ("mix", "windowed"):
            r = measure(path, order, args.seed) | {"layout": layout}
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
    print("| layout | order | row groups | row groups/batch median, p5 | days/batch median, p5 "
          "| i.i.d. days/batch median, p5 | TVD median (i.i.d.) | spread |")
    print("|---|---|---:|---|---|---|---|---:|")
    for r in rows:
        print(f"| {r['layout']} | {r['order']} | {r['row_groups']} | {r['row_groups_per_batch'][0]:.0f}, "
              f"{r['row_groups_per_batch'][1]:.0f} | {r['days_per_batch'][0]:.0f}, {r['days_per_batch'][1]:.0f} | "
              f"{r['iid_days_per_batch'][0]:.0f}, {r['iid_days_per_batch'][1]:.0f} | "
              f"{r['tvd_median']:.3f} ({r['iid_tvd_median']:.3f}) | {r['spread']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
