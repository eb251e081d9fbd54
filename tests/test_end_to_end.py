"""End to end: DQN and Rainbow solve CartPole-v1; the trading pipeline trains and evaluates.

Budgets are stated in the tests. Training stops as soon as a greedy evaluation (10 episodes, noise
off) reaches the target, so these runs cost well under their budgets when learning works.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from foxhunt import DQNHyperparameters, DQNTrainer
from foxhunt.markets.regimes import regime_accuracy
from foxhunt.runs import build_spec, build_trading
from foxhunt.session import evaluate_run, run_training

TARGET = 475.0


def _solve(hp: DQNHyperparameters, budget: int) -> tuple[float, int]:
    torch.set_num_threads(1)
    trainer = DQNTrainer(hp, "CartPole-v1")
    best = {"ret": -1.0, "steps": budget}

    def stop_when_solved(row: dict) -> bool:
        ret = row["eval_return"]
        if ret is not None and ret > best["ret"]:
            best["ret"] = ret
            if ret >= TARGET:
                best["steps"] = row["env_steps"]
                return False
        return True

    trainer.learn(budget, callback=stop_when_solved)
    trainer.close()
    return best["ret"], best["steps"]


@pytest.mark.slow
def test_dqn_solves_cartpole_within_50k_steps() -> None:
    """Plain double DQN (zoo-derived CartPole cadence, 1-step, no dueling), seed 0, 50k steps."""
    hp = DQNHyperparameters.cartpole(seed=0, eval_interval=2_500, n_step=1, dueling=False)
    ret, steps = _solve(hp, 50_000)
    print(f"greedy return {ret} reached at {steps} env steps")
    assert ret >= TARGET, f"best greedy return {ret} < {TARGET} within 50k steps"


@pytest.mark.slow
def test_rainbow_preset_solves_cartpole_within_50k_steps() -> None:
    """The Rainbow preset (double, dueling, PER, 3-step, C51, noisy) with CartPole cadence."""
    spec = build_spec(
        env="CartPole-v1",
        config_file=str(Path(__file__).parents[1] / "configs" / "cartpole_rainbow.yaml"),
        preset_name="rainbow",
        seed=0,
    )
    hp = spec.hyperparameters.replace(eval_interval=2_500)
    assert hp.noisy_nets and hp.prioritized_replay and hp.distributional == "c51"
    assert hp.n_step == 3 and hp.dueling and hp.double_q
    ret, steps = _solve(hp, 50_000)
    print(f"greedy return {ret} reached at {steps} env steps")
    assert ret >= TARGET, f"best greedy return {ret} < {TARGET} within 50k steps"


def test_trading_train_and_evaluate_smoke(tmp_path: Path) -> None:
    """`foxhunt train` defaults (regime-conditional agent, synthetic market) then a backtest."""
    torch.set_num_threads(1)
    spec = build_spec(
        total_steps=1_200,
        overrides={
            "learning_starts": 300,
            "hidden_sizes": [32, 32],
            "eval_interval": 600,
            "log_interval": 300,
            "checkpoint_interval": 600,
            "gradient_accumulation_steps": 2,
            "batch_size": 32,
            "trading.window": 8,
        },
    )
    assert spec.hyperparameters.regime_conditional
    run_dir = tmp_path / "run"
    summary = run_training(spec, run_dir, progress=False)
    assert summary["env_steps"] == 1_200
    assert summary["optimizer_steps"] > 0
    for name in ("config.yaml", "metrics.csv", "model.safetensors", "model.json", "summary.json"):
        assert (run_dir / name).is_file(), name
    out = evaluate_run(run_dir, split="test")
    names = set(out["metrics"])
    assert {"agent", "buy & hold", "flat", "regime rule"} <= names
    assert any("oracle" in n for n in names)  # synthetic data knows the true regimes
    assert out["oracle_capture"] is None or isinstance(out["oracle_capture"], float)
    report = run_dir / "backtest"
    assert (report / "report.html").is_file() and (report / "equity.png").is_file()
    metrics = json.loads((report / "metrics.json").read_text())
    assert metrics  # written and parseable
    # The per-period series behind the report, for a user's own analysis: each strategy's
    # equity compounds its net log returns, and ends at its reported total return.
    series = pd.read_csv(out["series"], index_col=0, parse_dates=True)
    assert len(series) == out["metrics"]["agent"]["bars"] and out["metrics_file"].endswith("json")
    strategies = (("agent", "agent"), ("buy & hold", "buy_and_hold"), ("flat", "flat"))
    for name, key in (*strategies, ("regime rule", "regime_rule")):
        equity = np.exp(np.cumsum(series[f"{key}_net_log_return"]))
        assert np.allclose(series[f"{key}_equity"], equity)
        assert series[f"{key}_equity"].iloc[-1] - 1 == pytest.approx(
            out["metrics"][name]["total_return"]
        )
    assert set(series["true_regime"]) <= set(range(4))
    # The detector's accuracy on this span, against the synthetic market's true regimes.
    setup = build_trading(spec)
    test = setup.span("test")
    # "bars" counts the periods traded: one from each of the test split's own bars (not the 7
    # warm-up bars the window borrows) but the data's last, which has no next close.
    assert out["bars"] == len(setup.market) - setup.val_end - 1 == len(test) - 7 - 1
    assert out["metrics"]["agent"]["bars"] == out["bars"]
    own = slice(8, None)  # the bars the periods end on: after the 7 warm-up bars and the first
    expected = regime_accuracy(test.regime_probs.argmax(axis=1)[own], test.true_regimes[own])
    assert out["regime_accuracy"] == pytest.approx(expected) and expected > 0.5
    assert metrics["regime_accuracy"] == pytest.approx(expected)
    assert f"{expected:.3f}" in (report / "report.md").read_text()
    # Every split is annualised at the file's one bar frequency, stated in the report.
    from foxhunt.backtest import infer_periods_per_year

    ppy = infer_periods_per_year(setup.market.timestamps)
    assert out["periods_per_year"] == ppy == out["metrics"]["agent"]["periods_per_year"]
    other = evaluate_run(run_dir, split="validation")
    assert other["periods_per_year"] == ppy
    # Another split or model is reported beside the test span's, not over it (as a Gymnasium
    # run's evaluation_best.json): a user comparing two keeps both.
    best = evaluate_run(run_dir, split="test", model="best")
    assert Path(other["report"]).parent == run_dir / "backtest_validation"
    assert Path(best["report"]).parent == run_dir / "backtest_best"
    assert "test span" in (report / "report.md").read_text()
    assert "validation span" in (run_dir / "backtest_validation" / "report.md").read_text()
    assert "best model" in (run_dir / "backtest_best" / "report.md").read_text()
    # Named after the model asked for, as evaluation_best.json is: the final weights standing in
    # for missing best ones do not replace the final model's own report.
    (run_dir / "best_model.safetensors").rename(run_dir / "kept.safetensors")
    stand_in = evaluate_run(run_dir, split="test", model="best")
    (run_dir / "kept.safetensors").rename(run_dir / "best_model.safetensors")
    assert stand_in["model_requested"] == "best" and stand_in["model"] == "final"
    assert Path(stand_in["report"]).parent == run_dir / "backtest_best"
    assert "final weights standing in for the best model" in Path(stand_in["report"]).read_text()
    text = (report / "report.md").read_text()
    assert f"Annualised with {ppy:,.2f}".rstrip("0").rstrip(".") + " bars per year" in text
    assert "Definitions: returns are per-bar log returns net of costs" in text
    assert "Definitions: returns are per-bar log returns" in (report / "report.html").read_text()
    # A split before the last closes its last period on the next split's first bar: every
    # return belongs to one split (the one from the last validation bar was in none).
    val = evaluate_run(run_dir, split="validation")
    assert val["bars"] == setup.val_end - setup.train_end
    val_series = pd.read_csv(val["series"], index_col=0, parse_dates=True)
    assert val_series.index[-1] == pd.Timestamp(setup.market.timestamps[setup.val_end])
    # config.yaml edited to other positions of the same count: the shapes still fit, but each
    # action would now trade another position than the model learned (once evaluated silently).
    import yaml

    from foxhunt.errors import ConfigError

    assert json.loads((run_dir / "model.json").read_text())["trading_positions"] == [-1, 0, 1]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config.setdefault("trading", {})["positions"] = [-0.5, 0.0, 0.5]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"positions \[-1.0, 0.0, 1.0\], but config.yaml's"):
        evaluate_run(run_dir, split="test")


def test_next_position_acts_on_new_bars_causally(tmp_path: Path, caplog, capsys) -> None:
    """A run acts on its data grown by new bars with its own spans, normalisation and detector:
    the decision at a bar does not change when later bars arrive."""
    import foxhunt
    from foxhunt.errors import ConfigError
    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv

    full = write_synthetic_csv(tmp_path / "full.csv", SyntheticMarketConfig(n_bars=700), seed=3)
    frame = pd.read_csv(full)
    frame.iloc[:650].to_csv(tmp_path / "base.csv", index=False)
    overrides = {"learning_starts": 300, "hidden_sizes": [32, 32], "eval_interval": 0}
    spec = foxhunt.build_spec(data=tmp_path / "base.csv", total_steps=800, overrides=overrides)
    foxhunt.train_run(spec, tmp_path / "run", progress=False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="foxhunt.session"):
        now = foxhunt.next_position(tmp_path / "run")
    assert pd.Timestamp(now["timestamp"]) == pd.Timestamp(frame["timestamp"].iloc[649])
    assert now["position"] in (-1.0, 0.0, 1.0) and len(now["regime_probabilities"]) == 4
    assert now["new_bars"] == 0 and "no bars after those the run trained on" in caplog.text
    later = foxhunt.next_position(tmp_path / "run", data=full)
    assert pd.Timestamp(later["timestamp"]) == pd.Timestamp(frame["timestamp"].iloc[-1])
    assert later["new_bars"] == 50
    # The backtest over the grown data held, from bar 649 to 650, what was decided at 649.
    grown = foxhunt.evaluate_run(tmp_path / "run", data=full, split="test")
    series = pd.read_csv(grown["series"], index_col=0, parse_dates=True)
    held = series.loc[pd.Timestamp(frame["timestamp"].iloc[650]), "agent_position"]
    assert held == now["position"]
    # Deciding from the position actually held, which the observation carries.
    decisions = {p: foxhunt.next_position(tmp_path / "run", held=p) for p in (-1.0, 0.0, 1.0)}
    assert all(d["held"] == p for p, d in decisions.items())
    assert decisions[now["held"]]["position"] == now["position"]
    for bad in (0.5, True, 1 + 0j, np.array([1.0])):  # True and 1+0j equal 1.0, but are not
        with pytest.raises(ConfigError, match=r"held must be one of the run's positions"):
            foxhunt.next_position(tmp_path / "run", held=bad)  # type: ignore[arg-type]
    assert foxhunt.next_position(tmp_path / "run", held=-0.0)["held"] == 0.0
    assert foxhunt.next_position(tmp_path / "run", held=Fraction(1, 1))["held"] == 1.0
    # `foxhunt position`: the same decision as JSON, errors in the flags a user typed.
    from foxhunt import cli

    capsys.readouterr()
    assert cli.main(["position", str(tmp_path / "run"), "--data", str(full)]) == 0
    assert json.loads(capsys.readouterr().out) == later
    assert cli.main(["position", str(tmp_path / "run"), "--held", "1"]) == 0
    assert json.loads(capsys.readouterr().out) == decisions[1.0]
    for flags, needle in (
        (["--held", "0.5"], "--held must be one of the run's positions"),
        (["--max-std", "1"], "--max-std applies to ensembles"),
    ):
        assert cli.main(["position", str(tmp_path / "run"), *flags]) == 2
        assert needle in capsys.readouterr().err
    # A vendor's revised value among the trained bars (same times): still the run's history.
    revised = frame.copy()
    revised.loc[600, "volume"] *= 1.5
    revised.to_csv(tmp_path / "revised.csv", index=False)
    again = foxhunt.evaluate_run(tmp_path / "run", data=tmp_path / "revised.csv", split="test")
    assert again["bars"] == grown["bars"]  # the spans stay as trained, not split again
    assert "bars of the run's data" in caplog.text and "differ from when it trained" in caplog.text
    assert "in-sample" not in caplog.text  # the grown data's test span is after the trained bars
    assert "bar frequency" not in caplog.text  # days, as trained
    # The same bars an hour apart: a daily model backtested on hourly bars is said to be.
    hourly = frame.assign(timestamp=pd.date_range("2030-01-01", periods=len(frame), freq="h"))
    hourly.to_csv(tmp_path / "hourly.csv", index=False)
    foxhunt.evaluate_run(tmp_path / "run", data=tmp_path / "hourly.csv", split="test")
    assert "trained on about 365 a year" in caplog.text
    assert "trained on one bar frequency is backtested on another" in caplog.text
    # A file cut within the run's training span is split anew: its "test" span holds bars the
    # run trained on, which was reported as out of sample without a word.
    frame.iloc[:400].to_csv(tmp_path / "cut.csv", index=False)
    foxhunt.evaluate_run(tmp_path / "run", data=tmp_path / "cut.csv", split="test")
    assert "lie within the bars" in caplog.text and "the result is in-sample" in caplog.text
    # Appended bars that jump a month (a month-first date written into a day-first file
    # parses, as the wrong day): said, since nothing else fails.
    swapped = frame.iloc[:652].copy()
    stamps = pd.to_datetime(swapped["timestamp"])
    swapped.loc[651, "timestamp"] = str(stamps.iloc[650] + pd.Timedelta(days=30))
    swapped.to_csv(tmp_path / "swapped.csv", index=False)
    caplog.clear()
    foxhunt.next_position(tmp_path / "run", data=tmp_path / "swapped.csv")
    assert "new bar" in caplog.text and "check its date" in caplog.text
    caplog.clear()
    foxhunt.next_position(tmp_path / "run", data=full)  # one day apart: nothing to say
    assert "check its date" not in caplog.text
    frame.iloc[5:].to_csv(tmp_path / "other.csv", index=False)  # not the run's history
    with pytest.raises(ConfigError, match="does not start with the bars the run trained on"):
        foxhunt.next_position(tmp_path / "run", data=tmp_path / "other.csv")


def test_walk_forward_runs_train_each_fold_on_its_own_past(tmp_path: Path) -> None:
    import foxhunt
    from foxhunt.errors import ConfigError
    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv

    full = write_synthetic_csv(tmp_path / "full.csv", SyntheticMarketConfig(n_bars=700), seed=4)
    overrides = {"learning_starts": 300, "hidden_sizes": [32, 32], "eval_interval": 0}
    spec = foxhunt.build_spec(data=full, total_steps=600, overrides=overrides)
    table = foxhunt.walk_forward_runs(
        spec, tmp_path / "wf", n_folds=2, train_size=450, validation_size=100, test_size=120
    )
    stamps = pd.read_csv(full)["timestamp"].map(pd.Timestamp)
    # Back-to-back test windows, the last ending at the last bar; each fold's detector and
    # normalisation see only its first 350 bars (its data.json records where its spans end).
    # Periods traded: fold 0's last closes on fold 1's first test bar (its data holds that one
    # bar more); fold 1 ends at the data's last bar, which has no next close.
    assert list(table["test_bars"]) == [120, 119]
    assert pd.Timestamp(table["test_end"].iloc[-1]) == stamps.iloc[-1]
    assert pd.Timestamp(table["test_start"].iloc[1]) == stamps.iloc[len(stamps) - 120]
    for run_dir, rows in zip(table["run_dir"], (571, 570), strict=True):
        record = json.loads((Path(run_dir) / "data.json").read_text())
        assert (record["rows"], record["train_end"], record["val_end"]) == (rows, 350, 450)
    # Stitched, the folds' per-period series leave no return out: period end bars run on.
    ends = [
        pd.read_csv(Path(d) / "backtest" / "series.csv", index_col=0, parse_dates=True).index
        for d in table["run_dir"]
    ]
    stitched = ends[0].append(ends[1])
    first = len(stamps) - 240 + 1  # the end bar of fold 0's first period
    assert list(stitched) == list(stamps.iloc[first:])
    # Acting on new bars from a fold's run: the file from the fold's first bar on, as the
    # error says when it is given the whole file.
    fold = Path(table["run_dir"].iloc[1])
    with pytest.raises(ConfigError, match=r"a walk-forward fold trains on a slice.*frame.loc\["):
        foxhunt.next_position(fold, data=full)
    first = json.loads((fold / "data.json").read_text())["first"]
    whole = pd.read_csv(full, index_col=0, parse_dates=True)
    whole.loc[first:].to_csv(tmp_path / "from_fold.csv")
    assert foxhunt.next_position(fold, data=tmp_path / "from_fold.csv")["position"] in (-1, 0, 1)
    saved = pd.read_csv(tmp_path / "wf" / "walk_forward.csv")
    assert saved["agent_total_log_return"].tolist() == pytest.approx(
        table["agent_total_log_return"].tolist()
    )
    # Every input is checked before anything is written, every fold's too: a fold that training
    # would refuse left the folds before it trained and the directory unusable for a retry.
    for train_size, sizes, needle in (
        (450, {"validation_size": 450, "test_size": 120}, "validation_size must be between 1"),
        # one test bar: two with fold 0's closing bar, of the 3 a backtest needs
        (450, {"validation_size": 100, "test_size": 1}, r"fold 0 of 452 bars .*leave 2 test"),
        # two: fold 0 closes on fold 1's first bar (3 test bars), the last fold has 2 of 3
        (450, {"validation_size": 100, "test_size": 2}, r"fold 1 of 452 bars .*leave 2 test"),
        (60, {"validation_size": 10, "test_size": 20}, r"fold 0 .*trading.window=32 needs"),
        (450, {"validation_size": 100, "test_size": "120"}, "test_size must be a positive"),
    ):
        with pytest.raises(ConfigError, match=needle):
            foxhunt.walk_forward_runs(
                spec, tmp_path / "wf2", n_folds=2, train_size=train_size, **sizes
            )
        assert not (tmp_path / "wf2").exists()


def test_new_bars_that_break_the_spacing_are_said(caplog) -> None:
    """Business-day bars, then one on a Saturday (a swapped day and month can land there)."""
    from foxhunt.runs import _check_new_bar_times

    days = pd.bdate_range("2023-01-02", periods=150)  # ends on Friday 2023-07-28
    saturday = pd.DatetimeIndex([pd.Timestamp("2023-07-29")])
    _check_new_bar_times(days.append(saturday), 150, "f.csv")
    assert "new bar 2023-07-29 00:00:00 comes on a weekend" in caplog.text
    caplog.clear()
    _check_new_bar_times(days.append(pd.DatetimeIndex([days[-1] + pd.offsets.BDay()])), 150, "f")
    assert not caplog.text
    # Minute bars: a new session after a night or a weekend is a gap the history already holds.
    minutes = pd.DatetimeIndex(
        [t for d in pd.bdate_range("2024-01-01", periods=5) for t in
         pd.date_range(d + pd.Timedelta(hours=9, minutes=30), periods=390, freq="min")]
    )  # fmt: skip
    _check_new_bar_times(minutes, 4 * 390, "m.csv")  # day 5 appended: its first bar after a night
    assert not caplog.text
    # ... and a weekend the kept bars (Tuesday to Friday) never held: still not a swapped date.
    week = pd.DatetimeIndex([t for t in minutes if t.day_of_week > 0])
    monday = pd.date_range("2024-01-08 09:30", periods=390, freq="min")
    _check_new_bar_times(week.append(monday), len(week), "m.csv")
    assert not caplog.text


def test_next_position_keeps_the_trained_detector_and_checks_bars_appended_in_place(
    tmp_path: Path, caplog
) -> None:
    """A revised value inside the training span does not refit the regime detector or the
    feature normalisation the policy was trained with (a refit relabels the regimes and rescales
    every observation: other decisions, silently), and bars appended to the run's own file are
    checked as --data's are (a weekend bar is said)."""
    import foxhunt
    from foxhunt.errors import ConfigError
    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv

    full = write_synthetic_csv(tmp_path / "full.csv", SyntheticMarketConfig(n_bars=700), seed=3)
    frame = pd.read_csv(full).drop(columns=["regime", "regime_name"])
    days = pd.bdate_range("2020-01-01", periods=len(frame))  # no weekends in the history
    frame["timestamp"] = days.strftime("%Y-%m-%d")
    frame.iloc[:650].to_csv(tmp_path / "base.csv", index=False)
    overrides = {"learning_starts": 300, "hidden_sizes": [32, 32], "eval_interval": 0}
    overrides["market.features"] = ["ret_1", "vol_20"]
    spec = foxhunt.build_spec(data=tmp_path / "base.csv", total_steps=400, overrides=overrides)
    foxhunt.train_run(spec, tmp_path / "run", progress=False)
    frame.to_csv(tmp_path / "grown.csv", index=False)
    before = foxhunt.next_position(tmp_path / "run", data=tmp_path / "grown.csv")
    revised = frame.copy()
    revised.loc[100, ["open", "high", "low", "close"]] *= 1.05  # a training-span bar
    revised.to_csv(tmp_path / "revised.csv", index=False)
    caplog.clear()
    after = foxhunt.next_position(tmp_path / "run", data=tmp_path / "revised.csv")
    assert after["regime_probabilities"] == before["regime_probabilities"]
    kept = "the run's feature normalisation and regime detector are kept as trained"
    assert kept in caplog.text

    # The observations' features: after the revised bar's windows, as the policy's scale had
    # them (a refit on the revised rows moved every one: vol_20's std by a factor of about 3).
    from foxhunt.runs import build_trading, load_spec, read_data_record

    def features(data: Path) -> np.ndarray:
        run = tmp_path / "run"
        setup = build_trading(load_spec(run), data_override=data, recorded=read_data_record(run))
        return setup.market.features

    np.testing.assert_array_equal(
        features(tmp_path / "revised.csv")[200:], features(tmp_path / "grown.csv")[200:]
    )

    # evaluate on the run's own file, its values revised in place: the trained detector too.
    def detected() -> np.ndarray:  # the series file is rewritten by each evaluate
        series = foxhunt.evaluate_run(tmp_path / "run")["series"]
        return pd.read_csv(series)["detected_regime"].to_numpy()

    trained = detected()
    revised.iloc[:650].to_csv(tmp_path / "base.csv", index=False)
    caplog.clear()
    assert (detected() == trained).all()
    assert kept in caplog.text
    frame.iloc[:650].to_csv(tmp_path / "base.csv", index=False)
    # A new bar with a shifted decimal (x100) validates, but is said; real new bars are not.
    assert "check its prices" not in caplog.text
    shifted = frame.iloc[:651].copy()
    shifted.loc[650, ["open", "high", "low", "close"]] *= 100.0
    shifted.to_csv(tmp_path / "shifted.csv", index=False)
    foxhunt.next_position(tmp_path / "run", data=tmp_path / "shifted.csv")
    assert "new bar" in caplog.text and "check its prices (a shifted decimal" in caplog.text
    # Only the new bars: the whole history is asked for, not a bar count.
    frame.iloc[650:].to_csv(tmp_path / "new.csv", index=False)
    with pytest.raises(ConfigError, match="fewer than the 650 the run trained on"):
        foxhunt.next_position(tmp_path / "run", data=tmp_path / "new.csv")
    # The run's own file grown in place by a bar dated on a Saturday.
    weekend = frame.iloc[:651].copy()
    weekend.loc[650, "timestamp"] = str((days[649] + pd.offsets.Week(weekday=5)).date())
    weekend.to_csv(tmp_path / "base.csv", index=False)
    caplog.clear()
    final = foxhunt.next_position(tmp_path / "run")
    assert "comes on a weekend" in caplog.text
    # The latest checkpoint's weights act on the grown file too (they were refused as if
    # resumed: "has changed since the run trained"); at the end of training they are final's.
    latest = foxhunt.next_position(tmp_path / "run", model="latest")
    assert latest["model"] == "latest" and latest["new_bars"] == final["new_bars"] == 1
    assert latest["action"] == final["action"] and latest["held"] == final["held"]
    caplog.clear()  # a bad split is refused before the weights and the data are read
    with pytest.raises(ConfigError, match="split must be one of train, validation, test, all"):
        foxhunt.evaluate_run(tmp_path / "run", split="bogus", model="best")
    assert not caplog.text
