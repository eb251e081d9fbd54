"""Load and validate OHLCV market data, and split it chronologically.

Real files differ in column names, date formats and quality. :func:`load_ohlcv` accepts the common
variants and returns one canonical frame; anything it cannot trust raises :class:`DataError` with
one line naming the file, the column, the row and the offending value, so a user can fix the file
without reading a traceback.

Canonical frame: a ``DatetimeIndex`` named ``timestamp`` (UTC, timezone-naive, ``datetime64[ns]``),
float64 columns ``open, high, low, close, volume``, plus an int64 ``regime`` column when the source
has one (files written by :func:`foxhunt.markets.synthetic.write_synthetic_csv`).

This module holds the public API and the validation; the loader's parts live beside it:
``_read`` (a raw frame out of a file), ``_columns`` (which label is which column),
``_timestamps`` (the bars' timestamps), ``_numbers`` (localised numbers) and ``_text``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd

from foxhunt.errors import ConfigError, DataError
from foxhunt.markets._columns import (
    _DECIMAL_COMMA_HEADERS,
    _PRICE_COLUMNS,
    _find_columns,
    _instrument_column,
    _one_instrument,
)
from foxhunt.markets._numbers import (
    _decimal_comma,
    _no_volume_marks,
    _to_float,
    _writes_decimal_points,
)
from foxhunt.markets._read import _read_source
from foxhunt.markets._text import _fmt, _norm, _stamp
from foxhunt.markets._timestamps import _bar_timestamps

log = logging.getLogger(__name__)

__all__ = [
    "OHLCV_COLUMNS",
    "Splits",
    "load_ohlcv",
    "split_chronological",
    "walk_forward",
]

OHLCV_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "volume")
# Relative slack for the high/low consistency checks: values written to CSV with limited
# precision may disagree in the last digits; anything larger is a real data error.
_OHLC_RTOL = 1e-9


def load_ohlcv(source: str | Path | pd.DataFrame, *, min_rows: int = 2) -> pd.DataFrame:
    """Load OHLCV bars from a CSV (plain, .gz, or the one file of a .zip), Parquet or Excel
    (.xlsx: the first sheet with data, needs openpyxl) file or a DataFrame and validate them.

    The CSV delimiter (``,`` ``;`` tab ``|``) is read from the header line; UTF-8, UTF-16 (by
    its BOM) and Windows-1252 text are read, and lines before the header that are blank, start
    with ``#`` or hold a single field (a URL, a title) are skipped, as are rows with every field
    empty at the end of the file. yfinance's three-row header is understood. Column names are
    matched case-insensitively, ignoring ``<>`` and a trailing dot (``Open``/``o``/``<OPEN>``,
    ``Volume``/``Vol.``/``v``; ``Adj Close``, ``Price`` or ``Last`` only when there is no close,
    tick volume or a qualified volume such as ``Volume BTC`` only when there is no volume).
    Timestamps come from a date/datetime/time/timestamp (or ``Gmt time``, ``Local time``,
    ``<DTYYYYMMDD>``, ...) column, separate date + time columns (``Time``, ``Zeit``, ``Heure``,
    IEX's ``minute``, ...; a digits-only time is HHMM when every value fits, else HHMMSS) or a
    DatetimeIndex. Decimal-typed columns (Parquet's decimal128) are numbers, never re-read as
    text. ISO 8601 strings are read as such (offsets
    converted to UTC); other strings are read with ONE format for the whole column, inferred from
    the first value month-first, then day-first (day-first first for dd.mm.yyyy; when both read
    every row in time order, the one whose bars keep a steady pace, with a logged warning),
    two-digit years included (never beyond next year: 62 is 1962), 12-hour clocks too; a column of
    times without dates, or dates without a year, is refused. When the preferred timestamp
    column cannot be read and another one can (CryptoDataDownload's ``Unix Timestamp`` beside
    ``2019-12-13 11-AM``), the other is used, with a logged warning. Integers are
    YYYYMMDD[HHMM[SS]] or a year, else unix epochs whose unit (s/ms/us/ns) is read from each
    value's magnitude (a change of unit part way is logged); small numbers (a row index) are
    refused. A title line before the header is skipped. A file without a header row (Binance
    klines, Kraken OHLCVT, MetaTrader and NinjaTrader exports) is read by position as time (or
    date, time), open, high, low, close[, volume], with a logged warning. Numbers may carry
    thousands separators or K/M/B suffixes; the decimal mark is read from the numbers
    themselves (in comma-delimited files, from the quoted ones), and from localised headers
    (``Datum``, ``Zuletzt``, ``Eröffn.``, ``Clôture``, ``Máximo``, ...) or a ``;`` delimiter
    when the numbers do not settle it (see :func:`_decimal_comma`). A file whose rows are all
    newest-first is reversed (with a logged warning); a missing volume column, or one of only
    ``-`` placeholders, becomes zeros (logged). A file holding several instruments (a
    symbol/ticker column with more than one value) is refused.

    Raises :class:`DataError` (one line: file, column, row, value) for anything it cannot trust:
    missing columns, rows with more fields than the header, unparseable or missing timestamps,
    NaN/inf, non-positive prices, high below low/open/close, low above open/close, negative
    volume, unsorted or duplicate timestamps, and fewer than ``min_rows`` rows. Rows holding data
    are never dropped, nor reordered silently; up to three rows at the end with neither a
    readable timestamp nor two prices (a vendor's footer, a totals row) are skipped, with a
    logged warning.
    """
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
        raise ConfigError(f"min_rows must be a positive integer, got {min_rows!r}")
    # A frame this function returned, passed back in unchanged (evaluate --data, prepare_market
    # on a loaded file), was checked then: it is returned as it is, not validated (and warned
    # about) twice. An edited one is checked as any other.
    if (
        isinstance(source, pd.DataFrame)
        and source.attrs.get(_VALIDATED) is not None
        and source.attrs[_VALIDATED] == _fingerprint(source)
        and len(source) >= min_rows
    ):
        return source.copy()
    out = _load_ohlcv(source, min_rows)
    out.attrs[_VALIDATED] = _fingerprint(out)
    return out


_VALIDATED = "foxhunt_validated"


def _fingerprint(frame: pd.DataFrame) -> str | None:
    """A hash of ``frame``'s labels, index and values (None when they cannot be hashed)."""
    try:
        rows = pd.util.hash_pandas_object(frame, index=True).to_numpy()
    except (TypeError, ValueError):
        return None
    h = hashlib.sha256(repr([str(c) for c in frame.columns]).encode())
    h.update(np.ascontiguousarray(rows).tobytes())
    return h.hexdigest()


def _load_ohlcv(source: str | Path | pd.DataFrame, min_rows: int) -> pd.DataFrame:
    frame, label = _read_source(source)
    _one_instrument(frame, label)
    found = _find_columns(frame, label)
    frame, timestamps, ts_column = _bar_timestamps(frame, found, label)
    n = len(frame)
    if n < min_rows:
        raise DataError(f"{label}: too few rows: {n} data row(s), min_rows={min_rows}")
    cols = [found[c] for c in OHLCV_COLUMNS if c in found]
    read_as_numbers = [c for c in cols if pd.api.types.is_float_dtype(frame[c].dtype)]
    point: list[str] = []  # price columns read as numbers whose fractions show a decimal point
    if frame.attrs.get("delimiter", ",") == ",":
        # A comma-delimited file can only carry decimal commas inside quotes ("16.769,36", as
        # localised investing.com exports do): read the mark from the columns held as text,
        # and from prices already read as numbers with a point (100.37: never a thousands dot).
        text = [c for c in cols if not pd.api.types.is_numeric_dtype(frame[c].dtype)]
        prices = {found[c] for c in _PRICE_COLUMNS if c in found}
        point = [  # only where text columns leave the mark to decide (a million-bar file of
            str(c)  # plain numbers skips the scan)
            for c in cols
            if text
            and c in prices
            and pd.api.types.is_float_dtype(frame[c].dtype)
            and _writes_decimal_points(frame[c])
        ]
        cols = text
    # Headers in a language that writes decimal commas (Eröffnung, Clôture, ...) settle a file
    # whose numbers show no decimal mark of their own (16.750 is then sixteen thousand).
    localised = any(_norm(found[c]) in _DECIMAL_COMMA_HEADERS for c in _PRICE_COLUMNS)
    delimiter = frame.attrs.get("delimiter", ",")
    first_point = point[0] if point else None
    decimal_comma = (
        _decimal_comma(frame[cols], label, localised, delimiter, first_point) if cols else False
    )
    if decimal_comma and point:
        raise DataError(
            f"{label}: numbers use both decimal marks: column {point[0]!r} writes a decimal "
            "point and a quoted value elsewhere a decimal comma; write one convention"
        )
    back = np.diff(timestamps.asi8)
    reversed_rows = n > 1 and bool(np.all(back <= 0)) and bool(np.any(back < 0))
    if reversed_rows:
        # Newest-first exports (common from brokers and data sites) are unambiguous: reverse
        # them, and say so (a repeated timestamp is still refused below).
        log.warning("%s: rows are newest first; reversed into time order", label)
        frame = frame.iloc[::-1]
        timestamps = timestamps[::-1]

    head = int(frame.attrs.get("head_rows", 0))  # a units row skipped before the bars

    def file_row(pos: int) -> int:  # as numbered in the source
        return (n - pos if reversed_rows else pos + 1) + head

    def where(pos: int) -> str:
        return f"row {file_row(pos)} ({_stamp(timestamps[pos])})"

    if decimal_comma and delimiter == ",":
        # Unquoted, a number in a comma-delimited file cannot hold a decimal comma: a dot in
        # it (1.234) is a thousands separator, which reading it as a number took for a point.
        for c in read_as_numbers:
            arr = frame[c].to_numpy(dtype=np.float64)
            dotted = np.isfinite(arr) & (arr % 1 != 0)
            if dotted.any():
                pos = int(np.argmax(dotted))
                raise DataError(
                    f"{label}: column {str(c)!r} {where(pos)}: unquoted {_fmt(arr[pos])} in a "
                    "file whose decimal mark is a comma (its quoted numbers): a thousands "
                    "dot? quote it, or write it without separators"
                )

    # Epoch times past next year are refused (no unit reads them as a bar's time); a written
    # date past today parses, and a typo'd year (2099 for 2024) would pass unseen.
    future = np.asarray(timestamps > pd.Timestamp.now() + pd.Timedelta(days=2))
    if future.any():
        log.warning(
            "%s: %d bar(s) dated after today, the first at %s: a typo in a date? (a synthetic "
            "market may run into the future)",
            label,
            int(future.sum()),
            where(int(np.argmax(future))),
        )

    values: dict[str, np.ndarray] = {}
    names: dict[str, str] = {}
    for canon in OHLCV_COLUMNS:
        if canon not in found:
            continue
        col = found[canon]
        names[canon] = str(col)
        raw = frame[col].reset_index(drop=True)
        if canon == "volume" and _no_volume_marks(raw):
            # investing.com writes '-' for every FX bar: the file has no volume, like a file
            # without the column (a partly missing volume is still refused below).
            log.warning(
                "%s: column %r holds no volumes (only '-' or empty); volume set to 0", label, col
            )
            continue
        arr = _to_float(raw, label, str(col), where, decimal_comma, suffixes=canon == "volume")
        nonfinite = ~np.isfinite(arr)
        if nonfinite.any():
            pos = int(np.argmax(nonfinite))
            why = (
                "missing value nan (empty, NaN, null or n/a in the file)"
                if np.isnan(arr[pos])
                else f"value {_fmt(arr[pos])} is not finite"
            )
            raise DataError(f"{label}: column {str(col)!r} {where(pos)}: {why}")
        values[canon] = arr
    if "volume" not in values:
        values["volume"] = np.zeros(n, dtype=np.float64)
        names["volume"] = "volume"
    if "tick volume" in found and not values["volume"].any():
        # MetaTrader FX exports: <VOL> is all zeros, <TICKVOL> is the usable activity measure.
        col = found["tick volume"]
        ticks = _to_float(frame[col].reset_index(drop=True), label, str(col), where, decimal_comma)
        if np.isfinite(ticks).all():
            values["volume"], names["volume"] = ticks, str(col)
    if "volume" not in found and names["volume"] == "volume":
        others = [
            repr(str(c)) for c in frame.columns if re.search(r"(?i)vol|shares|qty|quantity", str(c))
        ]
        log.warning(
            "%s: no volume column%s; volume set to 0",
            label,
            f" ({', '.join(others)}: an indicator or a partial volume, not taken)"
            if others
            else "",
        )

    for canon in _PRICE_COLUMNS:
        bad = values[canon] <= 0
        if bad.any():
            pos = int(np.argmax(bad))
            raise DataError(
                f"{label}: column {names[canon]!r} {where(pos)}: non-positive price "
                f"{_fmt(values[canon][pos])}"
            )
    o, h, lo, c = (values[k] for k in _PRICE_COLUMNS)
    checks = (
        ("high", h < lo * (1 - _OHLC_RTOL), "is below low", lo),
        ("high", h < o * (1 - _OHLC_RTOL), "is below open", o),
        ("high", h < c * (1 - _OHLC_RTOL), "is below close", c),
        ("low", lo > o * (1 + _OHLC_RTOL), "is above open", o),
        ("low", lo > c * (1 + _OHLC_RTOL), "is above close", c),
    )
    positional = (
        " (the file has no header row, so its columns were read by position: add a header)"
        if frame.attrs.get("positional")
        else ""
    )
    mixed = frame.attrs.get("adjusted_close")
    for canon, bad, relation, other in checks:
        if bad.any():
            pos = int(np.argmax(bad))
            hint = (
                f" (the close was read from {mixed!r}, an adjusted close, beside unadjusted "
                "open/high/low: keep only adjusted columns, or add the unadjusted close)"
                if mixed and other is c
                else ""
            )
            raise DataError(
                f"{label}: column {names[canon]!r} {where(pos)}: {canon} "
                f"{_fmt(values[canon][pos])} {relation} {_fmt(other[pos])}{hint}{positional}"
            )
    negative = values["volume"] < 0
    if negative.any():
        pos = int(np.argmax(negative))
        raise DataError(
            f"{label}: column {names['volume']!r} {where(pos)}: negative volume "
            f"{_fmt(values['volume'][pos])}"
        )

    known = [ts_column, *found.values()]
    stamps = timestamps.asi8
    steps = np.diff(stamps)
    for bad, why in ((steps < 0, "is earlier than"), (steps == 0, "duplicates")):
        if bad.any():
            pos = int(np.argmax(bad)) + 1
            # The later of the two rows in the file is the offending one.
            later, earlier = sorted((file_row(pos), file_row(pos - 1)), reverse=True)
            stacked = _instrument_column(frame, known, np.array([pos - 1, pos]))
            hint = (
                f" (column {stacked!r} changes from {_fmt(frame[stacked].iloc[pos - 1])} to "
                f"{_fmt(frame[stacked].iloc[pos])} there: several instruments in one file? "
                "keep the rows of one)"
                if stacked is not None
                else ""
            )
            o, h, lo, c = (values[k] for k in _PRICE_COLUMNS)
            flat = (o == h) & (h == lo) & (lo == c)
            if not hint and why == "duplicates" and flat.mean() >= 0.9:
                hint = (  # one price per row, several rows at one time: trades, not bars
                    " (ticks, one price per row? foxhunt trains on bars: resample them, e.g. "
                    "pandas' df.resample('1min').agg({'open': 'first', 'high': 'max', 'low': "
                    "'min', 'close': 'last', 'volume': 'sum'}))"
                )
            raise DataError(
                f"{label}: column {ts_column!r} row {later}: timestamp {_stamp(timestamps[pos])} "
                f"{why} row {earlier} ({_stamp(timestamps[pos - 1])}); rows must be strictly "
                f"increasing in time{hint}"
            )
    varying = _instrument_column(frame, known)
    ids = None if varying is None else frame[varying].astype(str).str.strip().to_numpy()
    changes = 0 if ids is None else int(np.count_nonzero(ids[1:] != ids[:-1]))
    # Instruments one after another change a handful of times; a column that changes on many
    # rows is something else (a status, a counter).
    if ids is not None and 0 < changes <= max(10, n // 100):
        change = int(np.argmax(ids[1:] != ids[:-1])) + 1
        log.warning(
            "%s: column %r changes value at %s (%s to %s): if these are different instruments "
            "rather than one series rolling from contract to contract, the prices jump there; "
            "keep the rows of one",
            label,
            varying,
            where(change),
            _fmt(ids[change - 1]),
            _fmt(ids[change]),
        )

    out = pd.DataFrame(
        {k: values[k] for k in OHLCV_COLUMNS},
        index=pd.DatetimeIndex(timestamps, name="timestamp"),
    )
    if "regime" in found:
        out["regime"] = _regime_column(frame[found["regime"]], label, str(found["regime"]), where)
        if "regime_name" in found:
            out.attrs["regime_names"] = _regime_names(
                out["regime"].to_numpy(), frame[found["regime_name"]], label, where
            )
    return out


def _regime_names(
    ids: np.ndarray, raw: pd.Series, label: str, where: Callable[[int], str]
) -> tuple[str, ...]:
    """The names of regimes 0..max id, from a ``regime_name`` column beside ``regime`` (what
    ``foxhunt data synth`` writes); an id never seen is ``regime_<id>``, as without names."""
    names = raw.reset_index(drop=True).fillna("").astype(str).str.strip().to_numpy()
    by_id: dict[int, str] = {}
    for pos, (k, name) in enumerate(zip(ids.tolist(), names, strict=True)):
        if not name:  # a blank cell names nothing
            continue
        if by_id.setdefault(k, name) != name:
            raise DataError(
                f"{label}: column {str(raw.name)!r} {where(pos)}: regime {k} is named "
                f"{name!r} here but {by_id[k]!r} before; one name per regime"
            )
    return tuple(by_id.get(k, f"regime_{k}") for k in range(max(by_id, default=-1) + 1))


def _regime_column(
    raw: pd.Series, label: str, column: str, where: Callable[[int], str]
) -> np.ndarray:
    arr = _to_float(raw.reset_index(drop=True), label, column, where)
    bad = ~np.isfinite(arr) | (arr < 0) | (arr != np.round(arr))
    if bad.any():
        pos = int(np.argmax(bad))
        raise DataError(
            f"{label}: column {column!r} {where(pos)}: regime must be a non-negative integer, "
            f"got {_fmt(arr[pos])}"
        )
    return arr.astype(np.int64)


class Splits(NamedTuple):
    """Chronological train / validation / test frames (no shuffling, no overlap)."""

    train: pd.DataFrame
    validation: pd.DataFrame
    test: pd.DataFrame


def _check_fraction(name: str, value: float, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number in (0, 1), got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value < 1):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise ConfigError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


def split_chronological(df: pd.DataFrame, train: float = 0.7, validation: float = 0.15) -> Splits:
    """Split rows in time order: the first ``train`` fraction, then ``validation``, then the rest.

    Sizes are ``floor(n * train)`` and ``floor(n * (train + validation)) - floor(n * train)``, so
    the three parts always tile the frame exactly. Train and test must be non-empty.
    """
    train = _check_fraction("train", train, allow_zero=False)
    validation = _check_fraction("validation", validation, allow_zero=True)
    if train + validation >= 1:
        raise ConfigError(
            f"train + validation must be < 1 to leave a test split, got {train} + {validation} "
            f"= {train + validation}"
        )
    n = len(df)
    # Rounded before the floor: 100 * 0.29 is 28.999999999999996 and must give 29 rows.
    train_end = math.floor(round(n * train, 9))
    val_end = math.floor(round(n * (train + validation), 9))
    if train_end < 1 or val_end >= n:
        raise DataError(
            f"<DataFrame>: too few rows ({n}) for train={train}, validation={validation}: "
            "train and test splits would be empty"
        )
    return Splits(df.iloc[:train_end], df.iloc[train_end:val_end], df.iloc[val_end:])


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def walk_forward(
    df: pd.DataFrame,
    n_folds: int,
    train_size: int,
    test_size: int,
    step: int | None = None,
    *,
    window: Literal["rolling", "expanding"] = "rolling",
) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Walk-forward (train, test) folds in time order, the last test window ending at the last row.

    Test windows have ``test_size`` rows and start ``step`` rows apart (default ``test_size``:
    back-to-back, non-overlapping). Each fold trains on the rows immediately before its test
    window: exactly ``train_size`` of them with ``window="rolling"``, or everything from the
    first usable row with ``window="expanding"`` (the first fold's train window then has
    ``train_size`` rows and later ones grow by ``step``). Folds are anchored to the end, like
    scikit-learn's ``TimeSeriesSplit``, so the most recent data is always tested; leading rows
    that do not fit are left out.
    """
    n_folds = _check_positive_int("n_folds", n_folds)
    train_size = _check_positive_int("train_size", train_size)
    test_size = _check_positive_int("test_size", test_size)
    step = test_size if step is None else _check_positive_int("step", step)
    if window not in ("rolling", "expanding"):
        raise ConfigError(f"window must be 'rolling' or 'expanding', got {window!r}")
    needed = train_size + (n_folds - 1) * step + test_size
    n = len(df)
    if needed > n:
        raise DataError(
            f"<DataFrame>: walk_forward needs {needed} rows (train_size={train_size} + "
            f"(n_folds-1)*step={(n_folds - 1) * step} + test_size={test_size}), got {n}"
        )
    offset = n - needed
    folds = []
    for k in range(n_folds):
        test_start = offset + train_size + k * step
        train_start = offset if window == "expanding" else test_start - train_size
        folds.append(
            (df.iloc[train_start:test_start], df.iloc[test_start : test_start + test_size])
        )
    return folds
