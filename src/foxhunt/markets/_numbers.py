"""Numbers for the OHLCV loader: Decimal-typed columns, the decimal mark (comma or point) read
from the values and headers, thousands separators, K/M/B suffixes and :func:`_to_float`. Separate
so that every rule about how a localised number reads sits in one place."""

from __future__ import annotations

import decimal
import logging
import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from foxhunt.errors import DataError
from foxhunt.markets._text import _fmt

# The loader's one logger, whichever of its modules warns: users and tests filter on this name,
# and _silenced() disables it for all of them at once.
log = logging.getLogger("foxhunt.markets.data")


_MISSING_STRINGS = {"", "nan", "na", "n/a", "null", "none", "nat"}


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
