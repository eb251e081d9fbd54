"""Backtest: metrics vs hand computations, accounting shared with the env, baselines, report."""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from foxhunt import backtest as bt
from foxhunt.envs.trading import BANKRUPTCY_REWARD, TradingEnvConfig
from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.arrays import MarketArrays

R = [0.01, -0.02, 0.03]  # log returns used by the hand-computed metric tests


def make_market(
    n: int = 120, seed: int = 0, close=None, true_regimes=None, n_regimes: int = 2
) -> MarketArrays:
    """A seeded random-walk market; regime probabilities put 0.7 on a (noisy) detected regime."""
    rng = np.random.default_rng(seed)
    if close is None:
        close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n)))
    close = np.asarray(close, dtype=np.float64)
    n = close.size
    detected = rng.integers(0, n_regimes, size=n)
    probs = np.full((n, n_regimes), 0.3 / max(n_regimes - 1, 1), dtype=np.float32)
    probs[np.arange(n), detected] = 0.7
    return MarketArrays(
        timestamps=np.datetime64("2021-01-04", "ns") + np.arange(n) * np.timedelta64(1, "D"),
        close=close,
        features=rng.normal(size=(n, 2)).astype(np.float32),
        regime_probs=probs,
        feature_names=("a", "b"),
        regime_names=tuple(f"state_{k}" for k in range(n_regimes)),  # the detector's states
        true_regimes=None if true_regimes is None else np.asarray(true_regimes, dtype=np.int64),
        true_regime_names=() if true_regimes is None else tuple(f"regime{k}" for k in range(9)),
    )


def regime_market(n: int, seed: int, drift: float = 0.004) -> MarketArrays:
    """Two persistent true regimes: 0 drifts up, 1 down (a bar's return follows its regime)."""
    rng = np.random.default_rng(seed)
    regimes = np.repeat(rng.integers(0, 2, size=n // 20 + 1), 20)[:n]
    regimes[:20], regimes[20:40] = 0, 1  # both regimes always present
    rets = np.where(regimes == 0, drift, -drift) + rng.normal(0.0, 0.002, n)
    rets[0] = 0.0
    return make_market(close=100.0 * np.exp(np.cumsum(rets)), true_regimes=regimes, seed=seed)


# --- metrics -----------------------------------------------------------------------------------
def test_metrics_match_hand_computation():
    mean = 0.02 / 3
    sd = math.sqrt(((0.01 - mean) ** 2 + (-0.02 - mean) ** 2 + (0.03 - mean) ** 2) / 2)
    downside = math.sqrt(0.02**2 / 3)
    assert bt.total_return(R) == pytest.approx(math.exp(0.02) - 1, rel=1e-12)
    assert bt.annualised_return(R) == pytest.approx(math.exp(mean * 252) - 1, rel=1e-12)
    assert bt.annualised_return(R, 12) == pytest.approx(math.exp(mean * 12) - 1, rel=1e-12)
    assert bt.annualised_volatility(R) == pytest.approx(sd * math.sqrt(252), rel=1e-12)
    assert sd == pytest.approx(0.0251661147842358, rel=1e-12)
    assert bt.sharpe(R) == pytest.approx(mean / sd * math.sqrt(252), rel=1e-12)
    assert bt.sortino(R) == pytest.approx(mean / downside * math.sqrt(252), rel=1e-12)
    # equity 1 -> e^.01 -> e^-.01 -> e^.02: worst fall is from e^.01 to e^-.01
    assert bt.max_drawdown(R) == pytest.approx(1 - math.exp(-0.02), rel=1e-12)
    assert bt.calmar(R) == pytest.approx(
        (math.exp(mean * 252) - 1) / (1 - math.exp(-0.02)), rel=1e-12
    )
    np.testing.assert_allclose(bt.equity_curve(R), np.exp([0.01, -0.01, 0.02]), rtol=1e-12)
    # Two losing bars of different sizes: the downside deviation is the root mean square of
    # min(r, 0) over all four bars (Sortino & Price), not the spread of the losses.
    r2 = [0.01, -0.02, -0.01, 0.03]
    downside2 = math.sqrt((0.02**2 + 0.01**2) / 4)
    assert bt.sortino(r2, 12) == pytest.approx(0.0025 / downside2 * math.sqrt(12), rel=1e-12)


def test_position_metrics_match_hand_computation():
    pos = [1.0, 1.0, 0.0, -1.0, -1.0]
    rets = [0.01, -0.02, 0.03, 0.005, -0.001]
    assert bt.turnover(pos) == pytest.approx(3 / 5)  # |1| + 0 + |-1| + |-1| + 0
    assert bt.turnover(pos, initial_position=1.0) == pytest.approx(2 / 5)
    assert bt.exposure(pos) == pytest.approx(4 / 5)
    assert bt.hit_rate(pos, rets) == pytest.approx(2 / 4)  # held bars 0,1,3,4; winners 0,3
    assert bt.hit_rate([0.0, 0.0], [0.01, 0.02]) == 0.0
    # A held bar that earned exactly nothing (net of costs) is not a hit.
    assert bt.hit_rate([1.0, 1.0, -1.0], [0.0, 0.01, -0.02]) == pytest.approx(1 / 3)
    m = bt.compute_metrics(rets, pos)
    assert m["turnover"] == pytest.approx(0.6) and m["hit_rate"] == pytest.approx(0.5)
    assert m["total_log_return"] == pytest.approx(0.024)


def test_max_drawdown_on_known_equity_path():
    equity = np.array([1.2, 0.9, 1.1, 0.6, 0.8])  # peak 1.2, trough 0.6
    log_returns = np.diff(np.log(np.concatenate([[1.0], equity])))
    assert bt.max_drawdown(log_returns) == pytest.approx(0.5, rel=1e-12)
    assert bt.max_drawdown(np.log([0.9, 1.0])) == pytest.approx(0.1, rel=1e-12)  # below the start
    assert bt.max_drawdown([0.01, 0.02]) == 0.0


def test_degenerate_inputs():
    zeros = np.zeros(10)
    assert bt.sharpe(zeros) == 0.0 and bt.sortino(zeros) == 0.0 and bt.calmar(zeros) == 0.0
    assert bt.annualised_volatility(zeros) == 0.0
    assert bt.sharpe(np.full(5, 0.001)) == 0.0  # constant gains: no dispersion
    assert bt.sortino([0.01, 0.02]) == 0.0  # no losing bar
    assert bt.sharpe_standard_error(zeros) == 0.0  # no Sharpe: shown as 0, like it
    assert bt.sharpe([0.01]) == 0.0 and bt.annualised_volatility([0.01]) == 0.0
    with pytest.raises(DataError, match="empty"):
        bt.sharpe([])
    with pytest.raises(DataError, match="index 1"):
        bt.total_return([0.0, float("nan")])
    with pytest.raises(DataError, match="length"):
        bt.hit_rate([1.0], [0.1, 0.2])
    # A NaN position would count as held and make turnover NaN: refused like a NaN return.
    with pytest.raises(DataError, match="positions: index 0 is not finite"):
        bt.turnover([float("nan"), 1.0, 0.0])
    with pytest.raises(DataError, match="positions: index 0 is not finite"):
        bt.exposure([math.inf, 0.0, 0.0])
    with pytest.raises(DataError, match="positions: index 1 is not finite"):
        bt.compute_metrics([0.1, 0.2], [1.0, float("nan")])
    for fine in (np.array(1.0), np.float32(1.0), 1, Fraction(1, 1)):  # any real scalar
        assert bt.turnover([1.0, 0.0], initial_position=fine) == 0.5
    for bad in (float("nan"), math.inf, True, "0", [1.0]):
        with pytest.raises(DataError, match="initial_position must be a finite number"):
            bt.turnover([1.0, 0.0], initial_position=bad)
        with pytest.raises(DataError, match="initial_position must be a finite number"):
            bt.compute_metrics([0.1, 0.2], [1.0, 0.0], initial_position=bad)


# --- accounting shared with the env ----------------------------------------------------------
def test_simulate_positions_matches_hand_computed_sequence():
    market = make_market(close=[100.0, 110.0, 99.0, 99.0, 90.0, 81.0])
    cfg = TradingEnvConfig(window=1, cost_bps=10.0, slippage_bps=5.0)
    res = bt.simulate_positions(market, [1.0, 1.0, 0.0, -1.0, -1.0], cfg, "hand")
    c = 0.0015
    growth = np.array([(1 - c) * 1.1, 0.9, 1 - c, (1 - c) * (1 + 9 / 99), 1.1])
    np.testing.assert_allclose(res.net_log_returns, np.log(growth), rtol=1e-12)
    np.testing.assert_allclose(res.costs, [c, 0, c, c, 0], rtol=1e-12)
    np.testing.assert_allclose(res.equity, np.cumprod(growth), rtol=1e-12)
    np.testing.assert_allclose(res.market_returns, [0.1, -0.1, 0.0, 90 / 99 - 1, -0.1])
    np.testing.assert_array_equal(res.timestamps, market.timestamps[1:])
    assert res.start_timestamp == market.timestamps[0]
    assert res.metrics["turnover"] == pytest.approx(0.6)
    assert res.metrics["total_cost"] == pytest.approx(3 * c)
    # a per-bar array (length T) gives the same result; the last bar's entry is ignored
    res_t = bt.simulate_positions(market, [1.0, 1.0, 0.0, -1.0, -1.0, 5.0], cfg, "hand")
    np.testing.assert_array_equal(res_t.net_log_returns, res.net_log_returns)
    with pytest.raises(DataError, match="length 4"):
        bt.simulate_positions(market, [1.0] * 4, cfg, "bad")


@pytest.mark.parametrize("positions", [(-1.0, 0.0, 1.0), (0.0, 1.0)])
def test_always_long_agent_equals_buy_and_hold(positions):
    market = make_market(n=150, seed=5)
    cfg = TradingEnvConfig(window=10, positions=positions, cost_bps=3.0, slippage_bps=2.0)
    long_index = positions.index(1.0)
    agent = bt.run_policy(market, lambda obs: long_index, cfg, "always long")
    bh = bt.buy_and_hold(market, cfg)
    np.testing.assert_allclose(agent.net_log_returns, bh.net_log_returns, rtol=1e-12, atol=0)
    np.testing.assert_allclose(agent.equity, bh.equity, rtol=1e-12)
    np.testing.assert_array_equal(agent.costs, bh.costs)
    np.testing.assert_array_equal(agent.positions, np.ones(150 - 10))
    # buy & hold = price ratio over the span minus the single entry cost
    expected = (1 - 5e-4) * market.close[-1] / market.close[9]
    assert bh.equity[-1] == pytest.approx(expected, rel=1e-12)
    assert bh.costs[0] == pytest.approx(5e-4) and np.all(bh.costs[1:] == 0)
    for key, value in bh.metrics.items():
        assert agent.metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_run_policy_matches_simulation_for_a_varying_policy():
    market = make_market(n=90, seed=2)
    cfg = TradingEnvConfig(window=5)
    # act from the observation itself (sign of the last feature of the newest bar)
    last_feature = 5 * 2 - 1
    agent = bt.run_policy(market, lambda obs: 2 if obs[last_feature] > 0 else 0, cfg, "sign")
    expected_positions = np.where(market.features[4:89, 1] > 0, 1.0, -1.0)
    np.testing.assert_array_equal(agent.positions, expected_positions)
    sim = bt.simulate_positions(market, expected_positions, cfg, "sim")
    np.testing.assert_allclose(agent.net_log_returns, sim.net_log_returns, rtol=1e-12)
    np.testing.assert_allclose(agent.costs, sim.costs, rtol=1e-12)


def test_flat_baseline_earns_nothing():
    res = bt.flat(make_market(), TradingEnvConfig(window=3))
    assert np.all(res.net_log_returns == 0.0) and np.all(res.equity == 1.0)
    assert res.metrics["exposure"] == 0.0 and res.metrics["sharpe"] == 0.0


def test_bankruptcy_is_accounted_the_same_in_env_and_simulation():
    market = make_market(close=[100.0, 100.0, 210.0, 220.0, 230.0])
    cfg = TradingEnvConfig(window=1)
    agent = bt.run_policy(market, lambda obs: 0, cfg, "short")
    sim = bt.simulate_positions(market, [-1.0] * 4, cfg, "short sim")
    for res in (agent, sim):
        assert res.bankrupt
        assert res.net_log_returns[1] == BANKRUPTCY_REWARD
        np.testing.assert_array_equal(res.equity[1:], 0.0)
        np.testing.assert_array_equal(res.positions, [-1.0, -1.0, 0.0, 0.0])
    np.testing.assert_allclose(agent.net_log_returns, sim.net_log_returns, rtol=1e-12)
    # Reported: everything lost, not the -10 training penalty read as a return.
    for res in (agent, sim):
        m = res.metrics
        assert m["total_return"] == -1.0 and m["max_drawdown"] == 1.0 and m["final_equity"] == 0.0
        assert m["annualised_return"] == -1.0
        assert all(math.isnan(m[k]) for k in ("total_log_return", "sharpe", "sortino", "calmar"))
    # The per-period series a user reads says the same: equity compounds the log returns.
    series = bt.series_frame([agent, sim])
    assert np.isfinite(series["short_net_log_return"].iloc[0])  # the entry cost
    np.testing.assert_array_equal(series["short_net_log_return"].iloc[1:], [-np.inf] * 3)
    np.testing.assert_array_equal(
        np.exp(np.cumsum(series["short_sim_net_log_return"])), series["short_sim_equity"]
    )
    # Per regime too: the regime holding the wipe-out period lost everything, the other did not.
    regimes = [0, 1, 0, 1, 1]  # the wipe-out period (bar 1 -> 2) is labelled with regime 0
    market = make_market(close=[100.0, 100.0, 210.0, 220.0, 230.0], true_regimes=regimes)
    res = bt.simulate_positions(market, [-1.0] * 4, cfg, "short")
    hit, other = res.per_regime["regime0"], res.per_regime["regime1"]
    assert hit["total_return"] == -1.0 and math.isnan(hit["sharpe"]) and hit["max_drawdown"] == 1.0
    assert other["total_return"] > -1.0 and not math.isnan(other["total_log_return"])


def test_wiped_out_strategy_reads_n_a_in_the_report_and_null_in_json(tmp_path):
    import json

    market = make_market(close=[100.0, 100.0, 210.0, 220.0, 230.0])
    cfg = TradingEnvConfig(window=1)
    results = [bt.simulate_positions(market, [-1.0] * 4, cfg, "short"), bt.flat(market, cfg)]
    files = bt.write_report(tmp_path, results, title="wipe-out")
    payload = json.loads(files["json"].read_text())  # strict JSON: no NaN tokens
    metrics = payload["results"]["short"]["metrics"]
    assert metrics["sharpe"] is None and metrics["total_return"] == -1.0
    assert "n/a" in files["markdown"].read_text() and "-100.00%" in files["markdown"].read_text()


# --- per regime ----------------------------------------------------------------------------------
def test_per_regime_metrics_use_true_regime_of_the_earning_bar():
    n = 40
    true = (np.arange(n) // 7) % 2
    market = make_market(n=n, seed=1, true_regimes=true)
    cfg = TradingEnvConfig(window=4)
    res = bt.buy_and_hold(market, cfg)
    assert res.regime_source == "true"
    # period t -> t+1 for decision bars t = 3..38 is labelled with true[t + 1]
    labels = true[4:40]
    log_growth = np.log(market.close[4:40] / market.close[3:39])
    log_growth[0] += math.log(1 - 2e-4)  # the entry cost lands in the first period
    # Named by the true regimes' names, not the detector's states (state_0, ...).
    assert set(res.per_regime) == {"regime0", "regime1"} and res.regime_names[:2] == (
        "regime0",
        "regime1",
    )
    for k in (0, 1):
        m = res.per_regime[f"regime{k}"]
        assert m["bars"] == np.sum(labels == k)
        assert m["total_log_return"] == pytest.approx(log_growth[labels == k].sum(), rel=1e-10)
    assert sum(m["bars"] for m in res.per_regime.values()) == res.metrics["bars"] == 36
    # turnover per regime keeps the true entry move of the first bar (regime of bar 4)
    first = f"regime{true[4]}"
    assert res.per_regime[first]["turnover"] == pytest.approx(1 / np.sum(labels == true[4]))


def test_per_regime_falls_back_to_detected_regime():
    market = make_market(n=50, seed=4, n_regimes=3)
    res = bt.buy_and_hold(market, TradingEnvConfig(window=5))
    assert res.regime_source == "detected" and res.true_regimes is None
    detected = market.regime_probs[5:50].argmax(axis=1)
    np.testing.assert_array_equal(res.regime_labels, detected)
    for k, name in enumerate(market.regime_names):
        assert res.per_regime.get(name, {"bars": 0.0})["bars"] == np.sum(detected == k)


# --- regime oracle -------------------------------------------------------------------------------
def test_regime_oracle_goes_long_up_short_down_and_beats_buy_and_hold():
    reference, test = regime_market(400, seed=0), regime_market(300, seed=1)
    cfg = TradingEnvConfig(window=5)
    assert bt.oracle_positions(reference, cfg) == {0: 1.0, 1: -1.0}
    oracle = bt.regime_oracle(test, cfg, reference)
    upcoming = test.true_regimes[5:300]
    np.testing.assert_array_equal(oracle.positions, np.where(upcoming == 0, 1.0, -1.0))
    bh = bt.buy_and_hold(test, cfg)
    assert oracle.metrics["total_log_return"] > bh.metrics["total_log_return"]
    assert oracle.metrics["total_log_return"] > 0
    # long-only action set: flat in the falling regime
    long_only = TradingEnvConfig(window=5, positions=(0.0, 1.0))
    assert bt.oracle_positions(reference, long_only) == {0: 1.0, 1: 0.0}
    # a regime is traded only if mean return x mean visit length beats a round trip's cost
    labels = reference.true_regimes[1:]  # regime of the bar whose return is earned
    rets = reference.close[1:] / reference.close[:-1] - 1
    visits = {0: [], 1: []}
    for i, k in enumerate(labels):
        if i == 0 or labels[i - 1] != k:
            visits[int(k)].append(0)
        visits[int(k)][-1] += 1
    edge_up = rets[labels == 0].mean() * np.mean(visits[0])
    breakeven_bps = edge_up / 2 * 1e4
    below = TradingEnvConfig(window=5, cost_bps=0.99 * breakeven_bps, slippage_bps=0.0)
    above = TradingEnvConfig(window=5, cost_bps=1.01 * breakeven_bps, slippage_bps=0.0)
    assert bt.oracle_positions(reference, below)[0] == 1.0
    assert bt.oracle_positions(reference, above)[0] == 0.0
    pricey = TradingEnvConfig(window=5, cost_bps=4000.0, slippage_bps=0.0)
    assert bt.oracle_positions(reference, pricey) == {0: 0.0, 1: 0.0}


def test_warm_up_bars_without_a_regime_estimate_are_not_the_first_regime(tmp_path):
    """A rule detector's warm-up rows (uniform probabilities) have no state: argmax called them
    state 0, so the per-regime table and the accuracy counted them in that state."""
    market = make_market(n=60, seed=3, n_regimes=3)
    market.regime_probs[:20] = 1.0 / 3.0  # no opinion yet
    res = bt.buy_and_hold(market, TradingEnvConfig(window=5))
    expected = market.regime_probs[5:60].argmax(axis=1)
    expected[:15] = -1  # period ends at bars 5..19 have no estimate
    np.testing.assert_array_equal(res.detected_regimes, expected)
    np.testing.assert_array_equal(res.regime_labels, expected)
    assert res.per_regime[bt.NO_REGIME]["bars"] == 15
    for k, name in enumerate(market.regime_names):
        assert res.per_regime.get(name, {"bars": 0.0})["bars"] == np.sum(expected == k)
    assert bt.series_frame([res])["detected_regime"].iloc[:15].eq(-1).all()
    bt.write_report(tmp_path, [res], title="warm-up")  # the report draws -1 labels too


def test_a_one_state_detector_always_has_an_estimate():
    """market.n_regimes=1: probabilities [1.0] on every bar are the estimate, not a warm-up."""
    market = make_market(n=30, seed=2, n_regimes=1)
    market.regime_probs[:] = 1.0
    res = bt.buy_and_hold(market, TradingEnvConfig(window=5))
    assert (res.detected_regimes == 0).all() and list(res.per_regime) == ["state_0"]


def test_regime_accuracy_counts_no_estimate_as_wrong_and_never_matches_it():
    from foxhunt.markets.regimes import regime_accuracy

    true = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    # Matched like a state, the warm-up label (-1) would take regime 1 and score 7 of 8.
    pred = np.array([0, 0, 0, -1, -1, -1, -1, 1])
    assert regime_accuracy(pred, true) == pytest.approx(4 / 8)
    assert regime_accuracy(np.full(8, -1), true) == 0.0


def test_regime_rule_without_a_detector_opinion_stays_flat():
    """A reference span whose detector never left its uniform no-opinion rows gives the rule no
    state to learn from: flat on every bar (it crashed on the empty run-length table)."""
    reference, test = regime_market(200, seed=0), regime_market(100, seed=1)
    reference.regime_probs[:] = 0.5
    cfg = TradingEnvConfig(window=5)
    assert bt.regime_rule_positions(reference, cfg) == {}
    res = bt.regime_rule(test, cfg, reference)
    assert np.all(res.positions == 0.0) and res.metrics["total_log_return"] == 0.0


@pytest.mark.parametrize(
    ("positions", "initial", "neutral"),
    [
        ((-1.0, 1.0), None, -1.0),
        ((-1.0, 1.0), 1, 1.0),
        ((1.0, -1.0), None, 1.0),
        ((0.5, -0.5, 1.0), 1, -0.5),
        ((-1.0, 0.0, 1.0), 2, 0.0),
    ],
)
def test_baselines_without_a_view_hold_the_start_when_no_one_position_is_nearest_flat(
    positions, initial, neutral
):
    """Long/short only has no flat: a baseline with no view holds the starting position (no
    cost to stay) rather than whichever tied position happened to be listed first."""
    reference, test = regime_market(200, seed=0), regime_market(100, seed=1)
    reference.regime_probs[:] = 0.5
    test.regime_probs[:] = 0.5
    cfg = TradingEnvConfig(window=5, positions=positions, initial_position=initial)
    assert cfg.neutral_value == neutral
    res = bt.regime_rule(test, cfg, reference)
    assert np.all(res.positions == neutral)
    unseen = dataclasses.replace(test, true_regimes=np.full(len(test), 7))  # not in reference
    assert np.all(bt.regime_oracle(unseen, cfg, reference).positions == neutral)


def test_regime_rule_holds_each_detector_states_training_direction_causally():
    """The rule decides at bar t from the detector's state at t (never t + 1), by the oracle's
    cost rule learned on the reference span, and appending bars changes nothing decided."""
    reference, test = regime_market(400, seed=0), regime_market(300, seed=1)
    for m in (reference, test):  # the detector sees the true regime of the bar, a bar late
        lagged = np.concatenate([[0], m.true_regimes[:-1]])
        m.regime_probs[:] = np.eye(2, dtype=np.float32)[lagged] * 0.8 + 0.1
    cfg = TradingEnvConfig(window=5)
    # independent computation of the rule: state at t labels the return from t to t + 1
    states = reference.regime_probs.argmax(axis=1)[:-1]
    rets = reference.close[1:] / reference.close[:-1] - 1
    visits = {0: [], 1: []}
    for i, k in enumerate(states):
        if i == 0 or states[i - 1] != k:
            visits[int(k)].append(0)
        visits[int(k)][-1] += 1
    edges = {k: rets[states == k].mean() * np.mean(visits[k]) for k in (0, 1)}
    expected = {k: 1.0 if e > 2 * cfg.cost_rate else -1.0 for k, e in edges.items()}
    assert expected == {0: 1.0, 1: -1.0}
    assert bt.regime_rule_positions(reference, cfg) == expected
    rule = bt.regime_rule(test, cfg, reference)
    decided = test.regime_probs.argmax(axis=1)[4:299]  # decision bars of window 5
    np.testing.assert_array_equal(rule.positions, np.where(decided == 0, 1.0, -1.0))
    assert rule.name == "regime rule"
    # a bar late, it trails the oracle, but beats buy-and-hold in persistent regimes
    oracle, bh = bt.regime_oracle(test, cfg, reference), bt.buy_and_hold(test, cfg)
    r = rule.metrics["total_log_return"]
    assert bh.metrics["total_log_return"] < r < oracle.metrics["total_log_return"]
    # a state the detector has no opinion on (uniform warm-up rows) is held flat and left out
    # of the training statistics, not counted as state 0
    test.regime_probs[10:20] = 0.5
    warm = bt.regime_rule(test, cfg, reference)
    assert (warm.positions[10 - 4 : 20 - 4] == 0.0).all()
    # warm-up rows of a steep fall: counted as state 0, they would turn its long into a short
    rets = np.r_[np.full(60, -0.01), np.tile(np.repeat([0.002, -0.002], 20), 3)]
    warmup = make_market(close=100.0 * np.exp(np.cumsum(rets)))
    warmup.regime_probs[:] = np.eye(2, dtype=np.float32)[
        np.r_[np.zeros(60, int), np.tile(np.repeat([0, 1], 20), 3)]
    ]
    assert bt.regime_rule_positions(warmup, cfg) == {0: -1.0, 1: -1.0}  # the rows as state 0
    warmup.regime_probs[:60] = 0.5
    assert bt.regime_rule_positions(warmup, cfg) == {0: 1.0, 1: -1.0}
    # long-only: the falling state is held flat
    assert bt.regime_rule_positions(
        reference, TradingEnvConfig(window=5, positions=(0.0, 1.0))
    ) == {
        0: 1.0,
        1: 0.0,
    }


def test_regime_oracle_needs_true_regimes():
    with pytest.raises(DataError, match="true_regimes"):
        bt.regime_oracle(make_market(), TradingEnvConfig(window=3), make_market())


def test_oracle_capture_ratio_and_sign_handling():
    market = regime_market(200, seed=3)
    cfg = TradingEnvConfig(window=5)
    oracle = bt.regime_oracle(market, cfg, market)
    bh = bt.buy_and_hold(market, cfg)
    expected = bh.net_log_returns.sum() / oracle.net_log_returns.sum()
    assert bt.oracle_capture(bh, oracle) == pytest.approx(expected, rel=1e-12)
    assert bt.oracle_capture(oracle, oracle) == pytest.approx(1.0)
    assert math.isnan(bt.oracle_capture(oracle, bt.flat(market, cfg)))  # oracle with no edge


# --- report ----------------------------------------------------------------------------------
def test_write_report_files(tmp_path):
    market = regime_market(160, seed=7)
    cfg = TradingEnvConfig(window=5)
    results = [
        bt.run_policy(market, lambda obs: 2, cfg, "agent <dqn>"),
        bt.buy_and_hold(market, cfg),
        bt.flat(market, cfg),
        bt.regime_oracle(market, cfg, market),
    ]
    paths = bt.write_report(tmp_path / "out", results, "Test & report")
    assert set(paths) == {"png", "markdown", "html", "json", "series"}
    for path in paths.values():
        assert path.exists() and path.stat().st_size > 0
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths["html"].read_text()
    assert "<table>" in page and "<th>Sharpe</th>" in page
    assert "agent &lt;dqn&gt;" in page and "Test &amp; report" in page
    assert "data:image/png;base64," in page
    assert "buy &amp; hold / regime0" in page  # per-regime rows
    md = paths["markdown"].read_text()
    assert "| Strategy | Bars | Total return |" in md and "| regime oracle |" in md
    assert "buy & hold holds +1 throughout, flat holds cash" in md  # whatever the agent may hold
    sharpe = f"{results[1].metrics['sharpe']:.3f}"
    assert sharpe in md and sharpe in page
    data = json.loads(paths["json"].read_text())
    assert data["results"]["flat"]["metrics"]["exposure"] == 0.0
    assert set(data["results"]["agent <dqn>"]["per_regime"]) == {"regime0", "regime1"}
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(ConfigError, match="unique"):
        bt.write_report(tmp_path, [results[1], results[1]], "dup")
    with pytest.raises(ConfigError, match="empty"):
        bt.write_report(tmp_path, [], "none")


def test_a_report_stopped_while_plotting_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """Ctrl-C during the plot (seconds on a long span) left a new series.csv beside the old
    equity.png and metrics.json, or an empty directory where there was no report."""
    market = regime_market(160, seed=7)
    cfg = TradingEnvConfig(window=5)
    old = [bt.run_policy(market, lambda obs: 2, cfg, "agent"), bt.flat(market, cfg)]
    new = [bt.run_policy(market, lambda obs: 0, cfg, "agent"), bt.flat(market, cfg)]
    paths = bt.write_report(tmp_path / "out", old, "old")
    before = {k: p.read_bytes() for k, p in paths.items()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bt, "_plot", interrupted)
    for where in ("out", "fresh"):
        with pytest.raises(KeyboardInterrupt):
            bt.write_report(tmp_path / where, new, "new")
    assert {k: p.read_bytes() for k, p in paths.items()} == before
    assert not (tmp_path / "fresh").exists()
    monkeypatch.undo()

    # A disk that fills at the third file: before, the first two were already replaced.
    import errno
    import os

    from foxhunt import _io

    real, opened = os.fdopen, []

    def full_disk(fd, *args, **kwargs):
        opened.append(fd)
        if len(opened) == 3:
            os.close(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # no file name, as ENOSPC
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(_io.os, "fdopen", full_disk)
    with pytest.raises(OSError) as err:
        bt.write_report(tmp_path / "out", new, "new")
    assert err.value.filename in {str(p) for p in paths.values()}  # the file it was writing
    assert {k: p.read_bytes() for k, p in paths.items()} == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        p.name for p in paths.values()
    )  # and no temporary left


def test_periods_per_year_is_read_from_the_timestamps():
    import pandas as pd

    from foxhunt.backtest import infer_periods_per_year

    daily = pd.date_range("2020-01-01", periods=731, freq="D").to_numpy()
    assert infer_periods_per_year(daily) == pytest.approx(365.25, rel=1e-3)
    business = pd.bdate_range("2020-01-01", "2023-12-31").to_numpy()
    assert infer_periods_per_year(business) == pytest.approx(261, rel=0.01)
    # One exchange session of minute bars: 391 bars a day on 5 days a week (this test used to
    # expect 24/7 trading, 525 960 a year, which is what bars / calendar span wrongly said).
    minutes = pd.date_range("2024-03-04 09:30", periods=391, freq="min").to_numpy()
    assert infer_periods_per_year(minutes) == pytest.approx(391 * 365.25 * 5 / 7, rel=1e-9)
    around_the_clock = pd.date_range("2024-03-04", periods=3 * 1440, freq="min").to_numpy()
    assert infer_periods_per_year(around_the_clock) == pytest.approx(365.25 * 24 * 60)
    assert infer_periods_per_year(np.arange(10)) == 252.0  # no timestamps: the default
    # A time-zone-aware index or Series (an object array to numpy) and descending timestamps
    # read the same rate; they used to fall back to 252 and annualise hourly bars as daily.
    hourly = pd.date_range("2024-01-01", periods=24 * 30, freq="h")
    for ts in (
        hourly.tz_localize("UTC"),
        pd.Series(hourly.tz_localize("UTC")),
        hourly.tz_localize("UTC").tz_convert("America/New_York"),
        hourly.to_numpy()[::-1],
        list(hourly.to_pydatetime()),
    ):
        assert infer_periods_per_year(ts) == pytest.approx(24 * 365.25), type(ts)
    # A missing time (NaT, None) says nothing about the spacing: sorted first, it had made a
    # monthly rate negative.
    months = pd.date_range("2015-01-31", periods=120, freq="ME").to_numpy().copy()
    months[60] = np.datetime64("NaT")
    assert infer_periods_per_year(months) == pytest.approx(12.0, rel=0.01)
    with_none = list(hourly.tz_localize("UTC"))
    with_none[5] = None
    assert infer_periods_per_year(np.array(with_none, dtype=object)) == pytest.approx(8766)


def test_bars_per_year_from_partial_days_come_with_a_caveat(tmp_path):
    """An afternoon of one-minute bars read 131 bars a day: 34 177 a year where an FX market
    trades about 360 000, every Sharpe 3x too small, and nothing said."""
    import pandas as pd

    from foxhunt.backtest import infer_periods_per_year, periods_per_year_with_caveat

    def periods_per_year_caveat(timestamps):
        return periods_per_year_with_caveat(timestamps)[1]

    afternoon = pd.date_range("2024-03-04 13:49", periods=131, freq="min")
    assert infer_periods_per_year(afternoon) == pytest.approx(131 * 365.25 * 5 / 7)
    caveat = periods_per_year_caveat(afternoon)
    assert caveat is not None and "1-minute bars fall on 1 date(s)" in caveat
    assert "may be understated" in caveat
    hours = pd.date_range("2024-03-04 09:00", periods=20, freq="h")  # across two dates
    assert "1-hour bars fall on 2 date(s)" in (periods_per_year_caveat(hours) or "")
    # A whole day among the dates, or longer bars: the rate is read, no caveat.
    assert (
        periods_per_year_caveat(pd.date_range("2024-03-04", periods=3 * 1440, freq="min")) is None
    )
    assert periods_per_year_caveat(pd.date_range("2020-01-01", periods=60, freq="D")) is None
    assert periods_per_year_caveat(np.arange(10)) is None
    # The report says it beside the rate it annualised with.
    market = make_market(60)
    res = bt.buy_and_hold(market, TradingEnvConfig(window=5), periods_per_year=34177.0)
    text = bt.write_report(tmp_path, [res], "t", rate_caveat=caveat)["markdown"].read_text()
    assert (
        f"Annualised with 34,177 bars per year (read from the data's timestamps; {caveat})." in text
    )


def _sessions(days, freq: str) -> np.ndarray:
    """Bars from 09:30 to 15:59 on each of ``days``."""
    import pandas as pd

    return np.concatenate(
        [
            pd.date_range(d + pd.Timedelta("09:30:00"), d + pd.Timedelta("15:59:00"), freq=freq)
            for d in days
        ]
    ).astype("datetime64[ns]")


def test_periods_per_year_is_robust_to_short_files_and_gaps():
    import pandas as pd

    from foxhunt.backtest import infer_periods_per_year

    days = pd.bdate_range("2021-01-04", "2022-12-30")
    exchange_minutes = 390 * 365.25 * 5 / 7  # 101 748: 390 bars a session, 5 sessions a week
    # One week, one day or two years of one-minute equity bars: the same rate (bars / span
    # said 166 709 for the week, 525 960 for the day).
    for span in (days[:5], days[:1], days):
        assert infer_periods_per_year(_sessions(span, "min")) == pytest.approx(exchange_minutes)
    # One week of daily equity bars: exchange days (bars / span said 365.25).
    assert infer_periods_per_year(days[:5].to_numpy()) == pytest.approx(365.25 * 5 / 7)
    # 24/7 daily bars with a three-month outage: 365.25 within 0.3% (the two weeks the outage
    # starts and ends in count their 4-6 bars; bars / span said 334).
    d = pd.date_range("2020-01-01", "2022-12-31", freq="D")
    d = d[(d < "2021-03-01") | (d > "2021-06-01")]
    assert infer_periods_per_year(d.to_numpy()) == pytest.approx(365.25, rel=3e-3)
    # Two years of NYSE days, holidays included (503 sessions in 2021-2022): ~252, as bars /
    # span said; the median week (5 days) would say 261.
    nyse_holidays = pd.to_datetime(
        ["2021-01-01", "2021-01-18", "2021-02-15", "2021-04-02", "2021-05-31", "2021-07-05",
         "2021-09-06", "2021-11-25", "2021-12-24", "2022-01-17", "2022-02-21", "2022-04-15",
         "2022-05-30", "2022-06-20", "2022-07-04", "2022-09-05", "2022-11-24", "2022-12-26"]
    )  # fmt: skip
    nyse = days[~days.isin(nyse_holidays)]
    assert len(nyse) == 503
    assert infer_periods_per_year(nyse.to_numpy()) == pytest.approx(251.5, rel=0.01)
    # Eight days of FX hourly bars (Sunday 22:00 to Monday 23:00 a week later): a short file
    # whose whole Saturday without a bar says a 5-day week, 24 bars a day. (Without a whole
    # Saturday inside, round-the-clock bars read as 24/7: crypto looks the same.)
    week = pd.date_range("2024-03-03 22:00", "2024-03-11 23:00", freq="h")
    week = week[~((week.day_of_week == 5) | ((week.day_of_week == 4) & (week.hour >= 22)))]
    week = week[~((week.day_of_week == 6) & (week.hour < 22))]
    assert infer_periods_per_year(week.to_numpy()) == pytest.approx(24 * 365.25 * 5 / 7)
    # A stray Saturday bar in two years of exchange days does not make the week 6 days long
    # (one week of 104 holds 6 bars: +0.2%).
    stray = np.sort(np.append(days.to_numpy(), np.datetime64("2021-06-05", "ns")))
    assert infer_periods_per_year(stray) == pytest.approx(365.25 * 5 / 7, rel=3e-3)
    # Hourly bars of a 7-bar session, and monthly bars (intervals / span: 119 in 9.9 years).
    assert infer_periods_per_year(_sessions(days, "h")) == pytest.approx(7 * 365.25 * 5 / 7)
    # Sessions that cross midnight UTC: FX trades from Sunday 22:00 to Friday 22:00 (120 hours a
    # week, on six dated days) and reads 120 bars a week, as bars / span did on long files.
    hours = pd.date_range("2021-01-03 22:00", "2022-12-30 21:00", freq="h")
    fx = hours[~((hours.day_of_week == 5) | ((hours.day_of_week == 4) & (hours.hour >= 22)))]
    fx = fx[~((fx.day_of_week == 6) & (fx.hour < 22))]
    assert infer_periods_per_year(fx.to_numpy()) == pytest.approx(120 * 365.25 / 7)
    months = pd.date_range("2000-01-31", periods=120, freq="ME").to_numpy()
    span_years = (months[-1] - months[0]) / np.timedelta64(1, "D") / 365.25
    assert infer_periods_per_year(months) == pytest.approx(119 / span_years)
    # Two weeks of 2-day bars are not daily bars (the short-file rule once said 365.25, a
    # Sharpe ratio sqrt(2) too high); a year of them reads the same rate.
    for periods in (8, 183):
        two_day = pd.date_range("2024-01-03", periods=periods, freq="2D").to_numpy()
        assert infer_periods_per_year(two_day) == pytest.approx(365.25 / 2, rel=3e-3)
    # A few business days across a weekend stay exchange days (their median gap can be 1.5
    # days, yet two bars are a day apart).
    for start, periods in (("2021-01-08", 3), ("2021-01-07", 4), ("2021-01-06", 5)):
        few = pd.bdate_range(start, periods=periods).to_numpy()
        assert infer_periods_per_year(few) == pytest.approx(365.25 * 5 / 7), (start, periods)


def test_metric_functions_refuse_a_meaningless_year_and_survive_huge_growth():
    from foxhunt.errors import ConfigError

    r = [0.01, -0.02, 0.03]
    for bad in (-1, 0, math.nan, math.inf, True, "252"):
        for fn in (
            bt.sharpe,
            bt.sortino,
            bt.annualised_volatility,
            bt.annualised_return,
            bt.calmar,
        ):
            with pytest.raises(ConfigError, match="periods_per_year must be a positive number"):
                fn(r, periods_per_year=bad)
            # Also where the ratio is undefined (one bar, no dispersion, no drawdown).
            for degenerate in ([0.1], [0.1, 0.1]):
                with pytest.raises(ConfigError, match="periods_per_year"):
                    fn(degenerate, periods_per_year=bad)
        with pytest.raises(ConfigError, match="periods_per_year"):
            bt.compute_metrics(r, [1, 1, 1], periods_per_year=bad)
    # A 1000-fold log return is growth past float range, not an OverflowError.
    assert bt.total_return([1000.0]) == math.inf
    assert bt.annualised_return([0.5] * 10, periods_per_year=1e6) == math.inf
    assert bt.total_return([-1000.0]) == -1.0


# --- batched greedy actions ------------------------------------------------------------------
def test_observations_for_many_bars_are_those_of_one_bar_at_a_time():
    from foxhunt.envs.trading import TradingEnv

    market = make_market(90, seed=4)
    env = TradingEnv(market, TradingEnvConfig(window=6), eval_mode=True)
    env.reset()
    for p in range(env.n_positions):
        many = env.observations(env.first_bar, env.last_bar + 1, p)
        for i, t in enumerate(range(env.first_bar, env.last_bar + 1)):
            state = env.get_state()
            state.update(t=t, position_index=p)
            env.set_state(state)
            assert np.array_equal(many[i], env.observation())
    with pytest.raises(ValueError, match="outside"):
        env.observations(0, 3, 0)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"dueling": True, "distributional": "c51", "n_atoms": 11},
        {"distributional": "qr", "n_atoms": 8, "noisy_nets": True},
        {"regime_conditional": True, "regime_gating": "residual"},
        {"regime_conditional": True, "regime_gating": "hard", "dueling": True},
    ],
    ids=["plain", "dueling-c51", "qr-noisy", "residual", "hard"],
)
def test_a_backtest_on_batched_greedy_actions_is_the_bar_by_bar_one(variant):
    """The backtest scores a chunk of bars at once; where a batched product could round the
    other way (a near tie), the one-bar call decides. Positions and returns must be those of
    the bar-by-bar loop, over a span longer than one chunk."""
    import gymnasium as gym

    from foxhunt.config import DQNHyperparameters
    from foxhunt.envs.trading import TradingEnv
    from foxhunt.learner import DQNAgent
    from foxhunt.runs import model_policy

    market = make_market(bt._CHUNK_BARS + 700, seed=5, n_regimes=3)
    cfg = TradingEnvConfig(window=4)
    env = TradingEnv(market, cfg, eval_mode=True)
    hp = DQNHyperparameters(hidden_sizes=(32, 32), batch_size=8, learning_starts=8, device="cpu",
                            seed=3, **variant)  # fmt: skip
    agent = DQNAgent(env.observation_space, gym.spaces.Discrete(3), hp, n_regimes=3)
    act = model_policy(agent)
    assert callable(act.q_batch)
    batched = bt.run_policy(market, act, cfg, "agent")
    one_by_one = bt.run_policy(market, lambda obs: act(obs), cfg, "agent")
    assert np.array_equal(batched.positions, one_by_one.positions)
    assert np.array_equal(batched.net_log_returns, one_by_one.net_log_returns)
    assert len(set(batched.positions.tolist())) > 1  # the policy moves: the walk is tested


def test_a_chunk_scores_only_the_positions_the_walk_holds_and_many_positions_go_bar_by_bar():
    """Scoring every position at every bar cost n_positions rows a bar where the walk visits
    one: 51 positions ran 10x slower than the one-bar loop."""
    from foxhunt.envs.trading import TradingEnv

    market = make_market(300, seed=8)
    rows = []

    def act(obs):
        return 2

    def q_batch(obs):
        rows.append(len(obs))
        q = np.zeros((len(obs), 3), np.float32)
        q[:, 2] = 1.0  # always long: the walk holds flat (the start), then long
        return q

    act.q_batch = q_batch  # type: ignore[attr-defined]
    cfg = TradingEnvConfig(window=3)
    res = bt.run_policy(market, act, cfg, "agent")
    n_bars = TradingEnv(market, cfg, eval_mode=True).max_steps + 1
    assert np.all(res.positions == 1.0) and rows == [n_bars, n_bars]  # flat, then long: once each
    wide = TradingEnvConfig(window=3, positions=tuple(np.linspace(-1, 1, 21).round(2).tolist()))
    assert bt.batched_greedy(TradingEnv(market, wide, eval_mode=True), act) is act


def test_near_ties_are_decided_by_the_one_bar_call():
    """A policy whose batched scores tie everywhere: every action comes from ``act`` itself."""
    from foxhunt.envs.trading import TradingEnv

    market = make_market(200, seed=6)
    cfg = TradingEnvConfig(window=3)
    calls = []

    def act(obs):
        calls.append(1)
        return len(calls) % 3

    act.q_batch = lambda obs: np.zeros((len(obs), 3), np.float32)  # type: ignore[attr-defined]
    env = TradingEnv(market, cfg, eval_mode=True)
    res = bt.run_policy(market, act, cfg, "agent")
    assert len(calls) == env.max_steps
    assert res.positions.tolist()[:3] == [0.0, 1.0, -1.0]


def test_the_sharpe_standard_error_is_the_spread_of_sharpe_over_repeated_samples():
    """Lo (2002) for independent bars, checked against the Sharpe ratios of 4000 simulated
    200-bar spans (per-bar SR 0.1): their spread is the standard error the report prints."""
    rng = np.random.default_rng(7)
    spans = rng.normal(0.001, 0.01, size=(4000, 200))
    sharpes = np.array([bt.sharpe(r, 252) for r in spans])
    predicted = bt.sharpe_standard_error(spans[0], 252)
    assert predicted == pytest.approx(math.sqrt((1 + 0.1**2 / 2) / 200 * 252), rel=0.05)
    assert sharpes.std(ddof=1) == pytest.approx(predicted, rel=0.05)
    m = bt.compute_metrics(spans[0], np.ones(200), periods_per_year=252)
    assert m["sharpe_se"] == predicted
