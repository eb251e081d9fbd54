"""Causal features and the train-only normaliser (foxhunt.markets.features)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foxhunt.errors import DataError
from foxhunt.markets.features import (
    FeatureNormalizer,
    compute_features,
    feature_warmup,
    log_returns,
    rolling_std,
)
from foxhunt.markets.synthetic import SyntheticMarketConfig, generate_market


@pytest.fixture(scope="module")
def market() -> pd.DataFrame:
    return generate_market(SyntheticMarketConfig(n_bars=1000), seed=7)


def tiny() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "open": [10.0, 10.0, 11.0, 12.0],
            "high": [11.0, 12.0, 12.0, 12.5],
            "low": [9.0, 9.5, 10.0, 11.0],
            "close": [10.0, 11.0, 12.0, 11.0],
            "volume": [100.0, 100.0, 200.0, 50.0],
        },
        index=pd.date_range("2020-01-01", periods=4, name="timestamp"),
    )


def test_features_match_hand_computation():
    f = compute_features(tiny(), return_horizons=(1, 2), vol_window=2, volume_window=3)
    assert list(f.columns) == ["ret_1", "ret_2", "vol_2", "range", "body", "volume_z"]
    np.testing.assert_allclose(f["ret_1"].iloc[1:], np.log([1.1, 12 / 11, 11 / 12]))
    np.testing.assert_allclose(f["ret_2"].iloc[2:], np.log([1.2, 1.0]))
    assert f["ret_1"].isna().iloc[0] and f["ret_2"].isna().iloc[:2].all()
    # vol_2 at row 2: sample sd of the returns at rows 1 and 2.
    r1, r2 = np.log(1.1), np.log(12 / 11)
    assert f["vol_2"].iloc[2] == pytest.approx(abs(r1 - r2) / np.sqrt(2))
    assert f["vol_2"].isna().iloc[:2].all()
    np.testing.assert_allclose(f["range"], [0.2, 2.5 / 11, 2 / 12, 1.5 / 11])
    np.testing.assert_allclose(f["body"], [0.0, 1 / 11, 1 / 12, -1 / 11])
    lv = np.log1p([100.0, 100.0, 200.0, 50.0])
    z2 = (lv[2] - lv[:3].mean()) / lv[:3].std(ddof=1)
    z3 = (lv[3] - lv[1:4].mean()) / lv[1:4].std(ddof=1)
    np.testing.assert_allclose(f["volume_z"].iloc[2:], [z2, z3])
    assert f["volume_z"].isna().iloc[:2].all()


def test_constant_volume_scores_zero_not_nan():
    df = tiny().assign(volume=0.0)
    f = compute_features(df, return_horizons=(1,), vol_window=2, volume_window=2)
    assert f["volume_z"].iloc[1:].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "windows",
    [{}, {"volume_window": 30}, {"vol_window": 25}, {"return_horizons": (1, 40)}],
    ids=["defaults", "volume", "volatility", "returns"],
)
def test_warmup_count_matches_nan_rows(market, windows):
    """Each window in turn the longest: the count follows the one that sets it."""
    f = compute_features(market, **windows)
    first_full = int(np.argmax(f.notna().all(axis=1).to_numpy()))
    assert first_full == feature_warmup(**windows)
    assert f.iloc[first_full:].notna().all().all()


def test_features_are_causal(market):
    """Appending future bars leaves every earlier row bit-for-bit identical."""
    full = compute_features(market)
    prefix = compute_features(market.iloc[:600])
    pd.testing.assert_frame_equal(full.iloc[:600], prefix, check_exact=True)


def test_rolling_std_and_log_returns_against_pandas():
    x = np.random.default_rng(0).normal(size=50)
    np.testing.assert_allclose(rolling_std(x, 5), pd.Series(x).rolling(5).std(), equal_nan=True)
    c = np.exp(np.cumsum(x) * 0.01)
    np.testing.assert_allclose(log_returns(c, 3)[3:], np.log(c[3:] / c[:-3]))


def test_normalizer_standardises_with_training_rows_only(market):
    f = compute_features(market)
    norm = FeatureNormalizer(clip=None).fit(f.iloc[:700])
    train_values = f.iloc[:700]
    np.testing.assert_allclose(norm.mean_, train_values.mean().to_numpy())  # pandas skips NaN
    np.testing.assert_allclose(norm.std_, train_values.std(ddof=0).to_numpy())
    z = norm.transform(f)
    # Finite training rows are centred; NaN warm-up rows map to exactly 0, so the sum is 0.
    np.testing.assert_allclose(z[:700].sum(axis=0), 0.0, atol=1e-9)
    # Changing the test span changes nothing about the statistics.
    tampered = f.copy()
    tampered.iloc[700:] = tampered.iloc[700:] * 50.0 + 3.0
    other = FeatureNormalizer(clip=None).fit(tampered.iloc[:700])
    np.testing.assert_array_equal(other.mean_, norm.mean_)
    np.testing.assert_array_equal(other.std_, norm.std_)
    np.testing.assert_array_equal(other.transform(tampered)[:700], z[:700])


def test_normalizer_warmup_rows_become_zero_and_clip(market):
    f = compute_features(market)
    z = FeatureNormalizer(clip=3.0).fit(f.iloc[:500]).transform(f)
    assert np.isfinite(z).all()
    assert (z[0, :3] == 0).all()  # NaN warm-up -> 0 (the training mean)
    assert np.abs(z).max() <= 3.0


def test_normalizer_guards_constant_columns():
    x = np.column_stack([np.ones(10), np.arange(10.0)])
    z = FeatureNormalizer().fit(x).transform(x)
    assert np.isfinite(z).all()
    assert (z[:, 0] == 0).all()


def test_normalizer_round_trips_through_dict(market):
    f = compute_features(market)
    norm = FeatureNormalizer().fit(f.iloc[:400])
    again = FeatureNormalizer.from_dict(norm.to_dict())
    np.testing.assert_array_equal(again.transform(f), norm.transform(f))


def test_normalizer_rejects_mismatched_columns(market):
    f = compute_features(market)
    norm = FeatureNormalizer().fit(f.iloc[:400])
    with pytest.raises(DataError, match="columns"):
        norm.transform(f.iloc[:, ::-1])
    with pytest.raises(DataError, match="no finite training rows"):
        FeatureNormalizer().fit(f.iloc[:3])
