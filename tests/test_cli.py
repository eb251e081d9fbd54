"""End-to-end smoke test of the command line: train -> evaluate -> report, and the help texts.

One tiny CartPole run (1500 env steps, seconds on one thread) checked against what the run
directory promises (see foxhunt.runs): config, metrics with every column, final and best models,
checkpoints, summary. The optimizer-step count is derived by hand from the schedule.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from _helpers import ForkedCli
from safetensors.torch import load_file

from foxhunt.cli import build_parser
from foxhunt.logging import METRIC_COLUMNS

SRC = Path(__file__).resolve().parents[1] / "src"
TOTAL, LEARNING_STARTS, TRAIN_FREQ = 1500, 200, 4
TINY = {
    "hidden_sizes": "[32,32]",
    "learning_starts": LEARNING_STARTS,
    "batch_size": 32,
    "gradient_accumulation_steps": 1,
    "buffer_capacity": 5000,
    "train_freq": TRAIN_FREQ,
    "gradient_steps": 1,
    "target_update_interval": 50,
    "log_interval": 100,
    "eval_interval": 500,
    "eval_episodes": 2,
    "torch_threads": 1,
    "device": "cpu",
}


_server: list[ForkedCli] = []


@pytest.fixture(scope="module", autouse=True)
def _close_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    _server.append(ForkedCli(tmp_path_factory.mktemp("cli-io")))
    yield
    _server.pop().close()


def foxhunt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``foxhunt ARGS`` in its own process: a child forked from a server that imported foxhunt
    once (tests/_helpers.py), which saves the ~2 s torch import per command. Exit code, stdout
    and stderr are the console script's; ``real_foxhunt`` starts a fresh interpreter."""
    res = _server[0](*args, cwd=cwd, timeout=300)
    return subprocess.CompletedProcess(["foxhunt", *args], res.code, res.stdout, res.stderr)


def real_foxhunt(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=300,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    out = foxhunt(
        "train",
        "--env",
        "CartPole-v1",
        "--total-steps",
        str(TOTAL),
        "--seed",
        "1",
        "--run-dir",
        "run",
        "--no-progress",
        *sets,
        cwd=root,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    # --no-progress hides the live display only: where the run went and its summary still print.
    assert "foxhunt: run run |" in out.stdout and "training summary" in out.stdout
    # The run line says where the hyperparameters came from.
    assert f"| preset classic + {len(TINY)} --set |" in out.stdout
    summary = json.loads((root / "run" / "summary.json").read_text())
    # Where the best evaluation beat the last, the summary says how to score its weights.
    hint = "--model best`" in out.stdout
    assert hint == (summary["best_eval_return"] > summary["last_eval_return"])
    return root / "run"


def test_train_writes_the_promised_run_directory(run: Path) -> None:
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["env"] == "CartPole-v1" and config["total_env_steps"] == TOTAL
    hp = config["hyperparameters"]
    assert hp["seed"] == 1 and hp["hidden_sizes"] == [32, 32] and hp["batch_size"] == 32

    with open(run / "metrics.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == list(METRIC_COLUMNS)
        rows = list(reader)
    assert [int(r["env_steps"]) for r in rows] == list(range(100, TOTAL + 1, 100))
    # Every column carries data somewhere (beta only with prioritized replay).
    filled = {c for r in rows for c, v in r.items() if v != ""}
    assert filled == set(METRIC_COLUMNS) - {"beta"}
    assert [r["eval_return"] != "" for r in rows] == [s % 500 == 0 for s in range(100, 1501, 100)]

    # Updates: one per 4 env steps from step LEARNING_STARTS on (step 200 included).
    updates = (TOTAL - LEARNING_STARTS) // TRAIN_FREQ + 1
    assert int(rows[-1]["optimizer_steps"]) == updates
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == TOTAL and summary["optimizer_steps"] == updates
    assert summary["episodes"] == int(rows[-1]["episodes"]) > 0
    assert summary["best_eval_return"] >= summary["last_eval_return"] > 0

    meta = json.loads((run / "model.json").read_text())
    assert (meta["format"], meta["obs_dim"], meta["n_actions"]) == ("foxhunt-model", 4, 2)
    final = load_file(str(run / "model.safetensors"))
    best = load_file(str(run / "best_model.safetensors"))
    assert final.keys() == best.keys() and len(final) >= 6
    assert any(k.endswith("weight") and v.shape[-1] == 4 for k, v in final.items())
    assert (run / "checkpoints" / f"step-{TOTAL:012d}" / "manifest.json").is_file()


def test_evaluate_scores_the_trained_agent(run: Path) -> None:
    out = foxhunt("evaluate", str(run), "--episodes", "2", cwd=run.parent)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    saved = json.loads((run / "evaluation.json").read_text())
    assert printed == saved
    assert saved["env"] == "CartPole-v1" and saved["episodes"] == 2
    assert 1.0 <= saved["mean_return"] <= 500.0  # CartPole-v1 returns lie in [1, 500]
    assert saved["model"] == "final" and len(saved["returns"]) == 2
    assert saved["mean_return"] == pytest.approx(sum(saved["returns"]) / 2)
    # The best weights' score goes beside the final one's, never over it.
    best = foxhunt("evaluate", str(run), "--episodes", "2", "--model", "best", cwd=run.parent)
    assert best.returncode == 0, best.stderr
    assert json.loads((run / "evaluation_best.json").read_text())["model"] == "best"
    assert json.loads((run / "evaluation.json").read_text()) == saved


def test_best_without_best_weights_is_scored_in_its_own_file(run: Path, tmp_path: Path) -> None:
    """A run that kept no best weights scores its final ones for --model best, in
    evaluation_best.json (saying so), and leaves evaluation.json alone."""
    from foxhunt import evaluate_run

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "best_model.safetensors").unlink()
    (copy / "evaluation.json").write_text('{"mine": 1}')
    out = evaluate_run(copy, episodes=2, model="best")
    assert (out["model"], out["model_requested"]) == ("final", "best")
    assert json.loads((copy / "evaluation_best.json").read_text()) == out
    assert json.loads((copy / "evaluation.json").read_text()) == {"mine": 1}


def test_summary_says_how_long_the_evaluations_took(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["eval_time_s"] < summary["wall_time_s"]


def test_report_writes_index_and_plots(run: Path) -> None:
    out = foxhunt("report", str(run), cwd=run.parent)
    assert out.returncode == 0, out.stderr
    index = run / "report" / "index.html"
    assert f"report written: {index}" in out.stdout
    html = index.read_text()
    pngs = sorted((run / "report").glob("*.png"))
    assert {"loss.png", "returns.png"} <= {p.name for p in pngs}
    for png in pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.name in html


def test_train_help_runs_as_a_process(tmp_path: Path) -> None:
    out = real_foxhunt("train", "--help", cwd=tmp_path)
    assert out.returncode == 0 and out.stderr == ""
    for flag in ("--env", "--data", "--config", "--set", "--total-steps", "--run-dir", "--seed"):
        assert flag in out.stdout


@pytest.mark.parametrize(
    ("argv", "choices"),
    [
        ([], "{train,resume,evaluate,"),
        (["ensemble"], "{train,resume,evaluate}"),
        (["data"], "{synth}"),
    ],
)
def test_a_missing_command_is_named_by_its_choices(
    argv: list[str], choices: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was named by argparse's dest ("ensemble_command"), a word no user typed, and the usage
    line that lists the choices is not printed."""
    from foxhunt.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"are required: {choices}" in err and "_command" not in err


def test_total_steps_help_gives_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    from foxhunt.cli import main
    from foxhunt.runs import DEFAULT_TOTAL_STEPS

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{DEFAULT_TOTAL_STEPS['trading']:,} for trading" in text
    assert f"{DEFAULT_TOTAL_STEPS['gym']:,} for a Gymnasium env" in text


def test_python_dash_m_foxhunt_is_the_command(tmp_path: Path) -> None:
    """``python -m foxhunt`` runs the CLI (exit codes and one-line errors included)."""
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "foxhunt", *args]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env)

    ok = run("--help")
    assert ok.returncode == 0 and ok.stdout.startswith("usage: foxhunt")
    bad = run("evaluate", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "missing" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("command", ["resume", "evaluate", "position", "report", "hyperopt"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    assert f"usage: foxhunt {command}" in capsys.readouterr().out


def test_filesystem_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from foxhunt.cli import main

    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code = main(["train", "--env", "CartPole-v1", "--run-dir", str(blocker / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("foxhunt: error: Not a directory") and str(blocker) in err
    assert "\n" not in err and "Traceback" not in err


def test_broken_symlinks_on_the_way_to_an_output_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dangling or looping symlink as (or above) --run-dir failed as "File exists", which
    reads as a run already being there; hyperopt said so only after its search had run."""
    from foxhunt.cli import main

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    loop, under_dangling = str(tmp_path / "loop"), str(tmp_path / "dangling" / "run")
    cases = {
        ("train", "--env", "CartPole-v1", "--run-dir", loop): "symlink loop",
        ("train", "--run-dir", under_dangling): f"dangling symlink (to {tmp_path / 'gone'}",
        ("hyperopt", "--env", "CartPole-v1", "--trials", "1", "--run-dir", loop): "symlink loop",
        ("data", "synth", "--out", str(tmp_path / "loop" / "m.csv")): "symlink loop",
    }
    for argv, said in cases.items():
        assert main(list(argv)) == 2, argv
        err = capsys.readouterr().err.strip()
        assert said in err and err.startswith("foxhunt: error: --"), err
        assert "\n" not in err and "Trial" not in err
    assert not (tmp_path / "gone").exists()
    assert main(["data", "synth", "--out", str(tmp_path / "dangling"), "--bars", "50"]) == 2
    assert "must end in .csv" in capsys.readouterr().err  # the file itself: replaced, not refused


def test_data_paths_are_stored_absolute_and_config_sections_stand_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`foxhunt evaluate` may run elsewhere: --data is stored absolute, and a config file's
    market.data is read relative to the config file. A file with only a trading: section is a
    sectioned config (not a hyperparameter named 'trading')."""
    from foxhunt.errors import ConfigError
    from foxhunt.runs import build_spec

    (tmp_path / "conf").mkdir()
    monkeypatch.chdir(tmp_path)
    spec = build_spec(data="prices.csv")
    assert spec.market.data == str(tmp_path / "prices.csv")
    cfg = tmp_path / "conf" / "long_only.yaml"
    cfg.write_text(yaml.safe_dump({"trading": {"positions": [0.0, 1.0]}}))
    spec = build_spec(config_file=str(cfg))
    assert spec.trading_config().positions == (0.0, 1.0)
    cfg.write_text(yaml.safe_dump({"market": {"data": "../data/bars.csv"}}))
    assert build_spec(config_file=str(cfg)).market.data == str(tmp_path / "data" / "bars.csv")
    # --set market.data=... is resolved against the working directory like --data.
    spec = build_spec(overrides={"market.data": "sub/prices.csv"})
    assert spec.market.data == str(tmp_path / "sub" / "prices.csv")
    assert build_spec(data="a.csv", overrides={"market.data": "a.csv"}).market.data == str(
        tmp_path / "a.csv"
    )
    with pytest.raises(ConfigError, match=r"--data 'a.csv' and --set market.data='b.csv' disagree"):
        build_spec(data="a.csv", overrides={"market.data": "b.csv"})
    with pytest.raises(ConfigError, match=r"market\.data must be a file path, got an empty string"):
        build_spec(overrides={"market.data": " "})


def test_best_model_falls_back_to_final_out_loud(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    from foxhunt.runs import load_model

    copy = tmp_path / "no_best"
    shutil.copytree(run, copy)
    (copy / "best_model.safetensors").unlink()
    load_model(copy, which="best")
    assert (
        "has no best model (no evaluation ran, or training has not finished): using the final"
        in caplog.text
    )


def test_split_and_window_errors_name_their_setting(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    from foxhunt.errors import ConfigError
    from foxhunt.runs import build_spec, build_trading

    with pytest.raises(ConfigError, match=r"market.train_fraction \+ market.validation_fraction"):
        build_spec(overrides={"market.train_fraction": 0.9})
    n = 200
    close = 100 * np.exp(np.cumsum(np.random.default_rng(0).normal(0, 0.01, n)))
    bars = pd.DataFrame(
        {"open": close, "high": close * 1.01, "low": close * 0.99, "close": close},
        index=pd.date_range("2020-01-01", periods=n, freq="D", name="date"),
    )
    path = tmp_path / "bars.csv"
    bars.to_csv(path)
    spec = build_spec(data=str(path), overrides={"trading.window": 100})
    with pytest.raises(ConfigError, match=r"trading.window=100 needs at least 306 bars .* got 200"):
        build_trading(spec)


def test_thin_spans_are_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A monthly file of ~130 bars trained and evaluated without a word: 4 regime states on 91
    training bars, and a 20-bar test span whose Sharpe is noise."""
    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv
    from foxhunt.runs import build_spec, build_trading

    for bars, thin in ((130, True), (1000, False)):
        caplog.clear()
        data = write_synthetic_csv(tmp_path / f"{bars}.csv", SyntheticMarketConfig(n_bars=bars))
        build_trading(build_spec(data=str(data), overrides={"market.detector": "volatility_trend"}))
        said = (
            "4 regime states fitted on 91 training bars (fewer than 50 a state)" in caplog.text,
            "the test span holds 20 bars; backtest figures over fewer than 100" in caplog.text,
        )
        assert said == (thin, thin), caplog.text


def test_force_replaces_only_a_run_and_only_after_the_inputs_check(
    run: Path, tmp_path: Path
) -> None:
    """--force never loses an old run to a bad new input, and never deletes a directory that
    is not a foxhunt run (nor the working directory)."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(run, old)
    before = sorted(p.relative_to(old) for p in old.rglob("*"))
    out = foxhunt("train", "--env", "CartPole-v9", "--run-dir", "old", "--force", cwd=tmp_path)
    assert out.returncode == 2 and "CartPole-v9" in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.relative_to(old) for p in old.rglob("*")) == before  # the old run is intact
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "data.csv").write_text("precious")
    out = foxhunt("train", "--env", "CartPole-v1", "--run-dir", "project", "--force", cwd=tmp_path)
    assert out.returncode == 2 and "holds other files (data.csv)" in out.stderr
    out = foxhunt("train", "--env", "CartPole-v1", "--run-dir", ".", "--force", cwd=old)
    assert out.returncode == 2 and "working or home directory" in out.stderr
    assert (mine / "data.csv").read_text() == "precious" and (old / "config.yaml").is_file()
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    out = foxhunt(
        "train", "--env", "CartPole-v1", "--total-steps", "300", "--seed", "7",
        "--run-dir", "old", "--force", "--no-progress", *sets, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((old / "config.yaml").read_text())
    assert config["hyperparameters"]["seed"] == 7 and config["total_env_steps"] == 300


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ({"env": "CartPole-v1", "total_env_step": 400}, "did you mean 'total_env_steps'?"),
        (
            {"env": "CartPole-v1", "learning_rat": 0.1},
            "hyperparameter name); did you mean 'learning_rate'?",
        ),
        ({"env": "CartPole-v1", "env_args": {"x": 1}}, "unknown key 'env_args'"),
        ({"env": "CartPole-v1", "env_kwargs": [1]}, "env_kwargs must be a mapping"),
        ({"hyperparameters": 5}, "hyperparameters must be a mapping"),
        ({"trading": 5}, "trading must be a mapping"),
        ({"market": [1]}, "market must be a mapping"),
        ({"env": 3}, "env must be a Gymnasium id"),
        ({"env": "CartPole-v1", "total_env_steps": 0}, "total_env_steps"),
        ({"env": "CartPole-v1", "total_env_steps": True}, "total_env_steps"),
        ({"env": "CartPole-v1", "total_env_steps": "400"}, "total_env_steps"),
        (
            {"hyperparameters": {"gamma": 0.9}, "gamma": 0.5},
            "gamma is set both at the top level and under hyperparameters",
        ),
    ],
)
def test_sectioned_config_accounts_for_every_key(tmp_path: Path, content: dict, needle: str):
    from foxhunt.errors import ConfigError
    from foxhunt.runs import build_spec

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError, match=re.escape(needle)) as err:
        build_spec(config_file=str(cfg))
    assert "\n" not in str(err.value)


def test_sectioned_config_takes_top_level_hyperparameters(tmp_path: Path) -> None:
    from foxhunt.runs import build_spec

    cfg = tmp_path / "run.yaml"
    content = {"env": "CartPole-v1", "total_env_steps": 400, "hyperparameters": {"gamma": 0.9}}
    cfg.write_text(yaml.safe_dump({**content, "learning_rate": 0.005}))
    spec = build_spec(config_file=str(cfg))
    assert spec.total_env_steps == 400 and spec.hyperparameters.gamma == 0.9
    assert spec.hyperparameters.learning_rate == 0.005


def test_evaluate_refuses_trading_options_on_a_gymnasium_run(run: Path, tmp_path: Path) -> None:
    for extra, needle in (
        (["--data", "prices.csv"], "--data applies to trading runs"),
        (["--split", "bogus"], "--split applies to trading runs"),
    ):
        out = foxhunt("evaluate", str(run), *extra, cwd=tmp_path)
        assert out.returncode == 2 and needle in out.stderr and "'CartPole-v1'" in out.stderr
        assert "Traceback" not in out.stderr


def test_a_run_in_use_is_not_resumed_or_replaced(run: Path, tmp_path: Path) -> None:
    """While one process trains in a run directory (it holds the run's lock), a second resume
    or train --force into it is refused in one line and leaves the files alone."""
    import shutil

    from foxhunt.session import run_lock

    live = tmp_path / "live"
    shutil.copytree(run, live)
    before = sorted(p.relative_to(live) for p in live.rglob("*"))
    with run_lock(live):  # stands in for the training process
        out = foxhunt("resume", str(live), "--total-steps", "5000", cwd=tmp_path)
        assert out.returncode == 2 and "is in use by another foxhunt process" in out.stderr
        out = foxhunt("train", "--env", "CartPole-v1", "--run-dir", "live", "--force", cwd=tmp_path)
        assert out.returncode == 2 and "is in use by another foxhunt process" in out.stderr
        # Without --force: not "use foxhunt resume", which the lock refuses too.
        out = foxhunt("train", "--env", "CartPole-v1", "--run-dir", "live", cwd=tmp_path)
        assert out.returncode == 2 and "is in use by another foxhunt process" in out.stderr
        assert "foxhunt resume" not in out.stderr
    after = sorted(p.relative_to(live) for p in live.rglob("*") if p.name != ".foxhunt.lock")
    assert after == [p for p in before if p.name != ".foxhunt.lock"]


def test_resume_refuses_a_config_that_builds_another_environment(run: Path, tmp_path: Path):
    """config.yaml edited after the checkpoint (another env, market seed, data file...): the
    resume would silently continue on other data, so it is refused naming the setting."""
    import shutil

    from foxhunt.errors import FoxhuntError
    from foxhunt.runs import build_spec
    from foxhunt.session import _check_same_environment, _run_sections

    edited = tmp_path / "edited"
    shutil.copytree(run, edited)
    config = yaml.safe_load((edited / "config.yaml").read_text())
    config["env"] = "Acrobot-v1"
    (edited / "config.yaml").write_text(yaml.safe_dump(config))
    out = foxhunt("resume", str(edited), "--total-steps", "5000", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "env is 'Acrobot-v1' but the checkpoint was trained with 'CartPole-v1'" in out.stderr
    saved = {"run": _run_sections(build_spec())}
    _check_same_environment(edited, build_spec(), saved)  # unchanged: accepted
    with pytest.raises(FoxhuntError, match=r"market.synthetic_seed is 4 but .* with 0"):
        _check_same_environment(edited, build_spec(overrides={"market.synthetic_seed": 4}), saved)
    # gym.make's keyword arguments build the env too; a checkpoint from before they were
    # recorded was made with none.
    lake = build_spec(env="FrozenLake-v1", overrides={"env_kwargs.is_slippery": False})
    saved = {"run": _run_sections(lake)}
    _check_same_environment(edited, lake, saved)
    slippery = build_spec(env="FrozenLake-v1", overrides={"env_kwargs.is_slippery": True})
    with pytest.raises(FoxhuntError, match=r"env_kwargs.is_slippery is True but .* with False"):
        _check_same_environment(edited, slippery, saved)
    old = {"run": {k: v for k, v in saved["run"].items() if k != "env_kwargs"}}
    _check_same_environment(edited, build_spec(env="FrozenLake-v1"), old)


def test_evaluate_refuses_a_config_whose_env_the_model_does_not_fit(run: Path, tmp_path: Path):
    """config.yaml edited after training: evaluate failed inside the network with a traceback
    (another env's observation shape), or on an emptied file, as a trading run."""
    import shutil

    from foxhunt.errors import ConfigError
    from foxhunt.session import evaluate_run

    edited = tmp_path / "edited"
    shutil.copytree(run, edited)
    config = yaml.safe_load((edited / "config.yaml").read_text())
    (edited / "config.yaml").write_text(yaml.safe_dump({**config, "env": "Acrobot-v1"}))
    out = foxhunt("evaluate", str(edited), "--episodes", "1", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "shape (4,) and chooses among 2 actions" in out.stderr
    assert "('Acrobot-v1') gives observations of shape (6,) and 3 actions" in out.stderr
    (edited / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"the trading env\) gives observations of shape"):
        evaluate_run(edited)
    assert not (edited / "backtest").exists()


def test_a_stopped_ensemble_is_continued_by_ensemble_resume() -> None:
    """`foxhunt resume r/member-1` would finish that member only, not the ensemble."""
    import argparse

    from foxhunt.cli import _interrupted
    from foxhunt.errors import TrainingInterrupted

    ckpt = Path("my runs/e1/member-1/checkpoints/step-300")
    said = _interrupted(
        TrainingInterrupted(300, ckpt), argparse.Namespace(command="ensemble"), "interrupted"
    )
    assert said.endswith("continue with `foxhunt ensemble resume 'my runs/e1'`")
    before_any = argparse.Namespace(command="ensemble", run_dir="e2")
    said = _interrupted(TrainingInterrupted(40, None), before_any, "terminated (SIGTERM)")
    assert said.startswith("terminated (SIGTERM) at env step 40 of a member")
    assert said.endswith("`foxhunt ensemble resume e2`")
    # read in a notebook's traceback: not the arguments tuple "(300, PosixPath(...))"
    assert str(TrainingInterrupted(300, ckpt)) == f"SIGINT at env step 300: checkpoint {ckpt}"
    assert str(TrainingInterrupted(40, None, 15)) == "SIGTERM at env step 40: no checkpoint saved"
    starting = argparse.Namespace(command="ensemble", ensemble_command="resume", run_dir="e 3")
    said = _interrupted(KeyboardInterrupt(), starting, "terminated (SIGTERM)")
    assert said.startswith("terminated (SIGTERM) while no member's checkpoint could be taken")
    assert said.endswith("last checkpoint with `foxhunt ensemble resume 'e 3'`")


def test_a_stop_signal_names_its_stop_without_importing_torch(tmp_path: Path) -> None:
    """Ctrl-C during startup lands while torch is half imported: the handler importing it
    again crashed (a traceback, a segfault)."""
    code = (
        "import argparse, sys\n"
        "from foxhunt import cli\n"
        "print(cli._interrupted(KeyboardInterrupt(), argparse.Namespace(command='evaluate'), "
        "'interrupted'))\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "interrupted"


def test_evaluation_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    """--data/--split score trading runs, --episodes Gymnasium runs; neither is ignored, for
    single runs and ensembles alike (both go through check_evaluation_options)."""
    from foxhunt.errors import ConfigError
    from foxhunt.runs import build_spec
    from foxhunt.session import check_evaluation_options

    gym_spec, trading_spec = build_spec(env="CartPole-v1"), build_spec()
    assert trading_spec.is_trading and not gym_spec.is_trading
    check = check_evaluation_options
    assert check(gym_spec, tmp_path, data=None, split=None, episodes=None) == 10
    assert check(gym_spec, tmp_path, data=None, split=None, episodes=3) == 3
    assert check(trading_spec, tmp_path, data="x.csv", split="all", episodes=None) == 10
    with pytest.raises(ConfigError, match=r"--split applies to trading runs; .* got: 'validation'"):
        check(gym_spec, tmp_path, data=None, split="validation", episodes=None)
    # A Path from Python is named as the user wrote it, not as PosixPath('x.csv').
    with pytest.raises(ConfigError, match=r"--data applies to trading runs; .* got: 'x.csv'$"):
        check(gym_spec, tmp_path, data=Path("x.csv"), split=None, episodes=None)
    with pytest.raises(ConfigError, match=r"--episodes applies to Gymnasium runs; .* is a trading"):
        check(trading_spec, tmp_path, data=None, split=None, episodes=3)
    with pytest.raises(ConfigError, match="episodes must be a positive integer, got: 0"):
        check(gym_spec, tmp_path, data=None, split=None, episodes=0)


def test_empty_paths_and_ensemble_directories_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from foxhunt.cli import main

    monkeypatch.chdir(tmp_path)
    for argv in (
        ["train", "--run-dir", "", "--env", "CartPole-v1"],
        ["train", "--data", " "],
        ["data", "synth", "--out", ""],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "must be a path, got an empty string" in capsys.readouterr().err
    for argv in (["hyperopt", "--sampler-seed", str(2**32)], ["train", "--seed", str(2**70)]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and "must be less than 2**32" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing was written in the working directory
    (tmp_path / "out.csv").mkdir()
    assert main(["data", "synth", "--out", "out.csv", "--force"]) == 2
    assert "--out must be a file path, got a directory: out.csv" in capsys.readouterr().err
    for out in ("new.csv/", "new.csv/."):  # Path() reads both as new.csv
        assert main(["data", "synth", "--out", out]) == 2
        assert f"--out must be a file path, got a directory path: {out}" in capsys.readouterr().err
    assert not (tmp_path / "new.csv").exists()
    ens = tmp_path / "ens"
    ens.mkdir()
    (ens / "ensemble.json").write_text("{}")
    for command, needle in (("resume", "foxhunt resume"), ("report", "foxhunt report")):
        assert main([command, str(ens)]) == 2
        err = capsys.readouterr().err
        assert f"{ens} is an ensemble" in err and f"`{needle} {ens / 'member-0'}`" in err


def test_cli_probe_findings_are_one_line_errors(run: Path, tmp_path: Path) -> None:
    """A search into a training run, a non-UTF-8 metrics file on resume, huge counts, YAML
    errors and a stopped ensemble: each one line, exit 2, saying what is wrong."""
    import shutil

    def one_line(out: subprocess.CompletedProcess[str], needle: str) -> None:
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr

    one_line(
        foxhunt(
            "hyperopt", "--env", "CartPole-v1", "--trials", "1", "--run-dir", str(run), cwd=tmp_path
        ),
        "holds a training run or an ensemble (config.yaml, checkpoints)",
    )
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "metrics.csv").write_bytes(b"a,b\n\xff\xfe,1\n")
    one_line(foxhunt("resume", str(copy), "--total-steps", "3000", cwd=tmp_path), "not UTF-8")
    one_line(
        foxhunt(
            "ensemble", "train", "--members", "100000000", "--env", "CartPole-v1", cwd=tmp_path
        ),
        "--members must be at most 1,000",
    )
    one_line(
        foxhunt("evaluate", str(run), "--episodes", str(10**20), cwd=tmp_path),
        "--episodes must be at most 1,000,000",
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("batch_size: [1\n")
    one_line(
        foxhunt("train", "--env", "CartPole-v1", "--config", str(bad), cwd=tmp_path),
        "expected ',' or ']', but got '<stream end>' at line 2, column 1",
    )
    one_line(
        foxhunt("data", "synth", "--out", "m.csv", "--bars", "1", cwd=tmp_path),
        "--bars must be at least 2, got: 1",
    )
    assert not (tmp_path / "m.csv").exists()
    one_line(  # a million daily bars end past 2262: the flag that fixes it is named
        foxhunt("data", "synth", "--out", "m.csv", "--bars", "1000000", cwd=tmp_path),
        "--freq must be a pandas offset alias",
    )
    synth = ("data", "synth", "--out", "m.csv", "--bars", "300", "--freq", "1min")
    assert foxhunt(*synth, cwd=tmp_path).returncode == 0
    import pandas as pd

    stamps = pd.to_datetime(pd.read_csv(tmp_path / "m.csv")["timestamp"])
    assert len(stamps) == 300 and (stamps.diff().dropna() == pd.Timedelta("1min")).all()
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "ensemble-plan.json").write_text('{"members": 2}')
    one_line(foxhunt("evaluate", str(stopped), cwd=tmp_path), "foxhunt ensemble resume")


def test_env_kwargs_reach_gym_make_and_the_evaluation(tmp_path: Path) -> None:
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    out = foxhunt(
        "train", "--env", "FrozenLake-v1", "--set", "env_kwargs.map_name=8x8",
        "--set", "env_kwargs.max_episode_steps=30", *sets, "--total-steps", "300",
        "--run-dir", str(tmp_path / "fl"), "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load((tmp_path / "fl" / "config.yaml").read_text())
    assert config["env_kwargs"] == {"map_name": "8x8", "max_episode_steps": 30}
    # A whole mapping at once is the same as one key at a time.
    from foxhunt.runs import build_spec

    whole = build_spec(env="FrozenLake-v1", overrides={"env_kwargs": {"map_name": "8x8"}})
    assert whole.env_kwargs == {"map_name": "8x8"}
    assert json.loads((tmp_path / "fl" / "model.json").read_text())["obs_dim"] == 64  # 8 x 8
    out = foxhunt("evaluate", str(tmp_path / "fl"), "--episodes", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["env_kwargs"]["map_name"] == "8x8"
    assert json.loads(out.stdout)["env_kwargs"]["max_episode_steps"] == 30
    for bad, needle in (
        (["--env", "FrozenLake-v1", "--set", "env_kwargs.foo=1"], "unexpected keyword argument"),
        (["--env", "FrozenLake-v1", "--set", "env_kwargs=5"], "env_kwargs takes a mapping"),
        # the env's constructor raising something else than TypeError/ValueError
        (["--env", "FrozenLake-v1", "--set", "env_kwargs.map_name=9x9"], "KeyError '9x9'"),
        (["--set", "env_kwargs.map_name=8x8"], "env_kwargs.map_name applies to Gymnasium envs"),
    ):
        out = foxhunt("train", *bad, "--run-dir", str(tmp_path / "x"), cwd=tmp_path)
        assert out.returncode == 2 and needle in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_an_ensemble_with_a_bad_env_kwarg_writes_nothing(tmp_path: Path) -> None:
    out = foxhunt(
        "ensemble", "train", "--members", "2", "--env", "CartPole-v1", "--set", "env_kwargs.bad=1",
        "--run-dir", str(tmp_path / "ens"), cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2 and "unexpected keyword argument" in out.stderr
    assert not (tmp_path / "ens").exists() or not any((tmp_path / "ens").iterdir())


def test_train_run_from_python_takes_only_a_new_or_empty_directory(tmp_path: Path) -> None:
    import foxhunt
    from foxhunt.errors import ConfigError

    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    spec = foxhunt.build_spec(env="CartPole-v1", total_steps=100)
    with pytest.raises(ConfigError, match="new or empty directory"):
        foxhunt.train_run(spec, used)
    assert [p.name for p in used.iterdir()] == ["notes.txt"]


def test_the_python_entry_points_take_paths_refuse_frames_and_keep_torch_threads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd
    import torch

    import foxhunt
    from foxhunt.errors import ConfigError

    with pytest.raises(ConfigError, match=r"save the DataFrame first") as err:
        foxhunt.build_spec(data=pd.DataFrame({"close": [1.0]}))
    assert "\n" not in str(err.value)
    bars = tmp_path / "bars.csv"
    bars.write_text("date,open,high,low,close\n")
    assert foxhunt.build_spec(data=bars).market.data == str(bars.resolve())  # a Path is a path
    whole = foxhunt.build_spec(overrides={"market": {"data": bars}})  # a mapping, a Path inside
    assert whole.market.data == str(bars.resolve())
    tiny = {"hidden_sizes": [32, 32], "learning_starts": 100, "eval_interval": 0}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        spec = foxhunt.build_spec(env="CartPole-v1", total_steps=200, overrides=tiny)
        capsys.readouterr()
        foxhunt.train_run(spec, tmp_path / "run", progress=False, verbose=False)
        assert capsys.readouterr().out == ""  # no run line, no summary table
        assert torch.get_num_threads() == 2  # the run's torch_threads=1 did not leak
        resumed = foxhunt.resume_run(str(tmp_path / "run"), total_steps=300, progress=False)
        assert resumed["env_steps"] == 300 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_train_run_keeps_the_callers_rngs_and_shows_progress_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep that draws its next configuration from np.random after each run drew the same
    one every time (the trainer seeds the global RNGs); progress=True with verbose=False showed
    nothing (the display went to the silenced stdout)."""
    import random

    import numpy as np
    import torch

    import foxhunt

    tiny = {"hidden_sizes": [32, 32], "learning_starts": 100, "eval_interval": 0}
    spec = foxhunt.build_spec(env="CartPole-v1", total_steps=200, overrides=tiny)
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    random.seed(123), np.random.seed(123), torch.manual_seed(123)
    capsys.readouterr()
    foxhunt.train_run(spec, tmp_path / "run", progress=True, verbose=False)
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected
    out = capsys.readouterr().out
    assert "env_steps 200/200" in out  # the plain progress line (stdout is not a terminal)
    assert "summary" not in out and "foxhunt: run" not in out  # still quiet otherwise


def test_resume_run_checks_its_total_steps(tmp_path: Path) -> None:
    """From Python, 0 was read as "not given" (the error then named the checkpoint's total) and
    300.5 reached the checkpointer as 304.0; the CLI's --total-steps was always checked."""
    import numpy as np

    import foxhunt
    from foxhunt.errors import ConfigError

    tiny = {"hidden_sizes": [16], "learning_starts": 100, "eval_interval": 0}
    spec = foxhunt.build_spec(env="CartPole-v1", total_steps=200, overrides=tiny)
    run = tmp_path / "run"
    foxhunt.train_run(spec, run, progress=False, verbose=False)
    for bad in (0, -5, 300.5, "300", True):
        with pytest.raises(
            ConfigError, match=f"total_steps must be a positive integer, got: {bad!r}"
        ):
            foxhunt.resume_run(run, total_steps=bad, progress=False, verbose=False)
    summary = foxhunt.resume_run(run, total_steps=np.int64(300), progress=False, verbose=False)
    assert summary["env_steps"] == 300


def test_a_quiet_run_leaves_what_other_threads_print_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """verbose=False swapped sys.stdout for the whole process: a notebook's other thread (a
    dashboard, a second run's progress) printed into the void while a quiet run trained."""
    import threading

    import foxhunt
    from foxhunt import session

    def finish_while_another_thread_prints(*args: object, **kwargs: object) -> None:
        other = threading.Thread(target=print, args=("printed by another thread",))
        other.start()
        other.join()
        print("printed by the caller's own code")  # in the run's thread: the caller's too
        finish(*args, **kwargs)

    finish = session._finish
    monkeypatch.setattr(session, "_finish", finish_while_another_thread_prints)
    tiny = {"hidden_sizes": [16], "learning_starts": 100, "eval_interval": 0}
    spec = foxhunt.build_spec(env="CartPole-v1", total_steps=200, overrides=tiny)
    capsys.readouterr()
    foxhunt.train_run(spec, tmp_path / "run", progress=False, verbose=False)
    out = capsys.readouterr().out
    assert "printed by another thread" in out and "printed by the caller's own code" in out
    assert "foxhunt" not in out  # the run itself stayed quiet: no run line, no summary


def test_suggested_commands_quote_a_run_directory_with_a_space(tmp_path: Path) -> None:
    """Pasted into a shell, the hint's path must stay one argument."""
    from foxhunt.cli import _prepare_run_dir
    from foxhunt.errors import FoxhuntError

    run = tmp_path / "my run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest.json").write_text("{}")
    with pytest.raises(FoxhuntError, match=r"use `foxhunt resume '.*/my run'`"):
        _prepare_run_dir(run, force=False)


def test_commands_that_train_several_runs_are_refused_under_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under torchrun every rank would run every member or trial, into the same directories."""
    from foxhunt.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    for argv in (
        ["ensemble", "train", "--members", "2", "--env", "CartPole-v1"],
        ["hyperopt", "--env", "CartPole-v1", "--trials", "2"],
    ):
        assert main([*argv, "--run-dir", str(tmp_path / "x")]) == 2
        assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WORLD_SIZE": "2"}, "RANK must be set"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR must be set"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT must be set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be an integer, got: 'two'"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK must lie in \[0, WORLD_SIZE=2\), got: 2"),
    ],
)
def test_a_torchrun_environment_missing_a_variable_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    env: dict[str, str],
    named: str,
) -> None:
    """WORLD_SIZE set without the rest of what torchrun sets was a KeyError or a torch
    rendezvous traceback."""
    import re

    from foxhunt.cli import main

    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["train", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "x"), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(named, err), err
    assert not (tmp_path / "x").exists()


def test_a_lost_data_parallel_peer_is_one_line_naming_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank killed mid-run made gloo raise on the others: forty lines of C++ traceback."""
    import foxhunt.distributed
    from foxhunt import cli

    def lost(args):  # type: ignore[no-untyped-def]
        raise RuntimeError(
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
            "[127.0.0.1]:29500: Connection reset by peer"
        )

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(foxhunt.distributed, "init_from_env", lambda device_type: None)
    monkeypatch.setitem(cli.COMMANDS, "train", lost)
    run = tmp_path / "my run"
    assert cli.main(["train", "--run-dir", str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a data-parallel peer stopped" in err
    assert f"foxhunt resume '{run}'" in err
    assert "why is in that rank's own output" in err  # rank 0 writes the run, not the cause
    monkeypatch.setenv("WORLD_SIZE", "1")  # outside torchrun the error is a bug: shown whole
    with pytest.raises(RuntimeError, match="Connection reset by peer"):
        cli.main(["train", "--run-dir", str(run)])


def test_position_names_the_held_flag_where_the_library_says_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replay wiped out says to pass the position actually held: --held on the CLI."""
    import foxhunt.session
    from foxhunt import cli
    from foxhunt.errors import FoxhuntError

    def wiped(run_dir, **kwargs):  # type: ignore[no-untyped-def]
        raise FoxhuntError(
            f"{run_dir}: the policy's replayed equity was wiped out at 2003-04-18, before the "
            "last bar: pass held= (the position actually held) to decide from it"
        )

    monkeypatch.setattr(foxhunt.session, "next_position", wiped)
    assert cli.main(["position", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pass --held (the position actually held)" in err and "held=" not in err


def test_ensemble_force_never_deletes_a_member_still_training(tmp_path: Path) -> None:
    """--force replaces an old ensemble, but not while one of its members is held by a
    training process."""
    from foxhunt.cli import main
    from foxhunt.session import run_lock

    run = tmp_path / "ens"
    member = run / "member-0"
    member.mkdir(parents=True)
    (run / "ensemble-plan.json").write_text('{"members": 2}\n')
    (member / "config.yaml").write_text("env: CartPole-v1\n")
    argv = ["ensemble", "train", "--members", "2", "--env", "CartPole-v1", "--force"]
    with run_lock(member):
        assert main([*argv, "--run-dir", str(run), "--total-steps", "300"]) == 2
    assert (member / "config.yaml").is_file()


def test_ensemble_force_keeps_the_old_run_until_the_new_one_is_built(tmp_path: Path) -> None:
    """A bad input found when member 0's trainer is built (memory, device) left the old
    ensemble deleted: --force removed it after checking only the envs."""
    from foxhunt.cli import main

    run = tmp_path / "ens"
    member = run / "member-0"
    member.mkdir(parents=True)
    (run / "ensemble-plan.json").write_text('{"members": 2}\n')
    (member / "config.yaml").write_text("env: CartPole-v1\n")
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
    argv = ["ensemble", "train", "--members", "2", "--env", "CartPole-v1", "--force", *sets]
    argv += ["--run-dir", str(run), "--total-steps", "300", "--no-progress"]
    assert main([*argv, "--set", "buffer_capacity=100000000000"]) == 2
    assert (member / "config.yaml").read_text() == "env: CartPole-v1\n"
    assert main(argv) == 0
    assert (run / "ensemble.json").is_file() and not (run / "ensemble-plan.json").exists()
    assert yaml.safe_load((member / "config.yaml").read_text())["total_env_steps"] == 300


def test_sigterm_outside_training_carries_its_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a trainer's own handler is up (a hyperopt trial building its envs), the CLI's
    SIGTERM handler raised a bare KeyboardInterrupt, and the trial was recorded as Ctrl-C."""
    import os
    import signal

    from foxhunt import cli

    seen: list[int] = []

    def command(args: object) -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode boundary
            for _ in range(1000):
                pass
        except KeyboardInterrupt as err:
            seen.append(getattr(err, "signum", 0))
            raise
        return 0

    monkeypatch.setitem(cli.COMMANDS, "report", command)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert cli.main(["report", "."]) == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM]


def test_main_in_process_leaves_logging_and_sigterm_as_it_found_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A notebook or script calling cli.main() kept foxhunt's SIGTERM handler (which raises
    KeyboardInterrupt) and a root logging handler after it returned."""
    import logging
    import signal

    from foxhunt import cli

    def mine(signum: int, frame: object) -> None:
        return None

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # an unconfigured process: basicConfig adds one
    monkeypatch.setattr(root, "level", logging.ERROR)
    previous = signal.signal(signal.SIGTERM, mine)
    inside: list[object] = []

    def command(args: object) -> int:
        inside.append((signal.getsignal(signal.SIGTERM), list(root.handlers)))
        return 0

    monkeypatch.setitem(cli.COMMANDS, "report", command)
    try:
        assert cli.main(["report", "."]) == 0
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    handler_inside, handlers_inside = inside[0]
    assert handler_inside is not mine and len(handlers_inside) == 1  # it did set both up
    assert after is mine
    assert root.handlers == [] and root.level == logging.ERROR


def test_every_option_and_argument_says_what_it_is(tmp_path):
    # --seed, --trials, --out ... showed nothing under --help.
    import argparse

    from foxhunt.markets.synthetic import SyntheticMarketConfig

    bare: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif action.help is None:
                bare.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "foxhunt")
    assert bare == []
    synth = foxhunt("data", "synth", "--help", cwd=tmp_path)
    assert f"(default: {SyntheticMarketConfig().n_bars})" in synth.stdout
