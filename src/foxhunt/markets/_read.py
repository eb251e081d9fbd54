"""Getting a raw frame out of a source for the OHLCV loader: CSV (plain, gzip, one file of a zip),
Excel and Parquet files; encoding, delimiter, header and comment-line sniffing, field counts,
headerless files and yfinance's multi-row header. Separate from validation in ``data.py``: nothing
here decides whether the bars can be trusted."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import logging
import re
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import pandas as pd

from foxhunt.errors import DataError, first_line
from foxhunt.markets._columns import (
    _ALIASES,
    _DATE_ONLY_ALIASES,
    _TIME_OF_DAY_ALIASES,
    _TIMESTAMP_ALIASES,
    _find_columns,
    _header_names,
    _looks_like_data,
)
from foxhunt.markets._numbers import _typed_decimals
from foxhunt.markets._text import _fmt, _norm, _number, _stamp
from foxhunt.markets._timestamps import _TIME_OF_DAY, _fullmatch_all

# The loader's one logger, whichever of its modules warns: users and tests filter on this name,
# and _silenced() disables it for all of them at once.
log = logging.getLogger("foxhunt.markets.data")


_SUFFIXES = (
    ".csv", ".csv.gz", ".tsv", ".tsv.gz", ".txt", ".txt.gz", ".zip", ".parquet", ".pq", ".xlsx",
)  # fmt: skip


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
        with path.open("rb") as f:  # whatever its suffix (.csv.gz, .parquet): not decompressed
            lfs = f.read(40).startswith(b"version https://git-lfs.github.com/spec/")
    except OSError as exc:  # unreadable (permissions): said as any reader's error is
        raise DataError(f"{label}: cannot read file: {first_line(exc)}") from None
    if lfs:
        raise DataError(
            f"{label}: a Git LFS pointer, not the data (a repository cloned without "
            "git-lfs): fetch the file with `git lfs pull`"
        )
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
            skip, sep, dtype = _layout(head)
            try:
                frame = _read_csv(path, sep, dtype, encoding, skip, label)
            except UnicodeDecodeError:
                if encoding != "utf-8-sig":
                    raise
                # Not UTF-8: what Excel writes in the user's locale (Eröffnung with the byte
                # 0xF6 in Windows-1252, Açılış in Windows-1254, 日付,始値 in Shift-JIS).
                fallback, head = _legacy_encoding(path, label)
                # The header's names are told in the code page (a title line before a
                # Turkish header was taken for the header: its names read as U+FFFD in UTF-8).
                skip, sep, dtype = _layout(head)
                try:
                    frame = _read_csv(path, sep, dtype, fallback, skip, label)
                except UnicodeDecodeError:
                    raise DataError(
                        f"{label}: cannot read file: not text (neither UTF-8, UTF-16 nor "
                        f"{_LEGACY_ENCODINGS[fallback]}); save it as UTF-8"
                    ) from None
                # Said once the fallback has read the file: never before an error saying it
                # could not.
                log.warning(
                    "%s: not UTF-8 text; reading it as %s", label, _LEGACY_ENCODINGS[fallback]
                )
                encoding = fallback  # the headerless re-read below reads it so too
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

    def read(names: list[str] | None = None) -> pd.DataFrame:
        # index_col=False: data rows with a trailing delimiter the header lacks must not turn
        # the first column into the index and shift every other column one place left.
        return pd.read_csv(
            source,
            sep=sep,
            skipinitialspace=True,
            dtype=dtype,
            encoding=encoding,
            skiprows=skip,
            index_col=False,
            header=header,
            names=names,
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", pd.errors.ParserWarning)
        frame = read()
    if any(issubclass(w.category, pd.errors.ParserWarning) for w in caught):
        # Some row has more fields than the header: pandas dropped the extras. Harmless when
        # they are empty (a trailing delimiter); otherwise say where.
        with _open_bytes(path, label) as f:
            lines = f.read().decode(encoding, errors="replace").splitlines()
        names = _unnamed_time_column(lines[skip:], sep) if header == 0 else None
        if names is None:
            _check_field_counts(lines[skip:], sep, skip + 1, label)
            return frame
        log.warning(
            "%s: every row holds a time of day after %r that the header does not name; read "
            "as the column 'time'",
            label,
            names[names.index("time") - 1],
        )
        if isinstance(source, io.BytesIO):
            source.seek(0)
        frame = read(names)  # header=0: the file's header line replaced by these names
    return frame


def _unnamed_time_column(lines: list[str], sep: str) -> list[str] | None:
    """The header's names with ``time`` put in, where every row holds one field more than the
    header names and that field, right after a date, is a time of day (backtrader's minute
    files name ``Date`` only); None otherwise."""
    if sep == _WHITESPACE:
        return None
    reader = csv.reader(lines, delimiter=sep, skipinitialspace=True)
    header = next(reader, None)
    if not header or any(_norm(name) in _TIME_OF_DAY_ALIASES for name in header):
        return None
    rows = [row for row in reader if any(field.strip() for field in row)]
    if not rows or any(len(row) != len(header) + 1 for row in rows):
        return None
    for k, name in enumerate(header):
        if _norm(name) not in _DATE_ONLY_ALIASES:  # a column named as a date, not a timestamp
            continue
        dates = [row[k].strip() for row in rows]
        clocks = [row[k + 1].strip() for row in rows]
        if all(_TIME_OF_DAY.fullmatch(c) for c in clocks) and not any(
            _TIME_OF_DAY.search(d) for d in dates
        ):
            return [*header[: k + 1], "time", *header[k + 1 :]]
        return None
    return None


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


# The code pages Excel writes CSV files in, by locale; the first wins a tie.
_LEGACY_ENCODINGS = {
    "cp1252": "Windows-1252",
    "cp1254": "Windows-1254 (Turkish)",
    "cp1250": "Windows-1250 (Central European)",
    "cp1251": "Windows-1251 (Cyrillic)",
    "cp932": "Shift-JIS",
}


def _legacy_encoding(path: Path, label: str) -> tuple[str, list[str]]:
    """The code page of a file that is not UTF-8, and its first lines in it: the one whose
    decoding shows the most known column names (Turkish Şimdi and Açılış read as Þimdi and
    Açýlýþ in Windows-1252, and match nothing). They all decode most bytes, so the names
    decide."""
    with _open_bytes(path, label) as f:
        raw = f.read(1 << 16)
    raw = raw[: raw.rfind(b"\n") + 1] or raw  # no character cut in half at the end

    def names(encoding: str) -> tuple[int, int]:
        text = raw.decode(encoding, errors="replace")
        lines = text.splitlines()[:40]
        found = max((_header_names(line) for line in lines), default=0)
        return found, -text.count("\ufffd")  # a tie goes to a code page that decodes it all

    best = max(_LEGACY_ENCODINGS, key=names)  # max keeps the first of equals
    return best, raw.decode(best, errors="replace").splitlines()[:50]


def _layout(head: list[str]) -> tuple[int, str, type | None]:
    """(lines before the header, delimiter, dtype) of a CSV from its first lines. Outside
    comma-delimited files the decimal mark is not known in advance ("12.345" may be 12345 in
    a German file): read text and decide once for the whole file."""
    skip = _leading_comments(head)
    sep = _delimiter(head[skip:])
    return skip, sep, None if sep == "," else str


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
