"""Loading an OHLCV file: foxhunt's validated loader against pandas' own parse, side by side.

A quant's minute bars run to millions of rows, and ``evaluate``, ``resume`` and
``next_position`` read the file again each time. ``foxhunt.load_ohlcv`` finds the columns,
infers the timestamp layout (checking every row against it: one format per column, never
day-first in one row and month-first in another), and validates every price (finite, positive,
high >= low, sorted, unique). The peer is what a user of a library without a loader writes:
``pd.read_csv`` and ``pd.to_datetime`` with the format given by hand, and no checks at all.

Three timestamp layouts, each a file of 1-minute bars, the two loaders taking turns:

* ``iso``: ``2020-01-01 00:00:00`` (the most common export);
* ``iso_offset``: ``2020-01-01T00:00:00+00:00`` (yfinance, ccxt);
* ``epoch_ms``: ``1577836800000`` (Binance klines).

Run: ``python benchmarks/load_ohlcv.py [--smoke] [--out FILE.json]``
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import _common as C

C.ensure_foxhunt_importable()

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

LAYOUTS = ("iso", "iso_offset", "epoch_ms")


def write_file(path: Path, rows: int, layout: str) -> Path:
    """``rows`` 1-minute bars of a random walk with the timestamp column in ``layout``."""
    rng = np.random.default_rng(0)
    index = pd.date_range("2020-01-01", periods=rows, freq="min")
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 1e-3, rows)))
    open_ = np.concatenate([[100.0], close[:-1]])
    spread = np.abs(rng.normal(0.0, 5e-4, rows)) * close
    if layout == "iso":
        stamps: Any = index.strftime("%Y-%m-%d %H:%M:%S")
    elif layout == "iso_offset":
        stamps = index.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    else:
        stamps = index.as_unit("ms").asi8
    frame = pd.DataFrame(
        {
            "timestamp": stamps,
            "open": open_,
            "high": np.maximum(open_, close) + spread,
            "low": np.minimum(open_, close) - spread,
            "close": close,
            "volume": rng.integers(1, 1000, rows),
        }
    )
    frame.to_csv(path, index=False)
    return path


def pandas_load(path: Path, layout: str) -> pd.DataFrame:
    """The peer: read and parse the timestamps with the format given, nothing checked."""
    frame = pd.read_csv(path)
    if layout == "epoch_ms":
        stamps = pd.to_datetime(frame["timestamp"], unit="ms")
    else:
        stamps = pd.to_datetime(frame["timestamp"], format="ISO8601", utc=True)
    return frame.drop(columns="timestamp").set_index(pd.DatetimeIndex(stamps))


def measure(rows: int, reps: int, root: Path) -> list[dict[str, Any]]:
    from foxhunt.markets.data import load_ohlcv

    results = []
    for layout in LAYOUTS:
        path = write_file(root / f"{layout}.csv", rows, layout)
        loaded = load_ohlcv(path)
        peer = pandas_load(path, layout)
        # The same bars either way (foxhunt keeps naive UTC timestamps).
        assert len(loaded) == len(peer) == rows
        naive = pd.DatetimeIndex(peer.index).tz_localize(None).as_unit("ns")
        assert np.array_equal(loaded.index.as_unit("ns").asi8, naive.asi8)
        times = C.interleaved(
            {
                "foxhunt": lambda p=path: C.timed(lambda: load_ohlcv(p)),
                "pandas": lambda p=path, lay=layout: C.timed(lambda: pandas_load(p, lay)),
            },
            reps,
        )
        results.append(
            {
                "layout": layout,
                "rows": rows,
                "file_mb": path.stat().st_size / 2**20,
                "seconds": times,
                "foxhunt_s_median": C.median(times["foxhunt"]),
                "pandas_s_median": C.median(times["pandas"]),
                "ratio_paired_median": C.median(
                    C.per_rep_ratios(times["foxhunt"], times["pandas"])
                ),
            }
        )
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = C.parser(__doc__.splitlines()[0]).parse_args(argv)
    rows, reps = (2_000, 3) if args.smoke else (1_000_000, 5)
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(rows, reps, Path(tmp))
    ratios = {f"foxhunt_vs_pandas_{r['layout']}": r["ratio_paired_median"] for r in results}
    table = C.md_table(
        ["timestamps", "rows", "foxhunt s", "pandas s", "foxhunt / pandas (paired median)"],
        [
            [
                r["layout"],
                r["rows"],
                r["foxhunt_s_median"],
                r["pandas_s_median"],
                r["ratio_paired_median"],
            ]
            for r in results
        ],
    )
    notes = (
        f"{rows} 1-minute bars per file; {reps} interleaved repetitions per layout. foxhunt "
        "infers the layout and validates every row; pandas is told the format and checks nothing."
    )
    config = {"rows": rows, "reps": reps, "layouts": list(LAYOUTS)}
    return C.finish("load_ohlcv", args, config, results, ratios, notes, table)


if __name__ == "__main__":
    main()
