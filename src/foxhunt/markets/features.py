"""Causal per-bar features and a normaliser fitted on the training span only.

Every feature at row ``t`` is computed from bars ``<= t`` (rolling windows end at ``t``). Each
rolling window is evaluated on its own, not by a running update, so a value never depends on how
many bars come after it: appending future bars leaves earlier rows bit-for-bit identical.

Warm-up policy: rows whose window reaches before the first bar are NaN in the raw features, and
:meth:`FeatureNormalizer.transform` maps NaN to 0 after normalisation (the training mean, i.e.
"no information"). Rows are never dropped, so features stay aligned with prices and regime
probabilities; :func:`feature_warmup` says how many leading rows carry no information, for
callers that prefer to start an episode after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from foxhunt.errors import ConfigError, DataError

__all__ = [
    "FeatureNormalizer",
    "compute_features",
    "feature_warmup",
    "log_returns",
    "rolling_mean",
    "rolling_std",
]


def log_returns(close: np.ndarray, horizon: int = 1) -> np.ndarray:
    """``log(close[t] / close[t - horizon])``; the first ``horizon`` rows are NaN."""
    close = np.asarray(close, dtype=np.float64)
    out = np.full(close.shape, np.nan)
    if close.size > horizon:
        logc = np.log(close)
        out[horizon:] = logc[horizon:] - logc[:-horizon]
    return out


def _rolling(values: np.ndarray, window: int, reducer) -> np.ndarray:
    """Apply ``reducer(axis=1)`` to each window ending at ``t``; earlier rows are NaN.

    A window containing NaN gives NaN, so warm-up propagates instead of being averaged away.
    """
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    if values.size >= window:
        out[window - 1 :] = reducer(sliding_window_view(values, window), axis=1)
    return out


def rolling_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of ``values[t - window + 1 .. t]``."""
    return _rolling(values, window, np.mean)


def rolling_std(values: np.ndarray, window: int) -> np.ndarray:
    """Sample standard deviation (ddof=1) of ``values[t - window + 1 .. t]``."""
    if window < 2:
        raise ConfigError(f"rolling_std window must be >= 2, got {window!r}")
    return _rolling(values, window, lambda w, axis: np.std(w, axis=axis, ddof=1))


def _check_window(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def feature_warmup(
    return_horizons: Sequence[int] = (1, 5, 20), vol_window: int = 20, volume_window: int = 20
) -> int:
    """Number of leading rows in which at least one feature of :func:`compute_features` is NaN."""
    return max(max(return_horizons), vol_window, volume_window - 1)


def compute_features(
    df: pd.DataFrame,
    *,
    return_horizons: Sequence[int] = (1, 5, 20),
    vol_window: int = 20,
    volume_window: int = 20,
) -> pd.DataFrame:
    """Raw (unnormalised) causal features of an OHLCV frame, one row per bar.

    Columns: ``ret_{h}`` log return over ``h`` bars for each horizon; ``vol_{w}`` standard
    deviation of 1-bar log returns over the last ``vol_window`` bars; ``range`` (high - low) /
    close; ``body`` (close - open) / close; ``volume_z`` z-score of log(1 + volume) against the
    last ``volume_window`` bars (0 when that window is constant, e.g. a file without volume).
    """
    horizons = tuple(_check_window("return horizon", h) for h in return_horizons)
    if not horizons or len(set(horizons)) != len(horizons):
        raise ConfigError(
            f"return_horizons must be non-empty and distinct, got {return_horizons!r}"
        )
    vol_window = _check_window("vol_window", vol_window, low=2)
    volume_window = _check_window("volume_window", volume_window, low=2)
    missing = [c for c in ("open", "high", "low", "close", "volume") if c not in df.columns]
    if missing:
        raise DataError(
            f"<DataFrame>: missing column(s) {', '.join(missing)} for features "
            f"(found: {', '.join(map(str, df.columns))})"
        )
    close = df["close"].to_numpy(dtype=np.float64)
    high = df["high"].to_numpy(dtype=np.float64)
    low = df["low"].to_numpy(dtype=np.float64)
    open_ = df["open"].to_numpy(dtype=np.float64)
    volume = df["volume"].to_numpy(dtype=np.float64)

    columns: dict[str, np.ndarray] = {f"ret_{h}": log_returns(close, h) for h in horizons}
    columns[f"vol_{vol_window}"] = rolling_std(log_returns(close, 1), vol_window)
    columns["range"] = (high - low) / close
    columns["body"] = (close - open_) / close
    log_volume = np.log1p(volume)
    mean = rolling_mean(log_volume, volume_window)
    std = rolling_std(log_volume, volume_window)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (log_volume - mean) / std
    # A constant window (std 0) carries no surprise: score it 0, not inf/NaN.
    columns["volume_z"] = np.where(np.isnan(mean), np.nan, np.where(std > 1e-12, z, 0.0))
    return pd.DataFrame(columns, index=df.index)


@dataclass
class FeatureNormalizer:
    """Standardise features with the mean and std of the training span only.

    ``clip`` bounds normalised values (test-span outliers, e.g. a crash far outside the training
    range, would otherwise dominate a network's inputs); ``None`` disables clipping.
    """

    clip: float | None = 10.0
    mean_: np.ndarray | None = None
    std_: np.ndarray | None = None
    columns_: tuple[str, ...] | None = None

    def fit(self, train_features: pd.DataFrame | np.ndarray) -> FeatureNormalizer:
        """Learn per-column mean/std from ``train_features``, ignoring NaN warm-up rows."""
        values, columns = self._as_array(train_features)
        finite = np.isfinite(values)
        if np.isinf(values).any():
            col = int(np.argmax(np.isinf(values).any(axis=0)))
            raise DataError(f"<features>: column {self._name(columns, col)!r} contains inf")
        counts = finite.sum(axis=0)
        if values.shape[0] == 0 or np.any(counts == 0):
            col = int(np.argmax(counts == 0)) if values.shape[0] else 0
            raise DataError(
                f"<features>: column {self._name(columns, col)!r} has no finite training rows "
                f"({values.shape[0]} rows given); use a longer training span"
            )
        filled = np.where(finite, values, 0.0)
        mean = filled.sum(axis=0) / counts
        var = np.where(finite, (values - mean) ** 2, 0.0).sum(axis=0) / counts
        std = np.sqrt(var)
        # A constant training column would divide by ~0; leave it centred but unscaled.
        self.std_ = np.where(std > 1e-12, std, 1.0)
        self.mean_ = mean
        self.columns_ = columns
        return self

    def transform(self, features: pd.DataFrame | np.ndarray) -> np.ndarray:
        """``(x - mean) / std`` per column, NaN -> 0, optionally clipped; float64 [T, F]."""
        if self.mean_ is None or self.std_ is None:
            raise RuntimeError("FeatureNormalizer.transform called before fit")
        values, columns = self._as_array(features)
        if values.shape[1] != self.mean_.shape[0]:
            raise DataError(
                f"<features>: expected {self.mean_.shape[0]} columns, got {values.shape[1]}"
            )
        if columns is not None and self.columns_ is not None and columns != self.columns_:
            raise DataError(
                f"<features>: columns {list(columns)} differ from fitted {list(self.columns_)}"
            )
        out = (values - self.mean_) / self.std_
        out = np.where(np.isnan(out), 0.0, out)
        if self.clip is not None:
            out = np.clip(out, -self.clip, self.clip)
        return out

    def fit_transform(self, features: pd.DataFrame | np.ndarray) -> np.ndarray:
        return self.fit(features).transform(features)

    def to_dict(self) -> dict:
        """JSON-ready statistics, so evaluation can reuse exactly the training normalisation."""
        if self.mean_ is None or self.std_ is None:
            raise RuntimeError("FeatureNormalizer.to_dict called before fit")
        return {
            "clip": self.clip,
            "mean": self.mean_.tolist(),
            "std": self.std_.tolist(),
            "columns": None if self.columns_ is None else list(self.columns_),
        }

    @classmethod
    def from_dict(cls, state: dict) -> FeatureNormalizer:
        try:
            mean = np.asarray(state["mean"], dtype=np.float64)
            std = np.asarray(state["std"], dtype=np.float64)
            clip = state.get("clip")
            columns = state.get("columns")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"normalizer state is malformed: {exc!r}") from None
        if mean.shape != std.shape or mean.ndim != 1 or np.any(std <= 0):
            raise ConfigError(
                f"normalizer state is malformed: mean shape {mean.shape}, std shape {std.shape}"
            )
        return cls(
            clip=None if clip is None else float(clip),
            mean_=mean,
            std_=std,
            columns_=None if columns is None else tuple(columns),
        )

    @staticmethod
    def _as_array(features: pd.DataFrame | np.ndarray) -> tuple[np.ndarray, tuple[str, ...] | None]:
        if isinstance(features, pd.DataFrame):
            return features.to_numpy(dtype=np.float64), tuple(map(str, features.columns))
        values = np.asarray(features, dtype=np.float64)
        if values.ndim != 2:
            raise DataError(f"<features>: expected a 2-D array [T, F], got shape {values.shape}")
        return values, None

    @staticmethod
    def _name(columns: tuple[str, ...] | None, index: int) -> str:
        return columns[index] if columns is not None else str(index)
