"""Column names for the OHLCV loader: canonical aliases, localised (German, French, ...) names,
fallbacks (adjusted close, price/last, tick volume), instrument and volume-variant columns, and
:func:`_find_columns`, which says which label holds open/high/low/close/volume. Separate from
reading and parsing: it decides what each column is, not how its values read."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from foxhunt.errors import DataError
from foxhunt.markets._text import _fmt, _norm, _printable

# The loader's one logger, whichever of its modules warns: users and tests filter on this name,
# and _silenced() disables it for all of them at once.
log = logging.getLogger("foxhunt.markets.data")


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
    # MOEX AlgoPack's trade statistics (pr_open ...; its "vol" is the volume).
    "pr open": "open",
    "pr high": "high",
    "pr low": "low",
    "pr close": "close",
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
        # NSE's index exports write "Shares Traded" (beside "Turnover", a value, not taken).
        frozenset({"total volume", "total traded quantity", "ttl trd qnty", "shares traded"}),
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
    "tradedate",
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
    "begin",  # MOEX ISS candles: the bar's start (beside its "end")
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
    "tradedate",  # MOEX AlgoPack, beside "tradetime"
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
    "時間", "时间", "minute", "tradetime",
)  # fmt: skip


def _header_names(line: str) -> int:
    """How many fields of a line are column names this loader knows (date, open, close, ...)."""
    names = [_norm(f.strip('"')) for f in re.split(r"[,;\t|]", line)]
    return sum(n in _ALIASES or n in _FALLBACK_NAMES or n in _TIMESTAMP_ALIASES[:-1] for n in names)


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
        quotes = {"bid", "ask", "bid price", "ask price", "bidprice", "askprice", "bid close"}
        hint = (
            "; bid/ask quotes are not bars: build OHLC bars from them (of the mid price, say)"
            if quotes & {_norm(c) for c in frame.columns}
            else ""
        )
        raise DataError(f"{label}: missing column(s) {', '.join(missing)} (found: {seen}){hint}")
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
