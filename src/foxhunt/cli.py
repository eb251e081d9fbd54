"""``foxhunt`` command line: train · resume · evaluate · report · hyperopt · ensemble · data.

User errors (bad config, data, checkpoint, arguments) print ONE line to stderr and exit 2;
nothing is written for a run whose inputs fail validation, because every input is checked
before the run directory is created.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from foxhunt._io import shell_quoted
from foxhunt.errors import ConfigError, FoxhuntError

EXIT_USER_ERROR = 2
log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors in one line (no usage dump) with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"foxhunt: error: {message}\n")


_DATA_KINDS = "CSV, .gz, .zip, Parquet or .xlsx"


def _positive_int(name: str, most: int | None = None):  # type: ignore[no-untyped-def]
    """An integer option > 0, and <= ``most`` where a larger one only exhausts memory before
    anything useful happens (a list of 10**8 ensemble members or evaluation seeds)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be greater than 0, got: {value}")
        if most is not None and value > most:
            raise argparse.ArgumentTypeError(f"{name} must be at most {most:,}, got: {value:,}")
        return value

    return parse


def _path(name: str):  # type: ignore[no-untyped-def]
    """A path option: an empty one would silently mean "the default" or the current directory."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name} must be a path, got an empty string")
        return text

    return parse


def _non_negative_int(name: str):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got: {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be at least 0, got: {value}")
        return value

    return parse


def _seed(name: str):  # type: ignore[no-untyped-def]
    """A seed: 0 <= seed < 2**32, what NumPy, torch and Optuna's samplers all accept."""
    whole = _non_negative_int(name)

    def parse(text: str) -> int:
        value = whole(text)
        if value >= 2**32:
            raise argparse.ArgumentTypeError(f"{name} must be less than 2**32, got: {value}")
        return value

    return parse


def _finite_float(name: str, minimum: float | None = None):  # type: ignore[no-untyped-def]
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got: {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{name} must be finite, got: {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be at least {minimum}, got: {value}")
        return value

    return parse


def _add_spec_args(p: argparse.ArgumentParser, *, data_help: str) -> None:
    """The options that build a RunSpec (shared by train, ensemble train and hyperopt)."""
    p.add_argument("--env", help="Gymnasium env id with discrete actions (e.g. CartPole-v1)")
    p.add_argument("--data", type=_path("--data"), help=data_help)
    p.add_argument(
        "--config", type=_path("--config"), help="YAML file of hyperparameters (flat or sectioned)"
    )
    p.add_argument(
        "--preset",
        help="classic (the default for Gymnasium envs; cartpole is the same), default (the plain "
        "DQNHyperparameters defaults), conservative, rainbow or trading (the default without "
        "--env)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a hyperparameter (or trading.X / market.X / env_kwargs.X / "
        "total_env_steps); repeatable",
    )
    p.add_argument(
        "--total-steps",
        type=_positive_int("--total-steps"),
        help="environment steps to train for (default: the config file's total_env_steps, "
        "else 60,000 for trading and 50,000 for a Gymnasium env)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="foxhunt", description="Exact DQN / Rainbow training for trading agents.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser(
        "train",
        help="train an agent (default: regime-conditional trading agent "
        "on the embedded synthetic market)",
    )
    _add_spec_args(t, data_help=f"OHLCV file ({_DATA_KINDS}) to train the trading agent on")
    t.add_argument(
        "--run-dir", type=_path("--run-dir"), help="output directory (default: runs/<time>-<env>)"
    )
    t.add_argument(
        "--seed",
        type=_seed("--seed"),
        help="seed of the environments, network and replay (default: the configuration's, 0)",
    )
    t.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress display (the run directory and end summary still print)",
    )
    t.add_argument("--force", action="store_true", help="replace an existing run directory")

    r = sub.add_parser("resume", help="continue a run exactly from its latest checkpoint")
    r.add_argument("run_dir", help="the run directory of `foxhunt train`")
    r.add_argument(
        "--total-steps",
        type=_positive_int("--total-steps"),
        help="new total environment steps (default: the run's own)",
    )
    r.add_argument(
        "--no-progress",
        action="store_true",
        help="no live progress display (the end summary still prints)",
    )

    e = sub.add_parser(
        "evaluate",
        help="backtest a trading run (writes RUN_DIR/backtest, or backtest_<model>_<split> "
        "beside it for another model or split) or score a Gymnasium run "
        "(writes RUN_DIR/evaluation.json, or evaluation_best.json / evaluation_latest.json "
        "with --model best / latest)",
    )
    e.add_argument("run_dir", help="the run directory of `foxhunt train`")
    e.add_argument(
        "--data",
        type=_path("--data"),
        help="(trading runs only) evaluate on this OHLCV file instead of the run's market: "
        "the run's own bars followed by new ones keep the spans, normalisation and detector as "
        "trained (the test span runs on into the new bars); any other file is split and fitted "
        "on its own training span, as in training",
    )
    e.add_argument(
        "--split", help="train, validation, test or all (default test; trading runs only)"
    )
    e.add_argument(
        "--model",
        default=None,
        choices=("best", "final", "latest"),
        help="final: weights at the end of training (default); best: weights of the best "
        "evaluation during training (model selection on the validation span); latest: the "
        "latest checkpoint's (a run stopped part way, or still training)",
    )
    e.add_argument(
        "--episodes",
        type=_positive_int("--episodes", most=1_000_000),
        help="greedy episodes (Gymnasium envs only; default 10)",
    )

    pos = sub.add_parser(
        "position",
        help="the position a trading run (or ensemble) takes at the last bar of its data, to "
        "hold to the next bar: acting on new bars (prints JSON)",
        description="Acting on new bars: append them to the run's data file (or pass the "
        "whole history grown by them with --data) and ask for the position to hold from the "
        "last bar's close to the next bar's. The run's spans, normalisation and regime "
        "detector stay as trained. new_bars in the output counts the bars after those the run "
        "trained on (0: no new bar, warned).",
    )
    pos.add_argument("run_dir", help="the run directory of `foxhunt train` or `ensemble train`")
    pos.add_argument(
        "--data",
        type=_path("--data"),
        help="the run's data grown by the new bars (the whole history; default: the run's "
        "own file as it is now)",
    )
    pos.add_argument(
        "--held",
        type=_finite_float("--held"),
        help="the position actually held into the last bar, one of the run's positions "
        "(default: the policy's own, replayed over the test span)",
    )
    pos.add_argument(
        "--model",
        default=None,
        choices=("best", "final", "latest"),
        help="a single run's weights: final (default), best or latest",
    )
    _add_ensemble_policy_options(pos)

    rep = sub.add_parser("report", help="plot a run's training curves into RUN_DIR/report")
    rep.add_argument("run_dir", help="the run directory of `foxhunt train`")

    h = sub.add_parser(
        "hyperopt",
        help="Optuna hyperparameter search (shared storage scales out)",
        description="Optuna search over foxhunt's search space. Settings given with --set stay "
        "fixed; the search tunes every other setting in its space, values from --config "
        "included (they only fill the settings the space does not cover).",
    )
    _add_spec_args(h, data_help=f"OHLCV file ({_DATA_KINDS}) for a trading search")
    h.add_argument(
        "--trials",
        type=_positive_int("--trials"),
        default=20,
        help="trials this process runs (each worker on a shared --storage runs its own; "
        "default 20)",
    )
    h.add_argument(
        "--storage",
        help="Optuna storage shared by every worker: sqlite:///study.db, a database URL, "
        "or journal:PATH (a file: no heartbeats there, so a worker killed outright leaves its "
        "trial RUNNING, where a database marks it failed)",
    )
    h.add_argument(
        "--sampler-seed",
        type=_seed("--sampler-seed"),
        help="TPE sampler seed (give each parallel worker its own, or none)",
    )
    h.add_argument(
        "--study-name",
        default="foxhunt",
        help="the study's name in --storage (workers sharing one search give the same)",
    )
    h.add_argument(
        "--run-dir", type=_path("--run-dir"), help="where to write the best configuration"
    )
    h.add_argument(
        "--seed",
        type=_seed("--seed"),
        help="run seed: each trial's seed derives from it and the trial number (default: 0)",
    )
    h.add_argument(
        "--force", action="store_true", help="replace another search's results in --run-dir"
    )

    d = sub.add_parser("data", help="market data tools")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    s = dsub.add_parser("synth", help="write the synthetic regime-switching market to a CSV file")
    s.add_argument("--out", type=_path("--out"), required=True, help="CSV file to write")
    s.add_argument(
        "--seed", type=_seed("--seed"), default=0, help="seed of the market (default: 0)"
    )
    s.add_argument(  # >= 2: see cmd_data
        "--bars", type=_positive_int("--bars"), help="number of bars (default: 6000)"
    )
    s.add_argument(
        "--freq",
        help="time between bars, a pandas offset alias: 1D (default), 1h, 1min (a million "
        "daily bars would run past pandas' last date, 2262); the per-bar returns stay the same",
    )
    s.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    ens = sub.add_parser(
        "ensemble", help="train and evaluate ensembles of independently seeded agents"
    )
    esub = ens.add_subparsers(dest="ensemble_command", required=True, parser_class=_Parser)
    et = esub.add_parser(
        "train",
        help="train N members into RUN_DIR/member-i (member 0 with --seed, the others with "
        "seeds drawn from it)",
    )
    et.add_argument(
        "--members",
        type=_positive_int("--members", most=1_000),
        default=5,
        help="members (at least 2; default 5)",
    )
    _add_spec_args(et, data_help=f"OHLCV file ({_DATA_KINDS}) to train the trading agents on")
    et.add_argument(
        "--run-dir",
        type=_path("--run-dir"),
        help="output directory (default: runs/<time>-<env>-ensemble)",
    )
    et.add_argument("--seed", type=_seed("--seed"), help="seed of member 0")
    et.add_argument("--no-progress", action="store_true", help="no live progress display")
    et.add_argument("--force", action="store_true", help="replace an existing run directory")
    er = esub.add_parser(
        "resume", help="finish an ensemble whose training stopped part way (members kept)"
    )
    er.add_argument("run_dir", help="the run directory of `foxhunt ensemble train`")
    er.add_argument("--no-progress", action="store_true", help="no live progress display")
    ee = esub.add_parser(
        "evaluate", help="backtest (trading) or score (Gymnasium) an ensemble run directory"
    )
    ee.add_argument("run_dir", help="the run directory of `foxhunt ensemble train`")
    ee.add_argument(
        "--data",
        type=_path("--data"),
        help="evaluate on this OHLCV file instead of the run's market",
    )
    ee.add_argument("--split", help="train, validation, test or all (default test; trading only)")
    ee.add_argument(
        "--episodes",
        type=_positive_int("--episodes", most=1_000_000),
        help="greedy episodes (Gymnasium envs only; default 10)",
    )
    _add_ensemble_policy_options(ee)
    for commands in (sub, dsub, esub):  # a missing command is named by its choices, not dest
        commands.metavar = "{" + ",".join(commands.choices) + "}"
    return p


def _add_ensemble_policy_options(parser: argparse.ArgumentParser) -> None:
    """How an ensemble decides (``ensemble evaluate``, ``position``): QEnsemble.decide's
    arguments as flags."""
    parser.add_argument(
        "--risk-aversion",
        type=_finite_float("--risk-aversion"),
        default=0.0,
        help="an ensemble acts on argmax(mean - K * std) of member Q-values (default 0: the mean)",
    )
    parser.add_argument(
        "--max-std",
        type=_finite_float("--max-std", minimum=0.0),
        help="an ensemble takes the fallback action when the chosen action's Q std exceeds this",
    )
    parser.add_argument(
        "--fallback-action",
        type=_non_negative_int("--fallback-action"),
        help="action index an ensemble takes above --max-std (default for trading: the flat "
        "position)",
    )


def _overrides(items: Sequence[str]) -> dict[str, Any]:
    from foxhunt.config import parse_override

    # A key given twice takes its last value, as repeated options do: a wrapper script's
    # defaults followed by the user's own.
    return dict(parse_override(i) for i in items)


def _spec_from_args(args: argparse.Namespace) -> Any:
    """A validated RunSpec from the shared spec options (see :func:`_add_spec_args`)."""
    from foxhunt.runs import build_spec

    if args.data is not None and not args.data.strip():
        raise FoxhuntError("--data must be a file path, got an empty string")
    # (a dangling link's path exists as a link: the loader names it)
    if args.data is not None and not Path(args.data).exists() and not Path(args.data).is_symlink():
        raise FoxhuntError(f"--data file not found: {args.data}")
    return build_spec(
        env=args.env,
        data=args.data,
        config_file=args.config,
        preset_name=args.preset,
        overrides=_overrides(args.overrides),
        total_steps=args.total_steps,
        seed=args.seed,
    )


def _default_run_dir(spec: Any) -> Path:
    name = spec.env or (
        "trading-" + (Path(spec.market.data).stem if spec.market.data else "synthetic")
    )
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{name}"


# What a foxhunt run (or ensemble) directory holds: --force replaces nothing else. Not
# config.yaml alone: a project directory has one too.
_RUN_MARKERS = (
    "ensemble.json",
    "ensemble-plan.json",
    "metrics.csv",
    "checkpoints",
    "model.safetensors",
)


def _refuse_broken_link(option: str, path: Path, *, parents_only: bool = False) -> None:
    """Name a dangling or looping symlink on the way to ``path``: creating the directory
    through one failed as "File exists", which reads as a run already being there."""
    for part in path.parents if parents_only else (path, *path.parents):
        if part.is_symlink() and not part.exists():
            try:
                part.stat()
                what = "a dangling symlink"
            except OSError as err:
                what = "a symlink loop" if err.errno == errno.ELOOP else "a dangling symlink"
            if what == "a dangling symlink":
                what += f" (to {os.readlink(part)}, which does not exist)"
            raise ConfigError(f"{option} {path}: {part} is {what}")


def _prepare_run_dir(path: Path, force: bool) -> bool:
    """Check ``--run-dir``; True when it holds an old run that ``--force`` will replace.

    Nothing is deleted here: the caller replaces the old run only once every input has been
    validated, so a bad new input leaves the old run as it was. ``--force`` replaces only a
    directory that holds a foxhunt run, never the working directory or one of its parents.
    """
    _refuse_broken_link("--run-dir", path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--run-dir must be a directory, got a file: {path}")
    if not (path.is_dir() and any(path.iterdir())):
        return False
    if not force:
        from foxhunt.session import assert_not_in_use

        assert_not_in_use(path)  # a live run: "resume it" would be refused as well
        if (path / "ensemble-plan.json").is_file():
            resume = f"foxhunt ensemble resume {shell_quoted(path)}"
            hint = f"an ensemble stopped part way: `{resume}`, or --force"
        elif (path / "checkpoints" / "latest.json").is_file():
            hint = f"use `foxhunt resume {shell_quoted(path)}`, another --run-dir, or --force"
        else:
            hint = "it has no checkpoint to resume: another --run-dir, or --force to replace it"
        raise ConfigError(f"--run-dir already holds files: {path} ({hint})")
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents or resolved == Path.home().resolve():
        raise ConfigError(f"--force would delete {path} (the working or home directory); refused")
    members = (path / "member-0" / "config.yaml").is_file()  # an ensemble stopped part way
    foreign = (path / ".git").exists()  # a repository is never a run, whatever it holds
    if foreign or (not members and not any((path / m).exists() for m in _RUN_MARKERS)):
        sample = ", ".join(sorted(p.name for p in path.iterdir())[:3])
        raise ConfigError(
            f"--force replaces only a foxhunt run directory; {path} holds other files "
            f"({sample}): choose another --run-dir"
        )
    return True


def cmd_train(args: argparse.Namespace) -> int:
    from foxhunt.session import run_training

    spec = _spec_from_args(args)
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir(spec)
    from foxhunt.distributed import current

    replace = current().is_main and _prepare_run_dir(run_dir, args.force)
    # The old run goes only after the new trainer is built (every input checked).
    before_write = (lambda: shutil.rmtree(run_dir)) if replace else None
    run_training(
        spec,
        run_dir,
        progress=not args.no_progress,
        before_write=before_write,
        origin=_origin(args, spec),
    )
    return 0


def _origin(args: argparse.Namespace, spec: Any) -> str:
    """Where the hyperparameters came from, lowest precedence first: the preset (named by
    --preset, else the env's default), the config file, the --set overrides."""
    from foxhunt.runs import default_preset

    preset = args.preset or default_preset(spec.is_trading)
    parts = [f"preset {preset}"]
    if args.config:
        parts.append(str(args.config))
    if args.overrides:
        parts.append(f"{len(args.overrides)} --set")
    return " + ".join(parts)


def _run_dir_arg(text: str) -> Path:
    """RUN_DIR of resume/evaluate/report: a file there is refused by name (never opened)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise FoxhuntError(f"RUN_DIR must be a run directory, got a file: {path}")
    if (path / "study.json").is_file() and not (path / "config.yaml").exists():
        best = path / "best_config.yaml"
        raise FoxhuntError(
            f"{path} holds a hyperparameter search's results, not a run"
            + (
                f": `foxhunt train --config {shell_quoted(best)}` trains its best configuration"
                if best.is_file()
                else ""
            )
        )
    return path


def cmd_resume(args: argparse.Namespace) -> int:
    from foxhunt.session import resume_training

    run_dir = _run_dir_arg(args.run_dir)
    if _under_torchrun():
        raise ConfigError(
            "resume continues a run in one process (a data-parallel checkpoint holds rank 0's "
            f"state only): run `foxhunt resume {shell_quoted(run_dir)}` without torchrun"
        )
    if (run_dir / "ensemble-plan.json").is_file():
        raise ConfigError(
            f"{run_dir} is an ensemble stopped part way: `foxhunt ensemble resume "
            f"{shell_quoted(run_dir)}`"
        )
    if (run_dir / "ensemble.json").is_file():
        raise ConfigError(
            f"{run_dir} is an ensemble: resume a member's run (e.g. `foxhunt resume "
            f"{run_dir / 'member-0'}`)"
        )
    resume_training(run_dir, total_steps=args.total_steps, progress=not args.no_progress)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from foxhunt.session import evaluate_run

    _run_dir_arg(args.run_dir)
    if _is_ensemble(Path(args.run_dir), args.model):
        from foxhunt.ensemble import evaluate_ensemble

        out = evaluate_ensemble(
            Path(args.run_dir), split=args.split, data=args.data, episodes=args.episodes
        )
        print(_json(out))
        return 0
    out = evaluate_run(
        Path(args.run_dir),
        data=args.data,
        split=args.split,
        model=args.model or "final",
        episodes=args.episodes,
    )
    print(_json(out))
    return 0


def cmd_position(args: argparse.Namespace) -> int:
    from foxhunt.session import next_position

    run_dir = _run_dir_arg(args.run_dir)
    _is_ensemble(run_dir, args.model)  # --model refused on an ensemble, in the flag's words
    try:
        out = next_position(
            run_dir,
            data=args.data,
            model=args.model or "final",
            held=args.held,
            risk_aversion=args.risk_aversion,
            max_std=args.max_std,
            fallback_action=args.fallback_action,
        )
    except ConfigError as exc:  # the library names its arguments; a user typed flags
        text = re.sub(r"^held must", "--held must", str(exc))  # "held" is a plain word too
        raise ConfigError(_flag_names(text, *_ENSEMBLE_POLICY)) from None
    except FoxhuntError as exc:  # a replay wiped out says to pass held=: the flag here
        if "pass held= " not in str(exc):
            raise
        raise FoxhuntError(str(exc).replace("pass held= ", "pass --held ")) from None
    print(_json(out))
    return 0


def _is_ensemble(run_dir: Path, model: str | None) -> bool:
    """Whether ``run_dir`` is an ensemble; one refuses ``--model`` (members' final weights)."""
    ensemble = (run_dir / "ensemble.json").is_file()
    if ensemble and model is not None:
        raise ConfigError(
            f"--model applies to single runs; {run_dir} is an ensemble (its members' final "
            "weights are used)"
        )
    return ensemble


_ENSEMBLE_POLICY = ("max_std", "fallback_action", "risk_aversion")
"""The library's names of the ensemble policy's arguments (``_add_ensemble_policy_options``)."""


def _flag_names(message: str, *names: str) -> str:
    """``message`` with the library's argument names (max_std) written as the flags a user
    typed (--max-std)."""
    words = "|".join(name.replace("-", "_") for name in names)
    return re.sub(rf"\b({words})\b", lambda m: "--" + m[1].replace("_", "-"), message)


def cmd_report(args: argparse.Namespace) -> int:
    from foxhunt.report import write_run_report

    run_dir = _run_dir_arg(args.run_dir)
    if (run_dir / "ensemble.json").is_file():
        raise ConfigError(
            f"{run_dir} is an ensemble: report a member's training (e.g. `foxhunt report "
            f"{shell_quoted(run_dir / 'member-0')}`); `foxhunt evaluate "
            f"{shell_quoted(run_dir)}` backtests the ensemble"
        )
    paths = write_run_report(run_dir)
    print(f"report written: {paths['index']}")
    return 0


def _under_torchrun() -> bool:
    from foxhunt.distributed import launched_world_size  # torch is imported only when needed

    return launched_world_size() > 1


def _not_under_torchrun(command: str) -> None:
    """Refuse a command that runs several trainings one after another under torchrun: every
    rank would run all of them, into the same directories."""
    if _under_torchrun():
        raise ConfigError(
            f"{command} runs its trainings one after another in one process; run it without "
            "torchrun (a single run trains data-parallel with `torchrun ... foxhunt.cli train`)"
        )


def cmd_hyperopt(args: argparse.Namespace) -> int:
    from foxhunt.config import RUN_KEYS
    from foxhunt.hyperopt import check_search_dir, run_hyperopt

    _not_under_torchrun("hyperopt")
    spec = _spec_from_args(args)
    if args.run_dir:  # before the market is built: a refused directory is refused at once
        _refuse_broken_link("--run-dir", Path(args.run_dir))
        check_search_dir(Path(args.run_dir), args.study_name, args.storage, args.force)
    best = run_hyperopt(
        spec,
        n_trials=args.trials,
        storage=args.storage,
        study_name=args.study_name,
        sampler_seed=args.sampler_seed,
        run_dir=Path(args.run_dir) if args.run_dir else None,
        force=args.force,
        # What the user set explicitly stays as set; the search tunes the rest.
        fixed={k for k in _overrides(args.overrides) if "." not in k} - RUN_KEYS,
    )
    if not args.run_dir:  # said after the search, so a refused input stays one line
        log.warning(
            "no --run-dir: trials.csv and best_config.yaml were not written (the summary below "
            "is all that remains, besides --storage)"
        )
    print(json.dumps(best, indent=2))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from foxhunt.markets.synthetic import SyntheticMarketConfig, write_synthetic_csv

    out = Path(args.out)
    _refuse_broken_link("--out", out, parents_only=True)  # the file itself is replaced
    if out.is_dir():
        raise ConfigError(f"--out must be a file path, got a directory: {out}")
    if os.path.basename(args.out) != out.name:  # Path() drops "x.csv/"'s slash, "x.csv/."'s dot
        raise ConfigError(f"--out must be a file path, got a directory path: {args.out}")
    if out.exists() and not args.force:
        raise ConfigError(f"--out already exists: {out} (choose another path, or --force)")
    if args.bars is not None and args.bars < 2:  # the config would name its field, n_bars
        raise ConfigError(f"--bars must be at least 2, got: {args.bars}")
    settings = {"n_bars": args.bars, "freq": args.freq}
    given = {k: v for k, v in settings.items() if v is not None}
    try:
        config = SyntheticMarketConfig(**given) if given else None
    except ConfigError as exc:  # named as the flags a user typed
        raise ConfigError(_flag_names(str(exc), "freq")) from None
    write_synthetic_csv(out, config, seed=args.seed)
    print(f"synthetic market written: {args.out}")
    return 0


def cmd_ensemble(args: argparse.Namespace) -> int:
    from foxhunt.ensemble import evaluate_ensemble, resume_ensemble, train_ensemble

    if args.ensemble_command in ("train", "resume"):
        _not_under_torchrun(f"ensemble {args.ensemble_command}")
    if args.ensemble_command == "resume":
        run_dir = _run_dir_arg(args.run_dir)
        paths = resume_ensemble(run_dir, progress=not args.no_progress)
        print(f"foxhunt: ensemble of {len(paths)} members written to {run_dir}")
        return 0
    if args.ensemble_command == "evaluate":
        try:
            out = evaluate_ensemble(
                Path(args.run_dir),
                split=args.split,
                risk_aversion=args.risk_aversion,
                max_std=args.max_std,
                fallback_action=args.fallback_action,
                data=args.data,
                episodes=args.episodes,
            )
        except ConfigError as exc:  # the library names its arguments; a user typed flags
            raise ConfigError(_flag_names(str(exc), *_ENSEMBLE_POLICY)) from None
        print(_json(out))
        return 0
    if args.members < 2:
        raise ConfigError(f"--members must be at least 2, got: {args.members}")
    spec = _spec_from_args(args)
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        default = _default_run_dir(spec)
        run_dir = default.with_name(default.name + "-ensemble")
    replace = _prepare_run_dir(run_dir, args.force)
    if replace:
        from foxhunt.runs import make_envs

        for env in make_envs(spec)[:2]:  # every input checked before the old run goes
            close = getattr(env, "close", None)
            if callable(close):
                close()
        from foxhunt.session import assert_not_in_use

        for member in sorted(run_dir.glob("member-*")):  # none may be training right now
            assert_not_in_use(member)
    # The old run goes only once member 0's trainer is built (device, memory checked).
    before_write = (lambda: shutil.rmtree(run_dir)) if replace else None
    paths = train_ensemble(
        spec, run_dir, args.members, progress=not args.no_progress, before_write=before_write
    )
    print(f"foxhunt: ensemble of {len(paths)} members written to {run_dir}")
    return 0


COMMANDS = {
    "train": cmd_train,
    "resume": cmd_resume,
    "evaluate": cmd_evaluate,
    "position": cmd_position,
    "report": cmd_report,
    "hyperopt": cmd_hyperopt,
    "data": cmd_data,
    "ensemble": cmd_ensemble,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: returns the exit code (0 ok, 2 user error, 130 interrupted, 143 SIGTERM,
    129 SIGHUP)."""
    args = build_parser().parse_args(argv)
    # Called in-process (a notebook, a test, a script), main() leaves the caller's logging,
    # signal handling and streams as it found them.
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    handlers = {sig: signal.getsignal(sig) for sig in _TERMINATING}
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        with _escaping_streams():
            return _main(args)
    finally:
        for handler in root.handlers[:]:
            if handler not in root_handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(root_level)
        for sig, previous in handlers.items():
            if previous is not None:  # None: set from C, which Python cannot put back
                with contextlib.suppress(ValueError):  # not the main thread: nothing was set
                    signal.signal(sig, previous)


# The signals (besides Ctrl-C) that end a command as one: SIGTERM (kill, docker stop, Slurm) and
# SIGHUP (a closed terminal or SSH session), where the platform has it.
_TERMINATING = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


@contextlib.contextmanager
def _escaping_streams() -> Iterator[None]:
    """stdout and stderr escape what their encoding lacks (a run directory named in Cyrillic on
    an ASCII or cp1252 stream) instead of raising mid-command with a traceback."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        errors = getattr(stream, "errors", None)
        if errors == "strict" and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="backslashreplace")
                changed.append(stream)
    try:
        yield
    finally:
        for stream in changed:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="strict")


def _main(args: argparse.Namespace) -> int:
    """Runs the parsed command; turns user errors and interrupts into one line and an exit code."""
    from foxhunt.errors import how_stopped, stop_signals

    terminated: list[int] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        # kill, docker stop, Slurm and Kubernetes stop a job with SIGTERM, a closed terminal
        # with SIGHUP: stop as Ctrl-C does, so training leaves a checkpoint to resume instead of
        # losing the run.
        terminated.append(signum)
        err = KeyboardInterrupt()
        err.signum = signum  # type: ignore[attr-defined]  # read as TrainingInterrupted's is
        raise err

    with contextlib.suppress(ValueError):  # only the main thread may set handlers
        for sig in stop_signals():  # SIGHUP left alone under nohup
            if sig != signal.SIGINT:
                signal.signal(sig, on_sigterm)
    try:
        if args.command == "train":
            import torch

            from foxhunt.distributed import init_from_env

            # Joins a torchrun job when launched by torchrun; no-op otherwise. SIGTERM keeps its
            # default action meanwhile: the rendezvous blocks in C++ (for up to 30 minutes when a
            # peer never comes), where a Python handler would not run and `kill` would not stop it.
            with _default_sigterm():
                init_from_env("cuda" if torch.cuda.is_available() else "cpu")
            from foxhunt.errors import TrainingHalted, TrainingInterrupted

            try:
                code = COMMANDS[args.command](args)
            except (TrainingInterrupted, TrainingHalted):
                _leave_process_group(wait=True)  # every rank stopped at the same boundary
                raise
            except BaseException:
                _leave_process_group(wait=False)
                raise
            _leave_process_group(wait=True)
            return code
        return COMMANDS[args.command](args)
    except FoxhuntError as err:
        print(f"foxhunt: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as err:
        # The trainer defers the signal to a loop boundary and says which one it was.
        signum = int(getattr(err, "signum", 0) or (terminated[0] if terminated else 0))
        signum = signum or signal.SIGINT
        with contextlib.suppress(OSError):  # stderr gone with the terminal that hung up
            print(f"foxhunt: {_interrupted(err, args, how_stopped(signum))}", file=sys.stderr)
        return 128 + signum
    except OSError as err:  # the filesystem said no: a path the user chose, a full disk
        # os.replace(temp, target) (an atomic write) names the temp file first: the target is
        # the path the user knows.
        path = err.filename2 or err.filename
        where = f": {path}" if path else ""
        what = err.strerror or _one_line(err)
        print(f"foxhunt: error: {what}{where}", file=sys.stderr)
        return EXIT_USER_ERROR
    except MemoryError:
        print(f"foxhunt: error: {_OUT_OF_MEMORY}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as err:
        # Two resource failures that other libraries raise as their own types: the allocator
        # refusing a size the settings asked for, and safetensors meeting a full disk.
        text = _one_line(err)
        if isinstance(err, RuntimeError) and "can't allocate memory" in text:
            size = re.search(r"allocate (\d+) bytes", text)
            asked = f" (one allocation of {int(size.group(1)) / 2**30:.1f} GiB)" if size else ""
            print(f"foxhunt: error: {_OUT_OF_MEMORY}{asked}", file=sys.stderr)
            return EXIT_USER_ERROR
        if type(err).__name__ == "SafetensorError" and "No space left on device" in text:
            print("foxhunt: error: No space left on device (writing a checkpoint)", file=sys.stderr)
            return EXIT_USER_ERROR
        if _peer_lost(err, text):  # another rank died (killed for memory, a node lost)
            run = getattr(args, "run_dir", None)
            target = shell_quoted(run) if run else "RUN_DIR"
            print(
                f"foxhunt: error: a data-parallel peer stopped ({text[:160]}; why is in that "
                f"rank's own output): the run keeps its last checkpoint; continue it with "
                f"`foxhunt resume {target}` (in one process) or a new torchrun job",
                file=sys.stderr,
            )
            return 1
        raise


def _peer_lost(err: Exception, text: str) -> bool:
    """Whether ``err`` is gloo/NCCL reporting that another rank of a torchrun job went away:
    rank 0 printed forty lines of C++ traceback for it."""
    try:
        launched = _under_torchrun()
    except FoxhuntError:
        return False
    signs = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
    return launched and isinstance(err, RuntimeError) and any(s in text for s in signs)


_OUT_OF_MEMORY = (
    "out of memory: lower buffer_capacity, batch_size, hidden_sizes or n_envs (or --bars)"
)


def _json(value: Any) -> str:
    """Strict JSON for stdout: undefined numbers (NaN, inf) are null, as in the report files."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(value), indent=2, default=str, allow_nan=False)


def _interrupted(err: KeyboardInterrupt, args: argparse.Namespace, how: str) -> str:
    """What a Ctrl-C (or SIGTERM: ``how``) left behind, and what to run next."""
    from foxhunt.errors import TrainingInterrupted

    if args.command == "ensemble" and isinstance(err, TrainingInterrupted):
        # A member's own resume would finish that member only: the ensemble's finishes all.
        where = err.checkpoint.parent.parent.parent if err.checkpoint is not None else None
        where = where or getattr(args, "run_dir", None)
        then = f": continue with `foxhunt ensemble resume {shell_quoted(where)}`" if where else ""
        return f"{how} at env step {err.env_steps} of a member{then}"
    if isinstance(err, TrainingInterrupted) and err.checkpoint is not None:
        run_dir = err.checkpoint.parent.parent
        return (
            f"{how} at env step {err.env_steps}; checkpoint saved: continue with "
            f"`foxhunt resume {shell_quoted(run_dir)}`"
        )
    if isinstance(err, TrainingInterrupted):
        return f"{how} at env step {err.env_steps} (nothing to save here)"
    if args.command == "ensemble" and getattr(args, "ensemble_command", None) == "resume":
        # Stopped while no member was training (starting up, between members), or by a second
        # signal: what is finished stays, and resume takes each member from where it is.
        return (
            f"{how} while no member's checkpoint could be taken: finished members are kept and "
            f"an unfinished one continues from its last checkpoint with "
            f"`foxhunt ensemble resume {shell_quoted(args.run_dir)}`"
        )
    if args.command in ("train", "resume"):
        return (
            f"{how} at once (a second stop signal, or before training started): the run keeps "
            "its last periodic checkpoint, if it has one"
        )
    return how


@contextlib.contextmanager
def _default_sigterm() -> Any:
    """SIGTERM's (and SIGHUP's) default action (end the process) inside the block, the handlers
    after it. A SIGHUP that ``nohup`` ignores stays ignored."""
    try:
        handlers = {
            sig: signal.signal(sig, signal.SIG_DFL)
            for sig in _TERMINATING
            if signal.getsignal(sig) is not signal.SIG_IGN
        }
    except ValueError:  # not the main thread: no handler was set either
        yield
        return
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def _leave_process_group(*, wait: bool) -> None:
    """Leave a torchrun job on every way out: a rank that exits still in the group makes gloo
    abort the process ("terminate called without an active exception"). A finished, stopped or
    halted run waits at a barrier for its peers (they stop at the same boundary); another error
    does not (a peer may be gone, or inside a collective this rank will never join), it only
    tears its side down."""
    import gc

    import torch.distributed as dist

    from foxhunt.distributed import shutdown

    with contextlib.suppress(Exception):
        if dist.is_available() and dist.is_initialized():
            # The finished trainer is garbage held in reference cycles: its DDP reducer, with
            # the gloo work it keeps, is freed now, not at interpreter finalization, where
            # releasing tensors from gloo's threads aborts the process (a rare SIGABRT seen
            # under load; pytorch/pytorch#179291 describes the mechanism).
            gc.collect()
        if wait:
            shutdown()
        elif dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
