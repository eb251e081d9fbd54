"""From an OHLCV frame to MarketArrays (foxhunt.markets.pipeline)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.arrays import MarketArrays
from foxhunt.markets.data import load_ohlcv
from foxhunt.markets.features import FeatureNormalizer, compute_features
from foxhunt.markets.pipeline import DETECTORS, default_market, prepare_market
from foxhunt.markets.regimes import GaussianHMMDetector
from foxhunt.markets.synthetic import SyntheticMarketConfig, generate_market, write_synthetic_csv

TRAIN_END = 1500


@pytest.fixture(scope="module")
def market() -> pd.DataFrame:
    return generate_market(SyntheticMarketConfig(n_bars=2000), seed=5)


@pytest.fixture(scope="module")
def arrays(market) -> MarketArrays:
    return prepare_market(market, train_end=TRAIN_END, detector="hmm", seed=0)


def test_layout_and_dtypes(arrays, market):
    n = len(market)
    assert len(arrays) == n
    assert arrays.timestamps.dtype == np.dtype("datetime64[ns]")
    np.testing.assert_array_equal(arrays.timestamps, market.index.to_numpy())
    assert arrays.close.dtype == np.float64
    np.testing.assert_array_equal(arrays.close, market["close"].to_numpy())
    assert arrays.features.dtype == np.float32 and arrays.features.shape == (n, 7)
    assert arrays.regime_probs.dtype == np.float32 and arrays.regime_probs.shape == (n, 4)
    np.testing.assert_allclose(arrays.regime_probs.sum(axis=1), 1.0, atol=1e-6)
    assert np.isfinite(arrays.features).all()
    assert arrays.feature_names == tuple(compute_features(market).columns)
    assert arrays.regime_names == ("state_0", "state_1", "state_2", "state_3")
    np.testing.assert_array_equal(arrays.true_regimes, market["regime"].to_numpy())
    assert arrays.true_regimes.dtype == np.int64


def test_features_use_training_statistics(arrays, market):
    raw = compute_features(market)
    expected = FeatureNormalizer().fit(raw.iloc[:TRAIN_END]).transform(raw).astype(np.float32)
    np.testing.assert_array_equal(arrays.features, expected)
    # Training rows are centred (NaN warm-up rows are exactly 0, so the sum over all is 0).
    assert np.abs(arrays.features[:TRAIN_END].astype(np.float64).sum(axis=0)).max() < 1e-2


def test_regime_probs_come_from_a_train_only_hmm(arrays, market):
    det = GaussianHMMDetector(4, seed=0).fit(market.iloc[:TRAIN_END])
    np.testing.assert_allclose(arrays.regime_probs, det.predict_proba(market), atol=1e-6)


@pytest.mark.parametrize("detector", ["hmm", "volatility_trend"])
def test_prefix_gives_identical_leading_rows(detector, arrays, market):
    """prepare_market on a prefix (same train_end) reproduces the leading rows exactly."""
    full = (
        arrays
        if detector == "hmm"
        else prepare_market(market, train_end=TRAIN_END, detector=detector)
    )
    prefix = prepare_market(market.iloc[:1700], train_end=TRAIN_END, detector=detector)
    np.testing.assert_array_equal(prefix.features, full.features[:1700])
    np.testing.assert_array_equal(prefix.regime_probs, full.regime_probs[:1700])
    np.testing.assert_array_equal(prefix.close, full.close[:1700])


def test_test_span_data_cannot_leak_into_training_rows(arrays, market):
    tampered = market.copy()
    scale = np.linspace(1.0, 3.0, len(market) - TRAIN_END)
    for col in ("open", "high", "low", "close"):
        tampered.iloc[TRAIN_END:, tampered.columns.get_loc(col)] *= scale
    other = prepare_market(tampered, train_end=TRAIN_END, detector="volatility_trend")
    baseline = prepare_market(market, train_end=TRAIN_END, detector="volatility_trend")
    np.testing.assert_array_equal(other.features[:TRAIN_END], baseline.features[:TRAIN_END])
    np.testing.assert_array_equal(other.regime_probs[:TRAIN_END], baseline.regime_probs[:TRAIN_END])


def test_oracle_and_none_detectors(market):
    oracle = prepare_market(market, train_end=TRAIN_END, detector="oracle")
    np.testing.assert_array_equal(oracle.regime_probs.argmax(axis=1), market["regime"].to_numpy())
    assert set(np.unique(oracle.regime_probs)) == {0.0, 1.0}
    assert oracle.regime_names == ("bull", "bear", "sideways", "high_volatility")
    none = prepare_market(market, train_end=TRAIN_END, detector="none")
    assert none.regime_probs.shape == (len(market), 1) and (none.regime_probs == 1).all()


def test_real_style_frame_without_regime_column(market):
    plain = market.drop(columns="regime").rename(columns=str.title)
    out = prepare_market(plain, train_end=TRAIN_END, detector="volatility_trend")
    assert out.true_regimes is None
    assert out.regime_names == ("bull", "bear", "sideways", "high_volatility")
    with pytest.raises(ConfigError, match="regime"):
        prepare_market(plain, train_end=TRAIN_END, detector="oracle")


def test_synthetic_csv_keeps_true_regimes(tmp_path):
    cfg = SyntheticMarketConfig(n_bars=400)
    frame = load_ohlcv(write_synthetic_csv(tmp_path / "m.csv", cfg, seed=2))
    out = prepare_market(frame, train_end=300, detector="volatility_trend")
    original = generate_market(cfg, seed=2)
    np.testing.assert_array_equal(out.true_regimes, original["regime"])
    # The names come back too (the CSV's regime_name column), not regime_0..regime_3; a regime
    # these 400 bars never visit has no name in the file.
    seen = np.unique(original["regime"])
    assert len(seen) >= 2 and out.true_regime_names[0] == "bull"
    for k in seen:
        assert out.true_regime_names[k] == original.attrs["regime_names"][k]


def test_a_regime_with_two_names_is_refused(tmp_path):
    path = write_synthetic_csv(tmp_path / "m.csv", SyntheticMarketConfig(n_bars=300), seed=2)
    lines = path.read_text().splitlines()
    header, first = lines[0].split(","), lines[1].split(",")
    first[header.index("regime_name")] = "renamed"
    path.write_text("\n".join([lines[0], ",".join(first), *lines[2:]]) + "\n")
    with pytest.raises(DataError, match=r"row 2 .*named 'bull' here but 'renamed' before"):
        load_ohlcv(path)


def test_validation_names_the_value(market):
    with pytest.raises(ConfigError) as err:
        prepare_market(market, train_end=TRAIN_END, detector="kmeans")
    assert "'kmeans'" in str(err.value)
    assert all(repr(d) in str(err.value) for d in DETECTORS)
    with pytest.raises(ConfigError, match="5000"):
        prepare_market(market, train_end=5000)
    with pytest.raises(ConfigError, match="train_end=10"):
        prepare_market(market, train_end=10)
    bad = market.copy()
    bad.iloc[7, bad.columns.get_loc("low")] = -1.0
    with pytest.raises(DataError, match="row 8"):
        prepare_market(bad, train_end=TRAIN_END, detector="none")


def test_default_market_is_the_default_config():
    a = default_market(seed=3)
    assert len(a) == SyntheticMarketConfig().n_bars
    pd.testing.assert_frame_equal(a, generate_market(seed=3))


def test_prepare_market_caps_regimes_as_the_cli_does():
    df = generate_market(SyntheticMarketConfig(n_bars=600), seed=0)
    for bad in (0, 17, 50, True):
        with pytest.raises(ConfigError, match=r"n_regimes must be an integer in 1..16"):
            prepare_market(df, train_end=400, n_regimes=bad)


def test_a_kept_detector_replaces_the_fit_with_the_same_arrays(
    arrays, market, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """A run keeps its fitted HMM (data.json), so evaluate and resume do not repeat Baum-Welch
    (minutes on a million bars): the kept state gives the same arrays as the fit, and is only
    taken for the same training rows and settings; a damaged one is refitted, with a warning."""
    import json

    from foxhunt.markets.pipeline import prepare_market_with_detector

    fitted, kept_fit = prepare_market_with_detector(market, train_end=TRAIN_END, seed=0)
    assert set(kept_fit) == {"detector", "normalizer"}
    state = kept_fit["detector"]
    assert state is not None and set(state) == {"key", "params"}
    state = json.loads(json.dumps(state))  # as data.json holds it
    calls: list[int] = request.getfixturevalue("hmm_fits")  # counted from here on
    again, kept = prepare_market_with_detector(
        market, train_end=TRAIN_END, seed=0, detector_state=state
    )
    assert calls == [] and kept["detector"] == state
    for name in ("regime_probs", "features", "close"):
        np.testing.assert_array_equal(getattr(again, name), getattr(arrays, name))
        np.testing.assert_array_equal(getattr(again, name), getattr(fitted, name))
    # Other training rows, another seed, another value in the training span: refitted.
    prepare_market_with_detector(market, train_end=TRAIN_END - 1, seed=0, detector_state=state)
    prepare_market_with_detector(market, train_end=TRAIN_END, seed=1, detector_state=state)
    changed = market.copy()
    changed.iloc[10, changed.columns.get_loc("close")] *= 1.0001
    prepare_market_with_detector(changed, train_end=TRAIN_END, seed=0, detector_state=state)
    assert calls == [TRAIN_END - 1, TRAIN_END, TRAIN_END]
    # Damaged: refitted, the same arrays as the fit.
    damages = (
        {"transition_": [[2.0] * 4] * 4},
        {"means_": [[0.0]]},
        {"means_": None},
        {"means_": [[10**400, 0.0]] * 4},  # past float: OverflowError
        {"log_likelihood_history": [10**400]},
        {"variances_": [[1e-320, 1.0]] * 4},  # below min_variance: no fit gives it
        {"variances_": [[1.0, 1e6]] * 4},  # beyond clip_sigma**2: nor this
        {"means_": [[1e200, 1e200]] * 4},  # beyond clip_sigma
        {"feature_std_": [0.0, 1.0]},
        {"state_return_": ["0.25"] * 4},
        {"converged": "yes"},
    )
    for damage in damages:
        bad = {"key": state["key"], "params": {**state["params"], **damage}}
        with caplog.at_level("WARNING", logger="foxhunt.markets.pipeline"):
            out, _ = prepare_market_with_detector(
                market, train_end=TRAIN_END, seed=0, detector_state=bad
            )
        np.testing.assert_array_equal(out.regime_probs, arrays.regime_probs)
    assert len(calls) == 3 + len(damages)
    assert caplog.text.count("kept regime detector is damaged") == len(damages)
    # start_ is not stored: the filter's prior is recomputed from the transitions, as fitted.
    assert "start_" not in state["params"]
    # The oracle and no detector keep nothing, and take nothing, whatever a record says.
    for detector in ("oracle", "none"):
        for record in ({}, {"key": None, "params": {}}, [1]):
            out, kept = prepare_market_with_detector(
                market, train_end=TRAIN_END, detector=detector, detector_state=record
            )
            assert kept["detector"] is None


@pytest.mark.parametrize("detector", ["volatility_trend", "hmm", "none"])
def test_revised_training_rows_keep_the_fitted_scale_and_rule(
    market, detector: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A run acting on its own bars with a revised training value (a vendor's correction)
    keeps what it fitted: the feature normalisation (a refit rescaled every observation) and
    the detector, the volatility/trend rule's quantile thresholds included (refitted, they
    moved, and bars near them changed state). A fresh preparation still refits."""
    import json

    from foxhunt.markets.pipeline import prepare_market_with_detector

    n_regimes = 3 if detector == "volatility_trend" else 4
    settings = {"train_end": TRAIN_END, "detector": detector, "n_regimes": n_regimes}
    trained, kept = prepare_market_with_detector(market, **settings)
    kept = json.loads(json.dumps(kept))  # as data.json holds it
    revised = market.copy()  # a stretch of training bars rescaled (a split mis-adjusted)
    revised.iloc[
        300:340, [revised.columns.get_loc(c) for c in ("open", "high", "low", "close")]
    ] *= 1.3
    refit, _ = prepare_market_with_detector(revised, **settings)
    with caplog.at_level("WARNING", logger="foxhunt.markets.pipeline"):
        again, again_kept = prepare_market_with_detector(
            revised,
            **settings,
            detector_state=kept["detector"],
            normalizer_state=kept["normalizer"],
            keep_fitted=True,
        )
    later = slice(400, None)  # past every window that holds the revised bar
    np.testing.assert_array_equal(again.features[later], trained.features[later])
    np.testing.assert_array_equal(again.regime_probs[later], trained.regime_probs[later])
    assert not np.array_equal(refit.features[later], trained.features[later])
    what = "feature normalisation" + ("" if detector == "none" else " and regime detector")
    assert f"the run's {what} " in caplog.text
    assert again_kept["normalizer"]["stats"] == kept["normalizer"]["stats"]
    if detector == "volatility_trend":
        assert not np.array_equal(refit.regime_probs[later], trained.regime_probs[later])
        assert kept["detector"]["params"]["vol_threshold"] is None  # 3 states: no such one
    # A damaged normalisation is refitted, said, and the detector still kept.
    caplog.clear()
    for damage in ({"mean": [0.0]}, {"std": "x"}, {"columns": ["a"]}, {"clip": 3.0}, None):
        stats = None if damage is None else {**kept["normalizer"]["stats"], **damage}
        with caplog.at_level("WARNING", logger="foxhunt.markets.pipeline"):
            out, _ = prepare_market_with_detector(
                revised,
                **settings,
                detector_state=kept["detector"],
                normalizer_state={"key": "other", "stats": stats},
                keep_fitted=True,
            )
        np.testing.assert_array_equal(out.features, refit.features)
    assert caplog.text.count("kept feature normalisation is damaged") == 5


def test_the_rule_detectors_kept_state_is_checked(market) -> None:
    from foxhunt.markets.regimes import VolatilityTrendDetector

    fitted = VolatilityTrendDetector(4).fit(market.iloc[:TRAIN_END])
    state = fitted.fitted_state()
    loaded = VolatilityTrendDetector(4).load_fitted_state(state)
    np.testing.assert_array_equal(loaded.predict_proba(market), fitted.predict_proba(market))
    for damage in (
        {"vol_threshold": None},
        {"vol_threshold": -1.0},
        {"vol_threshold": float("nan")},
        {"trend_thresholds": [0.1]},
        {"trend_thresholds": [0.2, 0.1]},
        {"trend_thresholds": ["0.1", 0.2]},
        {"settings": {**state["settings"], "vol_window": 10}},
    ):
        fresh = VolatilityTrendDetector(4)
        with pytest.raises(ValueError):
            fresh.load_fitted_state({**state, **damage})
        assert fresh.trend_thresholds_ is None  # nothing set
    with pytest.raises(ValueError, match="null with 3 states"):
        VolatilityTrendDetector(3).load_fitted_state(
            {**state, "settings": VolatilityTrendDetector(3).settings()}
        )


def test_prepare_market_keeps_the_features_named(market, arrays):
    # As market.features does for `foxhunt train`: a loop of one's own chose no features.
    names = arrays.feature_names
    picked = prepare_market(
        market, train_end=TRAIN_END, detector="none", features=[names[3], names[0]]
    )
    assert picked.feature_names == (names[3], names[0])
    np.testing.assert_array_equal(picked.features, arrays.features[:, [3, 0]])
    none = prepare_market(market, train_end=TRAIN_END, detector="none", features=())
    assert none.features.shape == (len(market), 0) and none.feature_names == ()
    one = prepare_market(market, train_end=TRAIN_END, detector="none", features=names[2])
    assert one.feature_names == (names[2],)  # a lone name, not its letters
    with pytest.raises(
        ConfigError, match=f"features has unknown feature 'nope'; available: {names[0]}"
    ):
        prepare_market(market, train_end=TRAIN_END, detector="none", features=["nope"])
    with pytest.raises(ConfigError, match=f"features names {names[1]!r} more than once"):
        prepare_market(market, train_end=TRAIN_END, features=[names[1], names[1]])
