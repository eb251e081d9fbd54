"""Trading-side defects found by probing: each test pins the corrected behaviour against numbers
worked out by hand in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt import backtest as bt
from foxhunt.envs.trading import BANKRUPTCY_REWARD, TradingEnv, TradingEnvConfig, step_growth
from foxhunt.errors import ConfigError
from foxhunt.markets.arrays import MarketArrays


def _market(close: list[float], regimes: list[int] | None = None) -> MarketArrays:
    """Daily bars, no features; detected regime per bar from ``regimes`` (default: one)."""
    n = len(close)
    labels = np.zeros(n, dtype=np.int64) if regimes is None else np.asarray(regimes)
    k = int(labels.max()) + 1
    return MarketArrays(
        timestamps=np.datetime64("2021-01-04", "ns") + np.arange(n) * np.timedelta64(1, "D"),
        close=np.asarray(close, dtype=np.float64),
        features=np.zeros((n, 0), np.float32),
        regime_probs=np.eye(k, dtype=np.float32)[labels],
        feature_names=(),
        regime_names=tuple(f"r{i}" for i in range(k)),
    )


# --- 1. a cost above equity times a wiped-out position is still a wipe-out ----------------------
# cost_rate 0.5 (5000 bps); moving 0 -> 5 costs 2.5 x equity (keep = 1 - 2.5 = -1.5); the bar
# falls 30% so the 5x position makes 1 + 5 x (-0.3) = -0.5. The product (+0.75) looked like a
# 25% loss; either factor <= 0 means nothing is left.
COSTLY = TradingEnvConfig(window=1, cost_bps=5000.0, slippage_bps=0.0, positions=(0.0, 5.0))
CLOSE = [100.0, 100.0, 70.0, 70.0, 70.0, 70.0]


def test_step_growth_is_zero_when_either_factor_is_not_positive():
    cost, growth = step_growth(0.0, 5.0, -0.3, 0.5)
    assert cost == 2.5 and growth == 0.0
    cost, growth = step_growth(0.0, np.array([5.0, 1.0, 0.0]), -0.3, 0.5)
    np.testing.assert_allclose(cost, [2.5, 0.5, 0.0])
    np.testing.assert_allclose(growth, [0.0, 0.5 * 0.7, 1.0])  # only the 5x move is wiped out
    assert step_growth(0.0, 1.0, 0.1, 0.01)[1] == pytest.approx(0.99 * 1.1)


def test_costs_that_wipe_out_the_account_on_one_trade_are_refused_for_new_runs():
    """A new run refuses them; a run directory recorded before the check still loads (its
    config builds), and the arithmetic below still holds for it."""
    from foxhunt.runs import build_spec

    with pytest.raises(ConfigError, match=r"charges 250% of equity .* one trade would wipe"):
        COSTLY.check_new()
    with pytest.raises(ConfigError, match=r"= 10001 bps charges 200% of equity"):
        build_spec(overrides={"trading.cost_bps": 1e4})  # short to long: a change of 2
    assert build_spec(overrides={"trading.cost_bps": 4000.0, "trading.positions": [0.0, 1.0]})
    assert TradingEnvConfig(cost_bps=1e4).cost_rate == 1.0001  # an old run's settings build
    with pytest.raises(ConfigError, match=r"trading.initial_position: must be an index into "):
        TradingEnvConfig(initial_position=3)


def test_cost_above_equity_with_a_losing_bar_is_bankrupt_everywhere():
    market = _market(CLOSE)
    env = TradingEnv(market, COSTLY, eval_mode=True)
    env.reset()
    _, reward, terminated, _, info = env.step(np.int64(0))  # flat over bar 0 -> 1
    assert reward == 0.0 and not info["bankrupt"]
    _, reward, terminated, _, info = env.step(np.int64(1))  # 0 -> 5 into the 30% fall
    assert info["bankrupt"] and terminated and reward == BANKRUPTCY_REWARD
    assert info["equity"] == 0.0 and info["cost"] == 2.5 and info["portfolio_return"] == -1.0

    res = bt.simulate_positions(market, [0, 5, 5, 5, 5, 5], COSTLY, "x", periods_per_year=252)
    assert res.bankrupt and res.metrics["total_return"] == -1.0
    np.testing.assert_array_equal(res.equity, [1.0, 0.0, 0.0, 0.0, 0.0])
    assert res.net_log_returns[1] == BANKRUPTCY_REWARD

    # The alternative "go 5x" at the same bar, seen from a flat step: bankrupt too.
    env.reset()
    obs1, _, term, _, info = env.step(np.int64(0))
    obs2, _, term, _, info = env.step(np.int64(0))  # flat over bar 1 -> 2 (the fall)
    actions, rewards, _, done = env.counterfactual_transitions(obs1, 0, obs2, term, info)
    assert actions.tolist() == [1] and rewards.tolist() == [BANKRUPTCY_REWARD]
    assert done.tolist() == [True]


# --- 6. the forced flat after a wipe-out is not a trade ----------------------------------------
# 5x long from bar 0; bar 2 -> 3 falls 102 -> 75 (1 + 5 x (75/102 - 1) < 0): wiped out in period
# 2. Eight periods, one entry of |5|: turnover 5 / 8. The later zero position is bookkeeping.
WIPE = [100.0, 101.0, 102.0, 75.0, 76.0, 77.0, 78.0, 79.0, 80.0]
LEVERED = TradingEnvConfig(window=1, cost_bps=0.0, slippage_bps=0.0, positions=(0.0, 5.0))


def test_turnover_after_a_wipe_out_counts_only_real_trades():
    regimes = [0, 0, 0, 0, 0, 1, 1, 1, 1]  # periods end at bars 1..8: labels 0,0,0,0,1,1,1,1
    market = _market(WIPE, regimes)
    sim = bt.simulate_positions(market, np.full(9, 5.0), LEVERED, "sim", periods_per_year=252)
    agent = bt.run_policy(market, lambda obs: 1, LEVERED, "agent", periods_per_year=252)
    for res in (sim, agent):
        assert res.bankrupt
        np.testing.assert_array_equal(res.positions, [5, 5, 5, 0, 0, 0, 0, 0])
        assert res.metrics["turnover"] == pytest.approx(5 / 8)
        assert res.per_regime["r0"]["turnover"] == pytest.approx(5 / 4)  # the entry only
        assert res.per_regime["r1"]["turnover"] == 0.0


# --- 3. spans too short to use are refused at training time, naming the fraction ----------------
def _bars_csv(path, n: int):
    import pandas as pd

    close = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.01, n)))
    bars = pd.DataFrame(
        {"open": close, "high": close * 1.01, "low": close * 0.99, "close": close},
        index=pd.date_range("2020-01-01", periods=n, freq="D", name="date"),
    )
    bars.to_csv(path)
    return path


def test_run_splits_keep_their_rounding_and_split_chronological_rounds_float_error():
    import pandas as pd

    from foxhunt.markets.data import split_chronological
    from foxhunt.runs import split_bounds

    # A run's spans are int(n * fraction), as they always were: runs trained before data.json
    # recorded their split ends are resumed and evaluated by recomputing them.
    assert 100 * 0.29 < 29
    assert split_bounds(100, 0.29, 0.15) == (28, 43)
    assert split_bounds(350, 0.7, 0.15) == (244, 296)  # 245 / 297 if rounded first
    assert split_bounds(1500, 0.7, 0.2987) == (1050, 1498)  # 448.05 validation bars -> 448
    frame = pd.DataFrame(
        {"close": np.arange(1.0, 101.0)}, index=pd.date_range("2020-01-01", periods=100)
    )
    parts = split_chronological(frame, train=0.29, validation=0.15)
    assert (len(parts.train), len(parts.validation), len(parts.test)) == (29, 15, 56)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # 200 bars: train 140, validation int(200 x 0.2905) = 58, test 2.
        (
            {"market.validation_fraction": 0.2905},
            r"market.train_fraction=0.7 \+ market.validation_fraction=0.2905 leave 2 test bars "
            r"of 200 .*\(train 140, validation 58, test 2\)",
        ),
        # train floor(200 x 0.1) = 20 bars; window 8 needs 10, the 20-bar feature warm-up 21.
        (
            {"market.train_fraction": 0.1},
            r"market.train_fraction=0.1 leaves 20 training bars of 200 .* at least 21",
        ),
        (
            {"market.validation_fraction": 0.01},  # floor(2.0) = 2 validation bars
            r"market.validation_fraction=0.01 leaves 2 validation bars of 200",
        ),
    ],
)
def test_too_short_spans_are_refused_naming_the_fraction(tmp_path, overrides, message):
    from foxhunt.errors import ConfigError
    from foxhunt.runs import build_spec, build_trading

    path = _bars_csv(tmp_path / "bars.csv", 200)
    spec = build_spec(data=str(path), overrides={"trading.window": 8, **overrides})
    with pytest.raises(ConfigError, match=message) as err:
        build_trading(spec)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_three_bar_test_span_is_the_smallest_accepted(tmp_path):
    from foxhunt.runs import build_spec, build_trading

    path = _bars_csv(tmp_path / "bars.csv", 200)
    # validation int(200 x 0.2875) = 57 -> test 200 - 197 = 3 bars, + 7 warm-up bars = 10.
    spec = build_spec(
        data=str(path), overrides={"trading.window": 8, "market.validation_fraction": 0.2875}
    )
    setup = build_trading(spec)
    assert setup.bounds("test") == (197, 200) and len(setup.span("test")) == 10
    env = setup.eval_env("test")
    assert env.max_steps == 2  # decisions at the test span's first two bars


def test_training_evaluates_on_the_validation_span_never_the_test_span(tmp_path):
    """The evaluations during training pick the best model and score hyperopt trials: they
    must see the validation bars (after a window of warm-up bars), never a test bar."""
    from foxhunt.runs import build_spec, make_envs

    path = _bars_csv(tmp_path / "bars.csv", 200)
    spec = build_spec(data=str(path), overrides={"trading.window": 8})
    _, eval_env, setup = make_envs(spec)
    start, stop = setup.bounds("validation")
    assert stop == setup.bounds("test")[0]
    seen = np.asarray(eval_env.market.timestamps)
    np.testing.assert_array_equal(seen, np.asarray(setup.market.timestamps)[start - 7 : stop])


# --- 8. the chunked forward-backward equals the textbook one ------------------------------------
def _reference_e_step(x, means, variances, trans, start):
    """Rabiner's scaled forward-backward, one restart and one bar at a time, with scipy's pdf."""
    from scipy.stats import norm

    n, (r, k) = x.shape[0], start.shape
    lls, gammas, xis = [], [], []
    for i in range(r):
        b = np.prod(norm.pdf(x[:, None, :], means[i], np.sqrt(variances[i])), axis=2)  # [N, K]
        alpha, c = np.empty((n, k)), np.empty(n)
        a = start[i] * b[0]
        c[0] = a.sum()
        alpha[0] = a / c[0]
        for t in range(1, n):
            a = (alpha[t - 1] @ trans[i]) * b[t]
            c[t] = a.sum()
            alpha[t] = a / c[t]
        beta = np.ones((n, k))
        for t in range(n - 2, -1, -1):
            beta[t] = trans[i] @ (b[t + 1] * beta[t + 1]) / c[t + 1]
        gamma = alpha * beta
        xi = sum(
            np.outer(alpha[t], b[t + 1] * beta[t + 1] / c[t + 1]) * trans[i] for t in range(n - 1)
        )
        lls.append(np.log(c).sum())
        gammas.append(gamma / gamma.sum(axis=1, keepdims=True))
        xis.append(xi)
    return np.array(lls), np.stack(gammas, axis=1), np.stack(xis)


@pytest.mark.parametrize("n", [2, 3, 17, 50])  # chunks of 1, 1, 4 and 7 bars, ragged tails
def test_hmm_e_step_matches_the_sequential_forward_backward(n):
    from foxhunt.markets.regimes import GaussianHMMDetector

    rng = np.random.default_rng(n)
    r, k = 3, 4
    x = rng.normal(size=(n, 2))
    means = rng.normal(size=(r, k, 2))
    variances = rng.uniform(0.3, 2.0, size=(r, k, 2))
    trans = rng.uniform(0.1, 1.0, size=(r, k, k))
    trans /= trans.sum(axis=2, keepdims=True)
    start = rng.dirichlet(np.ones(k), size=r)
    det = GaussianHMMDetector(k, n_restarts=r)
    ll, gamma, xi = det._e_step(x, means, variances, trans, start)
    ref_ll, ref_gamma, ref_xi = _reference_e_step(x, means, variances, trans, start)
    np.testing.assert_allclose(ll, ref_ll, rtol=1e-10)
    np.testing.assert_allclose(gamma, ref_gamma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(xi, ref_xi, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(xi.sum(axis=(1, 2)), n - 1)  # one transition per bar pair


# --- 2. a run notices when the file behind market.data has changed ------------------------------
TINY_RUN = {
    "hidden_sizes": [8],
    "batch_size": 16,
    "learning_starts": 64,
    "buffer_capacity": 1000,
    "train_freq": 4,
    "eval_interval": 0,
    "log_interval": 100,
    "checkpoint_interval": 150,
    "device": "cpu",
    "seed": 5,
    "market.detector": "volatility_trend",
    "trading.window": 4,
}


@pytest.fixture(scope="module")
def trained_on_600(tmp_path_factory):
    """A tiny run trained on the first 600 of 700 synthetic bars (file ``prices.csv``)."""
    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv
    from foxhunt.runs import build_spec
    from foxhunt.session import run_training

    root = tmp_path_factory.mktemp("data-record")
    full = write_synthetic_csv(root / "full.csv", SyntheticMarketConfig(n_bars=700), seed=3)
    lines = full.read_text().splitlines(keepends=True)
    (root / "first600.csv").write_text("".join(lines[:601]))  # header + 600 bars
    data = root / "prices.csv"
    data.write_text("".join(lines[:601]))
    spec = build_spec(data=str(data), overrides=TINY_RUN, total_steps=300)
    run_training(spec, root / "run", progress=False)
    return root


def _copy(root, tmp_path, csv: str):
    """The trained run, with prices.csv replaced by ``csv`` (a list of lines or a file name)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(root / "run", run)
    data = root / "prices.csv"
    source = root / csv if isinstance(csv, str) else None
    data.write_text(source.read_text() if source else "".join(csv))
    return run


def _edited(root, csv: str, row: int, edit) -> list[str]:  # type: ignore[no-untyped-def]
    """The lines of ``root / csv`` with line ``row``'s fields changed in place by ``edit``."""
    lines = (root / csv).read_text().splitlines(keepends=True)
    fields = lines[row].rstrip("\n").split(",")
    edit(fields)
    lines[row] = ",".join(fields) + "\n"
    return lines


def test_the_run_records_its_data(trained_on_600):
    import json

    from foxhunt.markets.data import load_ohlcv
    from foxhunt.runs import data_identity

    record = json.loads((trained_on_600 / "run" / "data.json").read_text())
    lines = (trained_on_600 / "first600.csv").read_text().splitlines()
    assert record["rows"] == 600 and (record["train_end"], record["val_end"]) == (420, 510)
    assert record["first"].startswith(lines[1].split(",")[0][:10])
    assert record["last"].startswith(lines[600].split(",")[0][:10])
    # The hash is of the loaded values: the same bars hash the same, one price changed does not.
    frame = load_ohlcv(trained_on_600 / "first600.csv")
    assert data_identity(frame)["sha256"] == record["sha256"]
    moved = frame.copy()
    moved.iloc[300, moved.columns.get_loc("close")] *= 1.0000001
    assert data_identity(moved)["sha256"] != record["sha256"]


def test_evaluate_keeps_the_trained_spans_when_the_file_grew(trained_on_600, tmp_path, caplog):
    from foxhunt.runs import build_spec, build_trading, load_spec, read_data_record
    from foxhunt.session import evaluate_run

    run = _copy(trained_on_600, tmp_path, "full.csv")  # the same 600 bars + 100 new ones
    with caplog.at_level("WARNING"):
        out = evaluate_run(run)
    assert "100 bars were appended" in caplog.text and "test span runs from bar 510" in caplog.text
    # periods traded: from each held-out test bar and new bar but the last, whose close ends
    # the period before it
    assert out["bars"] == 700 - 510 - 1
    # The 600 trained bars get exactly the features and regimes they had in training: the
    # normaliser and detector are still fitted on bars 0..419, not on 70% of the longer file.
    spec = load_spec(run)
    now = build_trading(spec, recorded=read_data_record(run))
    then = build_trading(
        build_spec(data=str(trained_on_600 / "first600.csv"), overrides=TINY_RUN, total_steps=300)
    )
    assert (now.train_end, now.val_end) == (420, 510)
    np.testing.assert_array_equal(now.market.regime_probs[:600], then.market.regime_probs)
    np.testing.assert_array_equal(now.market.features[:600], then.market.features)


def test_evaluate_and_resume_use_the_detector_the_run_trained_with(
    trained_on_600, tmp_path, request
):
    """data.json keeps the fitted HMM: evaluate (also of the grown file) and resume do not fit
    it again, and a record without one (a run from before it was kept) is refitted."""
    import json

    from foxhunt.runs import build_spec, load_spec, read_data_record
    from foxhunt.session import evaluate_run, resume_training, run_training

    lines = (trained_on_600 / "full.csv").read_text().splitlines(keepends=True)
    data = tmp_path / "prices.csv"
    data.write_text("".join(lines[:601]))
    hmm = {**TINY_RUN, "market.detector": "hmm"}
    run = tmp_path / "run"
    run_training(build_spec(data=str(data), overrides=hmm, total_steps=300), run, progress=False)
    data.write_text("".join(lines))  # 100 bars more
    fits: list[int] = request.getfixturevalue("hmm_fits")  # counted from here on
    assert set(read_data_record(run)["detector"]) == {"key", "params"}
    kept = evaluate_run(run)  # the grown file: the same training rows
    assert fits == []
    data.write_text("".join(lines[:601]))
    resume_training(run, total_steps=310, progress=False)
    assert fits == []
    data.write_text("".join(lines))
    record = json.loads((run / "data.json").read_text())
    del record["detector"]
    (run / "data.json").write_text(json.dumps(record))
    assert evaluate_run(run) == kept and fits == [420]
    assert load_spec(run).market.detector == "hmm"


def test_resume_refuses_any_change_and_evaluate_a_misaligned_one(trained_on_600, tmp_path):
    from foxhunt.errors import DataError
    from foxhunt.session import evaluate_run, resume_training

    lines = (trained_on_600 / "full.csv").read_text().splitlines(keepends=True)
    run = _copy(trained_on_600, tmp_path, lines[:551])  # the last 50 bars gone
    with pytest.raises(DataError, match=r"600 rows at training, 550 now; last bar .*lines up"):
        evaluate_run(run)
    with pytest.raises(DataError, match=r"prices.csv has changed .*600 rows at training, 550"):
        resume_training(run, total_steps=450, progress=False)
    _copy(trained_on_600, tmp_path / "b", "full.csv")  # grown: fine to evaluate, not to resume
    with pytest.raises(DataError, match=r"100 bars were appended\).*start a new run"):
        resume_training(tmp_path / "b" / "run", total_steps=450, progress=False)


def test_revised_prices_on_the_same_bars_warn_on_evaluate(trained_on_600, tmp_path, caplog):
    from foxhunt.errors import DataError
    from foxhunt.session import evaluate_run, resume_training

    def revise_volume(fields: list[str]) -> None:  # one bar's volume revised
        fields[5] = str(float(fields[5]) + 1.0)

    run = _copy(
        trained_on_600, tmp_path, _edited(trained_on_600, "first600.csv", 300, revise_volume)
    )
    with caplog.at_level("WARNING"):
        out = evaluate_run(run)
    assert "values differ (prices or volume) on the same 600 bars" in caplog.text
    assert out["bars"] == 600 - 510 - 1  # periods: the last bar closes the one before it
    with pytest.raises(DataError, match="the values differ"):
        resume_training(run, total_steps=450, progress=False)


def test_a_revised_last_bar_and_new_bars_evaluate_on_the_trained_spans(
    trained_on_600, tmp_path, caplog
):
    """What a vendor's refreshed file looks like: the last bar corrected, new bars after it."""
    from foxhunt.session import evaluate_run

    def revise_close(fields: list[str]) -> None:  # its close revised (mid-range)
        fields[4] = str((float(fields[2]) + float(fields[3])) / 2)

    # Line 600 is bar 599, the last one trained on.
    run = _copy(trained_on_600, tmp_path, _edited(trained_on_600, "full.csv", 600, revise_close))
    with caplog.at_level("WARNING"):
        out = evaluate_run(run)
    assert "100 bars were appended and values of the 600 trained bars revised" in caplog.text
    assert out["bars"] == 700 - 510 - 1  # periods traded


def test_a_bar_moved_inside_the_span_is_refused_not_taken_for_revised_prices(
    trained_on_600, tmp_path
):
    from foxhunt.errors import DataError
    from foxhunt.session import evaluate_run

    def move_by_a_minute(fields: list[str]) -> None:  # same rows, same first and last bar
        fields[0] = fields[0][:-2] + ("01" if fields[0][-2:] == "00" else "00")

    run = _copy(
        trained_on_600, tmp_path, _edited(trained_on_600, "first600.csv", 300, move_by_a_minute)
    )
    with pytest.raises(DataError, match="moved, removed or inserted"):
        evaluate_run(run)


def test_runs_without_a_data_record_still_evaluate_and_resume(trained_on_600, tmp_path):
    from foxhunt.errors import FoxhuntError
    from foxhunt.session import evaluate_run, resume_training

    run = _copy(trained_on_600, tmp_path, "first600.csv")
    (run / "data.json").write_text('{"format": "foxhunt-data", "rows": "600"}')
    with pytest.raises(FoxhuntError, match=r"data.json: rows must be an integer, got: '600'"):
        evaluate_run(run)
    (run / "data.json").write_text('{"format": "foxhunt-data", "rows": 600}')
    with pytest.raises(FoxhuntError, match=r"data.json: first is missing"):
        evaluate_run(run)
    (run / "data.json").write_text('{"rows": 600}')
    with pytest.raises(FoxhuntError, match=r"data.json: format must be 'foxhunt-data'"):
        evaluate_run(run)
    (run / "data.json").unlink()  # a run from before the record
    assert evaluate_run(run)["bars"] == 89  # periods traded: 90 bars, the last closes
    assert resume_training(run, total_steps=450, progress=False)["env_steps"] == 450


# --- 7. a long stale stretch does not collapse the volatility/trend thresholds ------------------
def test_volatility_trend_thresholds_come_from_the_bars_that_move():
    import pandas as pd

    from foxhunt.errors import DataError
    from foxhunt.markets.regimes import VolatilityTrendDetector

    rng = np.random.default_rng(0)
    close = 100 * np.exp(np.cumsum(rng.normal(0.0003, 0.01, 1050)))
    close[200:601] = close[200]  # 400 stale bars (38% of the span)
    frame = pd.DataFrame({"close": close}, index=pd.date_range("2015-01-01", periods=1050))
    det = VolatilityTrendDetector(4).fit(frame)
    # By hand with pandas: 20-bar sample std of log returns, 60-bar mean log return; the
    # quantiles are taken over bars whose volatility window moved.
    log_close = pd.Series(np.log(close))
    vol = log_close.diff().rolling(20).std().to_numpy()
    trend = (log_close.diff(60) / 60).to_numpy()
    moving = np.isfinite(vol) & np.isfinite(trend) & (vol > 1e-12)
    threshold = np.quantile(vol[moving], 0.85)
    calm = moving & (vol <= threshold)
    assert det.vol_threshold_ == pytest.approx(threshold, rel=1e-9)
    np.testing.assert_allclose(det.trend_thresholds_, np.quantile(trend[calm], [1 / 3, 2 / 3]))
    assert det.trend_thresholds_[0] < 0 < det.trend_thresholds_[1] and threshold > 0.005
    assert det.labels(frame)[500] == 2  # a stale bar: no volatility, no trend -> sideways

    constant = frame.assign(close=50.0)
    with pytest.raises(DataError, match=r"barely move \(0 of 990 bars"):
        VolatilityTrendDetector(4).fit(constant)


def test_an_empty_split_is_refused_not_read_as_test(trained_on_600, tmp_path):
    from foxhunt.session import evaluate_run

    run = _copy(trained_on_600, tmp_path, "first600.csv")
    with pytest.raises(ConfigError, match=r"split must be one of train, validation, test, all"):
        evaluate_run(run, split="")


def test_best_weights_asked_of_a_run_without_them_say_what_ran(trained_on_600, tmp_path):
    """A trading run that kept no best weights (no evaluations) backtests its final ones for
    model='best', and says so, as a Gymnasium run's evaluation_best.json does."""
    from foxhunt.session import evaluate_run

    run = _copy(trained_on_600, tmp_path, "first600.csv")
    assert not (run / "best_model.safetensors").exists()
    out = evaluate_run(run, model="best")
    assert (out["model"], out["model_requested"]) == ("final", "best")
    assert "model_requested" not in evaluate_run(run)


@pytest.mark.parametrize(
    "raw", [[], "abc", [1, "x", 0], [True, False], [float("nan"), 0.0], {"a": 1}, [[0.0, 1.0]]]
)
def test_a_malformed_positions_record_in_model_json_is_named(tmp_path, raw):
    import json

    from foxhunt.errors import FoxhuntError
    from foxhunt.session import _trained_positions

    (tmp_path / "model.json").write_text(json.dumps({"trading_positions": raw}))
    with pytest.raises(FoxhuntError, match=r"model.json: trading_positions must be a non-empty"):
        _trained_positions(tmp_path)
    (tmp_path / "model.json").write_text(json.dumps({"trading_positions": [0, 1.0]}))
    assert _trained_positions(tmp_path) == (0.0, 1.0)
    (tmp_path / "model.json").write_text(json.dumps({"obs_dim": 3}))  # saved before the record
    assert _trained_positions(tmp_path) is None


def test_a_backtest_on_bars_of_another_length_is_said(caplog, tmp_path) -> None:
    from foxhunt.session import _warn_other_frequency

    hourly_24_7 = {"periods_per_year": 8766.0, "bar_seconds": 3600.0}
    # Hourly stock bars (a 7-hour session) for a model of hourly crypto bars: same bar length.
    _warn_other_frequency(1764.0, 3600.0, hourly_24_7, "stock.csv", tmp_path)
    assert "bar frequency" not in caplog.text
    _warn_other_frequency(525_960.0, 60.0, hourly_24_7, "minutes.csv", tmp_path)
    assert "minutes.csv: its bars come about 525,960 a year" in caplog.text
    assert "trained on about 8,766 a year" in caplog.text
    caplog.clear()
    _warn_other_frequency(525_960.0, 60.0, {"rows": 5}, "minutes.csv", tmp_path)  # older record
    assert caplog.text == ""


def test_a_run_trained_when_local_midnight_bars_were_read_in_utc_still_evaluates(tmp_path, caplog):
    """yfinance's daily bars (local midnight with an offset) now keep their dates; runs trained
    before, when they were read in UTC, recorded the UTC times. Their unchanged file was then
    refused by evaluate, resume and next_position as moved bars."""
    import json
    import shutil

    import pandas as pd

    from foxhunt.markets._timestamps import midnight_offsets_in_utc
    from foxhunt.runs import build_spec
    from foxhunt.session import evaluate_run, next_position, resume_training, run_training

    rng = np.random.default_rng(0)
    days = pd.bdate_range("2020-01-01", periods=400, tz="Asia/Tokyo")
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(days))))
    lines = ["Date,Open,High,Low,Close,Volume"] + [
        f"{d.isoformat(sep=' ')},{c},{c * 1.01},{c * 0.99},{c},1000"
        for d, c in zip(days, close, strict=True)
    ]
    path = tmp_path / "7203.T.csv"
    path.write_text("\n".join(lines) + "\n")
    tiny = {"hidden_sizes": [8], "learning_starts": 64, "batch_size": 16,
            "gradient_accumulation_steps": 1, "eval_interval": 0, "checkpoint_interval": 200,
            "trading.window": 8, "market.detector": "volatility_trend"}  # fmt: skip
    spec = build_spec(data=str(path), total_steps=300, overrides=tiny)
    run = tmp_path / "run"
    with midnight_offsets_in_utc():  # as foxhunt read such files when the run trained
        run_training(spec, run, progress=False)
    assert json.loads((run / "data.json").read_text())["first"] == "2019-12-31 15:00:00"
    caplog.clear()
    out = evaluate_run(run)
    assert out["bars"] > 0 and "were read in UTC; they are read so for this run" in caplog.text
    assert next_position(run)["new_bars"] == 0
    assert resume_training(run, total_steps=400, progress=False)["env_steps"] == 400
    # A new run dates the same file's bars by their local dates.
    fresh = tmp_path / "fresh"
    run_training(spec, fresh, progress=False)
    assert json.loads((fresh / "data.json").read_text())["first"] == "2020-01-01 00:00:00"
    # An ensemble stopped before its last member: the member still to train reads the file
    # as member 0 did (it trained, then was refused as trained on other data).
    from foxhunt.ensemble import PLAN_FILE, member_seed, resume_ensemble, train_ensemble

    ens = tmp_path / "ensemble"
    with midnight_offsets_in_utc():
        train_ensemble(spec, ens, 2, progress=False, verbose=False)
    shutil.rmtree(ens / "member-1")
    (ens / "ensemble.json").unlink()
    seed = spec.hyperparameters.seed
    (ens / PLAN_FILE).write_text(json.dumps({"members": 2, "seeds": [seed, member_seed(seed, 1)]}))
    assert resume_ensemble(ens) == [
        ens / "member-0",
        ens / "member-1",
    ]
    first = json.loads((ens / "member-1" / "data.json").read_text())["first"]
    assert first == "2019-12-31 15:00:00"


def test_the_utc_reading_of_local_midnight_bars_is_chosen_only_for_runs_that_had_it(
    tmp_path, caplog
):
    """The reading an old run had is chosen by its record's timestamps. A London file (an
    offset of +00:00 in winter) was refused for an old run whose first bar fell in winter, and
    naive dates or a new run's changed file were said to be "read in UTC" when none was."""
    import pandas as pd

    from foxhunt.errors import DataError
    from foxhunt.markets._timestamps import midnight_offsets_in_utc
    from foxhunt.runs import build_spec, check_same_data, data_identity, load_market_frame

    rng = np.random.default_rng(0)

    def write(name, stamps):
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(stamps))))
        rows = [
            f"{s},{c},{c * 1.01},{c * 0.99},{c},1000" for s, c in zip(stamps, close, strict=True)
        ]
        path = tmp_path / name
        path.write_text("Date,Open,High,Low,Close,Volume\n" + "\n".join(rows) + "\n")
        return build_spec(data=str(path), total_steps=10)

    def record(frame):
        return {**data_identity(frame), "train_end": 100, "val_end": 150}

    london = [
        d.isoformat(sep=" ") for d in pd.bdate_range("2020-01-02", "2021-06-30", tz="Europe/London")
    ]
    spec = write("VOD.L.csv", london)
    with midnight_offsets_in_utc():
        old = record(load_market_frame(spec))  # an old run: summer bars at 23:00 the day before
    caplog.clear()
    assert check_same_data(spec, old) is True  # its unchanged file is read as it read it
    assert "were read in UTC" in caplog.text
    new = record(load_market_frame(spec))  # a run trained today: local dates
    spec = write("VOD.L.csv", london[1:])  # the file lost its first bar
    caplog.clear()
    with pytest.raises(DataError, match="has changed since the run trained"):
        check_same_data(spec, new)
    assert "were read in UTC" not in caplog.text
    # A record from before timestamps had their own hash (all such runs read in UTC), of a
    # London year whose first and last bars fall in winter: its unchanged file still reads.
    year = [
        d.isoformat(sep=" ") for d in pd.bdate_range("2020-01-02", "2020-12-30", tz="Europe/London")
    ]
    spec = write("VOD.L.csv", year)
    with midnight_offsets_in_utc():
        older = record(load_market_frame(spec))
    del older["index_sha256"]
    assert older["first"].endswith("00:00:00") and older["last"].endswith("00:00:00")
    assert check_same_data(spec, older) is True
    # An intraday run evaluated on another file of daily offset bars: new data, not its own.
    from foxhunt.runs import load_recorded_frame

    hourly = {**new, "first": "2020-01-02 05:00:00", "last": "2020-03-02 05:00:00"}
    ny = [
        d.isoformat(sep=" ")
        for d in pd.bdate_range("2020-01-02", periods=60, tz="America/New_York")
    ]
    other = write("SPY.csv", ny)
    caplog.clear()
    assert load_recorded_frame(spec, other.market.data, hourly)[1] is False
    assert "were read in UTC" not in caplog.text
    naive = [d.strftime("%Y-%m-%d") for d in pd.bdate_range("2020-01-01", periods=300)]
    spec = write("naive.csv", naive)
    rec = record(load_market_frame(spec))
    spec = write("naive.csv", naive[1:])
    caplog.clear()
    with pytest.raises(DataError, match="has changed since the run trained"):
        check_same_data(spec, rec)
    assert "were read in UTC" not in caplog.text
