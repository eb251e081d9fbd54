"""Hyperparameter search: the space always validates, trials train and report, studies share
storage, the best configuration reproduces its trial, and bad inputs are one-line ConfigErrors.

Trials are CartPole-v1 runs of 600 environment steps with 8-32 unit networks (about a second each).
"""

from __future__ import annotations

import csv
import json
import math
import signal
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from foxhunt import hyperopt
from foxhunt.cli import main
from foxhunt.config import DQNHyperparameters
from foxhunt.errors import ConfigError, FoxhuntError
from foxhunt.hyperopt import objective, run_hyperopt, search_space, trial_seed
from foxhunt.runs import RunSpec, build_spec, make_envs
from foxhunt.trainer import DQNTrainer

torch.set_num_threads(1)
optuna.logging.set_verbosity(optuna.logging.WARNING)

TINY = {
    "hidden_sizes": [16],
    "batch_size": 16,
    "learning_starts": 64,
    "buffer_capacity": 1000,
    "train_freq": 4,
    "gradient_steps": 1,
    "eval_interval": 200,
    "eval_episodes": 2,
    "log_interval": 100,
    "device": "cpu",
}
STEPS = 600


def tiny_spec(total_steps: int = STEPS, **overrides: Any) -> RunSpec:
    return build_spec(env="CartPole-v1", overrides={**TINY, **overrides}, total_steps=total_steps)


def read_trials(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


# --- the search space -----------------------------------------------------------------------------
BASES = {
    "tiny": DQNHyperparameters(**{**TINY, "hidden_sizes": (16,)}),
    "default": DQNHyperparameters(),
    "cartpole": DQNHyperparameters.cartpole(),
    "rainbow": DQNHyperparameters.rainbow(),
    "trading": DQNHyperparameters.trading(),
    # Everything as small as validation allows: the space must raise what the batch outgrows.
    "tight": DQNHyperparameters(
        batch_size=1,
        buffer_capacity=1,
        learning_starts=1,
        hidden_sizes=(1, 3),
        train_freq=1,
        gradient_steps=1,
    ),
}


@pytest.mark.parametrize("name", sorted(BASES))
def test_every_sampled_config_validates(name: str) -> None:
    base = BASES[name]
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, multivariate=True)
    )
    seen_batches, seen_freqs = set(), set()
    for k in range(50):
        trial = study.ask()
        params = search_space(trial, base)
        hp = base.replace(**params)  # raises ConfigError if the space produced an invalid config
        eff = hp.batch_size * hp.gradient_accumulation_steps
        assert hp.learning_starts >= eff and hp.buffer_capacity >= eff
        assert hp.learning_starts >= base.learning_starts
        assert hp.batch_size in {max(1, base.batch_size // 2), base.batch_size, 2 * base.batch_size}
        assert hp.gradient_accumulation_steps in (1, 2, 4)
        assert len(hp.hidden_sizes) == len(base.hidden_sizes)
        assert 1e-5 <= hp.learning_rate <= 1e-2
        seen_batches.add(hp.batch_size)
        seen_freqs.add(hp.train_freq)
        # Tell a value so TPE leaves its random start-up phase and models the space.
        study.tell(trial, -abs(math.log10(hp.learning_rate) + 3.0) + k * 1e-6)
    assert len(seen_batches) > 1 and len(seen_freqs) > 1
    if base.noisy_nets:  # epsilon is unused with noisy nets, so it is not searched
        assert all("exploration_fraction" not in t.params for t in study.trials)


def test_search_space_derived_fields_by_hand() -> None:
    """Fixed samples on a known base, checked against values worked out by hand."""
    base = DQNHyperparameters(
        hidden_sizes=(256, 128),
        batch_size=64,
        learning_starts=100,
        buffer_capacity=200,
        train_freq=256,
        gradient_steps=128,
    )
    fixed = {
        "learning_rate": 3e-4,
        "batch_size": 64,
        "gradient_accumulation_steps": 4,
        "gamma": 0.98,
        "target_update_interval": 10,
        "max_grad_norm": 1.0,
        "n_step": 3,
        "dueling": True,
        "prioritized_replay": False,
        "exploration_fraction": 0.2,
        "train_freq": 8,
        "hidden_width": 512,
    }
    p = search_space(optuna.trial.FixedTrial(fixed), base)
    # effective batch 64 * 4 = 256 > learning_starts 100 and > buffer_capacity 200: both raised
    assert p["learning_starts"] == 256 and p["buffer_capacity"] == 256
    # widest layer 256 -> 512 doubles every layer, keeping the base's shape
    assert p["hidden_sizes"] == (512, 256)
    # base does 128 updates per 256 env steps = 0.5 per step: train_freq 8 -> 4 gradient steps
    assert p["gradient_steps"] == 4 and p["train_freq"] == 8
    hp = base.replace(**p)
    assert hp.gamma == 0.98 and hp.dueling and hp.n_step == 3
    # train_freq 1 would need 0.5 updates per round: never below one
    p1 = search_space(optuna.trial.FixedTrial({**fixed, "train_freq": 1}), base)
    assert p1["gradient_steps"] == 1


def test_trial_seeds_are_reproducible_and_distinct() -> None:
    seeds = [trial_seed(7, n) for n in range(200)]
    assert seeds == [trial_seed(7, n) for n in range(200)]
    assert len(set(seeds)) == 200
    assert trial_seed(0, 1) != trial_seed(1, 0)
    assert all(0 <= s < 2**31 for s in seeds)


# --- the objective --------------------------------------------------------------------------------
def test_objective_reports_each_evaluation_and_returns_final_eval() -> None:
    spec = tiny_spec()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=1))
    study.optimize(lambda t: objective(t, spec), n_trials=1)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.COMPLETE
    assert sorted(t.intermediate_values) == [200, 400, 600]  # eval_interval 200 of 600 steps
    assert all(math.isfinite(v) for v in t.intermediate_values.values())
    assert t.user_attrs["seed"] == trial_seed(spec.hyperparameters.seed, 0)
    assert DQNHyperparameters(**t.user_attrs["hyperparameters"]).seed == t.user_attrs["seed"]
    # CartPole pays 1 per step and every episode lasts at least 8 steps
    assert 8.0 <= t.value <= 500.0


def test_the_trial_value_is_the_final_evaluation_not_the_best_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evaluations that fall (100, 99, 98, then the final 97): the study must rank the trial by
    what its final weights score, not by its luckiest evaluation along the way."""
    from foxhunt.trainer import DQNTrainer

    real = DQNTrainer.evaluate
    calls: list[float] = []

    def falling(self: DQNTrainer, *args: Any, **kwargs: Any) -> float:
        real(self, *args, **kwargs)  # the evaluation still runs
        calls.append(100.0 - len(calls))
        return calls[-1]

    monkeypatch.setattr(DQNTrainer, "evaluate", falling)
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: objective(t, tiny_spec()), n_trials=1)
    (t,) = study.trials
    assert t.intermediate_values == {200: 100.0, 400: 99.0, 600: 98.0}
    assert calls == [100.0, 99.0, 98.0, 97.0] and t.value == 97.0


def test_pruner_stops_a_trial_at_its_first_report() -> None:
    spec = tiny_spec()
    # A threshold nobody reaches: the trial must stop at the first evaluation (env step 200).
    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=1e9)
    )
    study.optimize(lambda t: objective(t, spec), n_trials=1)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.PRUNED
    assert list(t.intermediate_values) == [200]
    assert "env step 200" in t.user_attrs["pruned_reason"]


def test_health_monitor_halt_prunes_with_reason() -> None:
    # |Q| of any untrained network exceeds 1e-9, so the first optimizer step halts training.
    spec = tiny_spec(q_divergence_bound=1e-9, q_divergence_policy="stop")
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: objective(t, spec), n_trials=1)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.PRUNED
    assert t.user_attrs["pruned_reason"].startswith("training halted:")


def test_names_the_user_fixed_are_not_searched() -> None:
    """--set values stay as set: only the other names are suggested (FixedTrial raises on a
    suggestion it was not given, so the missing keys prove they were never asked for)."""
    base = DQNHyperparameters(batch_size=16, learning_rate=5e-4, n_step=5, hidden_sizes=(64,))
    sampled = {
        "gradient_accumulation_steps": 2,
        "gamma": 0.99,
        "target_update_interval": 10,
        "max_grad_norm": 1.0,
        "dueling": True,
        "prioritized_replay": False,
        "exploration_fraction": 0.2,
        "train_freq": 8,
        "hidden_width": 128,
    }
    fixed = frozenset({"batch_size", "learning_rate", "n_step"})
    p = search_space(optuna.trial.FixedTrial(sampled), base, fixed)
    assert (p["batch_size"], p["learning_rate"], p["n_step"]) == (16, 5e-4, 5)
    assert p["hidden_sizes"] == (128,) and p["gamma"] == 0.99
    with pytest.raises(ValueError, match="batch_size"):  # unfixed, it is searched (and missing)
        search_space(optuna.trial.FixedTrial(sampled), base, fixed - {"batch_size"})
    p = search_space(optuna.trial.FixedTrial(sampled), base, fixed | {"hidden_sizes"})
    assert p["hidden_sizes"] == (64,)


def test_invalid_sample_is_pruned_not_crashed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hyperopt, "search_space", lambda trial, base, fixed: {"batch_size": 0})
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: objective(t, tiny_spec()), n_trials=1)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.PRUNED
    assert "batch_size must be greater than 0, got: 0" in t.user_attrs["pruned_reason"]


def test_no_completed_trial_is_an_error_naming_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hyperopt, "search_space", lambda trial, base, fixed: {"batch_size": 0})
    with pytest.raises(FoxhuntError, match=r"no trial completed.*invalid configuration"):
        run_hyperopt(tiny_spec(), n_trials=2, run_dir=tmp_path)
    rows = read_trials(tmp_path / "trials.csv")
    assert [r["state"] for r in rows] == ["PRUNED", "PRUNED"]
    assert not (tmp_path / "best_config.yaml").exists()


def test_a_budget_no_trial_can_learn_in_is_refused_before_any_trial(tmp_path: Path) -> None:
    # learning_starts 64 > the 50 steps of the budget, and the search never lowers
    # learning_starts: every trial was pruned, one by one, for as many as asked (hours of them).
    with pytest.raises(ConfigError, match=r"total_env_steps 50 ends before learning_starts 64"):
        run_hyperopt(tiny_spec(total_steps=50), n_trials=3, run_dir=tmp_path)
    assert not (tmp_path / "trials.csv").exists()


def test_a_trial_whose_batch_outgrows_the_budget_is_pruned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A large effective batch raises a trial's learning_starts past what the budget reaches.
    far = {"learning_starts": 10 * STEPS, "buffer_capacity": 10 * STEPS}
    monkeypatch.setattr(hyperopt, "search_space", lambda trial, base, fixed: far)
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: objective(t, tiny_spec()), n_trials=1)
    (t,) = study.trials
    assert t.state == optuna.trial.TrialState.PRUNED
    assert "no optimizer step would run" in t.user_attrs["pruned_reason"]


# --- the study ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kept", ["learning_starts", "buffer_capacity"])
def test_a_kept_learning_starts_or_buffer_bounds_the_searched_batch(kept: str) -> None:
    # --set learning_starts=100 beside a batch searched up to 2 x 64 x 4: every trial was
    # pruned as invalid.
    base = DQNHyperparameters(batch_size=64, learning_starts=100, buffer_capacity=5000)
    base = base.replace(**{kept: 100})
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    effective = set()
    for _ in range(40):
        trial = study.ask()
        hp = base.replace(**search_space(trial, base, frozenset({kept})))
        assert getattr(hp, kept) == 100
        effective.add(hp.batch_size * hp.gradient_accumulation_steps)
        # What Optuna records (trials.csv, the sampler's model) is what trains.
        pair = f"{hp.batch_size}x{hp.gradient_accumulation_steps}"
        assert trial.params["batch_size_x_accumulation"] == pair
        assert "batch_size" not in trial.params
        study.tell(trial, 0.0)
    assert max(effective) <= 100 and len(effective) > 1  # still searched, within the bound


def test_study_writes_files_and_best_config_reproduces_the_trial(tmp_path: Path) -> None:
    spec = tiny_spec()
    out = run_hyperopt(spec, n_trials=2, run_dir=tmp_path / "hpo", sampler_seed=3)
    assert out["trials"] == 2 and out["complete"] + out["pruned"] + out["failed"] == 2
    json.dumps(out)  # the CLI prints it
    rows = read_trials(tmp_path / "hpo" / "trials.csv")
    assert [int(r["number"]) for r in rows] == [0, 1]
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    assert out["best_value"] == max(float(r["value"]) for r in complete)
    assert {int(r["seed"]) for r in rows} == {trial_seed(0, 0), trial_seed(0, 1)}
    assert "param_learning_rate" in rows[0] and "param_hidden_width" in rows[0]

    # best_config.yaml is a full run spec that `foxhunt train --config` accepts ...
    best = build_spec(config_file=str(tmp_path / "hpo" / "best_config.yaml"))
    assert best.env == "CartPole-v1" and best.total_env_steps == STEPS
    assert best.hyperparameters == DQNHyperparameters(**out["best_hyperparameters"])
    assert best.hyperparameters.seed == trial_seed(0, out["best_trial"])
    # ... and training it again gives exactly the trial's score (same seed, same everything).
    train_env, eval_env, _ = make_envs(best)
    trainer = DQNTrainer(best.hyperparameters, train_env, eval_env=eval_env)
    trainer.learn(best.total_env_steps)
    assert trainer.evaluate() == out["best_value"]
    trainer.close()


def test_trials_csv_says_why_each_trial_did_not_complete() -> None:
    study = optuna.create_study(direction="maximize")
    pruned = study.ask()
    pruned.set_user_attr("pruned_reason", "invalid configuration: x")
    study.tell(pruned, state=optuna.trial.TrialState.PRUNED)
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # as a stale heartbeat marks it
    rows = list(csv.DictReader(hyperopt._trials_csv(study).splitlines()))
    assert rows[0]["reason"] == "invalid configuration: x"
    assert rows[1]["state"] == "FAIL" and "worker stopped" in rows[1]["reason"]


def test_a_trading_best_config_reproduces_the_trial(tmp_path: Path) -> None:
    """Trials share the market fitted with the search's seed; best_config.yaml held only the
    trial's seed, so `foxhunt train --config` fitted the HMM another way and scored otherwise."""
    import numpy as np

    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv

    data = write_synthetic_csv(tmp_path / "m.csv", SyntheticMarketConfig(n_bars=800), seed=1)
    overrides = {**TINY, "hidden_sizes": [16, 16], "eval_interval": 300, "eval_episodes": 1}
    spec = build_spec(data=str(data), overrides=overrides, total_steps=300)
    np.random.seed(5)
    expected = np.random.random()
    np.random.seed(5)
    out = run_hyperopt(spec, n_trials=1, run_dir=tmp_path / "hpo", sampler_seed=0)
    assert np.random.random() == expected  # the caller's global RNG as it was (trials seed it)
    assert out["complete"] == 1
    best = build_spec(config_file=str(tmp_path / "hpo" / "best_config.yaml"))
    assert best.hyperparameters.seed == trial_seed(0, 0) != 0
    assert best.market.detector_seed == 0
    train_env, eval_env, setup = make_envs(best)
    np.testing.assert_array_equal(setup.market.regime_probs, make_envs(spec)[2].market.regime_probs)
    trainer = DQNTrainer(best.hyperparameters, train_env, eval_env=eval_env)
    trainer.learn(best.total_env_steps)
    assert trainer.evaluate() == out["best_value"]
    trainer.close()


def test_continuing_a_study_with_its_sampler_seed_draws_new_configurations(
    tmp_path: Path,
) -> None:
    """The documented way to continue a search is the same command again: with the seed alone,
    TPE's random start-up drew the first trials' configurations again (trials 2 and 3 were
    trials 0 and 1). The continuation is still reproducible."""

    def params(storage: str) -> list[dict[str, Any]]:
        for _ in range(2):
            run_hyperopt(tiny_spec(), n_trials=2, storage=storage, sampler_seed=7)
        study = optuna.load_study(study_name="foxhunt", storage=storage)
        return [t.params for t in study.trials]

    first = params(f"sqlite:///{tmp_path}/a.db")
    assert len(first) == 4 and first[2] not in first[:2] and first[3] not in first[:2]
    assert params(f"sqlite:///{tmp_path}/b.db") == first


def test_an_interrupted_trial_runs_again_when_the_study_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in a trial queues its configuration: the continued study runs it first, with the
    interrupted trial's seed, so it scores what that trial would have."""
    from foxhunt.trainer import DQNTrainer, TrainingInterrupted

    storage = f"sqlite:///{tmp_path}/study.db"
    learn = DQNTrainer.learn

    def interrupt(self: DQNTrainer, *args: object, **kwargs: object) -> object:
        raise TrainingInterrupted(self.env_steps, None, signal.SIGTERM)

    monkeypatch.setattr(DQNTrainer, "learn", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_hyperopt(tiny_spec(), n_trials=2, storage=storage, sampler_seed=5)
    monkeypatch.setattr(DQNTrainer, "learn", learn)
    run_hyperopt(tiny_spec(), n_trials=1, storage=storage, sampler_seed=5)
    stopped, rerun = optuna.load_study(study_name="foxhunt", storage=storage).trials
    assert stopped.state == optuna.trial.TrialState.FAIL
    assert rerun.state == optuna.trial.TrialState.COMPLETE
    assert rerun.params == stopped.params and rerun.user_attrs["rerun_of"] == 0
    assert rerun.user_attrs["seed"] == stopped.user_attrs["seed"]
    straight = run_hyperopt(tiny_spec(), n_trials=1, sampler_seed=5)  # never interrupted
    assert straight["best_params"] == rerun.params and straight["best_value"] == rerun.value


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_shared_storage_accumulates_trials(tmp_path: Path, kind: str) -> None:
    storage = (
        f"sqlite:///{tmp_path}/study.db" if kind == "sqlite" else f"journal:{tmp_path}/study.log"
    )
    spec = tiny_spec()
    first = run_hyperopt(spec, n_trials=1, storage=storage, study_name="shared", sampler_seed=1)
    second = run_hyperopt(spec, n_trials=1, storage=storage, study_name="shared", sampler_seed=2)
    assert first["trials"] == 1 and second["trials"] == 2
    assert second["storage"] == storage
    stored = optuna.load_study(study_name="shared", storage=hyperopt.open_storage(storage))
    assert [t.number for t in stored.trials] == [0, 1]
    assert second["best_value"] == max(t.value for t in stored.trials if t.value is not None)
    # A worker with another task must not join the study.
    with pytest.raises(ConfigError, match=r"total_env_steps=700 \(study has 600\)"):
        run_hyperopt(tiny_spec(total_steps=700), n_trials=1, storage=storage, study_name="shared")
    # ... but one on another device may (device is a system setting, not part of the task).
    assert hyperopt._task(tiny_spec(device="auto")) == hyperopt._task(spec)
    # Nor one that searches what the study keeps fixed, even at the same value.
    gamma = spec.hyperparameters.gamma
    with pytest.raises(ConfigError, match=r"fixed=\['gamma'\] \(study has \[\]\)"):
        run_hyperopt(
            tiny_spec(gamma=gamma),
            n_trials=1,
            storage=storage,
            study_name="shared",
            fixed={"gamma"},
        )


def test_a_study_recorded_before_fixed_names_still_opens(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/old.db"
    study = optuna.create_study(storage=storage, study_name="old", direction="maximize")
    old_task = hyperopt._task(tiny_spec())
    del old_task["fixed"]
    study.set_user_attr(hyperopt._ATTR_TASK, old_task)
    out = run_hyperopt(tiny_spec(), n_trials=1, storage=storage, study_name="old")
    assert out["trials"] == 1


def test_the_run_dir_check_knows_a_database_by_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:///s.db from two directories is two studies; the same file by its absolute path
    is the same study."""
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path / "x")
    out = tmp_path / "out"
    run_hyperopt(tiny_spec(), n_trials=1, storage="sqlite:///s.db", study_name="s", run_dir=out)
    kept = (out / "best_config.yaml").read_text()
    again = f"sqlite:///{tmp_path / 'x' / 's.db'}"
    run_hyperopt(tiny_spec(), n_trials=1, storage=again, study_name="s", run_dir=out)
    assert "best of 2 complete trials" in (out / "best_config.yaml").read_text()
    # A study.json written before storages were recorded by absolute path: still continued.
    legacy = {"study_name": "s", "storage": "sqlite:///s.db"}
    (out / "study.json").write_text(json.dumps(legacy))
    run_hyperopt(tiny_spec(), n_trials=1, storage="sqlite:///s.db", study_name="s", run_dir=out)
    assert json.loads((out / "study.json").read_text())["storage"] == again  # rewritten
    monkeypatch.chdir(tmp_path / "y")
    with pytest.raises(ConfigError, match="already holds another search's results"):
        run_hyperopt(tiny_spec(), n_trials=1, storage="sqlite:///s.db", study_name="s", run_dir=out)
    assert (out / "best_config.yaml").read_text() != kept  # the continued study's, not y's


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_storage_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="in-memory"):
        run_hyperopt(tiny_spec(), n_trials=1, storage=url)


def test_a_missing_database_driver_is_named() -> None:
    reason = hyperopt._storage_reason(
        ImportError(
            "Failed to import DB access module for the specified storage URL. Please "
            "install appropriate one."
        ),
        "postgresql://u:p@h/db",
    )
    assert reason == "its database driver is not installed: pip install 'psycopg[binary]'"
    err = ImportError("Failed to import DB access module for the specified storage URL.")
    assert hyperopt._storage_reason(err, "mysql+pymysql://h/db").endswith("pip install pymysql")
    assert hyperopt._storage_reason(err, "mysql://h/db").endswith("pip install mysqlclient")


@pytest.mark.parametrize(
    "url",
    [
        "notaurl",
        "nosuchdialect://host/db",
        "sqlite:////nonexistent-foxhunt-dir/study.db",
        "journal:/nonexistent-foxhunt-dir/study.log",
        "postgresql://user:s3cret@localhost:1/db",
        "",
    ],
)
def test_bad_storage_is_a_one_line_config_error(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        run_hyperopt(tiny_spec(), n_trials=1, storage=url)
    msg = str(info.value)
    assert "\n" not in msg and "storage" in msg
    assert "s3cret" not in msg  # passwords are never echoed
    assert url.split("//")[-1].split("@")[-1][:10] in msg  # the value is named


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="n_trials must be a positive integer, got: 0"):
        run_hyperopt(tiny_spec(), n_trials=0)
    with pytest.raises(ConfigError, match="--run-dir must be a directory"):
        run_hyperopt(tiny_spec(), n_trials=1, run_dir=tmp_path / "file")
    for seed in (-1, 2**32, 1.5, True):  # refused before any env is built, not NumPy's error
        with pytest.raises(ConfigError, match=r"sampler_seed must be None or an integer in"):
            run_hyperopt(tiny_spec(), n_trials=1, sampler_seed=seed)  # type: ignore[arg-type]


# --- the CLI --------------------------------------------------------------------------------------
def test_cli_hyperopt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "hpo"
    sets = [f"{k}={json.dumps(v)}" for k, v in {**TINY, "hidden_sizes": [32]}.items()]
    argv = [
        "hyperopt",
        "--env",
        "CartPole-v1",
        "--trials",
        "2",
        "--total-steps",
        str(STEPS),
        "--run-dir",
        str(run_dir),
    ]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trials"] == 2 and out["best_hyperparameters"]["hidden_sizes"][0] in (16, 32, 64)
    assert (run_dir / "best_config.yaml").is_file() and (run_dir / "trials.csv").is_file()
    assert "`foxhunt evaluate` scores held-out ones" in (run_dir / "best_config.yaml").read_text()

    # Another search into the same directory is refused: it would overwrite these results.
    assert main([*argv, "--trials", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--run-dir already holds another search's results (best_config.yaml, trials.csv" in err
    assert len((run_dir / "trials.csv").read_text().splitlines()) == 3  # untouched
    # resume / evaluate / report on it said "metrics.csv does not exist" and the like.
    for command in ("resume", "evaluate", "report"):
        assert main([command, str(run_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert "holds a hyperparameter search's results, not a run" in err, command
        assert "foxhunt train --config" in err and "best_config.yaml" in err

    assert main([*argv, "--storage", "notaurl", "--run-dir", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("foxhunt: error: storage") and "notaurl" in err and "\n" not in err

    # A stored study continues into its own directory; --force replaces another search.
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    stored = [*argv, "--trials", "1", "--storage", storage, "--run-dir", str(tmp_path / "s")]
    assert main(stored) == 0 and main(stored) == 0
    capsys.readouterr()
    assert len((tmp_path / "s" / "trials.csv").read_text().splitlines()) == 3  # both trials
    assert main([*stored, "--study-name", "other"]) == 2
    assert main([*argv, "--trials", "1", "--force"]) == 0
    assert len((run_dir / "trials.csv").read_text().splitlines()) == 2


def test_ctrl_c_stops_the_study_and_keeps_the_finished_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during the second trial: that trial fails (pruned, it counted as a bad
    configuration and never ran again) and is queued to run again, no third starts, the first
    one's results are written, then the interrupt goes on to the caller (the CLI exits 130)."""
    from foxhunt.trainer import DQNTrainer, TrainingInterrupted

    learn = DQNTrainer.learn
    calls = {"n": 0}

    def interrupt_second(self: DQNTrainer, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise TrainingInterrupted(self.env_steps, None)
        return learn(self, *args, **kwargs)

    monkeypatch.setattr(DQNTrainer, "learn", interrupt_second)
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_hyperopt(tiny_spec(), n_trials=3, run_dir=tmp_path)
    assert calls["n"] == 2  # the study stopped: no third trial
    assert stopped.value.signum == signal.SIGINT  # type: ignore[attr-defined]
    rows = read_trials(tmp_path / "trials.csv")
    assert [r["state"] for r in rows] == ["COMPLETE", "FAIL", "WAITING"]
    assert (
        rows[1]["reason"] == "interrupted (Ctrl-C); queued to run again as the study's next trial"
    )
    assert rows[2]["reason"] == "runs trial 1 again (it was interrupted)"
    assert (tmp_path / "best_config.yaml").is_file()
    # SIGTERM (kill, a scheduler) is told apart, so the CLI exits 143 as training does.
    calls["n"] = 0

    def terminate_second(self: DQNTrainer, *args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 2:
            raise TrainingInterrupted(self.env_steps, None, signal.SIGTERM)
        return learn(self, *args, **kwargs)

    monkeypatch.setattr(DQNTrainer, "learn", terminate_second)
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_hyperopt(tiny_spec(), n_trials=3, run_dir=tmp_path / "term")
    assert stopped.value.signum == signal.SIGTERM  # type: ignore[attr-defined]
    rows = read_trials(tmp_path / "term" / "trials.csv")
    assert rows[1]["reason"].startswith("terminated (SIGTERM); queued")


def test_run_hyperopt_from_python_keeps_other_results(tmp_path: Path) -> None:
    """The CLI refused these directories; the Python entry point wrote over them."""
    from foxhunt.errors import ConfigError

    first = run_hyperopt(tiny_spec(), n_trials=1, run_dir=tmp_path / "s")
    kept = (tmp_path / "s" / "best_config.yaml").read_text()
    with pytest.raises(ConfigError, match="already holds another search's results"):
        run_hyperopt(tiny_spec(), n_trials=1, run_dir=tmp_path / "s")
    assert (tmp_path / "s" / "best_config.yaml").read_text() == kept
    assert run_hyperopt(tiny_spec(), n_trials=1, run_dir=tmp_path / "s", force=True)
    (tmp_path / "ens").mkdir()
    (tmp_path / "ens" / "ensemble.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds a training run or an ensemble \(ensemble.json"):
        run_hyperopt(tiny_spec(), n_trials=1, run_dir=tmp_path / "ens", force=True)
    assert sorted(p.name for p in (tmp_path / "ens").iterdir()) == ["ensemble.json"]
    assert first["trials"] == 1


def test_ctrl_c_outside_training_keeps_the_finished_trials_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C lands as often while a trial's trainer is built (seconds of lazy imports) or
    between trials, in Optuna's bookkeeping: the finished trials' files were lost."""
    from foxhunt.trainer import DQNTrainer

    build = DQNTrainer.__init__
    calls = {"n": 0}

    def interrupt_third(self: DQNTrainer, *args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        build(self, *args, **kwargs)

    monkeypatch.setattr(DQNTrainer, "__init__", interrupt_third)
    with pytest.raises(KeyboardInterrupt) as stopped:
        run_hyperopt(tiny_spec(), n_trials=4, run_dir=tmp_path / "build")
    assert stopped.value.signum == signal.SIGINT  # type: ignore[attr-defined]
    rows = read_trials(tmp_path / "build" / "trials.csv")
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE", "FAIL", "WAITING"]
    assert rows[2]["reason"].startswith("interrupted (Ctrl-C)")
    assert (tmp_path / "build" / "best_config.yaml").is_file()
    monkeypatch.setattr(DQNTrainer, "__init__", build)
    # Between trials: the interrupt comes out of Optuna (its storage writes), not a trial.
    seen = {"n": 0}
    ask = optuna.Study.ask

    def interrupt_third_ask(self: optuna.Study, *args: object, **kwargs: object) -> object:
        seen["n"] += 1
        if seen["n"] == 3:
            raise KeyboardInterrupt
        return ask(self, *args, **kwargs)

    monkeypatch.setattr(optuna.Study, "ask", interrupt_third_ask)
    with pytest.raises(KeyboardInterrupt):
        run_hyperopt(tiny_spec(), n_trials=4, run_dir=tmp_path / "between")
    assert len((tmp_path / "between" / "trials.csv").read_text().splitlines()) == 3  # 2 trials
    assert (tmp_path / "between" / "best_config.yaml").is_file()


def test_workers_racing_to_create_a_new_database_both_join(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers started together on a new sqlite file: the one that loses the race to
    create its tables sees an IntegrityError; it tries again and joins the study, while a real
    storage error is still one line at once."""
    import sqlalchemy.exc

    from foxhunt import hyperopt as ho

    create = optuna.create_study
    calls = {"n": 0}

    def lose_once(*args: object, **kwargs: object) -> optuna.Study:
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlalchemy.exc.IntegrityError(
                "INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed")
            )
        return create(*args, **kwargs)

    monkeypatch.setattr(optuna, "create_study", lose_once)
    monkeypatch.setattr(ho.time, "sleep", lambda s: None)
    study = ho._open_study(tiny_spec(), f"sqlite:///{tmp_path / 's.db'}", "x", 0)
    assert calls["n"] == 2 and study.study_name == "x"
    # a crashed worker's running trial is failed by the heartbeat, not left RUNNING for ever
    assert study._storage.get_heartbeat_interval() == ho._HEARTBEAT_S
    built = {"n": 0}
    rdb = optuna.storages.RDBStorage

    def count(*args: object, **kwargs: object) -> object:
        built["n"] += 1
        return rdb(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", count)
    with pytest.raises(ConfigError, match="storage cannot be opened"):
        ho._open_study(tiny_spec(), f"sqlite:///{tmp_path / 'no' / 'dir' / 's.db'}", "x", 0)
    assert built["n"] == 1  # a real storage error is not retried


def test_a_trial_at_the_end_of_its_budget_completes_rather_than_being_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pruning saves budget only before the end: a trial whose report comes at its last env
    step is complete, and its value goes to the sampler."""
    monkeypatch.setattr(optuna.trial.Trial, "should_prune", lambda self: True)
    with pytest.raises(FoxhuntError, match="no trial completed"):  # pruned half way, each
        run_hyperopt(tiny_spec(eval_interval=STEPS // 2), n_trials=2, run_dir=tmp_path)
    rows = read_trials(tmp_path / "trials.csv")
    assert all(r["state"] == "PRUNED" and "env step 300" in r["reason"] for r in rows), rows
    spec = tiny_spec(eval_interval=STEPS)  # the only report is at the last step
    out = run_hyperopt(spec, n_trials=2, run_dir=tmp_path / "last")
    assert out["complete"] == 2 and out["pruned"] == 0
