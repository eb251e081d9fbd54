"""The plain value handed from the market-data stage to the trading environment and backtest."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MarketArrays:
    """Aligned per-bar arrays for one span of a market.

    Everything here at index ``t`` uses only bars ``<= t`` (features, regime probabilities), so an
    agent acting on row ``t`` and earning ``close[t+1] / close[t]`` never sees the future.
    """

    timestamps: np.ndarray  # [T] datetime64[ns]
    close: np.ndarray  # [T] float64, strictly positive
    features: np.ndarray  # [T, F] float32, normalised with training-span statistics only
    regime_probs: (
        np.ndarray
    )  # [T, K] float32, causal (filtered) regime probabilities, rows sum to 1
    feature_names: tuple[str, ...]
    regime_names: tuple[str, ...]
    true_regimes: np.ndarray | None = None  # [T] int64 ground truth (synthetic data only)
    true_regime_names: tuple[
        str, ...
    ] = ()  # names of the true regime ids, when the source has them

    def __len__(self) -> int:
        return int(self.close.shape[0])

    @property
    def n_regimes(self) -> int:
        return int(self.regime_probs.shape[1])

    def slice(self, start: int, stop: int) -> MarketArrays:
        """Rows ``start:stop`` (views, no copies)."""
        return MarketArrays(
            timestamps=self.timestamps[start:stop],
            close=self.close[start:stop],
            features=self.features[start:stop],
            regime_probs=self.regime_probs[start:stop],
            feature_names=self.feature_names,
            regime_names=self.regime_names,
            true_regimes=None if self.true_regimes is None else self.true_regimes[start:stop],
            true_regime_names=self.true_regime_names,
        )
