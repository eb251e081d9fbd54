"""Load and validate OHLCV market data, and split it chronologically.

Real files differ in column names, date formats and quality. :func:`load_ohlcv` accepts the common
variants and returns one canonical frame; anything it cannot trust raises :class:`DataError` with
one line naming the file, the column, the row and the offending value, so a user can fix the file
without reading a traceback.

Canonical frame: a ``DatetimeIndex`` named ``timestamp`` (UTC, timezone-naive, ``datetime64[ns]``),
float64 columns ``open, high, low, close, volume``, plus an int64 ``regime`` column when the source
has one (files written by :func:`foxhunt.markets.synthetic.write_synthetic_csv`).
"""

from __future__ import annotations

import contextlib
import csv
import decimal
import gzip
import hashlib
import io
import logging
import math
import re
import warnings
import zipfile
import zlib
import zoneinfo
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Literal, NamedTuple

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

from foxhunt.errors import ConfigError, DataError, first_line

log = logging.getLogger(__name__)

__all__ = [
    "OHLCV_COLUMNS",
    "Splits",
    "load_ohlcv",
    "split_chronological",
    "walk_forward",
]

OHLCV_COLUMNS: tuple[str, ...] = ("open", "high", "low", "close", "volume")
_PRICE_COLUMNS = ("open", "high", "low", "close")

# Normalised header (lower case, '_'/'-' -> ' ', '<>', trailing footnote '*' and a trailing '.'
# dropped, spaces collapsed) -> canonical column.
_ALIASES: dict[str, str] = {
    "open": "open",
    "o": "open",
    "high": "high",
    "h": "high",
    "low": "low",
    "l": "low",
    "close": "close",
    "c": "close",
    "volume": "volume",
    "vol": "volume",
    "v": "volume",
    "regime": "regime",
    "regime name": "regime_name",
    # Nasdaq.com's historical quotes, Bloomberg's field names.
    "close/last": "close",
    "px open": "open",
    "px high": "high",
    "px low": "low",
    "px last": "close",
    "px volume": "volume",
}
# The same names in the languages of common localised exports (investing.com, onvista, boursorama,
# broker statements): German, French, Spanish, Italian, Portuguese, Dutch, Polish.
# Russian, Turkish and Swedish too.
_LOCALISED: dict[str, tuple[str, ...]] = {
    "open": ("eröffnung", "eroeffnung", "eröffn", "erster", "ouverture", "ouv", "apertura",
             "abertura", "opening", "otwarcie", "откр", "открытие", "açılış", "acilis",
             "öppning", "öppningskurs"),
    "high": ("hoch", "höchst", "hoechst", "tageshoch", "plus haut", "haut", "máximo", "maximo",
             "máx", "máxima", "maxima", "massimo", "max", "hoogste", "najwyższy", "najwyzszy",
             "макс", "максимум", "yüksek", "yuksek", "högst", "högsta", "högsta kurs"),
    "low": ("tief", "tiefst", "tagestief", "plus bas", "bas", "mínimo", "minimo", "mín",
            "mínima", "minima", "min", "laagste", "najniższy", "najnizszy", "мин", "минимум",
            "düşük", "dusuk", "lägst", "lägsta", "lägsta kurs"),
    "close": ("schluss", "schlusskurs", "clôture", "cloture", "cierre", "chiusura", "fechamento",
              "fecho", "clot", "slot", "zamknięcie", "zamkniecie", "закр", "закрытие",
              "kapanış", "kapanis", "stängning", "stängningskurs"),
    "volume": ("volumen", "stück", "stücke", "volumes", "wolumen", "wol", "объём", "объем",
               "hacim", "hac", "volym"),
}  # fmt: skip
_ALIASES.update({name: canon for canon, names in _LOCALISED.items() for name in names})
# Japanese and Chinese exports write decimal points, so they stay out of _LOCALISED.
_ALIASES.update(
    {
        "始値": "open", "开盘": "open", "开盘价": "open", "開盤": "open", "開盤價": "open",
        "高値": "high", "最高": "high", "最高价": "high", "最高價": "high",
        "安値": "low", "最低": "low", "最低价": "low", "最低價": "low",
        "終値": "close", "收盘": "close", "收盘价": "close", "收盤": "close", "收盤價": "close",
        "出来高": "volume", "成交量": "volume",
    }
)  # fmt: skip
# "Last" / "price" in those languages (investing.com's localised "Price" column is the close).
_LOCALISED_LAST = (
    "zuletzt", "letzter", "dernier", "último", "ultimo", "laatste", "preço", "precio", "prezzo",
    "kurs", "ostatnio", "цена", "şimdi", "simdi", "senast",
)  # fmt: skip
# Every language above writes decimal commas; "max"/"min"/"opening" are shared with English.
_DECIMAL_COMMA_HEADERS = frozenset(
    name for names in _LOCALISED.values() for name in names if name not in ("max", "min", "opening")
) | frozenset(_LOCALISED_LAST)
# Fallbacks, used only when the primary column is absent: adjusted close (mixing it with
# unadjusted open/high/low is usually wrong), "price"/"last" (investing.com, exchange exports) and
# tick volume (MetaTrader exports carry both <TICKVOL> and <VOL>).
_FALLBACKS: dict[str, tuple[str, frozenset[str]]] = {
    # Exchange and broker exports (NSE/BSE, Bybit, Nasdaq Nordic), used only without the plain
    # name, which a file may hold beside them ("Volume" and "Total Volume"); first, so that
    # NSE's CLOSE_PRICE comes before its LAST_PRICE.
    "open price": ("open", frozenset({"open price", "opening price"})),
    "high price": ("high", frozenset({"high price"})),
    "low price": ("low", frozenset({"low price"})),
    "close price": ("close", frozenset({"close price", "closing price"})),
    "total volume": (
        "volume",
        frozenset({"total volume", "total traded quantity", "ttl trd qnty"}),
    ),
    "adj close": (
        "close",
        frozenset({"adj close", "adjclose", "adjusted close", "adj. close", "調整後終値"}),
    ),
    # Quandl's adjusted-only exports: one adjustment for every column, so they stay consistent.
    "adj open": ("open", frozenset({"adj open", "adj. open", "adjusted open"})),
    "adj high": ("high", frozenset({"adj high", "adj. high", "adjusted high"})),
    "adj low": ("low", frozenset({"adj low", "adj. low", "adjusted low"})),
    "adj volume": ("volume", frozenset({"adj volume", "adj. volume", "adjusted volume"})),
    "last": ("close", frozenset({"last", "last price", "price", *_LOCALISED_LAST})),
    "tick volume": ("volume", frozenset({"tickvol", "tick volume", "tickvolume", "ticks"})),
}
_FALLBACK_NAMES = frozenset().union(*(names for _, names in _FALLBACKS.values()))
# Timestamp column names, in order of preference.
_TIMESTAMP_ALIASES = (
    "timeopen",  # CoinMarketCap: the bar's open, before its close-time "timestamp"
    "timestamp",
    "datetime",
    "date time",
    "date/time",
    "date",
    "dates",
    "datum",
    "fecha",
    "data",
    "time",
    "gmt time",
    "utc time",
    "time utc",
    "time (utc)",
    "date (utc)",
    "timestamp utc",
    "datetime utc",
    "local time",
    "open time",
    "dtyyyymmdd",
    "trade date",
    "trading date",
    "day",
    "exchange date",
    "date1",  # NSE's full bhavcopy (sec_bhavdata_full), one symbol's rows kept
    "日付",
    "日期",
    "дата",
    "tarih",
    "时间",
    "時間",
    "время",
    "ts",
    "mts",
    "window start",
    "time period start",  # CoinAPI: the bar's start ("time_open" is its first trade)
    "ts event",  # Databento: the bar's open, in nanoseconds
    "unix",
    "unix timestamp",
    "t",
    "unnamed: 0",
    "index",
    "",
)
# Columns holding only the date; a "time" column next to one of them holds the time of day.
_DATE_ONLY_ALIASES = (
    "date",
    "dates",
    "datum",
    "fecha",
    "data",
    "dtyyyymmdd",
    "trade date",
    "trading date",
    "day",
    "exchange date",
    "date1",  # NSE's full bhavcopy (sec_bhavdata_full), one symbol's rows kept
    "日付",
    "日期",
    "дата",
    "tarih",
)
# A time-of-day column beside a date-only one (German, French, Spanish, Italian, Dutch exports;
# IEX's intraday "minute").
_TIME_OF_DAY_ALIASES = (
    "time", "zeit", "uhrzeit", "heure", "hora", "ora", "tijd", "время", "saat", "時刻",
    "時間", "时间", "minute",
)  # fmt: skip
_MISSING_STRINGS = {"", "nan", "na", "n/a", "null", "none", "nat"}
# Relative slack for the high/low consistency checks: values written to CSV with limited
# precision may disagree in the last digits; anything larger is a real data error.
_OHLC_RTOL = 1e-9
_SUFFIXES = (
    ".csv", ".csv.gz", ".tsv", ".tsv.gz", ".txt", ".txt.gz", ".zip", ".parquet", ".pq", ".xlsx",
)  # fmt: skip


def _norm(name: object) -> str:
    text = str(name).strip().lower().replace("_", " ").replace("-", " ")
    text = text.replace("<", "").replace(">", "").rstrip("*").rstrip(".")
    text = re.sub(r"\s*\([$€£¥]\)$", "", text)  # a currency sign as the unit: "Close ($)"
    text = re.sub(r"^\d\.\s+", "", text)  # Alpha Vantage's JSON keys: "1. open"
    return " ".join(text.split())


def _printable(text: str, limit: int = 400) -> str:
    """``text`` for a one-line message: control characters escaped (a binary file's bytes read
    as text), cut at ``limit`` characters."""
    text = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: object) -> str:
    """A short one-line rendering of an offending value."""
    if isinstance(value, float | np.floating):
        text = repr(float(value))
    elif isinstance(value, pd.Timestamp):
        text = str(value)
    else:
        text = repr(value.item() if isinstance(value, np.generic) else value)
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _stamp(ts: pd.Timestamp) -> str:
    """A timestamp for messages: the date alone when it is midnight."""
    return str(ts.date()) if ts == ts.normalize() else str(ts)


def _typed_decimals(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns of ``decimal.Decimal`` values (Parquet's decimal128, SQL exports) as floats: they
    are typed numbers, not text, so no decimal-mark guess may touch them (under German headers
    ``Decimal('100.000')`` would otherwise read as one hundred thousand)."""
    for col in frame.columns:
        if frame[col].dtype != object:
            continue

        # Not pandas' isna: a signalling NaN Decimal raises inside it. The first value present
        # settles most columns (text, timestamps) without a pass over all of them.
        def present(v: object) -> bool:
            return v is not None and not (isinstance(v, float) and v != v)

        first = next((v for v in frame[col] if present(v)), None)
        if not isinstance(first, decimal.Decimal):
            continue
        values = frame[col].tolist()
        if all(isinstance(v, decimal.Decimal) for v in values if present(v)):
            floats = [_decimal_float(v) if isinstance(v, decimal.Decimal) else math.nan
                      for v in values]  # fmt: skip
            frame[col] = np.asarray(floats, dtype=np.float64)
    return frame


def _decimal_float(value: decimal.Decimal) -> float:
    """A Decimal as a float; a signalling NaN (which float() refuses) is NaN, reported later."""
    return math.nan if value.is_nan() else float(value)


def _headerless(frame: pd.DataFrame, head_line: str) -> bool:
    """Whether pandas took a data row for the header: most labels are numbers or dates, none a
    known column name, and there are enough columns for time + open/high/low/close."""
    labels = list(frame.columns)
    data_like = sum(_looks_like_data(c) for c in labels)
    return len(labels) >= 5 and data_like >= len(labels) - 2 and _header_names(head_line) == 0


def _positional_names(frame: pd.DataFrame, label: str) -> list[str]:
    """Column names by position for a file without a header: ``time, open, high, low, close[,
    volume]`` (Binance klines, Kraken OHLCVT, NinjaTrader), or ``date, time, open, ...`` when
    the second field is a time of day (MetaTrader's history export). Later columns (Binance's
    close time, quote volume, trades, ...) are kept under neutral names and not used. The OHLC
    checks refuse a file whose order differs (high would fall below low).

    A price after the close (Kraken's REST OHLC puts the VWAP there, a headerless Yahoo file
    the adjusted close) is not taken for the volume: the column after it is, when it is no
    price itself; otherwise the file is read without volume (both said).
    """
    n = len(frame.columns)
    second = frame.iloc[:, 1].astype(str).str.strip()
    lead = ["date", "time"] if _fullmatch_all(second, _TIME_OF_DAY) else ["timestamp"]
    names = [*lead, "open", "high", "low", "close", "volume"][:n]
    names += [f"column {i + 1}" for i in range(len(names), n)]
    at = len(lead) + 4  # where the volume is read from
    why = _follows_prices(frame, len(lead), at) if n > at else None
    if why is not None:
        names[at] = f"column {at + 1}"
        if n > at + 1 and _follows_prices(frame, len(lead), at + 1) is None:
            names[at + 1] = "volume"
            then = f"volume is read from column {at + 2}"
        else:
            then = "the file is read without volume"
        log.warning(
            "%s: column %d %s: a price (a VWAP or an adjusted close), not a volume; %s",
            label,
            at + 1,
            why,
            then,
        )
    return names


def _loose_numbers(column: pd.Series) -> np.ndarray:
    """A column's numbers, decimal commas read as points; anything else NaN (for a check)."""
    text = column.astype(str).str.strip().str.replace(",", ".", regex=False)
    return pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64)


def _follows_prices(frame: pd.DataFrame, open_at: int, at: int) -> str | None:
    """How column ``at`` of a headerless frame shows itself a price rather than a count, or
    None: it lies inside every bar's low-high range, or it moves with the close (by the same
    factor on the bars where the close moved by 0.1% or more: an adjusted close between
    dividends). A volume does neither by chance over eight bars (a count inside each bar's
    range bar after bar: over fewer, a low-priced asset's volume in millions can be) or over
    three moved bars (moving with the close to 0.05%); repeated or constant volumes (tick counts
    of 1) are no evidence, as the close has to move for the second test to count a bar. (It
    needed 20 bars: a file of 12 Kraken REST bars had its VWAP read as the volume.)"""
    head = frame.iloc[:2000]
    high, low, close, value = (
        _loose_numbers(head.iloc[:, i]) for i in (open_at + 1, open_at + 2, open_at + 3, at)
    )
    ok = np.isfinite(high) & np.isfinite(low) & np.isfinite(close) & np.isfinite(value)
    if ok.sum() < 3:
        return None
    high, low, close, value = high[ok], low[ok], close[ok], value[ok]
    if np.ptp(value) == 0:  # a constant column (a placeholder volume) is no price
        return None
    slack = 1e-9 * np.maximum(np.abs(high), np.abs(low))
    if len(value) >= 8 and np.all((value >= low - slack) & (value <= high + slack)):
        return "lies within every bar's low-high range"
    if (value <= 0).any() or (close <= 0).any():
        return None
    moves = np.diff(np.log(close))
    moved = np.abs(moves) >= 1e-3
    if moved.sum() < 3:
        return None
    along = np.abs(np.diff(np.log(value))[moved] - moves[moved]) < 5e-4
    return "moves with the close" if along.mean() > 0.5 else None


def _read_source(source: str | Path | pd.DataFrame) -> tuple[pd.DataFrame, str]:
    if isinstance(source, pd.DataFrame):
        label = "<DataFrame>"
        frame = _unique_labels(_one_ticker_columns(source.copy(), label))
        return _typed_decimals(frame), label
    if not isinstance(source, str | Path):
        raise DataError(
            f"<{type(source).__name__}>: expected a file path or a pandas DataFrame, "
            f"got {type(source).__name__}"
        )
    path = Path(source)
    label = str(path)
    name = path.name.lower()
    suffix = next((s for s in _SUFFIXES if name.endswith(s)), None)
    if suffix is None:
        raise DataError(
            f"{label}: unknown file suffix {''.join(path.suffixes) or '(none)'!r} "
            f"(expected one of {', '.join(_SUFFIXES)})"
        )
    if not path.exists():
        if path.is_symlink():  # a link to nowhere, or a loop
            raise DataError(f"{label}: a symbolic link whose target does not resolve")
        raise DataError(f"{label}: file not found")
    if path.is_dir():
        raise DataError(f"{label}: is a directory, expected a file")
    if not path.is_file():  # a FIFO or a device: no size to check, and a read may block
        raise DataError(f"{label}: is not a regular file (a pipe or a device), expected a file")
    if path.stat().st_size == 0:
        raise DataError(f"{label}: file is empty")
    try:
        if suffix == ".xlsx":
            frame = _read_excel(path, label)
        elif suffix in (".parquet", ".pq"):
            _require_parquet_engine(label)
            frame = _unique_labels(_one_ticker_columns(pd.read_parquet(path), label))
            frame = _typed_decimals(frame)
            if isinstance(frame.index, pd.MultiIndex):  # (symbol, date): levels become columns
                frame = frame.reset_index()
        else:
            encoding, head = _sniff_text(path, suffix, label)
            skip = _leading_comments(head)
            sep = _delimiter(head[skip:])
            # Outside comma-delimited files the decimal mark is not known in advance ("12.345"
            # may be 12345 in a German file): read text and decide once for the whole file.
            dtype = None if sep == "," else str
            try:
                frame = _read_csv(path, sep, dtype, encoding, skip, label)
            except UnicodeDecodeError:
                if encoding != "utf-8-sig":
                    raise
                # Not UTF-8: Windows-1252 is what Excel in Western Europe writes (Eröffnung
                # with the byte 0xF6), Shift-JIS what Japanese brokers write (日付,始値).
                fallback = "cp932" if _shift_jis_header(path, label) else "cp1252"
                try:
                    frame = _read_csv(path, sep, dtype, fallback, skip, label)
                except UnicodeDecodeError:
                    raise DataError(
                        f"{label}: cannot read file: not text (neither UTF-8, UTF-16 nor "
                        "Windows-1252)"
                    ) from None
                # Said once the fallback has read the file: never before an error saying it
                # could not.
                log.warning(
                    "%s: not UTF-8 text; reading it as %s",
                    label,
                    "Shift-JIS" if fallback == "cp932" else "Windows-1252",
                )
            commented = [
                line for line in head[:skip] if line.startswith("#") and _header_names(line) >= 3
            ]
            if not commented and _headerless(frame, head[skip] if skip < len(head) else ""):
                frame = _read_csv(path, sep, dtype, encoding, skip, label, header=None)
                frame.columns = _positional_names(frame, label)
                frame.attrs["positional"] = True
                log.warning(
                    "%s: no header row; columns read by position as %s (the layout of "
                    "Binance, Kraken, MetaTrader and NinjaTrader exports)",
                    label,
                    ", ".join(c for c in frame.columns if not c.startswith("column ")),
                )
            # Rows with every field empty at the end of a file (Excel writes ",,,,,") carry
            # nothing; any other row with a missing value is still refused.
            filled = frame.notna().to_numpy().any(axis=1)
            if len(frame) and not filled[-1]:
                frame = frame.iloc[: int(np.flatnonzero(filled)[-1]) + 1 if filled.any() else 0]
            frame.attrs["delimiter"] = sep
            if not frame.attrs.get("positional") and skip < len(head):
                frame.attrs["repeated"] = _repeated_header_names(head[skip], sep)
            if commented:
                frame.attrs["commented_header"] = commented[-1]
            frame = _yfinance_layout(frame, label, head[skip - 1] if 0 < skip <= len(head) else "")
    except DataError:
        raise
    except pd.errors.EmptyDataError:
        raise DataError(f"{label}: file is empty (no header row)") from None
    except (
        pd.errors.ParserError,
        UnicodeDecodeError,
        OSError,
        ValueError,
        zipfile.BadZipFile,  # a damaged archive: bad CRC, truncated member
        zlib.error,
        EOFError,  # a truncated gzip download
        RuntimeError,  # zipfile: an encrypted member needs a password
    ) as exc:
        raise DataError(f"{label}: cannot read file: {first_line(exc)}") from None
    return frame, label


def _unique_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """Repeated column labels (``pd.concat(axis=1)``, a sheet with two ``Date`` headers) renamed
    as pandas' CSV reader renames them (``Date``, ``Date.1``), so that every source reaches the
    column search alike: a repeat of a column it reads is refused there, others are ignored."""
    if isinstance(frame.columns, pd.MultiIndex) or frame.columns.is_unique:
        return frame
    seen: dict[object, int] = {}
    labels: list[object] = []
    taken = set(frame.columns)
    for col in frame.columns:
        count = seen.get(col, 0)
        seen[col] = count + 1
        label = col
        while count and label in taken:  # x, x, x.1: the second x becomes x.2
            label, count = f"{col}.{count}", count + 1
        taken.add(label)
        labels.append(label)
    frame.columns = labels
    frame.attrs["repeated"] = [col for col, count in seen.items() if count > 1]
    return frame


def _repeated_header_names(line: str, sep: str) -> list[str]:
    """The names a CSV header line writes more than once (pandas reads the second ``Close`` as
    ``Close.1``, indistinguishable from a column really named ``Close.1``)."""
    if len(sep) != 1:  # a pattern: r"\s+" for space-aligned columns
        names = re.split(sep, line.strip())
    else:
        try:
            names = next(csv.reader([line], delimiter=sep, skipinitialspace=True), [])
        except csv.Error:
            return []
    return sorted({n for n in names if names.count(n) > 1})


def _one_ticker_columns(frame: pd.DataFrame, label: str) -> pd.DataFrame:
    """yfinance's ``download()`` frame, columns ``(Price, Ticker)``: one ticker's level is
    dropped (as in its CSV layout); several tickers are refused."""
    if not isinstance(frame.columns, pd.MultiIndex) or frame.columns.nlevels != 2:
        return frame
    for level in (1, 0):
        names = frame.columns.get_level_values(1 - level)
        if sum(_norm(n) in _ALIASES for n in names.unique()) < 3:
            continue  # not the price names: the other level may be
        tickers = sorted({str(t) for t in frame.columns.get_level_values(level)})
        if len(tickers) > 1:
            raise DataError(
                f"{label}: its two-level columns hold {len(tickers)} sets of prices "
                f"({', '.join(tickers[:5])}); foxhunt trades one series per frame: select "
                f"one, e.g. df.xs({tickers[0]!r}, axis=1, level={level})"
            )
        return frame.droplevel(level, axis=1)
    return frame


def _require_parquet_engine(label: str) -> None:
    """pandas reads Parquet through pyarrow (or fastparquet), which foxhunt installs only with
    its ``parquet`` extra: say so in one line instead of pandas' ImportError traceback."""
    for engine in ("pyarrow", "fastparquet"):
        try:
            __import__(engine)
            return
        except ImportError:
            continue
    raise DataError(
        f"{label}: reading Parquet files needs pyarrow: pip install 'foxhunt[parquet]' (or "
        "pyarrow; or save the data as CSV)"
    )


def _read_excel(path: Path, label: str) -> pd.DataFrame:
    """The first sheet holding data, its header found as in a CSV (title rows above it are
    skipped; a sheet without one is read by position). Cells keep Excel's types: dates are
    dates and numbers numbers, so no date format or decimal mark is guessed."""
    try:
        import openpyxl
    except ImportError:
        raise DataError(
            f"{label}: reading Excel files needs openpyxl: pip install 'foxhunt[excel]' (or "
            "openpyxl; or save the sheet as CSV)"
        ) from None
    try:
        book = openpyxl.load_workbook(path, read_only=True)
        visible = [ws.title for ws in book.worksheets if ws.sheet_state == "visible"]
        epoch = pd.Timestamp(book.epoch)  # 1899-12-30, or 1904-01-01 (old Mac workbooks)
        book.close()
        sheets = pd.read_excel(path, sheet_name=visible, header=None) if visible else {}
    except Exception as exc:  # zipfile/openpyxl/XML errors of a damaged workbook alike
        raise DataError(
            f"{label}: cannot read file as an .xlsx workbook (an old .xls, or a password-"
            f"protected one? save it as .xlsx or CSV): {first_line(exc)}"
        ) from None
    filled = [
        (name, _sheet_frame(sheet.dropna(how="all").dropna(axis=1, how="all"), label))
        for name, sheet in sheets.items()
        if not sheet.dropna(how="all").empty
    ]
    if not filled:
        raise DataError(f"{label}: no visible sheet holds data")
    # Notes or a summary often come first: the first sheet with price columns is the data.
    priced = [(n, f) for n, f in filled if _has_prices(f)]
    name, frame = (priced or filled)[0]
    if len(filled) > 1:
        log.warning(
            "%s: read sheet %r (the workbook also has %s)",
            label,
            name,
            ", ".join(repr(n) for n, _ in filled if n != name),
        )
    if frame.attrs.get("positional"):
        log.warning(
            "%s: sheet %r has no header row; columns read by position as %s",
            label,
            name,
            ", ".join(c for c in frame.columns if not c.startswith("column ")),
        )
    return _excel_serial_dates(frame, epoch, label)


def _excel_serial_dates(frame: pd.DataFrame, epoch: pd.Timestamp, label: str) -> pd.DataFrame:
    """Timestamp columns holding Excel's serial day numbers (a date cell in General format:
    45293 is 2024-01-02, 45293.3958 09:30 that day) as dates. Serials from 2200 (1906) up never
    meet a year (1800-2200), YYYYMMDD (8 digits) or an epoch time (from 1e8)."""
    dated = any(_norm(c) in _DATE_ONLY_ALIASES for c in frame.columns)
    for col in frame.columns:
        values = frame[col]
        if _norm(col) not in _TIMESTAMP_ALIASES or not pd.api.types.is_numeric_dtype(values):
            continue
        if dated and _norm(col) in _TIME_OF_DAY_ALIASES:
            continue  # a time of day beside the date (93000 is 09:30:00), not a serial
        days = values.to_numpy(dtype=np.float64)
        latest = (pd.Timestamp(pd.Timestamp.now().year + 2, 1, 1) - epoch).days  # as for epochs
        if not len(days) or not np.all((days > 2200) & (days < latest)):
            continue
        stamps = epoch + pd.to_timedelta(days, unit="D")
        frame[col] = pd.DatetimeIndex(stamps).round("s")  # Excel keeps ~1 us
        log.warning(
            "%s: column %r holds Excel serial day numbers (%s is %s); read as dates",
            label,
            str(col),
            _number(days[0]),
            _stamp(frame[col].iloc[0]),
        )
    return frame


def _sheet_frame(raw: pd.DataFrame, label: str) -> pd.DataFrame:
    """A sheet's cells as a frame: its header found as in a CSV, or columns by position."""
    lines = [
        ",".join("" if pd.isna(v) else str(v) for v in row)
        for row in raw.head(50).itertuples(index=False)
    ]
    skip = _leading_comments(lines)
    names = [
        f"column {i + 1}" if pd.isna(v) else str(v).strip() for i, v in enumerate(raw.iloc[skip])
    ]
    frame = _unique_labels(raw.iloc[skip + 1 :].reset_index(drop=True).set_axis(names, axis=1))
    if _headerless(frame, lines[skip]):
        frame = raw.iloc[skip:].reset_index(drop=True)
        frame.columns = _positional_names(frame, label)
        frame.attrs["positional"] = True
    return frame.infer_objects()


def _has_prices(frame: pd.DataFrame) -> bool:
    """Whether a frame has columns this loader reads as open, high, low and close."""
    try:
        _find_columns(frame, "")
    except DataError:
        return False
    return True


def _read_csv(
    path: Path,
    sep: str,
    dtype: type | None,
    encoding: str,
    skip: int,
    label: str,
    header: int | None = 0,
) -> pd.DataFrame:
    source: Path | io.BytesIO = path
    name = path.name.lower()
    # The one member of a ZIP, whatever else the archive holds; gzip without its suffix.
    if name.endswith(".zip") or (not name.endswith(".gz") and _is_gzip(path)):
        with _open_bytes(path, label) as f:
            source = io.BytesIO(f.read())
    with warnings.catch_warnings(record=True) as caught:
        # index_col=False: data rows with a trailing delimiter the header lacks must not turn
        # the first column into the index and shift every other column one place left.
        warnings.simplefilter("always", pd.errors.ParserWarning)
        frame = pd.read_csv(
            source,
            sep=sep,
            skipinitialspace=True,
            dtype=dtype,
            encoding=encoding,
            skiprows=skip,
            index_col=False,
            header=header,
        )
    if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
        # Some row has more fields than the header: pandas dropped the extras. Harmless when
        # they are empty (a trailing delimiter); otherwise say where.
        with _open_bytes(path, label) as f:
            lines = f.read().decode(encoding, errors="replace").splitlines()
        _check_field_counts(lines[skip:], sep, skip + 1, label)
    return frame


def _zip_member(archive: zipfile.ZipFile, label: str) -> str:
    """The one data file of a ZIP archive (Binance's data.binance.vision downloads hold one
    CSV); macOS metadata and folders do not count."""
    names = [
        n
        for n in archive.namelist()
        if not n.endswith("/")
        and not n.startswith("__MACOSX/")
        and not n.split("/")[-1].startswith(".")
    ]
    if len(names) != 1:
        raise DataError(
            f"{label}: a ZIP archive must hold exactly one data file, got {len(names)}: "
            f"{', '.join(names[:5]) or '(none)'}"
        )
    member = names[0]
    if member.lower().endswith((".parquet", ".pq", ".xlsx", ".xls", ".gz", ".zip")):
        raise DataError(
            f"{label}: the archive's file {member!r} is not a CSV or text file; extract it and "
            "pass it directly"
        )
    return member


@contextlib.contextmanager
def _open_bytes(path: Path, label: str) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed: gzip by its suffix, the one member of a ZIP archive."""
    name = path.name.lower()
    if name.endswith(".zip"):
        try:
            archive = zipfile.ZipFile(path)
        except zipfile.BadZipFile:
            raise DataError(f"{label}: cannot read file: not a ZIP archive") from None
        with archive, archive.open(_zip_member(archive, label)) as member:
            yield member
    elif name.endswith(".gz") or _is_gzip(path):  # or gzip saved without its suffix
        with gzip.open(path, "rb") as f:
            yield f  # type: ignore[misc]
    else:
        with open(path, "rb") as f:
            yield f


def _is_gzip(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except OSError:
        return False  # the caller's own open reports it


def _sniff_text(path: Path, suffix: str, label: str = "") -> tuple[str, list[str]]:
    """The text encoding (UTF-16 by its BOM, else UTF-8) and the first lines of a CSV."""
    try:
        with _open_bytes(path, label or str(path)) as f:
            raw = f.read(1 << 16)
    except (OSError, EOFError):
        return "utf-8-sig", []  # pandas reports the real problem with the file
    encoding = "utf-16" if raw.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8-sig"
    if encoding != "utf-16" and len(raw) >= 16:
        # UTF-16 without its BOM: every other byte of ASCII text is zero.
        if raw[1::2].count(0) > 0.4 * len(raw[1::2]):
            encoding = "utf-16-le"
        elif raw[0::2].count(0) > 0.4 * len(raw[0::2]):
            encoding = "utf-16-be"
    return encoding, raw.decode(encoding, errors="replace").splitlines()[:50]


def _shift_jis_header(path: Path, label: str) -> bool:
    """Whether a file that is not UTF-8 shows more known column names as Shift-JIS (日付,始値)
    than as Windows-1252 (Eröffnung): both decode most bytes, so the names decide."""
    with _open_bytes(path, label) as f:
        raw = f.read(1 << 16)
    raw = raw[: raw.rfind(b"\n") + 1] or raw  # no character cut in half at the end

    def names(encoding: str) -> int:
        lines = raw.decode(encoding, errors="replace").splitlines()[:40]
        return max((_header_names(line) for line in lines), default=0)

    return names("cp932") > names("cp1252")


def _header_names(line: str) -> int:
    """How many fields of a line are column names this loader knows (date, open, close, ...)."""
    names = [_norm(f.strip('"')) for f in re.split(r"[,;\t|]", line)]
    return sum(n in _ALIASES or n in _FALLBACK_NAMES or n in _TIMESTAMP_ALIASES[:-1] for n in names)


def _leading_comments(lines: list[str]) -> int:
    """Lines before the header: blank, starting with '#', or a single field (the URL line that
    CryptoDataDownload puts first, a title); or lines holding a delimiter (a title such as
    ``Apple Inc., daily prices``, Bloomberg's ``Security,AAPL US Equity`` block) when a later
    line among the first 40 is the header and they are not."""
    n = 0
    for line in lines:
        text = line.strip()
        if re.fullmatch(r'"?sep=.?"?', text, flags=re.IGNORECASE):
            n += 1  # Excel's delimiter hint (sep=;), Nasdaq Nordic's first line
            continue
        if text and not text.startswith("#") and any(d in text for d in ",;\t|"):
            break
        n += 1
    if n >= len(lines):
        return 0
    if _header_names(lines[n]) < 3:
        # Bloomberg and broker exports put a block of "Field,value" lines (security, dates,
        # currency, ...) before the header: look past a good many of them.
        for k in range(n + 1, min(n + 40, len(lines))):
            if _header_names(lines[k]) >= 3:
                return k
    return n


def _check_field_counts(lines: list[str], sep: str, first_row: int, label: str) -> None:
    """Refuse data rows with more non-empty fields than the header has names: an unquoted
    delimiter inside a value (``Jan 02, 2023``) would otherwise shift every later column. A
    trailing empty field (a delimiter at the end of each row) is harmless."""
    if sep == _WHITESPACE:
        reader: Iterator[list[str]] = iter([line.split() for line in lines])
    else:
        reader = csv.reader(lines, delimiter=sep, skipinitialspace=True)
    header = next(reader, None)
    if header is None:
        return
    names = len(header)
    for i, row in enumerate(reader, start=1):
        if any(field.strip() for field in row[names:]):
            raise DataError(
                f"{label}: line {first_row + i}: {len(row)} fields but the header has {names} "
                f"(an unquoted {'space' if sep == _WHITESPACE else repr(sep)} inside a "
                f"value?): {_fmt(lines[i])}"
            )


def _delimiter(head: list[str]) -> str:
    """The field delimiter of a CSV: whichever of , ; tab | splits the header line most, or runs
    of spaces when the header has none of those but several space-separated names."""
    header = re.sub(r'"[^"]*"', "", head[0] if head else "")  # quoted names do not count
    counts = {d: header.count(d) for d in (",", ";", "\t", "|")}
    best = max(counts, key=lambda d: counts[d])
    if counts[best] > 0:
        return best
    return _WHITESPACE if len(header.split()) >= 5 else ","


_WHITESPACE = r"\s+"  # pandas' regex for space-aligned columns (some broker and terminal exports)


def _yfinance_layout(frame: pd.DataFrame, label: str, above: str = "") -> pd.DataFrame:
    """yfinance's ``download(...).to_csv()``: header ``Price,Close,...``, then a ``Ticker`` row
    and a ``Date`` row; with ``group_by="ticker"`` a ``Ticker,AAPL,...`` line (``above``, the
    line before the header, skipped as a title) and then ``Price,Open,...`` and a ``Date`` row.
    One ticker is read as an ordinary file; several are refused."""
    if len(frame) < 2 or len(frame.columns) < 2 or _norm(frame.columns[0]) != "price":
        return frame
    first, second = (_norm(frame.iloc[i, 0]) for i in (0, 1))
    if first == "ticker" and second in ("date", "datetime"):
        tickers = {str(t).strip() for t in frame.iloc[0, 1:] if pd.notna(t) and str(t).strip()}
        dates_row = 1
    elif (
        first in ("date", "datetime")
        and frame.iloc[0, 1:].isna().all()
        and (fields := [f.strip().strip('"') for f in re.split(r"[,;\t]", above)])
        and _norm(fields[0]) == "ticker"
    ):
        tickers = {f for f in fields[1:] if f}
        dates_row = 0
    else:
        return frame
    if len(tickers) > 1:
        ordered = sorted(tickers)
        raise DataError(
            f"{label}: holds {len(ordered)} tickers ({', '.join(ordered[:5])}); foxhunt trades "
            "one instrument per file: download or save one ticker at a time"
        )
    out = frame.iloc[dates_row + 1 :].reset_index(drop=True)
    return out.rename(columns={frame.columns[0]: str(frame.iloc[dates_row, 0]).strip()})


# "Open (USD)": a currency as the unit.
_UNIT = re.compile(
    r"\s*\((?:usd|eur|gbp|jpy|chf|cad|aud|nzd|cny|hkd|sgd|inr|krw|brl|rub|try|sek|nok|dkk|pln"
    r"|zar|mxn|btc|eth|usdt|usdc)\)$"
)


def _relaxed_name(col: object) -> str | None:
    """open/high/low/close under a vendor's longer name: CoinAPI's ``price_open``, ``OpenPrice``,
    ``Open (USD)``, quantmod's ``AAPL.Open`` (and ``AAPL.Volume``), OANDA's ``mid_o``. Otherwise
    prices only: volume names have their own rules (``Volume (BTC)`` beside ``Volume (USD)``
    are two volumes, not one name twice), and a bid or ask price stays unknown (which of them
    is the bar's is the user's choice)."""
    text = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", str(col).strip())  # OpenPrice -> Open Price
    key = _UNIT.sub("", _norm(text))
    if re.fullmatch(r"[a-z0-9^=]+\.[a-z]+", key):  # AAPL.Open, AAPL.Volume (R's quantmod)
        prefix, name = key.split(".", 1)
        if prefix in ("bid", "ask"):  # OANDA's bid.o flattened: not the bar's price
            return None
        canon = _ALIASES.get(name)
        return canon if canon in (*_PRICE_COLUMNS, "volume") else None
    key = " ".join(w for w in key.split() if w not in ("price", "mid"))
    if key == _norm(col):
        return None  # nothing relaxed: the strict lookup has spoken
    canon = _ALIASES.get(key)
    return canon if canon in _PRICE_COLUMNS else None


def _find_columns(frame: pd.DataFrame, label: str) -> dict[str, object]:
    """Map canonical names to the source's own column labels (fallback names last)."""
    found: dict[str, object] = {}
    fallback: dict[str, object] = {}
    relaxed: dict[str, list[object]] = {}  # longer spellings: used only without the plain name
    for col in frame.columns:
        key = _norm(col)
        canon = _ALIASES.get(key)
        if canon is None:
            kind = next((k for k, (_, names) in _FALLBACKS.items() if key in names), None)
            if kind is not None:
                fallback.setdefault(kind, col)
            elif (spelled := _relaxed_name(col)) is not None:
                relaxed.setdefault(spelled, []).append(col)
            continue
        if canon in found:
            raise DataError(
                f"{label}: columns {str(found[canon])!r} and {str(col)!r} both name {canon!r}; "
                "keep one"
            )
        found[canon] = col
    for canon, cols in relaxed.items():
        if canon in found:
            continue
        if len(cols) > 1:
            raise DataError(
                f"{label}: columns {str(cols[0])!r} and {str(cols[1])!r} both name {canon!r}; "
                "keep one"
            )
        found[canon] = cols[0]
    for kind, (canon, _) in _FALLBACKS.items():
        if canon not in found and kind in fallback:
            found[canon] = fallback[kind]
    _adjustment_notes(frame, found, fallback, label)
    if "volume" not in found:
        volume = _volume_variant(frame, label)
        if volume is not None:
            found["volume"] = volume
    if "tick volume" in fallback and found.get("volume") != fallback["tick volume"]:
        found["tick volume"] = fallback["tick volume"]  # used if the real volume is all zero
    missing = [c for c in _PRICE_COLUMNS if c not in found]
    if missing:
        seen = _printable(", ".join(str(c) for c in frame.columns)) or "(none)"
        if sum(_looks_like_data(c) for c in frame.columns) >= 3:
            if "commented_header" in frame.attrs:
                raise DataError(
                    f"{label}: the header is commented out "
                    f"({_fmt(frame.attrs['commented_header'])}): remove the '#'"
                )
            if label == "<DataFrame>":  # pd.DataFrame(exchange.fetch_ohlcv(...)): 0, 1, 2, ...
                raise DataError(
                    f"{label}: the column names look like data or positions, not names "
                    f"(found: {seen}); name the columns, e.g. df.columns = ['date', 'open', "
                    "'high', 'low', 'close', 'volume']"
                )
            raise DataError(
                f"{label}: the first line looks like data, not a header (found: {seen}); add a "
                "header row such as date,open,high,low,close,volume"
            )
        raise DataError(f"{label}: missing column(s) {', '.join(missing)} (found: {seen})")
    _once(frame, tuple(found.values()), label)
    return found


def _adjustment_notes(
    frame: pd.DataFrame, found: dict[str, object], fallback: dict[str, object], label: str
) -> None:
    """Say when adjusted and unadjusted prices meet: an adjusted close beside unadjusted
    open/high/low, or unadjusted prices used where adjusted ones show a split the unadjusted
    series jumps over (Quandl's WIKI files: a 7:1 split reads as a -86% bar)."""
    adjusted = fallback.get("adj close")
    if adjusted is None:
        return
    if found.get("close") == adjusted:
        present = [c for c in ("open", "high", "low") if c in found]
        unadjusted = [str(found[c]) for c in present]
        if unadjusted and all(found[c] != fallback.get(f"adj {c}") for c in present):
            frame.attrs["adjusted_close"] = str(adjusted)  # the OHLC checks' errors say so too
            log.warning(
                "%s: close read from %r beside unadjusted %s: the bars mix adjusted and "
                "unadjusted prices",
                label,
                str(adjusted),
                ", ".join(repr(c) for c in unadjusted),
            )
        return
    if "close" not in found:
        return  # refused as a missing column by the caller
    close = pd.to_numeric(frame[found["close"]], errors="coerce").to_numpy(dtype=np.float64)
    adj = pd.to_numeric(frame[adjusted], errors="coerce").to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.abs(np.diff(np.log(adj / close)))
    jumps = np.flatnonzero(np.nan_to_num(steps) > np.log(1.1))
    if len(jumps):
        pos = int(jumps[0]) + 1
        log.warning(
            "%s: %r and %r part by %.2fx at data row %d (a split?): the unadjusted %r is "
            "used and jumps there; keep only adjusted columns to train on those",
            label,
            str(found["close"]),
            str(adjusted),
            float(np.exp(steps[pos - 1])),
            pos + 1,
            str(found["close"]),
        )


_INSTRUMENT_COLUMNS = ("symbol", "ticker", "instrument", "isin", "asset", "pair", "security")
# Words that may name an instrument column (Kaggle's "Name", Tushare's "ts_code", Refinitiv's
# "RIC", MOEX's "SECID"). Such a column may also change where one series rolls from contract to
# contract (Databento's "instrument_id"), so it is only warned about, or named in an error.
_INSTRUMENT_WORDS = frozenset(
    {"symbol", "ticker", "instrument", "isin", "asset", "pair", "security", "name", "code"}
    | {"ric", "secid", "stock", "sym", "figi", "cusip", "sedol", "permno", "contract", "coin"}
)


# Words that make such a name something else: "Day Name", "regime_name", "Exchange Code".
_NOT_INSTRUMENT_WORDS = frozenset(
    {"day", "weekday", "week", "month", "regime", "period", "session", "exchange", "currency"}
    | {"unit", "units", "file", "source", "country", "sector", "industry", "condition", "type"}
    | {"volume", "splits", "split", "cap", "size", "index", "count", "trades", "dividends"}
    | {"interest", "status", "signal", "class"}
)


def _instrument_column(
    frame: pd.DataFrame, known: Iterable[object], rows: np.ndarray | None = None
) -> str | None:
    """The first column besides the ``known`` ones (prices, time, regimes) whose name suggests
    an instrument and whose value varies (over ``rows`` only, when given)."""
    taken = {str(c) for c in known}
    for col in frame.columns:
        words = set(_norm(col).split())
        if (
            str(col) not in taken
            and _INSTRUMENT_WORDS & words
            and not _NOT_INSTRUMENT_WORDS & words
            and not pd.api.types.is_float_dtype(frame[col].dtype)  # a measurement, not an id
        ):
            values = frame[col] if rows is None else frame[col].iloc[rows]
            if values.dropna().astype(str).str.strip().nunique() > 1:
                return str(col)
    return None


def _one_instrument(frame: pd.DataFrame, label: str) -> None:
    """Refuse a file that stacks several instruments (a symbol column with more than one value):
    read as one series, its bars would interleave and fail the time-order check confusingly,
    or, one instrument's dates after another's, load as one series with a jump between them."""
    for col in frame.columns:
        if _norm(col) in _INSTRUMENT_COLUMNS:
            names = frame[col].dropna().astype(str).str.strip().unique()
            if len(names) > 1:
                raise DataError(
                    f"{label}: column {str(col)!r} holds {len(names)} instruments "
                    f"({', '.join(map(str, names[:5]))}); foxhunt trades one instrument per file: "
                    "keep the rows of one"
                )


# Words that may qualify a volume column's name without changing what it counts.
_VOLUME_QUALIFIERS = frozenset(
    {"base", "quote", "asset", "total", "traded", "trade", "shares", "contracts", "units", "in"}
    | {"from", "to", "usd", "usdt", "usdc", "busd", "eur", "gbp", "jpy", "btc", "eth"}
)
# Upper-case words that are indicators, not currency or asset codes (``Volume SMA``).
_VOLUME_INDICATORS = frozenset({"SMA", "EMA", "WMA", "OBV", "AVG", "OSC", "RSI", "VWAP", "MACD"})


def _volume_words(col: object) -> list[str]:
    """A column name's words; CryptoCompare's ``volumefrom`` / ``volumeto`` (base and quote
    volume) count as ``volume from`` / ``volume to``."""
    text = re.sub(r"(?i)\b(volume)(from|to)\b", r"\1 \2", str(col))
    return re.sub(r"[()\[\]_\-/]", " ", text).split()


def _plain_volume_name(col: object) -> bool:
    """``Volume BTC``, ``volume_usd``, ``base_volume``, ``quote_asset_volume``: a volume in some
    unit. Not ``Volume MA``, ``Up Volume``, ``Relative Volume``, ``taker_buy_base_asset_volume``:
    indicators and partial volumes would feed the volume feature something else."""
    words = _volume_words(col)
    if not {"volume", "vol"} & {w.lower() for w in words}:
        return False
    for word in words:
        low = word.lower()
        if low in ("volume", "vol") or low in _VOLUME_QUALIFIERS:
            continue
        code = word.isalpha() and word.isupper() and 3 <= len(word) <= 5  # BTC, USDT
        if not (code and word not in _VOLUME_INDICATORS):
            return False
    return True


def _volume_variant(frame: pd.DataFrame, label: str) -> object | None:
    """A volume column under a qualified name (see :func:`_plain_volume_name`): base-asset
    volume before quote-asset volume, the first of equals."""
    candidates = [col for col in frame.columns if _plain_volume_name(col)]
    if not candidates:
        return None
    quote = {"quote", "to", "usd", "usdt", "usdc", "eur"}
    base = [c for c in candidates if not quote & {w.lower() for w in _volume_words(c)}]
    chosen = (base or candidates)[0]
    if len(candidates) > 1:
        log.warning(
            "%s: volume read from %r (also found %s)",
            label,
            str(chosen),
            ", ".join(repr(str(c)) for c in candidates if c is not chosen),
        )
    return chosen


def _looks_like_data(name: object) -> bool:
    """Whether a column label is a number or a date (pandas took a data row as the header)."""
    text = str(name).strip()
    if re.fullmatch(r"[+-]?\d+([.,]\d+)?(\.\d+)?", text):
        return True
    return bool(re.fullmatch(r"\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}([ T].*)?", text))


# Midnight after a date, as spreadsheets, pandas and .NET write it (00:00:00, T00:00:00Z, a zero
# UTC offset, 12:00:00 AM).
_MIDNIGHT = (
    r"(?:[ T]+0?0:00(?::00(?:\.0+)?)?\s?(?:Z|[+-]00:?00)?|\s+12:00(?::00)?\s*[Aa]\.?[Mm]\.?)$"
)


def _once(frame: pd.DataFrame, cols: tuple[object, ...], label: str) -> None:
    """Refuse a column read for the bars whose name the header repeats: which one holds the
    data cannot be known. (The readers name a repeat ``Close.1``, as pandas' CSV reader does,
    and record the repeated names: a column really named ``Close.1`` is no repeat.)"""
    repeated = frame.attrs.get("repeated", ())
    for col in cols:
        if col in repeated:
            raise DataError(
                f"{label}: the header names column {str(col)!r} twice; keep one (or rename one)"
            )


def _timestamp_source(frame: pd.DataFrame, label: str) -> tuple[pd.Series, str]:
    """The raw timestamp values and the name to report them under."""
    by_norm: dict[str, object] = {}
    for col in frame.columns:
        by_norm.setdefault(_norm(col), col)
    for col in frame.columns:  # a zone after the name: Dukascopy's "Time (EET)"
        m = re.fullmatch(r"(.+?)\s*\(([^()]+)\)", _norm(col))
        if m and m[1] in _TIMESTAMP_ALIASES and _header_zone(m[2]) and m[1] not in by_norm:
            by_norm[m[1]] = col
            if m[2].upper() not in ("UTC", "GMT"):
                log.warning(
                    "%s: column %r: times kept as written, in %s local time (not converted to UTC)",
                    label,
                    str(col),
                    m[2].upper() if "/" not in m[2] else m[2],
                )
    has = {alias for alias in _TIMESTAMP_ALIASES if alias in by_norm}
    # Separate date and time columns (MetaTrader, MetaStock/Stooq exports) are joined into one.
    date_alias = next((a for a in _DATE_ONLY_ALIASES if a in has), None)
    time_alias = next((a for a in _TIME_OF_DAY_ALIASES if a in by_norm), None)
    if date_alias and time_alias and not has & {"timestamp", "datetime", "date time"}:
        dcol = by_norm[date_alias]
        dates = frame[dcol].astype(str).str.strip()
        times = frame[by_norm[time_alias]]
        if (
            dates.str.contains(r"\d{1,2}:\d{2}", regex=True).any()
            and dates.str.contains(_MIDNIGHT, regex=True).all()
            and (
                pd.api.types.is_timedelta64_dtype(times.dtype)
                or pd.api.types.is_float_dtype(times.dtype)
                or times.astype(str)
                .str.strip()
                .str.fullmatch(
                    r"\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s*[AaPp]\.?[Mm]\.?)?|\d{1,6}"
                )
                .all()
            )
        ):  # a date written with its midnight (Excel, Timestamp objects) beside the time
            dates = dates.str.replace(_MIDNIGHT, "", regex=True)
        # Only a column of dates takes a time of day: one that already holds the time (a
        # "date" of 2023-01-02 10:00 beside hour and minute columns) is a timestamp itself.
        if not dates.str.contains(r"\d{1,2}:\d{2}", regex=True).any():
            if time_alias == "minute" and "hour" in by_norm:  # the time is both together
                hcol, mcol = by_norm["hour"], by_norm["minute"]
                _once(frame, (dcol, hcol, mcol), label)
                clock = _two_digits(frame[hcol]) + ":" + _two_digits(frame[mcol])
                return (dates + " " + clock).reset_index(drop=True), f"{dcol}+{hcol}+{mcol}"
            tcol = by_norm[time_alias]
            _once(frame, (dcol, tcol), label)
            joined = dates + " " + _clock_times(frame[tcol], label, str(tcol))
            return joined.reset_index(drop=True), f"{dcol}+{tcol}"
    for alias in _TIMESTAMP_ALIASES:
        if alias in by_norm:
            col = by_norm[alias]
            _once(frame, (col,), label)
            return frame[col].reset_index(drop=True), str(col)
    index = frame.index
    if isinstance(index, pd.DatetimeIndex) or _norm(index.name) in _TIMESTAMP_ALIASES[:-1]:
        return pd.Series(index, dtype=index.dtype), str(index.name or "index")
    seen = ", ".join(str(c) for c in frame.columns) or "(none)"
    raise DataError(
        f"{label}: no timestamp column (looked for date, datetime, time, timestamp or a "
        f"DatetimeIndex; found: {seen})"
    )


def _bar_timestamps(
    frame: pd.DataFrame, found: dict[str, object], label: str
) -> tuple[pd.DataFrame, pd.DatetimeIndex, str]:
    """The bars' timestamps and the column they came from, with the frame they belong to: less
    a vendor's footer, when one stops the timestamps from reading, else read from another
    timestamp column, else the timestamp column's own error."""
    ts_raw, column = _timestamp_source(frame, label)
    try:
        return frame, _parse_timestamps(ts_raw, label, column), column
    except DataError as err:
        error = err
    # A second header row of units (",USD,USD,...", "yyyy-mm-dd,USD,...") and a vendor's footer
    # (Barchart's "Downloaded from ...", investing.com's "Highest: ...", a totals row): no
    # timestamp and no prices. Dropped (either, or both), and said; later messages still
    # number rows as the file does.
    head = _leading_unit_rows(frame, found, ts_raw, label, column)
    footer = _footer_rows(frame, found, ts_raw, label, column)
    tries = [(head, 0), (0, footer), (head, footer)]
    for h, f in dict.fromkeys(t for t in tries if any(t) and t[0] + t[1] < len(frame)):
        kept = frame.iloc[h : len(frame) - f].reset_index(drop=True)
        try:  # the source again: a footer may have hidden a date + time-of-day layout
            kept_raw, kept_column = _timestamp_source(kept, label)
            stamps = _parse_timestamps(kept_raw, label, kept_column)
        except DataError:
            continue
        if h:
            log.warning(
                "%s: the first %s no bar (%s): skipped as a row of units",
                label,
                "row holds" if h == 1 else f"{h} rows hold",
                _fmt(" ".join(str(v) for v in frame.iloc[:h].stack().dropna())),
            )
        if f:
            log.warning(
                "%s: the last %s no bar (%s): skipped as a footer",
                label,
                "row holds" if f == 1 else f"{f} rows hold",
                _fmt(" ".join(str(v) for v in frame.iloc[-f:].stack().dropna())),
            )
        kept.attrs["head_rows"] = h
        return kept, stamps, kept_column
    first = str(ts_raw.iloc[0]) if len(ts_raw) else ""
    if frame.attrs.get("positional") and not re.search(r"\d", first):
        # MetaStock / stooq without a header (AAPL.US,D,20240102,...): a ticker comes first.
        raise DataError(
            f"{label}: the file has no header row, so its columns were read by position, and "
            f"the first one holds text, not dates (first value {_fmt(first)}): add a header "
            "row naming the columns, e.g. ticker,date,open,high,low,close,volume"
        )
    # CryptoDataDownload's older files write "2019-12-13 11-AM" under Date and the same time
    # under "Unix Timestamp": a second timestamp column that reads is used, and said.
    stamps, column = _other_timestamps(frame, column, label, error)
    return frame, stamps, column


def _leading_unit_rows(
    frame: pd.DataFrame, found: dict[str, object], stamps: pd.Series, label: str, column: str
) -> int:
    """How many rows at the start (at most 2) hold neither a timestamp that reads nor more than
    one readable price: a header's second row of units, never a bar."""
    count = 0
    for pos in range(min(2, len(frame) - 1)):
        if not _bar_less(frame, found, stamps, label, column, pos):
            break
        count += 1
    return count


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """This module's warnings held back, for a parse that only probes."""
    was = log.disabled
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = was


def _bar_less(
    frame: pd.DataFrame,
    found: dict[str, object],
    stamps: pd.Series,
    label: str,
    column: str,
    pos: int,
) -> bool:
    """Whether row ``pos`` has neither a timestamp that reads nor two readable prices."""
    try:
        with _silenced():  # one row's reading says nothing about the column (day <= 12 ...)
            _parse_timestamps(stamps.iloc[pos : pos + 1], label, column)
        return False  # a row with its own timestamp is a bar, broken or not
    except DataError:
        pass
    cells = [frame[found[c]].iloc[pos] for c in _PRICE_COLUMNS]
    text = [re.sub(r"[\s,'$€£\u00a0]", "", str(v)) for v in cells if not pd.isna(v)]
    numbers = sum(bool(re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", t)) for t in text)
    return numbers < 2  # prices: a bar with a broken timestamp, refused later


def _footer_rows(
    frame: pd.DataFrame, found: dict[str, object], stamps: pd.Series, label: str, column: str
) -> int:
    """How many rows at the end (at most 3) hold neither a timestamp that reads nor more than
    one readable price: a vendor's footer or a totals row, never a bar (a bar with a timestamp,
    or with prices, stops the count, and is refused later). Only dropped when the timestamps
    then read."""
    count = 0
    for pos in range(len(frame) - 1, max(len(frame) - 4, 0), -1):
        if not _bar_less(frame, found, stamps, label, column, pos):
            break
        count += 1
    return count if count < len(frame) else 0


def _other_timestamps(
    frame: pd.DataFrame, failed: str, label: str, err: DataError
) -> tuple[pd.DatetimeIndex, str]:
    """The first other timestamp column (by ``_TIMESTAMP_ALIASES``) that parses, when the
    preferred one did not; else the preferred column's error."""
    used = {failed}  # a joined "date+time" that failed leaves its date column to try alone
    for alias in _TIMESTAMP_ALIASES[:-1]:
        col = next((c for c in frame.columns if _norm(c) == alias and str(c) not in used), None)
        if col is None:
            continue
        try:
            parsed = _parse_timestamps(frame[col].reset_index(drop=True), label, str(col))
        except DataError:
            continue
        steps = np.diff(parsed.asi8)
        if not ((steps > 0).all() or (steps < 0).all()):
            continue  # a date column without its time repeats: not the bars' timestamps
        log.warning("%s; timestamps read from column %r instead", str(err).rstrip("."), col)
        return parsed, str(col)
    raise err


# (format, smallest, largest) of integer timestamps that spell a calendar date.
_PACKED_FORMATS = (
    ("%Y%m%d", 1800_01_01, 2200_12_31),
    ("%Y%m%d%H", 1800_01_01_00, 2200_12_31_23),
    ("%Y%m%d%H%M", 1800_01_01_0000, 2200_12_31_2359),
    ("%Y%m%d%H%M%S", 1800_01_01_000000, 2200_12_31_235959),
    ("%Y%m%d%H%M%S%f", 1800_01_01_000000_000, 2200_12_31_235959_999),
    ("%Y", 1800, 2200),
)


def _two_digits(values: pd.Series) -> pd.Series:
    """An hour or minute column as two-digit text (9 -> '09'); anything else as written, for
    the timestamp parse to name."""
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().all() and (numbers % 1 == 0).all():
        return numbers.astype("Int64").astype(str).str.zfill(2)
    return values.astype(str).str.strip()


def _clock_times(times: pd.Series, label: str, column: str) -> pd.Series:
    """A time-of-day column as HH:MM[:SS] text. Digits only (often read as integers, leading
    zeros lost) are HHMM when every value fits HHMM (930 is 09:30), else HHMMSS (93000); 0-23
    alone are hours (hourly bars, or daily bars stamped 16 for the close), not minutes after
    midnight. Durations (a SQL TIME read by pandas) and fractions of a day (an Excel time cell
    in General format: 0.395833 is 09:30) are times since midnight."""
    if pd.api.types.is_timedelta64_dtype(times.dtype) or (
        pd.api.types.is_float_dtype(times.dtype)
        and len(times.dropna())
        and bool(np.all((times.dropna() >= 0) & (times.dropna() < 1)))
        and not np.all(times.dropna() == 0)
    ):
        since = (
            times if pd.api.types.is_timedelta64_dtype(times.dtype) else pd.to_timedelta(times, "D")
        )
        since = since.dt.round("ms")
        if not ((since >= pd.Timedelta(0)) & (since < pd.Timedelta(days=1))).all():
            return times.astype(str).str.strip()  # not a time of day: the join refuses it
        clock = pd.Timestamp(0) + since
        fmt = "%H:%M:%S.%f" if (since.dt.microseconds > 0).any() else "%H:%M:%S"
        return clock.dt.strftime(fmt)
    if pd.api.types.is_float_dtype(times.dtype) and np.all(times.dropna() % 1 == 0):
        times = times.astype("Int64")
    text = times.astype(str).str.strip()
    if not text.str.fullmatch(r"\d{1,6}").all():
        return text
    digits = text.astype(np.int64)
    if (digits <= 23).all() and (digits > 0).any():
        log.warning("%s: column %r: numbers 0-23 read as hours of the day", label, column)
        return text.str.zfill(2) + ":00"
    hhmm = bool(((digits // 100 <= 23) & (digits % 100 <= 59)).all())
    width = 4 if hhmm else 6
    padded = text.str.zfill(width)
    clock = padded.str[:2] + ":" + padded.str[2:4]
    return clock if hhmm else clock + ":" + padded.str[4:6]


_EPOCH_UNITS = ("s", "ms", "us", "ns")


def _epoch_units(values: np.ndarray) -> np.ndarray:
    """Per value, the index in ``_EPOCH_UNITS`` read from its magnitude: 1e11 s is the year
    5138, 1e11 ms is 1973, so the units' ranges of real dates lie 1000x apart."""
    return np.searchsorted([1e11, 1e14, 1e17], np.abs(values), side="right")


def _parse_timestamps(raw: pd.Series, label: str, column: str) -> pd.DatetimeIndex:
    def fail_at(pos: int, why: str) -> DataError:
        return DataError(f"{label}: column {column!r} row {pos + 1}: {why} {_fmt(raw.iloc[pos])}")

    missing = raw.isna().to_numpy()
    if missing.any():
        raise fail_at(int(np.argmax(missing)), "missing timestamp")
    dtype = raw.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        parsed = pd.DatetimeIndex(raw).tz_convert("UTC").tz_localize(None)
    elif pd.api.types.is_datetime64_dtype(dtype):
        parsed = pd.DatetimeIndex(raw)
    elif pd.api.types.is_bool_dtype(dtype):
        raise fail_at(0, "cannot parse timestamp")
    elif pd.api.types.is_numeric_dtype(dtype):
        if pd.api.types.is_integer_dtype(dtype):  # exactly: 17 digits are beyond a float64
            as_int = raw.to_numpy(dtype=np.int64)
            values = as_int.astype(np.float64)
        else:
            values = raw.to_numpy(dtype=np.float64)
            bad = ~np.isfinite(values)
            if bad.any():
                raise fail_at(int(np.argmax(bad)), "cannot parse timestamp")
            as_int = np.where(np.abs(values) < 9e18, values, 0).astype(np.int64)
        if np.all(as_int == values):
            # Packed calendar digits: YYYYMMDD (as epoch seconds these would all fall within
            # 1970-08), YYYYMMDDHH (2027-2039 as seconds), YYYYMMDDHHMM (as epoch ms, 1976),
            # YYYYMMDDHHMMSS, YYYYMMDDHHMMSSfff (Chinese vendors' bars), or a bare year.
            for fmt, lo, hi in _PACKED_FORMATS:
                if np.all((as_int >= lo) & (as_int <= hi)):
                    packed = pd.to_datetime(
                        pd.Series(as_int.astype(str)), format=fmt, errors="coerce"
                    )
                    if not packed.isna().any():
                        return pd.DatetimeIndex(packed).as_unit("ns")
        if float(np.max(np.abs(values))) < 1e8:
            # As epoch seconds every value would fall before 1973-03-03: a row number, a count
            # or a date format this loader does not know, never a real epoch column.
            raise DataError(
                f"{label}: column {column!r}: numbers {_number(values[0])} .. "
                f"{_number(values[-1])} "
                "are neither dates (YYYYMMDD, YYYYMMDDHHMM[SS], a year) nor Unix epoch times; "
                "write dates such as 2023-01-31 or 2023-01-31 09:30"
            )
        # Checked before converting: past 2262 nanoseconds wrap around without an error.
        latest = pd.Timestamp(pd.Timestamp.now().year + 2, 1, 1).timestamp()
        units = _epoch_units(values)
        seconds = values / np.power(1000.0, units)
        late = (seconds >= latest) | (seconds < -9.2e9)
        if late.any() and 2 * late[units == 0].sum() > (units == 0).sum():
            # Millisecond epochs from 1966 to 1973 are below 1e11, so one by one they read as
            # seconds of the years 3000 and on. When most values read as seconds are no date,
            # one unit that reads every value as a date wins, if its bars lie whole seconds
            # apart (seconds of the 2030s read as ms would be 3.6 or 86.4 s apart).
            for code in range(1, len(_EPOCH_UNITS)):
                whole = values / 1000.0**code
                gaps = np.diff(np.unique(whole))
                if (
                    np.all((whole < latest) & (whole >= -9.2e9))
                    and np.all(gaps >= 1)
                    and np.all(gaps % 1 == 0)
                ):
                    units = np.full(len(values), code)
                    late = np.zeros(len(values), dtype=bool)
                    log.warning(
                        "%s: column %r: epoch times read as %s throughout (as seconds, most "
                        "would be no date)",
                        label,
                        column,
                        _EPOCH_UNITS[code],
                    )
                    break
        changed = units != units[0]
        if changed.any():
            # Binance's klines went from ms to us on 2025-01-01: files joined across that date
            # hold both. Each value is unambiguous on its own; say where the unit changes.
            pos = int(np.argmax(changed))
            log.warning(
                "%s: column %r: epoch times change unit at row %d (%s to %s); each value is "
                "read in its own unit",
                label,
                column,
                pos + 1,
                _EPOCH_UNITS[units[0]],
                _EPOCH_UNITS[units[pos]],
            )
        if late.any():
            pos = int(np.argmax(late))
            raise fail_at(
                pos,
                f"epoch time ({_EPOCH_UNITS[units[pos]]}) beyond "
                f"{pd.Timestamp(latest, unit='s').year - 1} or before 1677, not a bar's time:",
            )
        if len(values) > 1 and np.all(as_int == values):
            # Every value a multiple of 1000 s or more: the digits were rounded away (a
            # spreadsheet's 1.70407E+12), which moves bars by up to hours, not a bar size.
            zeros = sum((as_int % 10**k == 0).astype(np.int64) for k in range(1, 19))
            if np.all(10.0**zeros / np.power(1000.0, units) >= 1000):
                raise DataError(
                    f"{label}: column {column!r}: epoch times are rounded (first value "
                    f"{_number(values[0])}, every value a multiple of "
                    f"{_number(float(10 ** int(zeros.min())))}), e.g. by a spreadsheet's "
                    "number format (1.70407E+12); write them in full"
                )
        stamps = np.empty(len(values), dtype="datetime64[ns]")
        fractional = values.dtype.kind == "f" and not np.all(values == np.floor(values))
        try:
            for code in np.unique(units):
                mask = units == code
                unit = _EPOCH_UNITS[code]
                chosen = values[mask]
                if fractional and unit != "ns":
                    # 1704067200.123 s: as a float of nanoseconds it reads .122999907. A
                    # float64 epoch holds microseconds at best, so round to them.
                    chosen = np.rint(chosen * 1000.0 ** (2 - code)).astype(np.int64)
                    unit = "us"
                stamps[mask] = pd.to_datetime(chosen, unit=unit).to_numpy("datetime64[ns]")
        except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
            raise fail_at(int(np.argmax(np.abs(values))), "timestamp out of range:") from None
        parsed = pd.DatetimeIndex(stamps)
    else:
        text = raw.astype(str).str.strip()
        # Whole numbers, or fractions of epoch times as long as seconds, ms, us or ns since 2001
        # are written (1711616400.250; never 2024.01, a month, nor 202401020930.5).
        digits = text.str.fullmatch(r"-?\d+(?:\.0*)?|-?(?:\d{9,10}|\d{13}|\d{16}|\d{19})\.\d+")
        digits = digits.to_numpy()
        if digits.all():
            # Epoch numbers stored as text (a string-typed Parquet column, a ';' file).
            return _parse_timestamps(pd.to_numeric(text), label, column)
        if digits.mean() > 0.5 and not text[~digits].str.contains(r"\d[/.\-:]\d").any():
            # Epoch numbers with a stray word ("oops", "n/a"): name that row, not row 1.
            raise fail_at(int(np.argmin(digits)), "cannot parse timestamp")
        zoned = _split_zones(text, label, column)
        if zoned is not None:
            return zoned
        if _fullmatch_all(text, _TIME_OF_DAY):
            raise DataError(
                f"{label}: column {column!r} holds times of day without a date (first value "
                f"{_fmt(raw.iloc[0])}); write full timestamps (2023-01-31 09:30) or add a "
                "date column"
            )
        parsed = _parse_text_timestamps(text, label, column)
        if parsed is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                coerced = pd.to_datetime(text, utc=True, errors="coerce", format="mixed")
            bad = np.asarray(pd.isna(coerced))
            pos = int(np.argmax(bad)) if bad.any() else 0
            raise fail_at(pos, "cannot parse timestamp")
    try:
        parsed = parsed.as_unit("ns")
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
        years = np.asarray(parsed.year)
        outside = (years < 1678) | (years > 2261)
        pos = int(np.argmax(outside)) if outside.any() else 0
        raise DataError(
            f"{label}: column {column!r} row {pos + 1}: timestamp {_fmt(raw.iloc[pos])} is "
            "outside the supported range (1677-2262)"
        ) from None
    nat = np.asarray(pd.isna(parsed))
    if nat.any():
        raise fail_at(int(np.argmax(nat)), "cannot parse timestamp")
    return parsed


_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}([.,]\d+)?)?)?\s?(Z|[+-]\d{2}(:?\d{2})?)?"
)
# A UTC offset (or Z) after an ISO time of day.
_ISO_OFFSET = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s?(?:Z|[+-]\d{2}(?::?\d{2})?)$")


def _arrow_backed(text: pd.Series) -> bool:
    """Whether pandas runs ``text.str`` regexes in pyarrow's RE2 (where RE2 agrees with ``re``)."""
    dtype = text.dtype
    return getattr(dtype, "storage", None) == "pyarrow" or isinstance(dtype, pd.ArrowDtype)


def _regex_rows(text: pd.Series, pattern: re.Pattern[str], *, full: bool) -> np.ndarray:
    """``text.str.fullmatch(pattern)`` (``full``) or ``.str.contains(pattern)`` as a bool array,
    the same answers at pyarrow's speed.

    A Python regex pass takes about 3 s per million rows; pandas hands a pattern to pyarrow's
    RE2 (a tenth of that) only where RE2 agrees with ``re``, and ``\\s`` is not such a pattern.
    Written as one space it matches a subset of the rows, written as any character a superset;
    two RE2 passes settle every row outside the gap between them, and ``re`` decides the rest
    (none in a usual file). ``text`` holds no missing values (the callers' ``astype(str)``)."""
    pat = pattern.pattern
    search = text.str.fullmatch if full else text.str.contains
    if "\\s" not in pat or not _arrow_backed(text) or re.search(r"\[[^\]]*\\s", pat):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "has match groups", as below
            return np.asarray(search(pattern), dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "has match groups": only whether it matches counts
        surely = np.array(search(pat.replace("\\s", "[ ]")), dtype=bool)
        maybe = np.asarray(search(pat.replace("\\s", "(?s:.)")), dtype=bool)
    gap = maybe & ~surely
    if gap.any():
        rest = text[gap]
        surely[gap] = np.asarray(
            rest.str.fullmatch(pattern) if full else rest.str.contains(pattern), dtype=bool
        )
    return surely


def _fullmatch_all(text: pd.Series, pattern: re.Pattern[str]) -> bool:
    """``text.str.fullmatch(pattern).all()``: a first value that fails settles it without a pass
    over every row."""
    if text.isna().any():  # pandas' own answer: .all() passes over the missing values
        return bool(text.str.fullmatch(pattern).all())
    first = text.iloc[0] if len(text) else None
    if isinstance(first, str) and pattern.fullmatch(first) is None:
        return False
    return bool(_regex_rows(text, pattern, full=True).all())


# Zone abbreviations with one meaning in market data; CST (US Central or China), IST, BST and
# AST have several and are refused rather than guessed.
_ZONE_OFFSETS = {
    "UTC": 0, "GMT": 0, "Z": 0, "WET": 0, "WEST": 60, "CET": 60, "CEST": 120, "EET": 120,
    "EEST": 180, "MSK": 180, "EST": -300, "EDT": -240, "CDT": -300, "MST": -420, "MDT": -360,
    "PST": -480, "PDT": -420, "JST": 540, "KST": 540, "HKT": 480, "SGT": 480, "AEST": 600,
    "AEDT": 660, "NZST": 720, "NZDT": 780,
}  # fmt: skip
_AMBIGUOUS_ZONES = frozenset({"CST", "IST", "BST", "AST", "ADT", "SST"})
# A timestamp ending in a zone: "... EST", "... US/Eastern", "... GMT+2", "...-05:00[America/
# New_York]" (Java), "... +00:00 UTC".
_ZONE_SUFFIX = re.compile(
    r"^(?P<body>.*?(?:\d|[AaPp]\.?[Mm]\.?))\s*"
    r"(?:\[(?P<bracket>[A-Za-z_]+(?:/[A-Za-z0-9_+\-]+)+)\]"
    r"|(?P<zone>[A-Za-z_]+(?:/[A-Za-z0-9_+\-]+)+|[A-Za-z]{1,5})"
    r"(?P<offset>[+-]\d{1,2}(?::?\d{2})?)?)$"
)


def _zone_offset(zone: str, offset: str | None) -> int | str | None:
    """Minutes east of UTC for an abbreviation (or UTC/GMT with an offset), the name of an IANA
    zone, or None when ``zone`` is not a time zone at all."""
    upper = zone.upper()
    if offset:
        if upper not in ("UTC", "GMT"):
            return None
        sign = -1 if offset[0] == "-" else 1
        digits = offset[1:].replace(":", "")
        hours, minutes = (digits, "0") if len(digits) <= 2 else (digits[:-2], digits[-2:])
        return sign * (int(hours) * 60 + int(minutes))
    if upper in _ZONE_OFFSETS:
        return _ZONE_OFFSETS[upper]
    if "/" in zone:
        try:
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            return None
        return zone
    return None


def _header_zone(name: str) -> bool:
    """Whether a column name's parenthesised suffix names a time zone (not a unit: "ms")."""
    upper = name.upper()
    if upper in _ZONE_OFFSETS or upper in _AMBIGUOUS_ZONES:
        return True
    if re.fullmatch(r"(?:GMT|UTC)[+-]\d{1,2}(?::?\d{2})?", upper):
        return True
    return "/" in name  # an IANA name (kept as written, so never looked up)


def _split_zones(text: pd.Series, label: str, column: str) -> pd.DatetimeIndex | None:
    """Timestamps that end in a time zone's name, in UTC; None when the values do not all end in
    one. Abbreviations are fixed offsets (EST is -05:00, EDT -04:00); an IANA name (the IB API's
    ``US/Eastern``) is placed by the zone's rules; a name after an explicit offset adds nothing."""
    first = str(text.iloc[0])
    if (
        not re.search(r"(?:[A-Za-z\]]|(?:GMT|UTC)[+-][\d:]+)$", first)
        or _ISO.fullmatch(first)  # ends in Z: ISO, read as such
        or re.search(r"\d\s*[AaPp]\.?[Mm]\.?$", first)  # a 12-hour clock, no zone
    ):
        return None  # the common cases, without a regex pass over the whole column
    parts = text.str.extract(_ZONE_SUFFIX.pattern)
    if parts["body"].isna().any():
        return None
    body = parts["body"]
    offsets = [None if pd.isna(o) else str(o) for o in parts["offset"]]
    if parts["bracket"].notna().all() or (
        not any(offsets) and body.str.contains(_ISO_OFFSET.pattern).all()
    ):
        # "-05:00[America/New_York]" (Java), "-0500 EST" (Go), "+00:00 UTC": the offset
        # written before the name places the time; the name adds nothing.
        return _parse_timestamps(body, label, column)
    ambiguous = parts["zone"].str.upper().isin(_AMBIGUOUS_ZONES).to_numpy()
    if ambiguous.any():
        pos = int(np.argmax(ambiguous))
        raise DataError(
            f"{label}: column {column!r} row {pos + 1}: time zone {parts['zone'].iloc[pos]!r} "
            f"has several meanings ({_fmt(text.iloc[pos])}); write UTC offsets (-06:00)"
        )
    # One label per row ("EST", "GMT+2"), compared as an array: no Python loop over the rows.
    labels = (parts["zone"].astype(str) + parts["offset"].fillna("")).to_numpy()
    zones: dict[str, int | str] = {}
    for zone, offset in parts[["zone", "offset"]].drop_duplicates().itertuples(index=False):
        found = _zone_offset(str(zone), None if pd.isna(offset) else str(offset))
        if found is None:
            return None
        zones[str(zone) + ("" if pd.isna(offset) else str(offset))] = found
    local = _parse_timestamps(body, label, column)
    result = local.to_numpy(dtype="datetime64[ns]").copy()
    for key, zone in zones.items():
        mask = labels == key
        if isinstance(zone, int):
            result[mask] = local[mask] - pd.Timedelta(minutes=zone)
            continue
        times = local[mask]
        newest_first = len(times) > 1 and times[0] > times[-1]
        if newest_first:  # "infer" places a repeated hour by the order of the times
            times = times[::-1]
        try:
            placed = times.tz_localize(zone, ambiguous="infer", nonexistent="raise")
        except (ValueError, TypeError) as err:  # pytz/zoneinfo DST errors are ValueErrors
            raise DataError(
                f"{label}: column {column!r}: times in {zone} cannot be placed across a "
                f"daylight-saving change ({str(err).splitlines()[0]}); write UTC offsets"
            ) from None
        placed = placed.tz_convert("UTC").tz_localize(None)
        result[mask] = placed[::-1] if newest_first else placed
    _summer_abbreviations(pd.DatetimeIndex(result), labels, label, column)
    return pd.DatetimeIndex(result)


# A standard-time abbreviation and the zone whose summers it does not cover.
_STANDARD_ZONES = {
    "EST": "America/New_York", "PST": "America/Los_Angeles", "CET": "Europe/Berlin",
    "EET": "Europe/Athens", "WET": "Europe/Lisbon", "AEST": "Australia/Sydney",
    "NZST": "Pacific/Auckland",
}  # fmt: skip


def _summer_abbreviations(
    utc: pd.DatetimeIndex, labels: np.ndarray, label: str, column: str
) -> None:
    """Warn when a standard-time abbreviation is written on a date its region keeps summer
    time: many vendors write EST for New York's local time all year, an hour off in summer.
    The abbreviation is read as written (EST is -05:00)."""
    for zone, area in _STANDARD_ZONES.items():
        mask = labels == zone
        if not mask.any():
            continue
        times = utc[mask]
        # Summer time is the region's larger offset from UTC (its standard one is the smaller).
        offsets = times.tz_localize("UTC").tz_convert(area).tz_localize(None) - times
        summer = np.asarray(offsets > offsets.min()) if len(set(offsets)) > 1 else None
        if summer is None:  # one offset throughout: summer only if it is not the standard one
            year = times[0].year
            standard = min(
                pd.Timestamp(f"{year}-{m}-15", tz=area).utcoffset() for m in ("01", "07")
            )
            summer = np.asarray(offsets > standard)
        if summer.any():
            when = times[int(np.argmax(summer))]
            log.warning(
                "%s: column %r: %s written on summer dates (%s): read as %s's fixed offset; if "
                "these are %s local times, write %s instead",
                label,
                column,
                zone,
                _stamp(when),
                zone,
                area,
                area,
            )


# A day-month-year or month-day-year date with a two-digit year (01/02/23, 02-Jan-23).
_TWO_DIGIT_YEAR = re.compile(r"(\d{1,2}([/.\-])(?:\d{1,2}|[A-Za-z]{3,9})\2)(\d{2})(?=$|[\sT])")
_YEAR_FIRST = re.compile(r"(\d{2})([/.\-]\d{1,2}[/.\-]\d{1,2})(?=$|[\sT])")
_NUMERIC_DATE = re.compile(r"\d{1,4}[/.\-]\d{1,2}[/.\-]\d{1,4}")
_TIME_OF_DAY = re.compile(r"\d{1,2}:\d{2}(:\d{2}([.,]\d+)?)?\s*([AaPp]\.?[Mm]\.?)?")
# A 12-hour clock after the date (03/05/2020 02:30:00 PM), which pandas infers no format for.
_TWELVE_HOUR = re.compile(
    r"(?P<date>.*?\S)(?P<sep>\s+)(?P<time>\d{1,2}:\d{2}(?P<sec>:\d{2})?)(?P<gap>\s*)[AaPp][Mm]"
)


def _guess_format(first: str, dayfirst: bool) -> str | None:
    """pandas' format guess, extended to 12-hour clocks after the date."""
    fmt = guess_datetime_format(first, dayfirst=dayfirst)
    if fmt is not None:
        return fmt
    m = _TWELVE_HOUR.fullmatch(first)
    if m is None:
        return None
    date_fmt = guess_datetime_format(m["date"], dayfirst=dayfirst)
    if date_fmt is None:
        return None
    clock = "%I:%M:%S" if m["sec"] else "%I:%M"
    return f"{date_fmt}{m['sep']}{clock}{m['gap']}%p"


def _four_digit_years(text: pd.Series) -> pd.Series:
    """01/02/23 -> 01/02/2023, so that one format can be inferred for the whole column; pandas
    infers none for two-digit years and would parse each value on its own, day-first here and
    month-first there. A year is 20yy unless that lies in the future (beyond next year), then
    19yy: prices are history, so 62 is 1962, where POSIX's %y (00-68 are 20xx) gives 2062."""
    latest = pd.Timestamp.now().year + 1

    def widen(m: re.Match[str]) -> str:
        yy = int(m.group(3))
        return f"{m.group(1)}{2000 + yy if 2000 + yy <= latest else 1900 + yy}"

    return text.str.replace(_TWO_DIGIT_YEAR, widen, n=1, regex=True)


def _four_digit_years_first(text: pd.Series) -> pd.Series:
    """24/01/02 -> 2024/01/02: the year-first reading of two-digit-year dates (yy/mm/dd, as
    Japanese, Korean and Chinese exports write them), widened as :func:`_four_digit_years` does
    the year-last one. Both readings then compete on the time order and pace of the bars."""
    latest = pd.Timestamp.now().year + 1

    def widen(m: re.Match[str]) -> str:
        yy = int(m.group(1))
        return f"{2000 + yy if 2000 + yy <= latest else 1900 + yy}{m.group(2)}"

    return text.str.replace(_YEAR_FIRST, widen, n=1, regex=True)


def _steps(stamps: pd.DatetimeIndex) -> np.ndarray:
    """The time between neighbouring rows, in either direction (ns, float)."""
    return np.abs(np.diff(stamps.asi8)).astype(np.float64)


def _spacing_spread(stamps: pd.DatetimeIndex) -> float:
    """How irregular the gaps between bars are: the mean absolute log of each gap over the
    median gap (0 for a steady pace; ten years of month starts score 0.02, weekday bars 0.22,
    days 1-12 of each month read month-first 0.44)."""
    gaps = _steps(stamps)
    gaps = gaps[gaps > 0]
    if not len(gaps):
        return 0.0
    return float(np.mean(np.abs(np.log(gaps / np.median(gaps)))))


def _median_step(stamps: pd.DatetimeIndex) -> float:
    """The usual time between neighbouring rows, in either direction (ns; 0 for one row)."""
    steps = _steps(stamps)
    return float(np.median(steps)) if len(steps) else 0.0


def _gap_ratio(stamps: pd.DatetimeIndex) -> float:
    """The largest step between bars over the median step (1 for a steady pace; 0 when there
    are no steps)."""
    gaps = _steps(stamps)
    gaps = gaps[gaps > 0]
    return float(gaps.max() / np.median(gaps)) if len(gaps) else 0.0


def _parse_text_timestamps(text: pd.Series, label: str, column: str) -> pd.DatetimeIndex | None:
    """One format for the whole column, or None when no single format reads every value.

    ISO 8601 values (date-only, date-time, with or without offsets, mixed) are read as such.
    Otherwise a format is inferred from the first value, month-first before day-first (day-first
    first for dd.mm.yyyy, a day-first convention), and must read every row: a file is never
    read day-first in one row and month-first in another.
    """
    original = text
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _fullmatch_all(text, _ISO):
            offset = _regex_rows(text, _ISO_OFFSET, full=False)
            utc = text.str.contains(r"(?:Z|[+-]00:?00)$").to_numpy()
            if offset.any() and not offset.all() and not utc[offset].all():
                # yfinance rows (-05:00) appended to a plain file: the plain rows' zone is
                # unknown, and reading them as UTC would open a false gap of hours. (Beside
                # UTC rows, plain rows are read as UTC too.)
                pos = int(np.argmax(offset != offset[0]))
                raise DataError(
                    f"{label}: column {column!r} row {pos + 1}: timestamp "
                    f"{_fmt(original.iloc[pos])} {'has' if offset[pos] else 'lacks'} a UTC "
                    f"offset and row 1 ({_fmt(original.iloc[0])}) "
                    f"{'does not' if offset[pos] else 'has one'}; write every row one way"
                )
            if offset.any() and not offset.all():
                pos = int(np.argmax(offset != offset[0]))
                log.warning(
                    "%s: column %r row %d: %s %s a UTC mark (Z, +00:00) and row 1 (%s) %s; "
                    "the rows without one are read as UTC",
                    label,
                    column,
                    pos + 1,
                    _fmt(original.iloc[pos]),
                    "has" if offset[pos] else "lacks",
                    _fmt(original.iloc[0]),
                    "does not" if offset[pos] else "has one",
                )
            try:
                result = pd.to_datetime(text, utc=True, format="ISO8601")
                return pd.DatetimeIndex(result).tz_localize(None)
            except (ValueError, TypeError, OverflowError):
                return None
        variants = [text]
        year_first = bool(
            _YEAR_FIRST.match(str(text.iloc[0])) and text.str.match(_YEAR_FIRST).all()
        )
        if _TWO_DIGIT_YEAR.match(str(text.iloc[0])) and text.str.match(_TWO_DIGIT_YEAR).all():
            if year_first:  # 24/01/02: 2 January 2024 or 24 January 2002
                variants.append(_four_digit_years_first(text))
            text = variants[0] = _four_digit_years(text)
        elif year_first:  # 24/1/2: only the year can be first
            text = variants[0] = _four_digit_years_first(text)
        dotted = bool(text.str.match(r"\d{1,2}\.\d{1,2}\.\d{2,4}\b").all())
        formats: list[str] = []
        candidates: list[tuple[pd.Series, str]] = []
        for variant in variants:
            for dayfirst in (True, False) if dotted else (False, True):
                fmt = _guess_format(str(variant.iloc[0]), dayfirst)
                if fmt is not None and not re.search("%[Yy]", fmt):
                    raise DataError(
                        f"{label}: column {column!r} holds dates without a year (first value "
                        f"{_fmt(original.iloc[0])}); write the year (2023-01-31)"
                    )
                year_day_month = fmt is not None and re.match(r"%Y\W?%d", fmt)
                if fmt is not None and not year_day_month:
                    if variant is text and fmt not in formats:
                        formats.append(fmt)
                    if not any(v is variant and f == fmt for v, f in candidates):
                        candidates.append((variant, fmt))
        readings: list[tuple[str, pd.DatetimeIndex]] = []
        for variant, fmt in candidates:
            try:
                result = pd.to_datetime(variant, utc=True, format=fmt)
            except (ValueError, TypeError, OverflowError):
                continue
            # Named as written: a widened two-digit year is %y.
            name = fmt.replace("%Y", "%y") if len(variants) > 1 or variant is not original else fmt
            readings.append((name, pd.DatetimeIndex(result).tz_localize(None)))
        if len(readings) > 1:
            year_first = any(name.startswith("%y") for name, _ in readings)
            why = "a two-digit year first or last" if year_first else "day and month both <= 12"
            # Day and month are both <= 12 in every row (or a two-digit year can come first or
            # last), so several orders read the file. A time series is in time order: a daily
            # file read in the wrong order jumps back a year at each month end. Keep the order
            # that is sorted; if several are, say so.
            ordered = [
                r for r in readings if r[1].is_monotonic_increasing or r[1].is_monotonic_decreasing
            ]
            if len(ordered) == 1:
                # In time order, unless read year-first at an absurd pace: an out-of-order
                # dd/mm/yy file can read sorted as yy/mm/dd, a year per row where the year-last
                # readings step a day. Then the bars are out of order, and the closest-paced
                # year-last reading goes on to be refused as such. (Day-month readings are not
                # so judged: monthly bars dated the 1st, January's the 2nd, step a day in the
                # wrong order and a month in the right one.)
                name, sorted_reading = ordered[0]
                if name.startswith("%y"):
                    pace = _median_step(sorted_reading)
                    paces = [(_median_step(r), r) for n, r in readings if not n.startswith("%y")]
                    closer = min(paces, key=lambda p: p[0], default=None)
                    if closer is not None and 20 * closer[0] < pace:
                        return closer[1]
                return sorted_reading
            if len(ordered) > 1:
                # All sorted (bars dated the 1st, or days 1-12 only): bars come at a steady
                # pace, a wrong reading steps a day at a time and then jumps a month or a year.
                spread = [_spacing_spread(r[1]) for r in ordered]
                widest = [_gap_ratio(r[1]) for r in ordered]
                pick = None
                best = int(np.argmin(spread))
                if all(s - spread[best] > 0.1 for i, s in enumerate(spread) if i != best):
                    pick = best
                else:
                    # Thousands of steady intraday steps hide a few wrong month jumps in the
                    # mean; the largest gap over the usual one shows them (a month against a
                    # weekend).
                    best = int(np.argmin(widest))
                    if widest[best] > 0 and all(
                        w >= 3 * widest[best] for i, w in enumerate(widest) if i != best
                    ):
                        pick = best
                if pick is not None:
                    log.warning(
                        "%s: column %r: dates read as %s, whose spacing is regular; every value "
                        "also reads as %s (%s), irregularly spaced",
                        label,
                        column,
                        ordered[pick][0],
                        " or ".join(r[0] for i, r in enumerate(ordered) if i != pick),
                        why,
                    )
                    return ordered[pick][1]
            chosen = (ordered or readings)[0]
            log.warning(
                "%s: column %r: dates read as %s; every value also reads as %s (%s): check "
                "the dates, or write ISO dates (2023-01-31)",
                label,
                column,
                chosen[0],
                " or ".join(r[0] for r in readings if r is not chosen),
                why,
            )
            return chosen[1]
        if readings:
            return readings[0][1]
        if formats:
            # Name the row where the format that reads the most leading rows stops: a typo, or a
            # file that changes layout (day-first after month-first) part way.
            stop, fmt = -1, formats[0]
            for candidate in formats:
                ok = pd.to_datetime(text, utc=True, format=candidate, errors="coerce").notna()
                pos = int(np.argmin(ok.to_numpy()))
                if pos > stop:
                    stop, fmt = pos, candidate
            raise DataError(
                f"{label}: column {column!r} row {stop + 1}: cannot parse timestamp "
                f"{_fmt(original.iloc[stop])} in the format of the rows before it ({fmt})"
            )
        if text.str.contains(_NUMERIC_DATE).any():
            return None  # value by value could swap day and month in some rows only
        if not text.str.contains(r"\d{4}").any():  # two-digit years were widened above
            raise DataError(
                f"{label}: column {column!r} holds dates without a year (first value "
                f"{_fmt(original.iloc[0])}); write the year (2023-01-31)"
            )
        try:  # month names, weekdays, free text: value by value is unambiguous
            result = pd.to_datetime(text, utc=True, format="mixed")
        except (ValueError, TypeError, OverflowError):
            return None
        return pd.DatetimeIndex(result).tz_localize(None)


_SUFFIX_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9}
# A separator followed by other than exactly three digits, or the last of two different
# separators, can only be a decimal mark.
# A mark is a decimal mark when it is followed by other than three digits (16,75), when the
# other mark groups before it (1.234,5), or when what precedes it is no thousands group: four or
# more digits (1100,125: a group holds at most three) or a lone zero (0,992).
_COMMA_DECIMAL = r"\d,(?:\d{1,2}|\d{4,})[kKmMbB]?$|\d\.\d{3},\d|^[+-]?(?:[$€£¥]\s*)?(?:\d{4,}|0),\d"
_DOT_DECIMAL = r"\d\.(?:\d{1,2}|\d{4,})[kKmMbB]?$|\d,\d{3}\.\d|^[+-]?(?:[$€£¥]\s*)?(?:\d{4,}|0)\.\d"


def _writes_decimal_points(values: pd.Series) -> bool:
    """Whether numbers already read with a decimal point show it: a fraction of one or two
    decimals, or of more than three (100.37, 1.08512). Three decimals (1.234) could be a
    thousands dot misread, so they are no evidence."""
    x = values.dropna().to_numpy(dtype=np.float64)
    x = x[np.isfinite(x)]
    hundredths, thousandths = x * 100, x * 1000
    short = np.isclose(hundredths, np.round(hundredths), rtol=0, atol=1e-6) & (x % 1 != 0)
    long = ~np.isclose(thousandths, np.round(thousandths), rtol=0, atol=1e-6)
    return bool((short | long).any())


def _decimal_comma(
    values: pd.DataFrame,
    label: str,
    localised: bool = False,
    delimiter: str = ",",
    point: str | None = None,
) -> bool:
    """Whether a file writes decimals with a comma, from the evidence in its numbers; a file
    showing both conventions is refused. One showing neither (only three-digit groups, e.g.
    16.750) is settled by repeated groups (1.234.567), then by localised headers (a comma),
    then by a ';' delimiter, which spreadsheets write where the comma is the decimal mark, when
    its numbers hold commas (1,100); otherwise, with a logged warning, a decimal point."""
    text = values.astype(str).stack().str.strip()
    comma = text.str.contains(_COMMA_DECIMAL, regex=True)
    dot = text.str.contains(_DOT_DECIMAL, regex=True)
    if comma.any() and dot.any():
        raise DataError(
            f"{label}: numbers use both decimal marks: {text[comma].iloc[0]!r} (comma) and "
            f"{text[dot].iloc[0]!r} (point); write one convention"
        )
    if not comma.any() and not dot.any():
        dot_groups = text.str.contains(r"\d\.\d{3}\.\d{3}\b", regex=True).any()
        comma_groups = text.str.contains(r"\d,\d{3},\d{3}\b", regex=True).any()
        if dot_groups != comma_groups:
            return bool(dot_groups)  # 1.234.567: the dot groups thousands
        grouped = text[text.str.contains(r"\d[.,]\d{3}\b", regex=True)]
        if not len(grouped):
            return localised and point is None
        commas = grouped.str.contains(",", regex=False)
        if point is not None:  # parsed numbers with a fraction: the file's mark is a point
            why, result = f"column {point!r} writes decimal points", False
        elif localised:
            why, result = "localised headers", True
        elif delimiter == ";" and commas.all():
            why, result = "a ';'-delimited file", True
        else:
            why, result = "no other evidence", False
        log.warning(
            "%s: numbers such as %r show no decimal mark of their own; read with a decimal %s (%s)",
            label,
            grouped.iloc[0],
            "comma" if result else "point",
            why,
        )
        return result
    return bool(comma.any())


def _localised_numbers(raw: pd.Series, decimal_comma: bool, suffixes: bool = True) -> np.ndarray:
    """Numbers written for people: thousands separators (1,234.5 / 1.234,5 / 1 234,5 / 1'234.5)
    and K/M/B suffixes (investing.com volumes), with the file's decimal mark (see
    :func:`_decimal_comma`); anything still unreadable becomes NaN for the caller to report."""
    # A space or apostrophe only ever groups three digits: 112'08 (a bond price in 32nds) or
    # 187 15 is no number, where dropping it would read 11208 or 18715.
    text = raw.astype(str).str.strip().str.replace(r"(?<=\d)[\s']+(?=\d{3}(?!\d))", "", regex=True)
    text = text.str.replace(r"(?<=\d)\s+(?=[kKmMbB]$)", "", regex=True)  # "1,23 M"
    text = text.str.replace(r"^([+-]?)[$€£¥]\s*|\s*[$€£¥]$", r"\1", regex=True)  # $182.01
    group, mark = (".", ",") if decimal_comma else (",", ".")
    # Indian digit grouping (12,34,567.50) writes lakhs and crores in pairs.
    indian = r"|\d{1,2}(,\d{2})*,\d{3}" if group == "," else ""
    tail = "[kKmMbB]?" if suffixes else ""
    grouped = rf"[+-]?(\d{{1,3}}(\{group}\d{{3}})+|\d+{indian})(\{mark}\d*)?{tail}"
    ok = text.str.fullmatch(grouped)
    text = text.where(~ok, text.str.replace(group, "", regex=False).str.replace(mark, "."))
    suffix = text.str[-1:].str.lower()
    if not suffixes:  # a K/M/B on a price is a typo, never a scale (101.2K is no price)
        suffix = suffix.where(~suffix.isin(list(_SUFFIX_SCALE)), "")
    scale = suffix.map(_SUFFIX_SCALE).fillna(1.0).to_numpy(dtype=np.float64)
    body = text.where(~suffix.isin(list(_SUFFIX_SCALE)), text.str[:-1])
    body = body.where(body.str.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?"), None)
    return pd.to_numeric(body, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan) * scale


def _no_volume_marks(raw: pd.Series) -> bool:
    """Whether a volume column is only placeholders ('-', '--', empty)."""
    if pd.api.types.is_numeric_dtype(raw.dtype):
        return bool(len(raw)) and bool(raw.isna().all())
    text = raw.dropna().astype(str).str.strip()
    return bool(len(text)) and bool(text.isin(["-", "--", "–", ""]).all())


def _to_float(
    raw: pd.Series,
    label: str,
    column: str,
    where: Callable[[int], str],
    decimal_comma: bool = False,
    suffixes: bool = True,
) -> np.ndarray:
    if pd.api.types.is_bool_dtype(raw.dtype):
        raise DataError(f"{label}: column {column!r} {where(0)}: non-numeric value {_fmt(True)}")
    if pd.api.types.is_numeric_dtype(raw.dtype):
        return raw.to_numpy(dtype=np.float64, na_value=np.nan)
    present = ~raw.isna().to_numpy()
    if decimal_comma:  # "12.345" is twelve thousand here: never let pandas read it first
        coerced = _localised_numbers(raw, decimal_comma, suffixes)
    else:
        coerced = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        if (np.isnan(coerced) & present).any():
            coerced = _localised_numbers(raw, decimal_comma, suffixes)
    bad = np.isnan(coerced) & present
    for pos in np.flatnonzero(bad):
        value = raw.iloc[pos]
        if str(value).strip().lower() not in _MISSING_STRINGS:
            raise DataError(
                f"{label}: column {column!r} {where(pos)}: non-numeric value {_fmt(value)}"
            )
    return coerced


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
        others = [repr(str(c)) for c in frame.columns if re.search(r"(?i)vol", str(c))]
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
