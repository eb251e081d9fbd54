"""Round trip of the OHLCV loader over randomly drawn vendor conventions.

Each case writes a known frame with a random frequency, start date, column spellings, date
format, delimiter, decimal mark, thousands grouping, row order, column order and container, then
loads it back. The loader must return the frame exactly, or refuse in one line naming the file:
never silently wrong data. (A property-based probe with about 6 500 such files found two silent
1000x price errors this way; both are fixed.)
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from foxhunt import load_ohlcv
from foxhunt.errors import DataError

_INTRADAY_FORMATS = (
    "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%SZ", "%d/%m/%Y %H:%M", "%m/%d/%Y %H:%M",
    "%d.%m.%Y %H:%M", "%Y/%m/%d %H:%M", "+05:30", "epoch_s", "epoch_ms",
)  # fmt: skip
_DAILY_FORMATS = (
    "%Y-%m-%d", "%Y%m%d", "%m/%d/%Y", "%d/%m/%Y", "%d.%m.%Y", "%d.%m.%y", "%m/%d/%y",
    "%Y-%m-%dT%H:%M:%SZ", "epoch_s", "epoch_ms",
)  # fmt: skip
_DAY_MONTH = ("%d/%m", "%m/%d", "%d.%m")
_NAMES = {
    "timestamp": ("Date", "Datetime", "timestamp", "time", "DATE"),
    "open": ("Open", "open", "OPEN", "o"),
    "high": ("High", "high", "HIGH", "h"),
    "low": ("Low", "low", "LOW", "l"),
    "close": ("Close", "close", "CLOSE", "c"),
    "volume": ("Volume", "volume", "vol", "Vol"),
}


def _stamp(ts: pd.Timestamp, fmt: str) -> str:
    if fmt == "epoch_s":
        return str(ts.value // 10**9)
    if fmt == "epoch_ms":
        return str(ts.value // 10**6)
    if fmt == "+05:30":  # the wall time in +05:30 of the UTC instant ts
        return (ts + pd.Timedelta("5h30min")).strftime("%Y-%m-%d %H:%M:%S") + "+05:30"
    return ts.strftime(fmt)


def _number(x: float, decimals: int | None, comma: bool, thousands: bool) -> str:
    text = f"{x:.{decimals}f}" if decimals is not None else repr(float(x))
    if "e" in text:
        text = f"{x:.17f}".rstrip("0")
    text = text.removesuffix(".0")
    if thousands:
        whole, _, fraction = text.partition(".")
        text = f"{int(whole):,}" + (f".{fraction}" if fraction else "")
    return text.translate(str.maketrans({".": ",", ",": "."})) if comma else text


def _case(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 300))
    freq = str(rng.choice(["min", "h", "B", "D", "7D", "MS"]))
    start = pd.Timestamp("1990-01-01") + pd.Timedelta(days=int(rng.integers(0, 11_000)))
    if freq == "min":
        start = start.normalize() + pd.Timedelta("9h30min")
    stamps = pd.date_range(start, periods=n, freq=freq).as_unit("ns")
    close = float(rng.choice([0.05, 1.2, 35.0, 1800.0, 42_000.0])) * np.exp(
        np.cumsum(rng.normal(0, 0.02, n))
    )
    open_ = close * np.exp(rng.normal(0, 0.01, n))
    frame = pd.DataFrame(
        {
            "open": open_,
            "high": np.maximum(open_, close) * np.exp(np.abs(rng.normal(0, 0.01, n))),
            "low": np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0, 0.01, n))),
            "close": close,
            "volume": rng.integers(0, 5_000_000, n).astype(np.float64),
        },
        index=stamps,
    )
    # Three decimals with a decimal comma and no ';' is truly ambiguous (100,125): not drawn.
    decimals = rng.choice([None, 2, 4, 6]) if close.min() >= 0.01 else None
    if decimals is not None:
        for c in ("open", "high", "low", "close"):
            frame[c] = frame[c].round(int(decimals))
    intraday = freq in ("min", "h")
    return {
        "frame": frame,
        "fmt": str(rng.choice(_INTRADAY_FORMATS if intraday else _DAILY_FORMATS)),
        "sep": str(rng.choice([",", ";", "\t"])),
        "comma": bool(rng.random() < 0.4),
        "thousands": bool(rng.random() < 0.3),
        "decimals": None if decimals is None else int(decimals),
        "names": {k: str(rng.choice(v)) for k, v in _NAMES.items()},
        "adj_close": bool(rng.random() < 0.5),
        "descending": bool(rng.random() < 0.3),
        "shuffle": rng.permutation(4) if rng.random() < 0.3 else None,
        "container": str(rng.choice(["csv", "csv", "gz", "parquet"])),
    }


def _write(case: dict[str, Any], directory: Path) -> Path:
    frame, names = case["frame"], case["names"]
    out = frame.iloc[::-1] if case["descending"] else frame
    columns = ["open", "high", "low", "close"]
    if case["shuffle"] is not None:
        columns = [columns[i] for i in case["shuffle"]]
    columns += ["adj"] * case["adj_close"] + ["volume"]
    header = {c: names.get(c, "Adj Close") for c in columns}
    values = {c: out["close"] * 0.73 if c == "adj" else out[c] for c in columns}  # never close
    if case["container"] == "parquet":
        table = pd.DataFrame({header[c]: values[c].to_numpy() for c in columns})
        table.insert(0, names["timestamp"], out.index)
        path = directory / "bars.parquet"
        table.to_parquet(path)
        return path
    sep, comma = case["sep"], case["comma"] and case["sep"] != ","
    quote = sep == ","  # a comma-delimited file quotes numbers holding a comma
    lines = [sep.join([names["timestamp"], *header.values()])]
    for i, ts in enumerate(out.index):
        cells = [_stamp(ts, case["fmt"])]
        for c in columns:
            decimals = None if c == "volume" else case["decimals"]
            text = _number(float(values[c].iloc[i]), decimals, comma, case["thousands"])
            cells.append(f'"{text}"' if quote and "," in text else text)
        lines.append(sep.join(cells))
    text = "\n".join(lines) + "\n"
    suffix = ".tsv" if sep == "\t" else ".csv"
    if case["container"] == "gz":
        path = directory / f"bars{suffix}.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path = directory / f"bars{suffix}"
        path.write_text(text, encoding="utf-8")
    return path


_CASES = range(120)
_RAN: list[int] = []
_LOADED: list[int] = []


@pytest.mark.parametrize("seed", _CASES)
def test_a_written_frame_loads_back_exactly_or_is_refused_in_one_line(
    seed: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _RAN.append(seed)
    case = _case(seed)
    path = _write(case, tmp_path)
    caplog.set_level(logging.WARNING)
    try:
        got = load_ohlcv(path)
    except DataError as err:
        message = str(err)
        assert "\n" not in message and path.name in message, message
        return
    want = case["frame"]
    assert len(got) == len(want)
    stamps = pd.DatetimeIndex(got.index).as_unit("ns")
    if not (stamps.asi8 == want.index.asi8).all():
        # Only a file whose every date reads both day- and month-first may be read the other
        # way, and then with a warning.
        ambiguous = case["fmt"].startswith(_DAY_MONTH) and (want.index.day <= 12).all()
        assert ambiguous and "also reads as" in caplog.text, (case["fmt"], stamps[:3])
        return
    for c in ("open", "high", "low", "close", "volume"):
        np.testing.assert_allclose(got[c].to_numpy(), want[c].to_numpy(), rtol=1e-12, err_msg=c)
    _LOADED.append(seed)


def test_most_drawn_files_load() -> None:
    """The round trip above counts a one-line refusal as a pass; a loader that refused
    everything must not pass it. (Runs after it: pytest keeps the file's order; counted over
    the cases this session ran, so a selection of them is judged on its own.)"""
    if not _RAN:
        pytest.skip("the round-trip cases did not run in this session")
    assert len(_LOADED) >= 0.85 * len(_RAN), (len(_LOADED), len(_RAN))
