"""From an OHLCV frame to :class:`MarketArrays`: features, causal regime probabilities, prices.

Every statistic that is learned (feature mean/std, detector thresholds or HMM parameters) is
learned from rows ``[:train_end]`` only, then applied causally to all rows. Hence running
:func:`prepare_market` on a prefix of a frame (with the same ``train_end``) gives exactly the
leading rows of running it on the whole frame: nothing after a bar influences that bar's row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.arrays import MarketArrays
from foxhunt.markets.data import load_ohlcv
from foxhunt.markets.features import FeatureNormalizer, compute_features, feature_warmup
from foxhunt.markets.regimes import GaussianHMMDetector, RegimeDetector, VolatilityTrendDetector
from foxhunt.markets.synthetic import SyntheticMarketConfig, generate_market

__all__ = [
    "DETECTORS",
    "default_market",
    "make_detector",
    "prepare_market",
    "prepare_market_with_detector",
]

log = logging.getLogger(__name__)

# "oracle" one-hot encodes the true `regime` column (synthetic data only): an upper bound for
# ablations, not a detector. "none" gives a single constant regime: the no-regime ablation.
DETECTORS: tuple[str, ...] = ("hmm", "volatility_trend", "oracle", "none")


def default_market(seed: int = 0) -> pd.DataFrame:
    """The default synthetic market (:class:`SyntheticMarketConfig` defaults) for ``seed``."""
    return generate_market(SyntheticMarketConfig(), seed=seed)


def make_detector(name: str, n_regimes: int = 4, *, seed: int = 0) -> RegimeDetector:
    """Build an unfitted detector by name (``"hmm"`` or ``"volatility_trend"``)."""
    if name == "hmm":
        return GaussianHMMDetector(n_regimes, seed=seed)
    if name == "volatility_trend":
        return VolatilityTrendDetector(n_regimes)
    raise ConfigError(f"detector must be one of 'hmm', 'volatility_trend', got {name!r}")


def _oracle_probs(df: pd.DataFrame, n_regimes: int) -> tuple[np.ndarray, tuple[str, ...]]:
    if "regime" not in df.columns:
        raise ConfigError("detector='oracle' needs a 'regime' column (synthetic data); none found")
    regimes = df["regime"].to_numpy(dtype=np.int64)
    if regimes.min() < 0 or regimes.max() >= n_regimes:
        raise ConfigError(
            f"detector='oracle': regime ids must lie in [0, n_regimes={n_regimes}), "
            f"found {int(regimes.min())}..{int(regimes.max())}"
        )
    names = df.attrs.get("regime_names")
    if names is None or len(names) != n_regimes:
        names = [f"regime_{k}" for k in range(n_regimes)]
    return np.eye(n_regimes)[regimes], tuple(str(n) for n in names)


def prepare_market(
    df: pd.DataFrame,
    *,
    train_end: int,
    detector: str = "hmm",
    n_regimes: int = 4,
    seed: int = 0,
    features: Sequence[str] | None = None,
) -> MarketArrays:
    """Build the arrays an environment and a backtest consume, without look-ahead.

    ``df`` is validated with :func:`load_ohlcv` (a synthetic ``regime`` column becomes
    ``true_regimes``). Features are normalised with statistics of rows ``[:train_end]``; the
    detector (``"hmm"``, ``"volatility_trend"``, ``"oracle"`` or ``"none"``) is fitted on the
    same rows and filtered over all rows. Warm-up rows have zero features (see ``features.py``).
    ``features`` keeps the named columns of ``feature_names`` in that order (default: all; ``()``
    none, the observation then being the regime estimate and the position), as
    ``market.features`` does for ``foxhunt train``.
    """
    market = prepare_market_with_detector(
        df, train_end=train_end, detector=detector, n_regimes=n_regimes, seed=seed
    )[0]
    return market if features is None else select_features(market, features)


def select_features(
    market: MarketArrays, names: Sequence[str], *, field: str = "features"
) -> MarketArrays:
    """Keep only the named feature columns, in the order named (errors list what is available
    and name ``field``, the setting the names came from)."""
    if isinstance(names, str):  # "ret_1" would read as five one-letter names
        names = (names,)
    names = tuple(names)
    available = list(market.feature_names)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ConfigError(
            f"{field} has unknown feature {unknown[0]!r}; available: {', '.join(available)}"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{field} names {repeated[0]!r} more than once: list it once")
    idx = [available.index(n) for n in names]
    return dataclasses.replace(market, features=market.features[:, idx], feature_names=names)


# Bumped whenever the HMM fit changes: a detector kept by an older version is then refitted.
_FIT_VERSION = 1


def _fit_key(train: pd.DataFrame, detector: str, n_regimes: int, seed: int) -> str:
    """What a fitted detector depends on: its settings and every value of the training rows."""
    h = hashlib.sha256(json.dumps([_FIT_VERSION, detector, n_regimes, seed]).encode())
    h.update(train.index.to_numpy(dtype="datetime64[ns]").view(np.int64).tobytes())
    for column in ("open", "high", "low", "close", "volume"):
        if column in train.columns:
            h.update(column.encode())
            h.update(np.ascontiguousarray(train[column].to_numpy(dtype=np.float64)).tobytes())
    return h.hexdigest()


def _load_kept(model: RegimeDetector, key: str | None, state: object) -> bool:
    """Whether ``model`` took the kept ``state`` (a run record's: any JSON) for ``key``."""
    if key is None or not isinstance(state, Mapping) or state.get("key") != key:
        return False
    try:
        model.load_fitted_state(state.get("params"))  # type: ignore[attr-defined]
    except ValueError as err:
        log.warning("the run's kept regime detector is damaged (%s): refitting it", err)
        return False
    return True


def _kept_normalizer(stats: object, columns: tuple[str, ...]) -> FeatureNormalizer | None:
    """The run record's feature normalisation (any JSON), or None with a warning when it does
    not fit these features (damaged, or written for other columns or clipping)."""
    try:
        if not isinstance(stats, Mapping):
            raise ConfigError(f"not a mapping: {type(stats).__name__}")
        kept = FeatureNormalizer.from_dict(dict(stats))
        assert kept.mean_ is not None and kept.std_ is not None
        if kept.columns_ != columns or kept.clip != FeatureNormalizer().clip:
            raise ConfigError(f"columns {kept.columns_!r:.80} / clip {kept.clip} are not these")
        if not (np.isfinite(kept.mean_).all() and np.isfinite(kept.std_).all()):
            raise ConfigError("a mean or std is not finite")
    except (ConfigError, TypeError, ValueError, OverflowError) as err:
        log.warning("the run's kept feature normalisation is damaged (%s): refitting it", err)
        return None
    return kept


def _same_settings(model: RegimeDetector, state: object) -> bool:
    """Whether a kept detector ``state`` (a run record's: any JSON) was fitted with ``model``'s
    settings, whatever rows it was fitted on."""
    params = state.get("params") if isinstance(state, Mapping) else None
    settings = getattr(model, "settings", None)
    return (
        isinstance(params, Mapping) and callable(settings) and params.get("settings") == settings()
    )


def prepare_market_with_detector(
    df: pd.DataFrame,
    *,
    train_end: int,
    detector: str = "hmm",
    n_regimes: int = 4,
    seed: int = 0,
    detector_state: Mapping[str, Any] | None = None,
    normalizer_state: Mapping[str, Any] | None = None,
    keep_fitted: bool = False,
) -> tuple[MarketArrays, dict[str, Any]]:
    """:func:`prepare_market`, also returning what it fitted on the training rows, as JSON
    values: ``{"normalizer": ..., "detector": ...}`` (the feature normalisation's statistics;
    the detector's state, None for ``oracle`` and ``none``), and taking them back.

    ``detector_state`` from an earlier call on the same training rows and settings is used
    instead of refitting (a run's evaluate and resume on a million-bar file would otherwise
    repeat minutes of Baum-Welch); a state for other rows or settings is ignored, a damaged one
    refitted with a warning, and the result is the same array for array either way.
    ``keep_fitted``: take both states for other training rows too (same settings), for a run
    acting on its own bars with revised values: its policy learned the regimes of the detector
    and the feature scale it trained with, and a refit on the revised rows would move both.
    """
    if detector not in DETECTORS:
        raise ConfigError(
            f"detector must be one of {', '.join(repr(d) for d in DETECTORS)}, got {detector!r}"
        )
    if isinstance(n_regimes, bool) or not isinstance(n_regimes, int) or not 1 <= n_regimes <= 16:
        # 16, as market.n_regimes: more states than that fit noise on a few thousand bars.
        raise ConfigError(f"n_regimes must be an integer in 1..16, got {n_regimes!r}")
    if not isinstance(df, pd.DataFrame):
        raise DataError(f"<{type(df).__name__}>: prepare_market expects a pandas DataFrame")
    attrs = dict(df.attrs)
    frame = load_ohlcv(df)
    frame.attrs.update(attrs)
    n = len(frame)
    if isinstance(train_end, bool) or not isinstance(train_end, int | np.integer):
        raise ConfigError(f"train_end must be an integer row count, got {train_end!r}")
    if not 1 <= train_end <= n:
        raise ConfigError(f"train_end must be in [1, {n}] for a frame of {n} rows, got {train_end}")
    warmup = feature_warmup()
    if train_end <= warmup:
        raise ConfigError(
            f"train_end={train_end} leaves no training rows after the {warmup}-bar feature warm-up"
        )
    train = frame.iloc[:train_end]

    raw = compute_features(frame)
    kept_as_trained: list[str] = []  # what was kept although the training rows were revised
    rows_key = _fit_key(train, "features", 0, 0)
    normalizer = None
    revised = isinstance(normalizer_state, Mapping) and normalizer_state.get("key") != rows_key
    if keep_fitted and revised:  # the same rows: a refit is this state, bit for bit
        normalizer = _kept_normalizer(normalizer_state.get("stats"), tuple(raw.columns))  # type: ignore[union-attr]
        if normalizer is not None:
            kept_as_trained.append("feature normalisation")
    if normalizer is None:
        normalizer = FeatureNormalizer().fit(raw.iloc[:train_end])
    features = normalizer.transform(raw).astype(np.float32)
    fitted: dict[str, Any] = {
        "normalizer": {"key": rows_key, "stats": normalizer.to_dict()},
        "detector": None,
    }

    if detector == "none":
        probs = np.ones((n, 1))
        names: tuple[str, ...] = ("all",)
    elif detector == "oracle":
        probs, names = _oracle_probs(frame, n_regimes)
    else:
        model = make_detector(detector, n_regimes, seed=seed)
        key = _fit_key(train, detector, n_regimes, seed)
        kept = _load_kept(model, key, detector_state)
        if not kept and keep_fitted and _same_settings(model, detector_state):
            # ``keep_fitted``: the kept state even for other training rows (its settings
            # still have to match): refitting on revised values can relabel every regime.
            kept = _load_kept(model, detector_state.get("key"), detector_state)  # type: ignore[union-attr]
            if kept:
                kept_as_trained.append("regime detector")
        if not kept:
            model = model.fit(train)
        fitted["detector"] = {"key": key, "params": model.fitted_state()}  # type: ignore[attr-defined]
        probs = model.predict_proba(frame)
        names = tuple(model.regime_names)
    if kept_as_trained:
        log.warning(
            "the training rows differ from those the run was fitted on (revised values): the "
            "run's %s kept as trained, not refitted on the revised rows",
            " and ".join(kept_as_trained) + (" are" if len(kept_as_trained) > 1 else " is"),
        )
    probs32 = probs.astype(np.float32)
    probs32 /= probs32.sum(axis=1, keepdims=True)

    true = frame["regime"].to_numpy(dtype=np.int64) if "regime" in frame.columns else None
    market = MarketArrays(
        timestamps=frame.index.to_numpy(dtype="datetime64[ns]"),
        close=frame["close"].to_numpy(dtype=np.float64),
        features=np.ascontiguousarray(features),
        regime_probs=np.ascontiguousarray(probs32),
        feature_names=tuple(str(c) for c in raw.columns),
        regime_names=names,
        true_regimes=true,
        # The synthetic market's own names (bull, bear, ...); a detector's states are not them.
        true_regime_names=tuple(str(x) for x in attrs.get("regime_names", ()))
        if true is not None
        else (),
    )
    return market, fitted
