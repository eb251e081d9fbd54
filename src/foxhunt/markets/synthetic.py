"""A seeded Markov-switching market with known regimes, for testing regime-aware agents.

Each bar's regime follows a sticky Markov chain; within a regime the log price moves as Brownian
motion with the regime's drift and volatility (optionally pulled back toward its level at regime
entry). Every bar is built from ``substeps`` intrabar steps, so open/high/low/close are genuinely
consistent (open = first step, close = last, high/low = extremes). Volume rises with the bar's
absolute return and the regime's volatility.

The default market is designed so that knowing the regime is worth something but not
everything: bull and bear drifts are a tenth of a bar's volatility (a Sharpe of about 0.1 per bar),
so a regime only pays off when it is recognised early and held; sideways is driftless and
mean-reverting, high-volatility is driftless but wild. Volatility separates the regimes more
clearly than drift does, as in real markets.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from foxhunt._io import atomic_write_bytes
from foxhunt.errors import ConfigError

__all__ = [
    "DEFAULT_REGIMES",
    "DEFAULT_TRANSITION",
    "REGIME_NAMES",
    "RegimeSpec",
    "SyntheticMarketConfig",
    "generate_market",
    "write_synthetic_csv",
]


_MAX_PATH_POINTS = 200_000_000


@dataclass(frozen=True)
class RegimeSpec:
    """One market regime. Drift and volatility are of the log price, per bar."""

    name: str
    drift: float  # mean log return per bar
    volatility: float  # standard deviation of the log return per bar
    mean_reversion: float = 0.0  # per-bar pull of log price toward its level at regime entry

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"regime name must be a non-empty string, got {self.name!r}")
        for attr in ("drift", "volatility", "mean_reversion"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"regime {self.name!r}: {attr} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"regime {self.name!r}: {attr} must be finite, got {value!r}")
        if not 0 < self.volatility < 1:
            raise ConfigError(
                f"regime {self.name!r}: volatility must be in (0, 1) per bar, "
                f"got {self.volatility!r}"
            )
        if not 0 <= self.mean_reversion < 1:
            raise ConfigError(
                f"regime {self.name!r}: mean_reversion must be in [0, 1), "
                f"got {self.mean_reversion!r}"
            )


DEFAULT_REGIMES: tuple[RegimeSpec, ...] = (
    RegimeSpec("bull", drift=0.0010, volatility=0.010),
    RegimeSpec("bear", drift=-0.0014, volatility=0.015),
    RegimeSpec("sideways", drift=0.0, volatility=0.008, mean_reversion=0.03),
    RegimeSpec("high_volatility", drift=0.0, volatility=0.030),
)
REGIME_NAMES: tuple[str, ...] = tuple(r.name for r in DEFAULT_REGIMES)


def _sticky_matrix(durations: tuple[float, ...], exits: tuple[tuple[float, ...], ...]):
    """Rows: stay with probability 1 - 1/duration, leave in proportion to ``exits``."""
    rows = []
    for i, (duration, shares) in enumerate(zip(durations, exits, strict=True)):
        leave = 1.0 / duration
        total = sum(shares)
        rows.append(
            tuple(1.0 - leave if j == i else leave * s / total for j, s in enumerate(shares))
        )
    return tuple(rows)


# Expected durations: bull 150, bear 80, sideways 100, high_volatility 50 bars. Bear markets
# often end in turbulence and turbulence often resolves into bear or sideways markets.
DEFAULT_TRANSITION: tuple[tuple[float, ...], ...] = _sticky_matrix(
    (150.0, 80.0, 100.0, 50.0),
    (
        (0.0, 0.30, 0.45, 0.25),
        (0.30, 0.0, 0.35, 0.35),
        (0.45, 0.30, 0.0, 0.25),
        (0.30, 0.40, 0.30, 0.0),
    ),
)


@dataclass(frozen=True)
class SyntheticMarketConfig:
    """Everything that defines a synthetic market; the seed picks one sample path."""

    regimes: tuple[RegimeSpec, ...] = DEFAULT_REGIMES
    transition: tuple[tuple[float, ...], ...] = DEFAULT_TRANSITION  # row = from, column = to
    n_bars: int = 6000
    start_price: float = 100.0
    start: str = "2000-01-03"  # timestamp of the first bar
    freq: str = "1D"  # pandas offset alias between bars
    substeps: int = 24  # intrabar steps that make up each bar's path
    base_volume: float = 1_000_000.0  # typical volume of a calm bar
    volume_noise: float = 0.3  # standard deviation of log-volume noise
    initial_regime: int | None = None  # None: drawn from the stationary distribution
    _matrix: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regimes = tuple(self.regimes)
        if len(regimes) < 1 or not all(isinstance(r, RegimeSpec) for r in regimes):
            raise ConfigError(
                f"regimes must be a non-empty sequence of RegimeSpec, got {regimes!r}"
            )
        names = [r.name for r in regimes]
        if len(set(names)) != len(names):
            raise ConfigError(f"regime names must be unique, got {names}")
        k = len(regimes)
        try:
            matrix = np.array(self.transition, dtype=np.float64)
        except (TypeError, ValueError):
            raise ConfigError(
                f"transition must be a {k}x{k} matrix, got {self.transition!r}"
            ) from None
        if matrix.shape != (k, k):
            raise ConfigError(
                f"transition must be {k}x{k} for {k} regimes, got shape {matrix.shape}"
            )
        if not np.all(np.isfinite(matrix)) or np.any(matrix < 0):
            raise ConfigError(f"transition entries must be finite and >= 0, got {matrix.tolist()}")
        sums = matrix.sum(axis=1)
        bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-9)
        if bad.size:
            i = int(bad[0])
            raise ConfigError(f"transition row {i} ({names[i]}) must sum to 1, sums to {sums[i]!r}")
        for attr, low in (("n_bars", 2), ("substeps", 1)):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{attr} must be an integer >= {low}, got {value!r}")
        # The intrabar paths are n_bars x substeps floats, built at once: beyond 2e8 (1.6 GB a
        # copy) a typo (a billion substeps) met the OOM killer rather than an error.
        if self.n_bars * self.substeps > _MAX_PATH_POINTS:
            raise ConfigError(
                f"n_bars x substeps must be at most {_MAX_PATH_POINTS:,} (the intrabar path is "
                f"built in memory), got {self.n_bars:,} x {self.substeps:,}"
            )
        for attr in ("start_price", "base_volume"):
            value = getattr(self, attr)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ConfigError(f"{attr} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.volume_noise, int | float) and 0 <= self.volume_noise < 5):
            raise ConfigError(f"volume_noise must be in [0, 5), got {self.volume_noise!r}")
        if self.initial_regime is not None and (
            isinstance(self.initial_regime, bool)
            or not isinstance(self.initial_regime, int)
            or not 0 <= self.initial_regime < k
        ):
            raise ConfigError(
                f"initial_regime must be None or in [0, {k}), got {self.initial_regime!r}"
            )
        try:
            if pd.isna(pd.Timestamp(self.start)):  # None, "NaT": no time to start from
                raise ValueError(self.start)
        except (ValueError, TypeError):
            raise ConfigError(f"start must be a timestamp, got {self.start!r}") from None
        try:
            step = pd.tseries.frequencies.to_offset(self.freq)
            first = pd.Timestamp(self.start).as_unit("ns")  # bars are nanosecond timestamps
            last = first + (self.n_bars - 1) * step
            forward = last > first
        except (ValueError, TypeError, OverflowError, pd.errors.OutOfBoundsDatetime):
            raise ConfigError(
                f"freq must be a pandas offset alias such as '1D', and the {self.n_bars:,} bars "
                f"from start {self.start!r} must end by 2262-04-11, got freq {self.freq!r}"
            ) from None
        if not forward:  # 0D, -1D: bars that do not move forward in time
            raise ConfigError(f"freq must step forward in time, got {self.freq!r}")
        object.__setattr__(self, "regimes", regimes)
        object.__setattr__(
            self, "transition", tuple(tuple(float(x) for x in row) for row in matrix)
        )
        matrix.setflags(write=False)
        object.__setattr__(self, "_matrix", matrix)

    @property
    def regime_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regimes)

    @property
    def transition_matrix(self) -> np.ndarray:
        """The transition matrix as a read-only [K, K] array."""
        return self._matrix

    @property
    def expected_durations(self) -> np.ndarray:
        """Mean bars spent in each regime per visit: 1 / (1 - P[k, k])."""
        stay = np.diag(self._matrix)
        with np.errstate(divide="ignore"):
            return np.where(stay < 1, 1.0 / (1.0 - stay), np.inf)

    def stationary_distribution(self) -> np.ndarray:
        """The long-run share of bars in each regime (left eigenvector of P for eigenvalue 1)."""
        k = self._matrix.shape[0]
        # Solve pi (P - I) = 0 with sum(pi) = 1 as a least-squares system (robust when reducible).
        a = np.vstack([self._matrix.T - np.eye(k), np.ones((1, k))])
        b = np.concatenate([np.zeros(k), [1.0]])
        pi = np.linalg.lstsq(a, b, rcond=None)[0]
        pi = np.clip(pi, 0.0, None)
        return pi / pi.sum()


def generate_market(config: SyntheticMarketConfig | None = None, *, seed: int = 0) -> pd.DataFrame:
    """Sample one market path: OHLCV bars plus the true ``regime`` (int) of every bar.

    The same config and seed give the identical frame. ``frame.attrs["regime_names"]`` holds the
    names of the regime ids. Bar ``t``'s regime governs the move from close ``t-1`` to close ``t``.
    """
    cfg = config if config is not None else SyntheticMarketConfig()
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(int(seed))
    n, s, k = cfg.n_bars, cfg.substeps, len(cfg.regimes)
    drift = np.array([r.drift for r in cfg.regimes])
    vol = np.array([r.volatility for r in cfg.regimes])
    kappa = np.array([r.mean_reversion for r in cfg.regimes])

    # Regime chain: draw every uniform up front so the draws do not depend on the path.
    cumulative = np.cumsum(cfg.transition_matrix, axis=1)
    cumulative[:, -1] = 1.0
    u = rng.random(n)
    regime = np.empty(n, dtype=np.int64)
    if cfg.initial_regime is None:
        first_cdf = np.cumsum(cfg.stationary_distribution())
        first_cdf[-1] = 1.0
        regime[0] = min(int(np.searchsorted(first_cdf, u[0], side="right")), k - 1)
    else:
        regime[0] = cfg.initial_regime
    for t in range(1, n):
        regime[t] = min(int(np.searchsorted(cumulative[regime[t - 1]], u[t], side="right")), k - 1)

    z = rng.standard_normal((n, s))
    noise_path = np.cumsum(z, axis=1) * (vol[regime] / math.sqrt(s))[:, None]  # [n, s]

    # Bar drift depends on the previous close when the regime mean-reverts, hence the loop.
    log_start = math.log(cfg.start_price)
    bar_mu = np.empty(n)
    x_prev = log_start
    anchor = log_start
    for t in range(n):
        k_t = regime[t]
        if t > 0 and regime[t] != regime[t - 1]:
            anchor = x_prev
        bar_mu[t] = drift[k_t] - kappa[k_t] * (x_prev - anchor)
        x_prev = x_prev + bar_mu[t] + noise_path[t, -1]
    steps = np.arange(1, s + 1) / s
    rel_path = bar_mu[:, None] * steps[None, :] + noise_path  # log move from previous close
    bar_ret = rel_path[:, -1]
    prev_close = log_start + np.concatenate([[0.0], np.cumsum(bar_ret)[:-1]])
    path = prev_close[:, None] + rel_path
    hi, lo = path.max(axis=1), path.min(axis=1)
    # exp() overflows above a log price of 709.78 and reaches 0 below -745: inf or 0 prices.
    beyond = (hi > 709.0) | (lo < -745.0)
    if beyond.any():
        i = int(np.argmax(beyond))
        crossed = float(hi[i] if hi[i] > 709.0 else lo[i])
        raise ConfigError(
            f"the market's prices leave float range at bar {i} of {n} (log price {crossed:.4g}):"
            " lower start_price, the regimes' drift (a mean log return per bar) or n_bars"
        )

    # Volume: busier in volatile regimes and on big moves, with lognormal noise.
    ref_vol = float(cfg.stationary_distribution() @ vol)
    sigma = cfg.volume_noise
    noise = np.exp(sigma * rng.standard_normal(n) - 0.5 * sigma**2)
    volume = (
        cfg.base_volume
        * np.sqrt(vol[regime] / ref_vol)
        * (0.5 + np.abs(bar_ret) / vol[regime])
        * noise
    )

    index = pd.date_range(pd.Timestamp(cfg.start), periods=n, freq=cfg.freq, name="timestamp")
    frame = pd.DataFrame(
        {
            "open": np.exp(path[:, 0]),
            "high": np.exp(hi),
            "low": np.exp(lo),
            "close": np.exp(path[:, -1]),
            "volume": volume,
            "regime": regime,
        },
        index=index.as_unit("ns"),
    )
    frame.attrs["regime_names"] = list(cfg.regime_names)
    return frame


def write_synthetic_csv(
    path: str | Path, config: SyntheticMarketConfig | None = None, seed: int = 0
) -> Path:
    """Generate a market and write it atomically as CSV (gzip if the name ends in ``.csv.gz``).

    Columns: ``timestamp, open, high, low, close, volume, regime, regime_name``; floats are
    written as the shortest text that round-trips, so :func:`foxhunt.markets.data.load_ohlcv`
    reads back the identical values, and the regime names too (per-regime backtest tables say
    "bull", not "regime_0").
    """
    target = Path(path)
    name = target.name.lower()
    if not (name.endswith(".csv") or name.endswith(".csv.gz")):
        raise ConfigError(f"synthetic output path must end in .csv or .csv.gz, got {str(path)!r}")
    frame = generate_market(config, seed=seed)
    names = np.asarray(frame.attrs["regime_names"], dtype=object)
    frame = frame.assign(regime_name=names[frame["regime"].to_numpy()])
    sub_second = bool((frame.index.microsecond != 0).any() or (frame.index.nanosecond != 0).any())
    date_format = "%Y-%m-%dT%H:%M:%S.%f" if sub_second else "%Y-%m-%dT%H:%M:%S"
    text = frame.to_csv(index=True, date_format=date_format)
    data = text.encode("utf-8")
    if name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime=0: the same seed gives the same bytes
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, data)
    return target
