"""Causal market-regime detectors.

Both detectors are fitted on a training span only and then label any span causally: row ``t`` of
``predict_proba`` uses bars ``<= t`` and nothing else, so it can be fed to an agent acting at ``t``.
Appending future bars leaves earlier rows unchanged (the tests check this to 1e-12).

* :class:`VolatilityTrendDetector` — a transparent rule on rolling volatility and trend with
  thresholds set by training-span quantiles; one-hot probabilities.
* :class:`GaussianHMMDetector` — a Gaussian hidden Markov model (diagonal covariance) on per-bar
  return and short-window log true range, fitted by Baum-Welch EM with seeded restarts, then run
  as a forward *filter* ``p(s_t | x_1..x_t)``. Smoothed probabilities ``p(s_t | x_1..x_T)``
  would look better and leak the future, so they are never produced.

Common interface: ``fit(train_df) -> self``, ``predict_proba(df) -> [T, K]``, ``predict(df) ->
[T]``, ``n_regimes``, ``regime_names``.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.features import log_returns, rolling_std

log = logging.getLogger("foxhunt.regimes")

_SAY_FIT_LONGER_THAN_S = 30.0
"""A fit expected to take longer than this is announced: on a million bars it takes minutes,
and a terminal silent for that long looks hung."""

__all__ = [
    "GaussianHMMDetector",
    "RegimeDetector",
    "VolatilityTrendDetector",
    "forward_filter",
    "hmm_features",
    "regime_accuracy",
]

_LOG_2PI = math.log(2.0 * math.pi)


@runtime_checkable
class RegimeDetector(Protocol):
    """What the pipeline needs from a detector."""

    @property
    def n_regimes(self) -> int: ...

    @property
    def regime_names(self) -> tuple[str, ...]: ...

    def fit(self, train_df: pd.DataFrame) -> RegimeDetector: ...

    def predict_proba(self, df: pd.DataFrame) -> np.ndarray: ...

    def predict(self, df: pd.DataFrame) -> np.ndarray: ...


def _close(df: pd.DataFrame) -> np.ndarray:
    if "close" not in df.columns:
        raise DataError(
            f"<DataFrame>: missing column close (found: {', '.join(map(str, df.columns))})"
        )
    return df["close"].to_numpy(dtype=np.float64)


def _int_at_least(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_fitted(obj: object, attr: str) -> None:
    if getattr(obj, attr) is None:
        raise RuntimeError(f"{type(obj).__name__} must be fitted before predicting")


class VolatilityTrendDetector:
    """Rule-based regimes: high volatility first, else bull / bear / sideways by trend.

    Volatility is the std of 1-bar log returns over ``vol_window`` bars; trend is the mean log
    return over ``trend_window`` bars. Thresholds are quantiles of the training span: volatility
    above its ``vol_quantile`` quantile is ``high_volatility`` (only when ``n_regimes == 4``); the
    remaining bars split at the ``trend_quantiles`` of their trend. Bars before both windows are
    full get uniform probabilities (and ``predict`` then returns 0).
    """

    def __init__(
        self,
        n_regimes: int = 4,
        *,
        vol_window: int = 20,
        trend_window: int = 60,
        vol_quantile: float = 0.85,
        trend_quantiles: tuple[float, float] = (1 / 3, 2 / 3),
    ) -> None:
        if n_regimes not in (3, 4):
            raise ConfigError(
                f"VolatilityTrendDetector n_regimes must be 3 or 4, got {n_regimes!r}"
            )
        self._n = int(n_regimes)
        self.vol_window = _int_at_least("vol_window", vol_window, 2)
        self.trend_window = _int_at_least("trend_window", trend_window, 1)
        if not (isinstance(vol_quantile, int | float) and 0 < vol_quantile < 1):
            raise ConfigError(f"vol_quantile must be in (0, 1), got {vol_quantile!r}")
        lo_q, hi_q = trend_quantiles
        if not (0 < lo_q <= hi_q < 1):
            raise ConfigError(
                f"trend_quantiles must satisfy 0 < low <= high < 1, got {trend_quantiles!r}"
            )
        self.vol_quantile = float(vol_quantile)
        self.trend_quantiles = (float(lo_q), float(hi_q))
        self.vol_threshold_: float | None = None
        self.trend_thresholds_: tuple[float, float] | None = None

    @property
    def n_regimes(self) -> int:
        return self._n

    @property
    def regime_names(self) -> tuple[str, ...]:
        return ("bull", "bear", "sideways", "high_volatility")[: self._n]

    def _stats(self, df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        close = _close(df)
        vol = rolling_std(log_returns(close, 1), self.vol_window)
        trend = log_returns(close, self.trend_window) / self.trend_window
        return vol, trend

    def fit(self, train_df: pd.DataFrame) -> VolatilityTrendDetector:
        vol, trend = self._stats(train_df)
        ok = np.isfinite(vol) & np.isfinite(trend)
        if ok.sum() < 10:
            raise DataError(
                f"<DataFrame>: training span of {len(train_df)} bars leaves {int(ok.sum())} bars "
                f"after the {max(self.vol_window, self.trend_window)}-bar warm-up; need >= 10"
            )
        # Thresholds are quantiles of the bars whose volatility window saw a price move: a long
        # stale stretch (a halt, an illiquid spell) would otherwise pile zeros into the
        # quantiles until they collapse to 0 .. 0 although most of the span moves. Stale bars
        # are still labelled afterwards, by the same thresholds (zero volatility is low).
        moving = ok & (vol > 0.0)
        if moving.sum() < 10:
            raise DataError(
                f"<DataFrame>: the training span's prices barely move ({int(moving.sum())} of "
                f"{int(ok.sum())} bars after the warm-up saw a price move in their "
                f"{self.vol_window}-bar window; need >= 10): the volatility/trend detector "
                "cannot tell regimes apart"
            )
        if self._n == 4:
            self.vol_threshold_ = float(np.quantile(vol[moving], self.vol_quantile))
            calm = moving & (vol <= self.vol_threshold_)
        else:
            self.vol_threshold_ = math.inf
            calm = moving
        lo, hi = np.quantile(trend[calm], self.trend_quantiles)
        if lo >= hi:
            raise DataError(
                f"<DataFrame>: the training span's trend does not vary (trend thresholds "
                f"{lo:.3g} .. {hi:.3g} over its {int(calm.sum())} calm moving bars: prices "
                "still, or moving at one steady rate): the volatility/trend detector cannot "
                "tell regimes apart"
            )
        self.trend_thresholds_ = (float(lo), float(hi))
        return self

    def settings(self) -> dict[str, object]:
        """What a fit depends on besides the data (a kept state must match)."""
        return {
            "n_regimes": self._n,
            "vol_window": self.vol_window,
            "trend_window": self.trend_window,
            "vol_quantile": self.vol_quantile,
            "trend_quantiles": list(self.trend_quantiles),
        }

    def fitted_state(self) -> dict[str, object]:
        """The fitted thresholds as JSON values, so a run acting on its own bars with revised
        values keeps the regimes its policy learned: a refit moves the quantiles, and bars near
        them change state."""
        _check_fitted(self, "trend_thresholds_")
        assert self.trend_thresholds_ is not None and self.vol_threshold_ is not None
        vol = self.vol_threshold_
        return {
            "settings": self.settings(),
            "vol_threshold": vol if math.isfinite(vol) else None,  # 3 states: no such state
            "trend_thresholds": list(self.trend_thresholds_),
        }

    def load_fitted_state(self, state: object) -> VolatilityTrendDetector:
        """Take :meth:`fitted_state`'s output instead of fitting; it comes from a file, so it is
        checked against what a fit can produce first. ValueError says what is wrong, and nothing
        is set."""
        if not isinstance(state, dict):
            raise ValueError(f"must be a mapping, got {type(state).__name__}")
        if state.get("settings") != self.settings():
            raise ValueError(f"settings {state.get('settings')!r:.120} are not this detector's")

        def number(value: object) -> bool:
            return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]

        vol = state.get("vol_threshold")
        if self._n == 4 and not (number(vol) and vol >= 0):  # type: ignore[operator]
            raise ValueError(f"vol_threshold must be a number >= 0, got {vol!r:.40}")
        if self._n == 3 and vol is not None:
            raise ValueError(f"vol_threshold must be null with 3 states, got {vol!r:.40}")
        trend = state.get("trend_thresholds")
        if not (isinstance(trend, list) and len(trend) == 2 and all(map(number, trend))):
            raise ValueError(f"trend_thresholds must be two numbers, got {trend!r:.60}")
        if not trend[0] < trend[1]:
            raise ValueError(f"trend_thresholds must rise, got {trend!r:.60}")
        self.vol_threshold_ = math.inf if vol is None else float(vol)  # type: ignore[arg-type]
        self.trend_thresholds_ = (float(trend[0]), float(trend[1]))
        return self

    def labels(self, df: pd.DataFrame) -> np.ndarray:
        """Regime id per bar, -1 during warm-up."""
        _check_fitted(self, "trend_thresholds_")
        assert self.trend_thresholds_ is not None and self.vol_threshold_ is not None
        vol, trend = self._stats(df)
        lo, hi = self.trend_thresholds_
        out = np.full(len(df), 2, dtype=np.int64)
        out[trend > hi] = 0
        out[trend < lo] = 1
        out[vol > self.vol_threshold_] = 3
        out[~(np.isfinite(vol) & np.isfinite(trend))] = -1
        return out

    def predict_proba(self, df: pd.DataFrame) -> np.ndarray:
        labels = self.labels(df)
        proba = np.full((len(df), self._n), 1.0 / self._n)
        known = labels >= 0
        proba[known] = np.eye(self._n)[labels[known]]
        return proba

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        return np.argmax(self.predict_proba(df), axis=1).astype(np.int64)


def hmm_features(df: pd.DataFrame, vol_window: int = 20) -> np.ndarray:
    """Per-bar HMM observations [T, 2]: log return and the mean log true range of the last bars.

    The volatility column averages ``log(true range)`` over the last ``vol_window`` bars, where the
    true range ``max(high, prev close) / min(low, prev close)`` (Wilder) is a far less noisy
    per-bar volatility measure than a squared return and includes overnight gaps. Averaging the
    *logs* (a geometric mean) keeps one wild bar from owning the window; on the synthetic market
    this lifted test-span regime accuracy from 0.71 to 0.82 (mean of 10 market seeds) against the
    log of the mean squared range + return it replaces (BENCHMARKS.md, section 6). Bars without
    any price move (zero true range: halted or illiquid) carry no volatility evidence and are
    skipped in the average; without high/low columns the true range is ``|log return|``. Rows
    before the first full window are NaN, and so is a window without a single moving bar.
    """
    close = _close(df)
    ret = log_returns(close, 1)
    if {"high", "low"} <= set(df.columns):
        prev = np.concatenate([[np.nan], close[:-1]])
        high = np.fmax(df["high"].to_numpy(dtype=np.float64), prev)
        low = np.fmin(df["low"].to_numpy(dtype=np.float64), prev)
        true_range = np.log(high / low)
        true_range[0] = np.nan  # no previous close: the warm-up starts one bar late, as for ret
    else:
        true_range = np.abs(ret)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_range = np.where(true_range > 0, np.log(true_range), np.nan)
    out = np.full(close.shape, np.nan)
    if close.size > vol_window:
        windows = sliding_window_view(log_range, vol_window)[1:]  # windows ending at t >= window
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN window: stays NaN
            out[vol_window:] = np.nanmean(windows, axis=1)
    return np.column_stack([ret, out])


def forward_filter(
    log_b: np.ndarray, transition: np.ndarray, prior: np.ndarray
) -> tuple[np.ndarray, float]:
    """Filtered state probabilities ``p(s_t | x_1..x_t)`` and the total log-likelihood.

    ``log_b[t, k] = log p(x_t | s_t = k)``; a row of NaN marks a bar with no observation, for which
    the filter only predicts (``alpha_t = alpha_{t-1} A``). ``prior`` is the distribution of the
    state *before* the first bar, so ``p(s_0) = prior @ A``. Scaled recursion: each step is
    normalised, and the log of the normaliser accumulates the likelihood.
    """
    log_b = np.asarray(log_b, dtype=np.float64)
    a = np.asarray(transition, dtype=np.float64)
    n, k = log_b.shape
    alpha = np.empty((n, k))
    observed = np.isfinite(log_b).all(axis=1)
    shift = np.where(observed, np.max(np.where(observed[:, None], log_b, 0.0), axis=1), 0.0)
    b = np.where(observed[:, None], np.exp(log_b - shift[:, None]), 1.0)
    prev = np.asarray(prior, dtype=np.float64)
    loglik = 0.0
    for t in range(n):
        pred = prev @ a
        if observed[t]:
            joint = pred * b[t]
            norm = joint.sum()
            if not norm > 0:  # every state rules this bar out: restart from the prediction
                alpha[t] = pred / pred.sum()
            else:
                alpha[t] = joint / norm
                loglik += math.log(norm) + shift[t]
        else:
            alpha[t] = pred / pred.sum()
        prev = alpha[t]
    return alpha, loglik


def _chained_recursion(
    x0: np.ndarray, trans: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``x_s = (x_{s-1} @ T) * e_s / c_s`` (``c_s`` normalises each ``x_s`` to sum 1), s = 1..m.

    ``x0`` [R, K], ``trans`` [R, K, K], ``e`` [m, R, K]; returns ``x`` [m + 1, R, K] (``x0``
    first) and ``c`` [m, R]. This is the HMM forward recursion; a Python loop over bars costs
    several NumPy calls per bar (minutes on 350k bars), so the bars are cut into about sqrt(m)
    chunks of L bars: (1) every chunk's product of ``T diag(e_s)`` at once (L steps over all
    chunks), (2) the chunks' starting vectors in order (one vector-matrix product per chunk),
    (3) the recursion inside all chunks at once from those starts (L steps). Step (3) computes
    each ``x_s`` and ``c_s`` by the sequential formula from its predecessor, so results agree
    with the plain loop to float rounding.
    """
    m = e.shape[0]
    r, k = x0.shape
    out = np.empty((m + 1, r, k))
    out[0] = x0
    if m == 0:
        return out, np.empty((0, r))
    length = max(1, math.isqrt(m))
    chunks = -(-m // length)
    pad = np.ones((chunks * length - m, r, k))  # only ever the tail of the last chunk
    ec = np.concatenate([e, pad]).reshape(chunks, length, r, k)
    # (1) chunk products, rescaled each step so they neither underflow nor overflow
    # (einsum / matmul with ones: NumPy's reductions over small trailing axes cost far more)
    ones = np.ones(k)
    prod = np.broadcast_to(np.eye(k), (chunks - 1, r, k, k)).copy()
    for step in range(length):
        prod = np.matmul(prod, trans) * ec[:-1, step, :, None, :]
        prod /= np.einsum("crij->cr", prod)[:, :, None, None]
    # (2) each chunk's starting vector (the last vector of the chunk before it)
    starts = np.empty((chunks, r, k))
    starts[0] = x0
    for c in range(1, chunks):
        v = np.matmul(starts[c - 1][:, None, :], prod[c - 1])[:, 0, :]
        starts[c] = v / (v @ ones)[:, None]
    # (3) the recursion inside every chunk at once
    xs = np.empty((chunks, length, r, k))
    cs = np.empty((chunks, length, r))
    cur = starts
    for step in range(length):
        v = np.matmul(cur[:, :, None, :], trans)[:, :, 0, :] * ec[:, step]
        cs[:, step] = v @ ones
        cur = v / cs[:, step, :, None]
        xs[:, step] = cur
    out[1:] = xs.reshape(-1, r, k)[:m]
    c = cs.reshape(-1, r)[:m]
    if not (np.isfinite(c).all() and (c > 0).all() and np.isfinite(out).all()):
        # A chunk product normalised as a whole can underflow a row the plain loop keeps (exact
        # zero transitions and emissions far below the best row's): take the plain loop then.
        return _sequential_recursion(x0, trans, e)
    return out, c


def _sequential_recursion(
    x0: np.ndarray, trans: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_chained_recursion` one bar at a time (the reference it falls back to)."""
    m = e.shape[0]
    out = np.empty((m + 1, *x0.shape))
    c = np.empty((m, x0.shape[0]))
    out[0] = x0
    for s in range(m):
        v = np.matmul(out[s][:, None, :], trans)[:, 0, :] * e[s]
        c[s] = v.sum(axis=1)
        out[s + 1] = v / c[s][:, None]
    return out, c


def _stationary(a: np.ndarray) -> np.ndarray:
    k = a.shape[0]
    system = np.vstack([a.T - np.eye(k), np.ones((1, k))])
    rhs = np.concatenate([np.zeros(k), [1.0]])
    pi = np.clip(np.linalg.lstsq(system, rhs, rcond=None)[0], 0.0, None)
    return pi / pi.sum() if pi.sum() > 0 else np.full(k, 1.0 / k)


# What a fit learns, with its shape (K states, D = 2 observation columns); predict_proba also
# reads start_, which is the stationary law of transition_ and is recomputed, never stored.
_HMM_FITTED = {
    "feature_mean_": ("D",),
    "feature_std_": ("D",),
    "means_": ("K", "D"),
    "variances_": ("K", "D"),
    "transition_": ("K", "K"),
    "state_return_": ("K",),
    "state_volatility_": ("K",),
}


class GaussianHMMDetector:
    """Gaussian HMM regimes, fitted by Baum-Welch on the training span, applied as a filter.

    States are sorted by mean return (descending), ties by volatility (ascending), and named
    ``state_0`` (most bullish) .. ``state_{K-1}``; fitted per-state mean return and volatility
    (original units, per bar) are in ``state_return_`` and ``state_volatility_``. Observations are
    standardised with training statistics and clipped to +-``clip_sigma`` so one corrupt bar
    cannot own a state. Bars in the volatility warm-up get the prediction from the stationary
    distribution. EM runs all restarts as one batch; the restart with the best final likelihood
    wins, and its per-iteration log-likelihoods are in ``log_likelihood_history_``.
    """

    def __init__(
        self,
        n_regimes: int = 4,
        *,
        vol_window: int = 20,
        n_restarts: int = 4,
        max_iter: int = 100,
        tol: float = 1e-5,
        min_variance: float = 1e-3,
        clip_sigma: float = 8.0,
        sticky_init: float = 0.95,
        seed: int = 0,
    ) -> None:
        self._n = _int_at_least("n_regimes", n_regimes, 1)
        self.vol_window = _int_at_least("vol_window", vol_window, 1)
        self.n_restarts = _int_at_least("n_restarts", n_restarts, 1)
        self.max_iter = _int_at_least("max_iter", max_iter, 1)
        for name, value in (
            ("tol", tol),
            ("min_variance", min_variance),
            ("clip_sigma", clip_sigma),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        if not (isinstance(sticky_init, int | float) and 0 < sticky_init < 1):
            raise ConfigError(f"sticky_init must be in (0, 1), got {sticky_init!r}")
        self.tol = float(tol)
        self.min_variance = float(min_variance)
        self.clip_sigma = float(clip_sigma)
        self.sticky_init = float(sticky_init)
        self.seed = _int_at_least("seed", seed, 0)
        self.transition_: np.ndarray | None = None
        self.means_: np.ndarray | None = None  # [K, D] in standardised units
        self.variances_: np.ndarray | None = None  # [K, D] in standardised units
        self.start_: np.ndarray | None = None  # [K] filter prior: stationary distribution
        self.feature_mean_: np.ndarray | None = None
        self.feature_std_: np.ndarray | None = None
        self.state_return_: np.ndarray | None = None
        self.state_volatility_: np.ndarray | None = None
        self.log_likelihood_history_: list[float] = []
        self.n_iter_: int = 0
        self.converged_: bool = False

    @property
    def n_regimes(self) -> int:
        return self._n

    @property
    def regime_names(self) -> tuple[str, ...]:
        return tuple(f"state_{k}" for k in range(self._n))

    # ----------------------------------------------------------------------------- observations
    def _observations(self, df: pd.DataFrame) -> np.ndarray:
        """Standardised, clipped observations [T, D]; NaN rows in the warm-up."""
        raw = hmm_features(df, self.vol_window)
        z = (raw - self.feature_mean_) / self.feature_std_
        return np.clip(z, -self.clip_sigma, self.clip_sigma)

    @staticmethod
    def _log_emission(x: np.ndarray, means: np.ndarray, variances: np.ndarray) -> np.ndarray:
        """``log N(x_t; mu_k, diag(var_k))`` for x [N, D], means/variances [..., K, D].

        Returns [N, ..., K]. Elementwise maths and a sum over D only, so each row's value is
        independent of how many rows there are (no BLAS blocking effects on causality).
        """
        xe = x.reshape(x.shape[0], *([1] * (means.ndim - 1)), x.shape[1])
        quad = (xe - means) ** 2 / variances + np.log(variances) + _LOG_2PI
        return -0.5 * quad.sum(axis=-1)

    # ----------------------------------------------------------------------------------- fitting
    def _say_if_long(self, rows: int, first_iteration_s: float) -> None:
        """Announce a fit that will take a while, from its first EM iteration's time."""
        longest = first_iteration_s * self.max_iter
        if longest > _SAY_FIT_LONGER_THAN_S:
            log.warning(
                "fitting the HMM regime detector on %s training bars: %.1f s per EM iteration, "
                "at most %d iterations (up to %.0f min); a run keeps the fit, so its evaluate "
                "and resume do not repeat it",
                f"{rows:,}",
                first_iteration_s,
                self.max_iter,
                longest / 60,
            )

    def fit(self, train_df: pd.DataFrame) -> GaussianHMMDetector:
        raw = hmm_features(train_df, self.vol_window)
        valid = np.isfinite(raw).all(axis=1)
        x_raw = raw[valid]
        k = self._n
        min_rows = max(20, 10 * k)
        if x_raw.shape[0] < min_rows:
            flat = int((~valid[self.vol_window :]).sum())
            why = (
                f" ({flat} bars after the warm-up saw no price movement in their window: flat "
                "or halted prices give no volatility evidence)"
                if flat
                else ""
            )
            raise DataError(
                f"<DataFrame>: training span of {len(train_df)} bars gives {x_raw.shape[0]} HMM "
                f"observations after the {self.vol_window}-bar warm-up{why}; need >= "
                f"{min_rows} for {k} states"
            )
        self.feature_mean_ = x_raw.mean(axis=0)
        std = x_raw.std(axis=0)
        if k > 1 and not (std > 1e-12).any():
            # Standardised, every observation would be 0 and every state alike: the filter
            # would report uniform probabilities on every bar, new data or not.
            raise DataError(
                f"<DataFrame>: the training span's bars do not vary (its {x_raw.shape[0]} HMM "
                "observations, each bar's log return and recent mean true range, are all the "
                "same: prices still, or moving at one steady rate): the HMM detector cannot "
                "tell regimes apart"
            )
        self.feature_std_ = np.where(std > 1e-12, std, 1.0)
        x = np.clip(
            (x_raw - self.feature_mean_) / self.feature_std_, -self.clip_sigma, self.clip_sigma
        )

        means, variances, trans, start = self._initialise(x)
        history: list[np.ndarray] = []
        prev_ll = np.full(self.n_restarts, -np.inf)
        converged = False
        n_iter = 0
        started = time.perf_counter()
        while n_iter < self.max_iter:
            n_iter += 1
            ll, gamma, xi_sum = self._e_step(x, means, variances, trans, start)
            if n_iter == 1:
                self._say_if_long(x.shape[0], time.perf_counter() - started)
            history.append(ll)
            means, variances, trans, start = self._m_step(x, gamma, xi_sum, means, variances, trans)
            gain = (ll - prev_ll) / x.shape[0]
            prev_ll = ll
            if np.all(gain < self.tol):
                converged = True
                break
        final_ll, _, _ = self._e_step(x, means, variances, trans, start, need_posteriors=False)
        history.append(final_ll)
        # A restart whose likelihood is NaN never wins (np.argmax would pick NaN first).
        best = int(np.argmax(np.where(np.isnan(final_ll), -np.inf, final_ll)))

        # Deterministic state order: by mean return (descending), then volatility (ascending).
        ret_mean = means[best, :, 0] * self.feature_std_[0] + self.feature_mean_[0]
        vol_level = means[best, :, 1] * self.feature_std_[1] + self.feature_mean_[1]
        order = np.lexsort((vol_level, -ret_mean))
        self.means_ = means[best][order]
        self.variances_ = variances[best][order]
        self.transition_ = trans[best][np.ix_(order, order)]
        self.start_ = _stationary(self.transition_)
        self.state_return_ = ret_mean[order]
        # Per-state return standard deviation: a per-bar volatility in the data's own units.
        self.state_volatility_ = np.sqrt(variances[best][order, 0]) * self.feature_std_[0]
        self.log_likelihood_history_ = [float(h[best]) for h in history]
        self.n_iter_ = n_iter
        self.converged_ = converged
        return self

    def _initialise(self, x: np.ndarray):
        """Restart 0 splits the data by volatility quantile; others use k-means++ seeds."""
        k, r = self._n, self.n_restarts
        n, d = x.shape
        rng = np.random.default_rng(self.seed)
        means = np.empty((r, k, d))
        variances = np.empty((r, k, d))
        order = np.argsort(x[:, 1], kind="stable")
        for i, chunk in enumerate(np.array_split(order, k)):
            means[0, i] = x[chunk].mean(axis=0)
            variances[0, i] = np.maximum(x[chunk].var(axis=0), self.min_variance)
        for j in range(1, r):
            centres = [x[rng.integers(n)]]
            for _ in range(1, k):
                d2 = np.min([((x - c) ** 2).sum(axis=1) for c in centres], axis=0)
                probs = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1.0 / n)
                centres.append(x[rng.choice(n, p=probs)])
            c = np.array(centres)
            for _ in range(10):  # a few Lloyd iterations
                assign = np.argmin(((x[:, None, :] - c[None]) ** 2).sum(axis=2), axis=1)
                for i in range(k):
                    if np.any(assign == i):
                        c[i] = x[assign == i].mean(axis=0)
            means[j] = c
            for i in range(k):
                members = x[assign == i]
                var = members.var(axis=0) if members.shape[0] > 1 else np.ones(d)
                variances[j, i] = np.maximum(var, self.min_variance)
        off = (1.0 - self.sticky_init) / (k - 1) if k > 1 else 0.0
        trans = np.full((r, k, k), off)
        trans[:, np.arange(k), np.arange(k)] = self.sticky_init if k > 1 else 1.0
        start = np.full((r, k), 1.0 / k)
        return means, variances, trans, start

    def _e_step(self, x, means, variances, trans, start, *, need_posteriors: bool = True):
        """Scaled forward-backward for all restarts at once (Rabiner 1989, Sec. V.A).

        Both recursions run through :func:`_chained_recursion` (a few thousand NumPy calls
        instead of several per bar); the backward one carries ``y_t = b_t * beta_t``, normalised
        per bar, because gamma and xi are normalised per bar anyway and need no scale of beta.
        """
        log_b = self._log_emission(x, means, variances)  # [N, R, K]
        shift = log_b.max(axis=2, keepdims=True)
        b = np.exp(log_b - shift)
        first = start * b[0]
        alpha, scale = _chained_recursion(first / first.sum(axis=1, keepdims=True), trans, b[1:])
        ll = np.log(scale).sum(axis=0) + np.log(first.sum(axis=1)) + shift[:, :, 0].sum(axis=0)
        if not need_posteriors:
            return ll, None, None
        trans_t = np.swapaxes(trans, 1, 2)
        last = b[-1] / b[-1].sum(axis=1, keepdims=True)
        y_rev, _ = _chained_recursion(last, trans_t, b[-2::-1])  # y_{N-1}, y_{N-2}, .., y_0
        y = y_rev[::-1]
        beta = np.empty_like(alpha)  # up to a per-bar scale: beta_t = A y_{t+1}, beta_{N-1} = 1
        beta[-1] = 1.0
        beta[:-1] = np.einsum("trj,rij->tri", y[1:], trans)
        gamma = alpha * beta
        gamma /= gamma.sum(axis=2, keepdims=True)
        # xi_t(i, j) = alpha_t(i) A_ij y_{t+1}(j) / Z_t, each bar's xi summing to 1.
        norm = np.einsum("tri,tri->tr", alpha[:-1], beta[:-1])
        xi_sum = np.einsum("tri,trj->rij", alpha[:-1] / norm[:, :, None], y[1:]) * trans
        return ll, gamma, xi_sum

    def _m_step(self, x, gamma, xi_sum, old_means, old_variances, old_trans):
        """Closed-form maximisation; states that own no data keep their old parameters."""
        occupancy = gamma.sum(axis=0)  # [R, K]
        empty = occupancy < 1e-8
        safe = np.where(empty, 1.0, occupancy)[:, :, None]
        means = np.einsum("nrk,nd->rkd", gamma, x) / safe
        sq = np.einsum("nrk,nd->rkd", gamma, x**2) / safe
        variances = np.maximum(sq - means**2, self.min_variance)
        means = np.where(empty[:, :, None], old_means, means)
        variances = np.where(empty[:, :, None], old_variances, variances)
        row = xi_sum.sum(axis=2, keepdims=True)
        trans = np.where(row > 0, xi_sum / np.where(row > 0, row, 1.0), old_trans)
        start = gamma[0]
        return means, variances, trans, start

    # -------------------------------------------------------------------------------- prediction
    def predict_proba(self, df: pd.DataFrame) -> np.ndarray:
        """Forward-filtered ``p(s_t | x_1..x_t)`` [T, K]; warm-up rows get the stationary law."""
        _check_fitted(self, "transition_")
        x = self._observations(df)
        log_b = self._log_emission(x, self.means_, self.variances_)  # NaN rows stay NaN
        alpha, _ = forward_filter(log_b, self.transition_, self.start_)
        return alpha

    def predict(self, df: pd.DataFrame) -> np.ndarray:
        return np.argmax(self.predict_proba(df), axis=1).astype(np.int64)

    def settings(self) -> dict[str, float | int]:
        """What a fit depends on besides the data and the seed (a kept state must match)."""
        return {
            "n_regimes": self._n,
            "vol_window": self.vol_window,
            "n_restarts": self.n_restarts,
            "max_iter": self.max_iter,
            "tol": self.tol,
            "min_variance": self.min_variance,
            "clip_sigma": self.clip_sigma,
            "sticky_init": self.sticky_init,
            "seed": self.seed,
        }

    def fitted_state(self) -> dict[str, object]:
        """The fitted model as JSON values (floats round-trip exactly), so a run keeps the
        detector it trained with instead of refitting it for every evaluate and resume: Baum-Welch
        over a million training bars takes minutes, the filter seconds."""
        _check_fitted(self, "transition_")
        return {
            "settings": self.settings(),
            **{a: np.asarray(getattr(self, a)).tolist() for a in _HMM_FITTED},
            "log_likelihood_history": list(self.log_likelihood_history_),
            "n_iter": self.n_iter_,
            "converged": self.converged_,
        }

    def load_fitted_state(self, state: object) -> GaussianHMMDetector:
        """Take :meth:`fitted_state`'s output instead of fitting. It comes from a file, so it is
        checked whole first against what a fit can produce (this detector's settings, shapes,
        finite numbers, variances at least ``min_variance``, positive scales, stochastic
        transitions); the filter's prior is recomputed from the transitions, as the fit does.
        ValueError says what is wrong, and nothing is set."""
        if not isinstance(state, dict):
            raise ValueError(f"must be a mapping, got {type(state).__name__}")
        if state.get("settings") != self.settings():
            raise ValueError(f"settings {state.get('settings')!r:.120} are not this detector's")
        dims = {"K": self._n, "D": 2}
        arrays: dict[str, np.ndarray] = {}
        for name, shape in _HMM_FITTED.items():
            want = tuple(dims[d] for d in shape)
            try:
                raw = np.asarray(state[name])
                value = raw.astype(np.float64)
            except (KeyError, TypeError, ValueError, OverflowError) as err:
                raise ValueError(f"{name} is missing or not numeric ({str(err)[:80]})") from None
            numbers = raw.dtype.kind in "iuf"
            if not numbers or value.shape != want or not np.isfinite(value).all():
                raise ValueError(f"{name} must be finite numbers of shape {want}")
            arrays[name] = value
        t = arrays["transition_"]
        if (t < 0).any() or not np.allclose(t.sum(axis=1), 1.0, rtol=0, atol=1e-9):
            raise ValueError("the transition rows are not probabilities")
        # Means and variances of observations clipped to +-clip_sigma lie within its range.
        c = self.clip_sigma * (1 + 1e-9)
        if (np.abs(arrays["means_"]) > c).any():
            raise ValueError(f"a state mean lies beyond clip_sigma={self.clip_sigma}")
        v = arrays["variances_"]
        if (v < self.min_variance).any() or (v > max(c * c, self.min_variance)).any():
            raise ValueError(
                f"a variance lies outside [min_variance, clip_sigma**2] = [{self.min_variance}, "
                f"{self.clip_sigma**2}]"
            )
        if not (arrays["feature_std_"] > 1e-12).all() or (arrays["state_volatility_"] < 0).any():
            raise ValueError("a feature scale or state volatility is not positive")
        history, n_iter = state.get("log_likelihood_history"), state.get("n_iter")
        if not isinstance(history, list) or not all(type(h) in (int, float) for h in history):
            raise ValueError("log_likelihood_history must be a list of numbers")
        try:
            history = [float(h) for h in history]
        except OverflowError:
            raise ValueError("log_likelihood_history holds a number past float's range") from None
        if isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 0:
            raise ValueError(f"n_iter must be a count, got {n_iter!r:.40}")
        if not isinstance(state.get("converged"), bool):
            raise ValueError("converged must be true or false")
        for name, value in arrays.items():
            setattr(self, name, value)
        self.start_ = _stationary(t)
        self.log_likelihood_history_ = history
        self.n_iter_ = n_iter
        self.converged_ = state["converged"]
        return self

    def score(self, df: pd.DataFrame) -> float:
        """Log-likelihood of the span's observations under the fitted model (filter prior)."""
        _check_fitted(self, "transition_")
        x = self._observations(df)
        log_b = self._log_emission(x, self.means_, self.variances_)
        return forward_filter(log_b, self.transition_, self.start_)[1]


def regime_accuracy(pred: Sequence[int] | np.ndarray, true: Sequence[int] | np.ndarray) -> float:
    """Accuracy after the best one-to-one matching of predicted to true labels.

    Detector labels are arbitrary, so each predicted label is assigned to the true regime it
    agrees with most, jointly, by the Hungarian algorithm (a predicted label left unmatched, when
    there are more of them than true regimes, counts as wrong). A negative predicted label means
    the detector had no opinion yet (a rule's warm-up bars): wrong, and never matched.
    """
    from scipy.optimize import linear_sum_assignment

    p = np.asarray(pred)
    t = np.asarray(true)
    if p.ndim != 1 or p.shape != t.shape or p.size == 0:
        raise DataError(
            f"<regimes>: pred and true must be equal-length non-empty 1-D arrays, got shapes "
            f"{p.shape} and {t.shape}"
        )
    size = p.size
    known = p >= 0
    p, t = p[known], t[known]
    if p.size == 0:
        return 0.0
    p_labels, p_idx = np.unique(p, return_inverse=True)
    t_labels, t_idx = np.unique(t, return_inverse=True)
    confusion = np.zeros((p_labels.size, t_labels.size), dtype=np.int64)
    np.add.at(confusion, (p_idx, t_idx), 1)
    rows, cols = linear_sum_assignment(confusion, maximize=True)
    return float(confusion[rows, cols].sum() / size)
