"""Performance metrics, baselines and reports for trading policies.

Conventions (shared by every function here):

* Metric functions take **per-bar net log returns** (what :class:`~foxhunt.envs.trading.TradingEnv`
  pays as reward), so they add up over time: total log return = ``sum(r)``.
* A backtest period ``i`` runs from decision bar ``t`` (the position is filled at ``close[t]``) to
  bar ``t + 1``. ``BacktestResult.timestamps[i]`` is the timestamp of bar ``t + 1`` (the end of the
  period), ``equity[i]`` the equity there, ``costs[i]`` the cost paid at the fill. Per-regime
  metrics label a period by the regime of bar ``t + 1``, whose return it earns.
* Undefined ratios (Sharpe/Sortino with zero dispersion, Calmar with no drawdown, hit rate with
  no exposure) are reported as ``0.0``, never inf/nan, so comparisons, hyperopt objectives and
  JSON stay finite. Empty or non-finite inputs raise :class:`~foxhunt.errors.DataError`.
* A strategy wiped out (equity 0) reports total and annualised return -100% and drawdown 100%;
  its log-return metrics (log 0) are NaN in ``metrics``, "n/a" in the tables, null in JSON.
* Baselines are simulated with :func:`simulate_positions`, which uses the env's own
  :func:`~foxhunt.envs.trading.step_growth`, so agent and baselines pay identical costs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from foxhunt._io import atomic_write_many
from foxhunt.envs.trading import (
    BANKRUPTCY_REWARD,
    MAX_LEVERAGE,
    TradingEnv,
    TradingEnvConfig,
    step_growth,
    validate_market,
)
from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.arrays import MarketArrays

_ZERO = 1e-12  # dispersion below this counts as zero (float noise on constant returns)


# ---------------------------------------------------------------------------------------------
# metric functions
# ---------------------------------------------------------------------------------------------
def _returns(log_returns: Any, name: str = "log_returns") -> np.ndarray:
    r = np.asarray(log_returns, dtype=np.float64).ravel()
    if r.size == 0:
        raise DataError(f"{name}: empty array; metrics need at least one bar")
    if not np.isfinite(r).all():
        raise DataError(f"{name}: index {int(np.flatnonzero(~np.isfinite(r))[0])} is not finite")
    return r


def _positions(positions: Any, n: int | None = None) -> np.ndarray:
    p = np.asarray(positions, dtype=np.float64).ravel()
    if p.size == 0:
        raise DataError("positions: empty array; metrics need at least one bar")
    if n is not None and p.size != n:
        raise DataError(f"positions: length {p.size} != {n} returns")
    if not np.isfinite(p).all():  # a NaN would count as held and turn turnover into NaN
        raise DataError(f"positions: index {int(np.flatnonzero(~np.isfinite(p))[0])} is not finite")
    return p


def _initial(initial_position: Any) -> float:
    """The position held before the first bar: a finite number (its move is the first trade)."""
    value = None
    if np.ndim(initial_position) == 0 and not isinstance(
        initial_position, bool | np.bool_ | str | bytes
    ):
        try:
            value = float(initial_position)  # also 0-d arrays, Fraction, Decimal
        except (TypeError, ValueError):
            value = None
    if value is None or not math.isfinite(value):
        raise DataError(f"initial_position must be a finite number, got: {initial_position!r}")
    return value


def _ppy(periods_per_year: float) -> float:
    """Bars per year: a positive finite number, or every annualised figure is meaningless."""
    ok = isinstance(periods_per_year, int | float | np.number) and not isinstance(
        periods_per_year, bool
    )
    if not (ok and math.isfinite(periods_per_year) and periods_per_year > 0):
        raise ConfigError(f"periods_per_year must be a positive number, got: {periods_per_year!r}")
    return float(periods_per_year)


def _growth(log_growth: float) -> float:
    """``exp(x) - 1``, +inf past float range (a 1000-fold log return is not an error)."""
    try:
        return math.expm1(log_growth)
    except OverflowError:
        return math.inf


def total_return(log_returns: Any) -> float:
    """Simple return over the whole span: ``exp(sum r) - 1``."""
    return _growth(float(_returns(log_returns).sum()))


def annualised_return(log_returns: Any, periods_per_year: float = 252) -> float:
    """Compound annual growth rate: ``exp(mean(r) * periods_per_year) - 1``."""
    return _growth(float(_returns(log_returns).mean()) * _ppy(periods_per_year))


def annualised_volatility(log_returns: Any, periods_per_year: float = 252) -> float:
    """Sample std (ddof=1) of log returns times ``sqrt(periods_per_year)``; 0 for one bar."""
    r = _returns(log_returns)
    if r.size < 2:
        _ppy(periods_per_year)
        return 0.0
    return float(r.std(ddof=1) * math.sqrt(_ppy(periods_per_year)))


def sharpe(log_returns: Any, periods_per_year: float = 252) -> float:
    """Annualised Sharpe ratio at zero risk-free rate, ``mean / std(ddof=1) * sqrt(ppy)``.

    0.0 when the returns have no dispersion (e.g. always flat) or there is a single bar.
    """
    r, ppy = _returns(log_returns), _ppy(periods_per_year)
    if r.size < 2:
        return 0.0
    sd = r.std(ddof=1)
    return 0.0 if sd < _ZERO else float(r.mean() / sd * math.sqrt(ppy))


def sharpe_standard_error(log_returns: Any, periods_per_year: float = 252) -> float:
    """Standard error of :func:`sharpe` for independent bars (Lo 2002): ``sqrt((1 + SR^2 / 2)
    / n)`` for the per-bar ratio SR over ``n`` bars, annualised by ``sqrt(ppy)``. A 100-bar
    daily span reads about 1.6: a Sharpe under twice its standard error is no evidence of an
    edge. 0.0 where the Sharpe is shown as 0 for being undefined (under 2 bars, no
    dispersion), as the other ratios are."""
    r, ppy = _returns(log_returns), _ppy(periods_per_year)
    if r.size < 2 or r.std(ddof=1) < _ZERO:
        return 0.0
    per_bar = r.mean() / r.std(ddof=1)
    return float(math.sqrt((1.0 + per_bar * per_bar / 2.0) / r.size * ppy))


def sortino(log_returns: Any, periods_per_year: float = 252) -> float:
    """Annualised Sortino ratio: ``mean / sqrt(mean(min(r, 0)^2)) * sqrt(ppy)`` (target 0).

    The downside deviation averages over *all* bars (Sortino & Price's definition); 0.0 when
    there is no losing bar, as the ratio is then undefined.
    """
    r = _returns(log_returns)
    downside = math.sqrt(float(np.mean(np.minimum(r, 0.0) ** 2)))
    ppy = _ppy(periods_per_year)
    return 0.0 if downside < _ZERO else float(r.mean() / downside * math.sqrt(ppy))


def equity_curve(log_returns: Any) -> np.ndarray:
    """Equity after each bar, starting from 1.0 (the start itself is not included)."""
    return np.exp(np.cumsum(_returns(log_returns)))


def max_drawdown(log_returns: Any) -> float:
    """Largest peak-to-trough fall of equity, as a positive fraction; the 1.0 start is a peak."""
    log_eq = np.concatenate([[0.0], np.cumsum(_returns(log_returns))])
    drawdown_log = np.maximum.accumulate(log_eq) - log_eq  # log(peak / equity) >= 0
    return float(-math.expm1(-drawdown_log.max()))


def calmar(log_returns: Any, periods_per_year: float = 252) -> float:
    """Annualised return divided by max drawdown; 0.0 when there is no drawdown."""
    ppy = _ppy(periods_per_year)
    mdd = max_drawdown(log_returns)
    return 0.0 if mdd < _ZERO else annualised_return(log_returns, ppy) / mdd


def turnover(positions: Any, initial_position: float = 0.0) -> float:
    """Mean ``|Δposition|`` per bar, including the first move from ``initial_position``."""
    p = _positions(positions)
    return float(np.abs(np.diff(p, prepend=_initial(initial_position))).mean())


def hit_rate(positions: Any, log_returns: Any) -> float:
    """Among bars holding a nonzero position, the share whose net pnl (after costs) is > 0.

    0.0 when the strategy never holds a position.
    """
    r = _returns(log_returns)
    held = _positions(positions, r.size) != 0.0
    return float((r[held] > 0).mean()) if held.any() else 0.0


def exposure(positions: Any) -> float:
    """Share of bars holding a nonzero position."""
    return float((_positions(positions) != 0.0).mean())


_DAY_NS = 86_400 * 10**9
_YEAR_DAYS = 365.25


def _active_weekdays(days: np.ndarray, intraday_hours: float) -> int:
    """How many days of the week a market trades, for data too short to show whole weeks.

    A bar on a Saturday (UTC) means 7: crypto trades every day, while exchanges, FX and futures
    are shut all Saturday (their Sunday-evening opens belong to Monday's session). Data that
    spans a whole Saturday without a bar on it means 5. Otherwise the data cannot show its
    week: sessions round the clock (``intraday_hours`` of 20 or more a day) say 7, others the
    5-day week of exchanges.
    """
    weekday = (days + 3) % 7  # 1970-01-01 (day 0) was a Thursday; Monday = 0
    if (weekday == 5).any():
        return 7
    inner = np.arange(days[0] + 1, days[-1])  # calendar days the data covers wholly
    if ((inner + 3) % 7 == 5).any():
        return 5
    return 7 if intraday_hours >= 20.0 else 5


def _bar_text(ns: float) -> str:
    """A bar's length in words: '1-minute', '4-hour'."""
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:g}-second"
    return f"{seconds / 60:g}-minute" if seconds < 3600 else f"{seconds / 3600:g}-hour"


def _utc_datetime64(timestamps: Any) -> np.ndarray | None:
    """Timestamps as naive UTC datetime64, or None when they are not dates.

    A time-zone-aware index or Series reaches numpy as an object array of Timestamps: without
    this it would fall back to the default and annualise hourly bars as daily ones.
    """
    ts = np.asarray(timestamps)
    if not np.issubdtype(ts.dtype, np.datetime64):
        if ts.dtype != object or ts.size == 0:
            return None
        if pd.api.types.infer_dtype(ts.ravel(), skipna=True) not in ("datetime", "datetime64"):
            return None
        try:
            ts = pd.to_datetime(ts.ravel(), utc=True).tz_localize(None).to_numpy()
        except (ValueError, TypeError, OverflowError):
            return None
    ts = ts.ravel()
    return ts[~np.isnat(ts)]  # a missing time says nothing about the spacing (NaT sorts first)


def median_bar_seconds(timestamps: Any) -> float | None:
    """The usual time from one bar to the next, in seconds (None for fewer than two bars)."""
    ts = _utc_datetime64(timestamps)
    if ts is None or ts.size < 2:
        return None
    gaps = np.diff(np.sort(ts.astype("datetime64[ns]").astype(np.int64)))
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) / 1e9 if gaps.size else None


def infer_periods_per_year(timestamps: Any, default: float = 252.0) -> float:
    """Bars per year as the data has them: 365.25 for 24/7 daily bars, ~252 for exchange days,
    ~98 000 for one-minute bars of a 6.5-hour exchange session. Annualising every file with
    252 would scale an intraday Sharpe ratio by the wrong square root.

    Read from the bars of the calendar weeks rather than from bars / calendar span, which a
    short file (one week of minute bars reads as 24/7 trading squeezed into 5 days) or an
    outage (three missing months read as a slower market) throws off:

    * bars spaced under 4 days: the mean number of bars in the calendar weeks (Monday to
      Sunday) that lie wholly inside the data, leaving out weeks with under half the median
      (an outage), times 365.25 / 7. Holiday weeks count, so exchange days read ~252; a
      session that crosses midnight (FX from Sunday evening to Friday evening, 23-hour
      futures) counts what it trades;
    * data shorter than two whole weeks: the median number of bars per dated day times the
      days traded per year (:func:`_active_weekdays`; exchange holidays cannot be seen);
    * longer bars, and bars never closer than a day and a half in data too short for whole weeks:
      intervals / span in years (weekly, monthly bars have no week to read; two weeks of
      2-day bars are not daily bars).
    """
    return periods_per_year_with_caveat(timestamps, default)[0]


def periods_per_year_with_caveat(
    timestamps: Any, default: float = 252.0
) -> tuple[float, str | None]:
    """:func:`infer_periods_per_year`, and why it may be off for these timestamps (intraday bars
    without one whole day among them) or None: said in a warning and in the report."""
    ts = _utc_datetime64(timestamps)
    if ts is None or ts.size < 3:
        return default, None
    ns = np.sort(ts.astype("datetime64[ns]").astype(np.int64))  # order does not change the rate
    gaps = np.diff(ns)
    gaps = gaps[gaps > 0]
    if gaps.size == 0:
        return default, None
    bar = float(np.median(gaps))
    days = ns // _DAY_NS
    weeks, per_week = np.unique((days + 3) // 7, return_counts=True)  # day 0 was a Thursday
    whole = per_week[(weeks > weeks[0]) & (weeks < weeks[-1])]
    # Bars never a day apart (a weekend gap makes a few business days' median 1.5 days).
    if bar >= 4 * _DAY_NS or (whole.size < 2 and gaps.min() >= 1.5 * _DAY_NS):
        years = (ns[-1] - ns[0]) / (_YEAR_DAYS * _DAY_NS)
        return float((ts.size - 1) / years), None
    if whole.size >= 2:
        trading = whole[whole >= 0.5 * np.median(whole)]  # weeks of an outage left out
        return float(trading.mean()) * _YEAR_DAYS / 7, None
    if bar < 20 * 3_600e9:
        dated, per_date = np.unique(days, return_counts=True)
        # The first and last dates are usually partial sessions: count whole days when any.
        per_day = float(np.median(per_date[1:-1] if dated.size >= 3 else per_date))
        weekdays = _active_weekdays(days, per_day * bar / 3_600e9)
        note = None
        if dated.size < 3:  # a session's length is not seen: a few hours read as the day
            note = (
                f"the data's {_bar_text(bar)} bars fall on {dated.size} date(s), so bars per "
                "year count the bars of days that may be partial sessions: annualised figures "
                "(Sharpe, annual return, volatility) may be understated"
            )
        return per_day * _YEAR_DAYS * weekdays / 7, note
    return _YEAR_DAYS * _active_weekdays(days, 0.0) / 7, None


def compute_metrics(
    log_returns: Any,
    positions: Any,
    *,
    initial_position: float = 0.0,
    periods_per_year: float = 252,
) -> dict[str, float]:
    """All metrics of one contiguous run, keyed by name."""
    r = _returns(log_returns)
    p = _positions(positions, r.size)
    changes = np.abs(np.diff(p, prepend=_initial(initial_position)))
    return _metrics(r, p, changes, _ppy(periods_per_year))


def _metrics(r: np.ndarray, p: np.ndarray, changes: np.ndarray, ppy: float) -> dict[str, float]:
    """Metrics given precomputed |Δposition| (so regime subsets keep their true entry moves)."""
    return {
        "bars": float(r.size),
        "total_log_return": float(r.sum()),
        "total_return": total_return(r),
        "annualised_return": annualised_return(r, ppy),
        "annualised_volatility": annualised_volatility(r, ppy),
        "sharpe": sharpe(r, ppy),
        "sharpe_se": sharpe_standard_error(r, ppy),
        "sortino": sortino(r, ppy),
        "max_drawdown": max_drawdown(r),
        "calmar": calmar(r, ppy),
        "turnover": float(changes.mean()),
        "hit_rate": hit_rate(p, r),
        "exposure": exposure(p),
    }


def oracle_capture(agent: BacktestResult, oracle: BacktestResult) -> float:
    """Agent total log return / oracle total log return (share of the oracle's edge captured).

    Negative when the agent loses money while the oracle gains. NaN when the oracle's own total
    log return is <= 0: then it has no edge to capture and any ratio would mislead.
    """
    denominator = float(np.sum(oracle.net_log_returns))
    if denominator <= 0.0:
        return float("nan")
    return float(np.sum(agent.net_log_returns)) / denominator


# ---------------------------------------------------------------------------------------------
# results and simulation
# ---------------------------------------------------------------------------------------------
@dataclass
class BacktestResult:
    """One strategy's run over a span; arrays are per period (see the module docstring)."""

    name: str
    timestamps: np.ndarray  # [n] end of each period (bar t + 1)
    positions: np.ndarray  # [n] position held over the period
    net_log_returns: np.ndarray  # [n] log equity growth net of costs
    costs: np.ndarray  # [n] cost paid at the period's fill, fraction of equity
    equity: np.ndarray  # [n] equity at the end of the period (start = 1.0)
    market_returns: np.ndarray  # [n] simple return of the asset over the period
    start_timestamp: Any  # timestamp of the first decision bar (equity 1.0)
    regime_labels: np.ndarray  # [n] int regime id per period used for per-regime metrics
    regime_source: str  # "true" or "detected"
    regime_names: tuple[str, ...]  # name per regime id
    detected_regimes: np.ndarray  # [n] detector's most likely state at bar t + 1 (-1: none yet)
    true_regimes: np.ndarray | None  # [n] or None
    metrics: dict[str, float] = field(default_factory=dict)
    per_regime: dict[str, dict[str, float]] = field(default_factory=dict)
    bankrupt: bool = False


def series_frame(results: Sequence[BacktestResult]) -> pd.DataFrame:
    """Per-period series of strategies run over one span, indexed by the period's END bar: the
    position in row ``ts[k + 1]`` was decided at bar ``k`` and held from it. For each strategy
    (``buy & hold`` as ``buy_and_hold``): position, cost, net log return (-inf where equity was
    wiped out) and equity; then the market's simple return over the period and the end bar's
    regimes (detected, and true when known)."""
    first = results[0]
    columns: dict[str, np.ndarray] = {}
    for res in results:
        if len(res.timestamps) != len(first.timestamps):
            raise ConfigError(
                f"results: {res.name!r} has {len(res.timestamps)} periods, {first.name!r} "
                f"{len(first.timestamps)}; series_frame needs strategies over one span"
            )
        key = re.sub(r"\W+", "_", res.name.replace("&", "and")).strip("_")
        columns[f"{key}_position"] = res.positions
        columns[f"{key}_cost"] = res.costs
        # A wipe-out's row carries the env's penalty reward; the series says what equity did.
        columns[f"{key}_net_log_return"] = np.where(res.equity > 0, res.net_log_returns, -np.inf)
        columns[f"{key}_equity"] = res.equity
    columns["market_return"] = first.market_returns
    columns["detected_regime"] = first.detected_regimes
    if first.true_regimes is not None:
        columns["true_regime"] = first.true_regimes
    index = pd.DatetimeIndex(pd.to_datetime(first.timestamps), name="timestamp")
    return pd.DataFrame(columns, index=index)


NO_REGIME = "no estimate (warm-up)"


def _regime_name(names: Sequence[str], k: int) -> str:
    if k < 0:  # the detector had no opinion yet (see _detected_states)
        return NO_REGIME
    return names[k] if k < len(names) else f"regime_{k}"


def _regime_colors(labels: Any) -> np.ndarray:
    """RGBA per label in one colormap call (not one per bar); grey where no regime is known."""
    from matplotlib import colormaps

    k = np.atleast_1d(np.asarray(labels, dtype=np.int64))
    colors = colormaps["tab10"](k % 10)
    colors[k < 0] = (0.6, 0.6, 0.6, 1.0)
    return colors


def _wiped_out(metrics: dict[str, float]) -> None:
    """A run that lost everything: the env's -10 bankruptcy reward is a training penalty, not a
    return. Returns and drawdown say -100%; ratios built on log returns are undefined (log 0),
    reported as n/a in the tables and null in JSON."""
    metrics.update(total_return=-1.0, annualised_return=-1.0, max_drawdown=1.0)
    for key in (
        "total_log_return",
        "annualised_volatility",
        "sharpe",
        "sharpe_se",
        "sortino",
        "calmar",
    ):
        metrics[key] = float("nan")


def _build_result(
    market: MarketArrays,
    name: str,
    config: TradingEnvConfig,
    positions: np.ndarray,
    log_returns: np.ndarray,
    costs: np.ndarray,
    equity: np.ndarray,
    bankrupt: bool,
    periods_per_year: float | None,
) -> BacktestResult:
    if periods_per_year is None:
        periods_per_year = infer_periods_per_year(market.timestamps)
    periods_per_year = _ppy(periods_per_year)
    first = config.window - 1
    n = len(market) - 1 - first
    ends = slice(first + 1, first + 1 + n)  # bar t + 1 of each period
    close = np.asarray(market.close, dtype=np.float64)
    market_returns = close[ends] / close[first : first + n] - 1.0
    # -1 where the detector has no opinion yet: a rule's warm-up bars are not its first state.
    detected = _detected_states(market)[ends]
    true = None if market.true_regimes is None else np.asarray(market.true_regimes)[ends]
    labels, source = (true.astype(np.int64), "true") if true is not None else (detected, "detected")

    # Per-regime tables name the labels they split by: the source's true regimes (bull, bear,
    # ...) or the detector's states, never one under the other's names.
    names = market.true_regime_names if source == "true" else market.regime_names
    changes = np.abs(np.diff(positions, prepend=config.initial_value))
    # The period that wiped the account out carries the env's -10 bankruptcy reward.
    wiped = np.flatnonzero(log_returns == BANKRUPTCY_REWARD)[:1] if bankrupt else np.array([])
    if wiped.size:
        # The flat periods after a wipe-out are not a trade (there is nothing left to sell): the
        # drop to 0 there is bookkeeping and must not count as turnover.
        changes[int(wiped[0]) + 1 :] = 0.0
    metrics = _metrics(log_returns, positions, changes, periods_per_year)
    if bankrupt:
        _wiped_out(metrics)
    metrics["periods_per_year"] = float(periods_per_year)
    metrics["final_equity"] = float(equity[-1])
    metrics["total_cost"] = float(costs.sum())
    per_regime: dict[str, dict[str, float]] = {}
    for k in np.unique(labels):
        mask = labels == k
        part = _metrics(log_returns[mask], positions[mask], changes[mask], periods_per_year)
        if wiped.size and mask[wiped[0]]:
            _wiped_out(part)  # the regime holding the wipe-out period lost everything too
        per_regime[_regime_name(names, int(k))] = part
    return BacktestResult(
        name=name,
        timestamps=np.asarray(market.timestamps)[ends],
        positions=positions,
        net_log_returns=log_returns,
        costs=costs,
        equity=equity,
        market_returns=market_returns,
        start_timestamp=np.asarray(market.timestamps)[first],
        regime_labels=labels,
        regime_source=source,
        regime_names=tuple(names),
        detected_regimes=detected,
        true_regimes=true,
        metrics=metrics,
        per_regime=per_regime,
        bankrupt=bankrupt,
    )


def simulate_positions(
    market: MarketArrays,
    positions_per_bar: Any,
    config: TradingEnvConfig,
    name: str,
    *,
    periods_per_year: float | None = None,
) -> BacktestResult:
    """Account a given position series exactly as :class:`TradingEnv` in eval mode would.

    ``positions_per_bar`` is either one entry per market bar (length ``len(market)``; entry ``t``
    is held from ``close[t]`` to ``close[t+1]``, entries before the first full window and the last
    bar are ignored) or one per env step (length ``len(market) - window``). Values need not be in
    ``config.positions`` (buy-and-hold is 1.0 whatever the action set) but must satisfy
    ``|p| <= MAX_LEVERAGE``. After a wipe-out the remaining periods are flat with zero equity.
    """
    validate_market(market, config.window)
    first = config.window - 1
    n = len(market) - 1 - first
    p = np.asarray(positions_per_bar, dtype=np.float64).ravel()
    if p.size == len(market):
        p = p[first : first + n]
    elif p.size != n:
        raise DataError(
            f"positions_per_bar: length {p.size}; expected {len(market)} (one per bar) or "
            f"{n} (one per step with window={config.window})"
        )
    if not np.isfinite(p).all() or np.abs(p).max() > MAX_LEVERAGE:
        raise DataError(f"positions_per_bar: values must be finite with |p| <= {MAX_LEVERAGE}")
    p = p.copy()
    close = np.asarray(market.close, dtype=np.float64)
    market_returns = close[first + 1 : first + 1 + n] / close[first : first + n] - 1.0
    previous = np.concatenate([[config.initial_value], p[:-1]])
    costs, growth = step_growth(previous, p, market_returns, config.cost_rate)
    costs = np.asarray(costs, dtype=np.float64)

    wiped = np.flatnonzero(growth <= 0.0)
    bankrupt = wiped.size > 0
    end = int(wiped[0]) if bankrupt else n
    log_returns = np.zeros(n)
    log_returns[:end] = np.log(growth[:end])
    equity = np.zeros(n)
    equity[:end] = np.cumprod(growth[:end])  # multiplied bar by bar, like the env
    if bankrupt:
        log_returns[end] = BANKRUPTCY_REWARD
        p[end + 1 :] = 0.0
        costs[end + 1 :] = 0.0
    return _build_result(
        market, name, config, p, log_returns, costs, equity, bankrupt, periods_per_year
    )


_CHUNK_BARS = 4096
"""Bars whose greedy actions :class:`_BatchedGreedy` computes at once, per position held."""


class _BatchedGreedy:
    """``act`` for a policy that can score many observations at once (``act.q_batch``, as
    :func:`foxhunt.runs.model_policy` gives it): the greedy actions of a chunk of bars, for
    each position the walk holds there, from one batched forward pass instead of one pass per
    bar (60 us a bar).

    A batched product may round differently in the last bits from a one-row one, so where the
    best action's lead over the next is within rounding reach, ``act`` itself decides: the
    actions are those of the bar-by-bar loop, only faster.
    """

    def __init__(self, env: TradingEnv, act: Callable[[np.ndarray], int]) -> None:
        self.env, self.act, self.q_batch = env, act, act.q_batch  # type: ignore[attr-defined]
        self.start = self.stop = -1  # the chunk of bars scored
        # Per position, filled when the walk first holds it in the chunk: scoring every
        # position at every bar costs n_positions forward rows a bar where the walk visits a few.
        self.best: dict[int, np.ndarray] = {}
        self.certain: dict[int, np.ndarray] = {}

    def _fill(self, p: int) -> None:
        env = self.env
        q = np.asarray(self.q_batch(env.observations(self.start, self.stop, p)), dtype=np.float64)
        q = q.reshape(self.stop - self.start, -1)
        self.best[p] = q.argmax(axis=-1)
        if q.shape[-1] > 1:
            top = np.partition(q, q.shape[-1] - 2, axis=-1)[..., -2:]
            lead = top[..., 1] - top[..., 0]
            # float32 products' rounding is ~1e-7 relative; NaN leads fail the test as well.
            self.certain[p] = lead > 1e-4 * np.abs(q).max(axis=-1) + 1e-6
        else:
            self.certain[p] = np.isfinite(q[..., 0])

    def __call__(self, obs: np.ndarray) -> int:
        t, p = self.env.bar, self.env.position_index
        if not self.start <= t < self.stop:
            self.start, self.stop = t, min(t + _CHUNK_BARS, self.env.last_bar + 1)
            self.best, self.certain = {}, {}
        if p not in self.best:
            self._fill(p)
        i = t - self.start
        if self.certain[p][i]:
            return int(self.best[p][i])
        return self.act(obs)


_MOST_POSITIONS_BATCHED = 16
"""Beyond this many positions a policy that wanders over them makes a chunk score more rows
than the bar-by-bar loop would run (measured: 51 positions, window 128, 2x slower)."""


def batched_greedy(
    env: TradingEnv, act: Callable[[np.ndarray], int]
) -> Callable[[np.ndarray], int]:
    """``act`` run through :class:`_BatchedGreedy` when it offers ``q_batch`` (and the env has
    at most :data:`_MOST_POSITIONS_BATCHED` positions); else ``act`` itself."""
    batched = callable(getattr(act, "q_batch", None))
    few = env.n_positions <= _MOST_POSITIONS_BATCHED
    return _BatchedGreedy(env, act) if batched and few else act


def run_policy(
    market: MarketArrays,
    act: Callable[[np.ndarray], int],
    config: TradingEnvConfig,
    name: str,
    *,
    periods_per_year: float | None = None,
) -> BacktestResult:
    """Run ``act(observation) -> action index`` through a :class:`TradingEnv` in eval mode.

    Sequential by necessity: each observation holds the current position, which depends on the
    previous action. After a wipe-out the remaining periods are flat with zero equity.
    """
    env = TradingEnv(market, config, eval_mode=True)
    n = env.max_steps
    positions, log_returns, costs, equity = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    obs, _ = env.reset()
    act = batched_greedy(env, act)
    bankrupt = False
    for i in range(n):
        obs, reward, terminated, _, info = env.step(act(obs))
        positions[i], log_returns[i] = info["position"], reward
        costs[i], equity[i] = info["cost"], info["equity"]
        if info["bankrupt"]:
            bankrupt = True
            break
        if terminated:
            break
    return _build_result(
        market, name, config, positions, log_returns, costs, equity, bankrupt, periods_per_year
    )


# ---------------------------------------------------------------------------------------------
# baselines
# ---------------------------------------------------------------------------------------------
def buy_and_hold(
    market: MarketArrays, config: TradingEnvConfig, *, periods_per_year: float | None = None
) -> BacktestResult:
    """Hold 1.0 (fully long) from the first decision bar; pays the cost of moving there from
    ``config``'s initial position (one unit from flat), and no exit cost."""
    return simulate_positions(
        market, np.ones(len(market)), config, "buy & hold", periods_per_year=periods_per_year
    )


def flat(
    market: MarketArrays, config: TradingEnvConfig, *, periods_per_year: float | None = None
) -> BacktestResult:
    """Hold nothing (pays an exit cost only if ``config``'s initial position is not flat)."""
    return simulate_positions(
        market, np.zeros(len(market)), config, "flat", periods_per_year=periods_per_year
    )


def _run_lengths(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(label, length) of each maximal run of equal consecutive labels."""
    if labels.size == 0:
        return labels, labels
    starts = np.flatnonzero(np.diff(labels, prepend=labels[0] - 1) != 0)
    lengths = np.diff(np.append(starts, labels.size))
    return labels[starts], lengths


def _positions_by_label(
    rets: np.ndarray, labels: np.ndarray, config: TradingEnvConfig
) -> dict[int, float]:
    """Per label, the position worth holding: ``rets[i]`` is earned while ``labels[i]`` holds.

    With mean one-bar return ``m_k`` and mean visit length ``d_k`` (bars) of label ``k``, a
    position is worth taking when the expected gain over a visit beats entering and leaving it,
    ``|m_k| * d_k > 2 * cost_rate``: long at ``max(positions)`` when ``m_k`` is positive, short at
    ``min(positions)`` when negative and the action set has a short, otherwise the position
    closest to flat (:attr:`TradingEnvConfig.neutral_value`).
    """
    run_labels, run_lengths = _run_lengths(labels)
    longest, shortest = max(config.positions), min(config.positions)
    neutral = config.neutral_value
    choice: dict[int, float] = {}
    for k in np.unique(labels):
        mean = float(rets[labels == k].mean())
        duration = float(run_lengths[run_labels == k].mean())
        edge = mean * duration
        if edge > 2 * config.cost_rate and longest > 0:
            choice[int(k)] = longest
        elif edge < -2 * config.cost_rate and shortest < 0:
            choice[int(k)] = shortest
        else:
            choice[int(k)] = neutral
    return choice


def _reference_returns(reference: MarketArrays, who: str) -> np.ndarray:
    close = np.asarray(reference.close, dtype=np.float64)
    if close.size < 2:
        raise DataError(f"reference: {close.size} bars; the {who} needs at least 2")
    return close[1:] / close[:-1] - 1.0


def oracle_positions(reference: MarketArrays, config: TradingEnvConfig) -> dict[int, float]:
    """Position the regime oracle takes in each true regime, learned on ``reference``.

    The regime of bar ``t + 1`` decides the position held from ``t`` to ``t + 1`` (the oracle
    sees it coming), by :func:`_positions_by_label`'s rule: hold a regime's direction when its
    mean return over a mean visit beats a round trip's cost. Regimes unseen in the reference
    take the neutral position (:attr:`TradingEnvConfig.neutral_value`).
    """
    if reference.true_regimes is None:
        raise DataError(
            "reference.true_regimes: None; the regime oracle needs ground-truth regimes"
        )
    rets = _reference_returns(reference, "regime oracle")
    labels = np.asarray(reference.true_regimes, dtype=np.int64)[1:]  # regime of bar t + 1
    return _positions_by_label(rets, labels, config)


def regime_rule_positions(reference: MarketArrays, config: TradingEnvConfig) -> dict[int, float]:
    """Position the regime rule holds in each detector state, learned on ``reference``.

    The oracle's rule with only what is known at the decision bar: the detector's most likely
    state at bar ``t`` (its causal probabilities) labels the return from ``t`` to ``t + 1``.
    """
    rets = _reference_returns(reference, "regime rule")
    labels = _detected_states(reference)[:-1]
    known = labels >= 0
    return _positions_by_label(rets[known], labels[known], config)


def _detected_states(market: MarketArrays) -> np.ndarray:
    """The detector's most likely state per bar; -1 where it has no opinion yet (uniform
    probabilities: a rule detector's warm-up rows), which argmax would call state 0."""
    probs = np.asarray(market.regime_probs)
    states = probs.argmax(axis=1).astype(np.int64)
    if probs.shape[1] > 1:  # one state (market.n_regimes=1) is always the estimate
        states[probs.max(axis=1) <= probs.min(axis=1)] = -1
    return states


def regime_rule(
    market: MarketArrays,
    config: TradingEnvConfig,
    reference: MarketArrays,
    *,
    periods_per_year: float | None = None,
) -> BacktestResult:
    """A causal baseline with the agent's own regime input: in each detector state, the
    position whose training-span return beats costs (:func:`regime_rule_positions`).

    It asks what the detector alone is worth: an agent that trails it has not learned to use
    the regime estimate it is given (BENCHMARKS.md, section 6). Pass the training span as
    ``reference``, never the span being tested.
    """
    choice = regime_rule_positions(reference, config)
    neutral = config.neutral_value
    states = _detected_states(market)  # no opinion (-1): the neutral position
    per_bar = np.array([choice.get(int(k), neutral) for k in states], dtype=np.float64)
    return simulate_positions(
        market, per_bar, config, "regime rule", periods_per_year=periods_per_year
    )


def regime_oracle(
    market: MarketArrays,
    config: TradingEnvConfig,
    reference: MarketArrays,
    *,
    periods_per_year: float | None = None,
) -> BacktestResult:
    """A baseline that knows the true regime of the period it is about to hold.

    Not an upper bound: it holds each regime's training-span direction, and a detector's states
    may split the returns more usefully than the true regimes do (on the default synthetic
    market the causal regime rule earns more on the test span).

    At decision bar ``t`` it takes :func:`oracle_positions` for ``true_regimes[t + 1]``, with the
    per-regime choice learned on ``reference`` (pass the training span, never the test span).
    """
    if market.true_regimes is None:
        raise DataError("market.true_regimes: None; the regime oracle needs ground-truth regimes")
    choice = oracle_positions(reference, config)
    neutral = config.neutral_value
    upcoming = np.asarray(market.true_regimes, dtype=np.int64)[1:]
    per_bar = np.full(len(market), neutral)
    per_bar[:-1] = [choice.get(int(k), neutral) for k in upcoming]
    return simulate_positions(
        market, per_bar, config, "regime oracle", periods_per_year=periods_per_year
    )


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
_COLUMNS = (
    ("total_return", "Total return", "pct"),
    ("annualised_return", "Ann. return", "pct"),
    ("annualised_volatility", "Ann. vol", "pct"),
    ("sharpe", "Sharpe", "num"),
    ("sharpe_se", "Sharpe s.e.", "num"),
    ("sortino", "Sortino", "num"),
    ("max_drawdown", "Max DD", "pct"),
    ("calmar", "Calmar", "num"),
    ("turnover", "Turnover", "num"),
    ("hit_rate", "Hit rate", "pct"),
    ("exposure", "Exposure", "pct"),
)


def _fmt(value: float, kind: str) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value * 100:.2f}%" if kind == "pct" else f"{value:.3f}"


def _tables(
    results: Sequence[BacktestResult],
) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(header, overall rows, per-regime rows) as plain strings."""
    header = ["Strategy", "Bars"] + [label for _, label, _ in _COLUMNS]
    overall, regimes = [], []
    for res in results:
        cells = [_fmt(res.metrics[key], kind) for key, _, kind in _COLUMNS]
        overall.append([res.name, str(int(res.metrics["bars"])), *cells])
        for regime, m in res.per_regime.items():
            cells = [_fmt(m[key], kind) for key, _, kind in _COLUMNS]
            regimes.append([f"{res.name} / {regime}", str(int(m["bars"])), *cells])
    return header, overall, regimes


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(esc(h) for h in header) + " |"]
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _shade_regimes(ax: Any, x: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> None:
    """Background band per regime: one artist per regime, not per run, so long spans stay cheap.

    ``x`` holds the start plus each period's end (len(labels) + 1 points); a point is inside
    regime ``k``'s band when the period ending there or the one starting there is in ``k``, so
    adjacent bands meet without gaps.
    """
    ext = np.concatenate([labels[:1], labels])
    for k in np.unique(labels):
        inside = ext == k
        inside[:-1] |= ext[1:] == k
        ax.fill_between(
            x,
            0,
            1,
            where=inside,
            transform=ax.get_xaxis_transform(),
            color=_regime_colors(k)[0],
            alpha=0.12,
            linewidth=0,
            label=_regime_name(names, int(k)),
        )


def _plot(results: Sequence[BacktestResult], title: str) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    main = results[0]
    x = np.concatenate([[main.start_timestamp], main.timestamps])
    fig = Figure(figsize=(11, 8), dpi=100)
    FigureCanvasAgg(fig)
    ax_eq, ax_pos, ax_reg = fig.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1, 0.6]}
    )
    _shade_regimes(ax_eq, x, main.regime_labels, main.regime_names)
    for res in results:
        xs = np.concatenate([[res.start_timestamp], res.timestamps])
        ax_eq.plot(xs, np.concatenate([[1.0], res.equity]), label=res.name, linewidth=1.2)
    ax_eq.set_ylabel("equity")
    ax_eq.set_title(title)
    ax_eq.legend(loc="upper left", fontsize=8, ncol=2)
    ax_eq.grid(alpha=0.3)

    ax_pos.step(x, np.concatenate([[main.positions[0]], main.positions]), where="pre")
    ax_pos.set_ylabel(f"position\n({main.name})", fontsize=8)
    ax_pos.grid(alpha=0.3)

    stripes = [("detected", main.detected_regimes)]
    if main.true_regimes is not None:
        stripes.insert(0, ("true", main.true_regimes))
    for row, (_, regs) in enumerate(stripes):
        ax_reg.scatter(
            main.timestamps,
            np.full(regs.size, row),
            c=_regime_colors(regs),
            marker="|",
            s=120,
        )
    ax_reg.set_yticks(range(len(stripes)), [s[0] for s in stripes], fontsize=8)
    ax_reg.set_ylim(-0.6, len(stripes) - 0.4)
    ax_reg.set_ylabel("regime", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _count(value: float) -> str:
    """A bars-per-year figure in full: 252, 365.25, 6,261.43, 31,557,600."""
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def _jsonable(value: float) -> float | None:
    return value if math.isfinite(value) else None


# Said in every report: the baselines are fixed strategies, not the agent's position set.
_BASELINES_NOTE = (
    "Baselines trade the asset directly, whatever positions the agent may take: buy & hold holds "
    "+1 throughout, flat holds cash; every strategy starts from the env's initial position and "
    "pays the same cost per unit of position change (no exit cost at the end)."
)
# Said under every report's tables: the conventions a reader cannot guess from the numbers.
_DEFINITIONS = (
    "Definitions: returns are per-bar log returns net of costs; volatility, Sharpe (mean / std, "
    "sample std with ddof 1) and Sortino (mean / root mean square of the losing bars, over all "
    "bars) are computed on them, at a zero risk-free rate, and annualised by the square root of "
    "the bars per year; Sharpe s.e. is its standard error for independent bars (Lo 2002: "
    "sqrt((1 + SR^2 / 2) / bars) for the per-bar SR, annualised alike; a Sharpe under twice it "
    "is no evidence of an edge); annualised return is exp(mean x bars per year) - 1. Max "
    "drawdown is the "
    "largest fall of equity from its running peak, the starting equity counting as a peak. "
    "Sharpe (and its s.e.) is shown as 0 when returns do "
    "not vary, Sortino as 0 when no bar loses and Calmar (annualised return / max drawdown) as "
    "0 when there is no drawdown; a strategy wiped out shows n/a for its log-return figures. "
    "Turnover is the mean |change of position| per bar, in units of "
    "the position; hit rate is the share of bars holding a position whose net return is > 0. "
    "Per-regime rows join that regime's bars end to end: their drawdown, Calmar and annualised "
    "figures describe those bars alone, not a path any account lived through."
)


def write_report(
    out_dir: str | Path,
    results: Sequence[BacktestResult],
    title: str,
    *,
    regime_accuracy: float | None = None,
    rate_caveat: str | None = None,
) -> dict[str, Path]:
    """Write ``equity.png``, ``report.md``, ``report.html``, ``metrics.json`` and ``series.csv``
    (every strategy's per-period position, cost, net log return and equity, with the market
    return and regimes, for a user's own plots and analysis) into ``out_dir``.

    ``results[0]`` is the primary strategy (the agent): its positions and regimes are plotted;
    all results' equity curves are overlaid. The HTML embeds the PNG, so it is self-contained.
    ``regime_accuracy`` (the detector against known true regimes, synthetic data) is stated
    next to the tables, because every per-regime figure is only as good as the labels.
    Returns the written paths keyed ``png``, ``markdown``, ``html``, ``json``, ``series``.
    """
    if not results:
        raise ConfigError("results: empty list; write_report needs at least one BacktestResult")
    names = [res.name for res in results]
    if len(set(names)) != len(names):
        raise ConfigError(f"results: strategy names must be unique, got {names}")
    out = Path(out_dir)
    paths = {
        "png": out / "equity.png",
        "markdown": out / "report.md",
        "html": out / "report.html",
        "json": out / "metrics.json",
        "series": out / "series.csv",
    }
    # Every file is made in memory first and written at the end, in well under a second: a
    # Ctrl-C or an error while plotting (seconds on a long span) leaves the previous report
    # whole, not a new series.csv beside an old equity.png.
    contents = {"series": series_frame(results).to_csv().encode()}
    png = _plot(results, title)
    contents["png"] = png

    header, overall, regimes = _tables(results)
    source = results[0].regime_source
    accuracy = (
        ""
        if regime_accuracy is None
        else f"Regime detector accuracy against the true regimes: {regime_accuracy:.3f}"
    )
    ppy = results[0].metrics.get("periods_per_year")
    rate = (
        ""
        if ppy is None
        else f"Annualised with {_count(ppy)} bars per year (read from the data's timestamps"
        + (f"; {rate_caveat})." if rate_caveat else ").")
    )
    rate = " ".join(part for part in (rate, _BASELINES_NOTE) if part)
    md = (
        f"# {title}\n\n![equity curves]({paths['png'].name})\n\n## Overall\n\n"
        + (f"{rate}\n\n" if rate else "")
        + f"{_markdown_table(header, overall)}\n\n## Per regime ({source} regimes)\n\n"
        + (f"{accuracy}\n\n" if accuracy else "")
        + f"{_markdown_table(header, regimes)}\n\n{_DEFINITIONS}\n"
    )
    contents["markdown"] = md.encode()

    png_b64 = base64.b64encode(png).decode("ascii")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
img {{ max-width: 100%; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<img alt="equity curves" src="data:image/png;base64,{png_b64}">
<h2>Overall</h2>
{f"<p>{html.escape(rate)}</p>" if rate else ""}
{_html_table(header, overall)}
<h2>Per regime ({html.escape(source)} regimes)</h2>
{f"<p>{html.escape(accuracy)}</p>" if accuracy else ""}
{_html_table(header, regimes)}
<p>{html.escape(_DEFINITIONS)}</p>
</body></html>
"""
    contents["html"] = page.encode()

    payload = {
        "title": title,
        "regime_accuracy": regime_accuracy,
        "results": {
            res.name: {
                "metrics": {k: _jsonable(v) for k, v in res.metrics.items()},
                "per_regime": {
                    reg: {k: _jsonable(v) for k, v in m.items()}
                    for reg, m in res.per_regime.items()
                },
                "regime_source": res.regime_source,
                "bankrupt": res.bankrupt,
            }
            for res in results
        },
    }
    contents["json"] = json.dumps(payload, indent=2, allow_nan=False).encode()
    # All or nothing (it makes the directory too): a full disk part way through leaves the
    # previous report whole.
    atomic_write_many({paths[key]: data for key, data in contents.items()})
    return paths
