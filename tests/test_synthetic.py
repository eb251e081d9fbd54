"""The seeded Markov-switching market (foxhunt.markets.synthetic)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from foxhunt.errors import ConfigError
from foxhunt.markets.data import load_ohlcv
from foxhunt.markets.synthetic import (
    REGIME_NAMES,
    RegimeSpec,
    SyntheticMarketConfig,
    generate_market,
    write_synthetic_csv,
)

SMALL = SyntheticMarketConfig(n_bars=3000)


@pytest.fixture(scope="module")
def market() -> pd.DataFrame:
    return generate_market(SMALL, seed=0)


def single_regime(**kwargs) -> SyntheticMarketConfig:
    spec = RegimeSpec("only", **kwargs)
    return SyntheticMarketConfig(regimes=(spec,), transition=((1.0,),), n_bars=3000)


def test_same_seed_same_market_different_seed_different(market):
    again = generate_market(SMALL, seed=0)
    pd.testing.assert_frame_equal(market, again)
    other = generate_market(SMALL, seed=1)
    assert not np.allclose(market["close"].to_numpy(), other["close"].to_numpy())
    assert not np.array_equal(market["regime"].to_numpy(), other["regime"].to_numpy())


def test_layout_and_timestamps(market):
    assert list(market.columns) == ["open", "high", "low", "close", "volume", "regime"]
    assert market["regime"].dtype == np.int64
    assert market.attrs["regime_names"] == list(REGIME_NAMES)
    assert REGIME_NAMES == ("bull", "bear", "sideways", "high_volatility")
    assert len(market) == 3000
    assert market.index[0] == pd.Timestamp("2000-01-03")
    assert (np.diff(market.index.asi8) == 86_400 * 10**9).all()
    hourly = generate_market(SyntheticMarketConfig(n_bars=10, freq="1h", start="2021-05-01"))
    assert hourly.index[1] - hourly.index[0] == pd.Timedelta(hours=1)


def test_ohlc_consistent_and_passes_loader_validation(market):
    o, h, lo, c, v = (market[k].to_numpy() for k in ("open", "high", "low", "close", "volume"))
    assert (lo > 0).all() and (v > 0).all()
    assert (h >= np.maximum(o, c)).all()
    assert (lo <= np.minimum(o, c)).all()
    assert (h > lo).all()
    loaded = load_ohlcv(market)  # the strict validator accepts it unchanged
    np.testing.assert_array_equal(loaded["close"].to_numpy(), c)


def test_single_regime_returns_match_drift_and_volatility():
    """Close-to-close log returns are N(drift, vol^2) by construction: check both moments."""
    drift, vol = 0.002, 0.01
    df = generate_market(single_regime(drift=drift, volatility=vol), seed=3)
    r = np.diff(np.log(df["close"].to_numpy()))
    se = vol / math.sqrt(r.size)
    assert abs(r.mean() - drift) < 4 * se
    assert abs(r.std(ddof=1) / vol - 1) < 0.05  # sd of the sd estimate ~ 1/sqrt(2n) = 1.3%


def test_mean_reversion_matches_ar1_stationary_spread():
    """x_t = (1-k) x_{t-1} + e_t has stationary sd vol / sqrt(2k - k^2)."""
    kappa, vol = 0.1, 0.01
    df = generate_market(single_regime(drift=0.0, volatility=vol, mean_reversion=kappa), seed=5)
    x = np.log(df["close"].to_numpy() / 100.0)
    expected = vol / math.sqrt(2 * kappa - kappa**2)
    assert abs(x[100:].std() / expected - 1) < 0.25
    random_walk = generate_market(single_regime(drift=0.0, volatility=vol), seed=5)
    assert np.log(random_walk["close"].to_numpy() / 100).std() > 3 * expected


def test_regime_chain_follows_transition_matrix():
    """The empirical transition frequencies converge to the configured matrix."""
    p = ((0.9, 0.1, 0.0), (0.05, 0.9, 0.05), (0.2, 0.0, 0.8))
    specs = tuple(RegimeSpec(f"r{i}", drift=0.0, volatility=0.01) for i in range(3))
    df = generate_market(SyntheticMarketConfig(regimes=specs, transition=p, n_bars=3000), seed=2)
    s = df["regime"].to_numpy()
    counts = np.zeros((3, 3))
    np.add.at(counts, (s[:-1], s[1:]), 1)
    empirical = counts / counts.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(empirical, np.array(p), atol=0.04)
    assert counts[0, 2] == 0 and counts[2, 1] == 0  # impossible moves never happen


def test_each_bar_moves_with_its_own_regime_and_closes_at_its_path_end():
    """Nearly noiseless regimes that alternate every bar: each close-to-close log return is
    the drift of the regime the bar is labelled with (a one-bar lag of the labels, or a close
    taken before the path's end, would show), starting from the configured regime."""
    specs = (RegimeSpec("up", 0.05, 1e-9), RegimeSpec("down", -0.03, 1e-9))
    for first in (0, 1):
        cfg = SyntheticMarketConfig(
            regimes=specs, transition=((0.0, 1.0), (1.0, 0.0)), n_bars=40, initial_regime=first
        )
        df = generate_market(cfg, seed=1)
        regime = df["regime"].to_numpy()
        assert regime[0] == first and (np.diff(regime) != 0).all()
        moves = np.diff(np.log(np.concatenate([[cfg.start_price], df["close"].to_numpy()])))
        np.testing.assert_allclose(moves, np.where(regime == 0, 0.05, -0.03), atol=1e-7)


def test_mean_reversion_pulls_toward_the_level_at_regime_entry():
    """A trend, then a mean-reverting regime with no drift that never ends: prices stay at the
    level where it began, not at the market's start price."""
    specs = (RegimeSpec("trend", 0.02, 1e-9), RegimeSpec("range", 0.0, 1e-9, mean_reversion=0.5))
    cfg = SyntheticMarketConfig(
        regimes=specs, transition=((0.95, 0.05), (0.0, 1.0)), n_bars=400, initial_regime=0
    )
    df = generate_market(cfg, seed=0)
    regime, close = df["regime"].to_numpy(), df["close"].to_numpy()
    entry = int(np.argmax(regime == 1))
    assert 5 < entry < 300 and (regime[entry:] == 1).all()
    np.testing.assert_allclose(close[entry:], close[entry - 1], rtol=1e-6)
    assert close[entry - 1] > 1.1 * cfg.start_price


def test_default_regimes_are_sticky(market):
    cfg = SyntheticMarketConfig()
    durations = cfg.expected_durations
    assert ((durations > 50 - 1e-6) & (durations < 200 + 1e-6)).all()
    s = market["regime"].to_numpy()
    changes = np.flatnonzero(np.diff(s) != 0)
    mean_run = len(s) / (changes.size + 1)
    expected_run = 1.0 / float(cfg.stationary_distribution() @ (1 - np.diag(cfg.transition_matrix)))
    assert 0.6 * expected_run < mean_run < 1.6 * expected_run
    assert len(np.unique(s)) == 4  # every regime visited in 3000 bars


def test_stationary_distribution_is_fixed_point():
    cfg = SyntheticMarketConfig()
    pi = cfg.stationary_distribution()
    np.testing.assert_allclose(pi @ cfg.transition_matrix, pi, atol=1e-12)
    assert abs(pi.sum() - 1) < 1e-12


def test_default_regimes_differ_in_the_way_a_trader_cares_about(market):
    r = np.diff(np.log(market["close"].to_numpy()))
    s = market["regime"].to_numpy()[1:]
    mean = {name: r[s == k].mean() for k, name in enumerate(REGIME_NAMES)}
    std = {name: r[s == k].std() for k, name in enumerate(REGIME_NAMES)}
    assert mean["bull"] > 0 > mean["bear"]
    assert std["high_volatility"] > 1.5 * max(std["bull"], std["bear"], std["sideways"])
    assert std["sideways"] < std["bull"] < std["bear"]


def test_volume_rises_with_absolute_return(market):
    r = np.abs(np.diff(np.log(market["close"].to_numpy())))
    v = market["volume"].to_numpy()[1:]
    spearman = np.corrcoef(np.argsort(np.argsort(r)), np.argsort(np.argsort(v)))[0, 1]
    assert spearman > 0.3


def test_write_synthetic_csv_round_trips_exactly(tmp_path):
    cfg = SyntheticMarketConfig(n_bars=200)
    path = write_synthetic_csv(tmp_path / "sub" / "market.csv", cfg, seed=4)
    loaded = load_ohlcv(path)
    original = generate_market(cfg, seed=4)
    pd.testing.assert_frame_equal(loaded, original, check_freq=False, check_like=False)
    assert sorted(p.name for p in path.parent.iterdir()) == ["market.csv"]  # no temp left


def test_write_synthetic_csv_gzip_is_deterministic(tmp_path):
    cfg = SyntheticMarketConfig(n_bars=50)
    a = write_synthetic_csv(tmp_path / "a.csv.gz", cfg, seed=1).read_bytes()
    b = write_synthetic_csv(tmp_path / "b.csv.gz", cfg, seed=1).read_bytes()
    assert a == b and a[:2] == b"\x1f\x8b"
    assert load_ohlcv(tmp_path / "a.csv.gz").shape == (50, 6)


def test_write_rejects_other_suffix(tmp_path):
    with pytest.raises(ConfigError, match=r"market\.txt"):
        write_synthetic_csv(tmp_path / "market.txt")
    assert not (tmp_path / "market.txt").exists()


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"transition": ((0.5, 0.5),)}, "4x4"),
        ({"transition": ((0.9, 0.1, 0, 0),) * 3 + ((0.5, 0.1, 0.1, 0.1),)}, "row 3"),
        ({"n_bars": 1}, "n_bars"),
        ({"start_price": -1.0}, "start_price"),
        ({"freq": "fortnightly"}, "fortnightly"),
        ({"initial_regime": 7}, "initial_regime"),
        # Bars that do not move forward in time (a raw range() error, or a newest-first file).
        ({"freq": "0D"}, "freq must step forward in time, got '0D'"),
        ({"freq": "-1D"}, "freq must step forward in time"),
        # Past pandas' last nanosecond timestamp: OutOfBoundsDatetime while generating.
        ({"start": "2262-04-05", "n_bars": 10}, "must end by 2262-04-11"),
        # A billion intrabar steps met the OOM killer, not an error.
        ({"substeps": 10**9}, r"n_bars x substeps must be at most 200,000,000"),
    ],
)
def test_config_validation_names_field_and_value(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        SyntheticMarketConfig(**kwargs)


def test_regime_spec_validation():
    with pytest.raises(ConfigError, match="volatility"):
        RegimeSpec("x", drift=0.0, volatility=0.0)
    with pytest.raises(ConfigError, match="mean_reversion"):
        RegimeSpec("x", drift=0.0, volatility=0.01, mean_reversion=1.5)


def test_negative_seed_rejected():
    with pytest.raises(ConfigError, match="seed"):
        generate_market(SMALL, seed=-1)


def test_inputs_that_cannot_make_a_market_name_their_field():
    """start=None blamed freq; a drift that takes prices past float range returned inf closes
    with only NumPy's overflow warnings."""
    with pytest.raises(ConfigError, match="start must be a timestamp, got None"):
        SyntheticMarketConfig(start=None)  # type: ignore[arg-type]
    steep = SyntheticMarketConfig(
        regimes=(RegimeSpec("x", 0.5, 0.5),), transition=np.ones((1, 1)), n_bars=3000
    )
    with pytest.raises(ConfigError, match=r"leave float range at bar \d+ of 3000 .*drift"):
        generate_market(steep, seed=0)
    # Prices near the float limits that stay within them are generated, as before.
    tiny = SyntheticMarketConfig(start_price=1e-300, n_bars=300)
    assert np.isfinite(generate_market(tiny, seed=0)["close"]).all()
