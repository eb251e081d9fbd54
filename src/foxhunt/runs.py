"""A run: what to train on, with which hyperparameters, written to and read from a run directory.

The CLI is a thin shell over these functions, so everything it does is also a library call. A run
directory holds ``config.yaml`` (this spec, resolved), ``metrics.csv``, ``tensorboard/``,
``checkpoints/``, ``model.safetensors`` + ``model.json`` (the final greedy policy),
``summary.json``, for trading runs ``data.json`` (the identity of the market trained on, see
:data:`DATA_FILE`) and, after ``evaluate``, ``backtest/`` (``backtest_best/``,
``backtest_validation/``, ... for other models and splits).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from foxhunt._io import atomic_write_bytes, atomic_write_text, read_json_object, shell_quoted
from foxhunt.config import (
    RUN_KEYS,
    DQNHyperparameters,
    _format_validation_error,
    did_you_mean,
    dump_yaml,
    load_config_dict,
    shown,
)
from foxhunt.envs.trading import TradingEnvConfig
from foxhunt.errors import ConfigError, DataError, FoxhuntError

PRESETS = ("classic", "default", "conservative", "rainbow", "cartpole", "trading")
DEFAULT_TOTAL_STEPS = {"trading": 60_000, "gym": 50_000}
HALTED_FILE = "halted.json"  # why a health monitor stopped the run (report.py reads it)

log = logging.getLogger(__name__)


class MarketSpec(BaseModel):
    """Where market data comes from and how regimes and splits are built (trading runs only)."""

    # Numbers are strict: a lax int/float would silently take YAML's ``true`` as 1.
    model_config = ConfigDict(extra="forbid", frozen=True)

    data: str | None = None
    """OHLCV file (CSV or Parquet); None = the embedded synthetic regime-switching market."""
    synthetic_seed: StrictInt = Field(0, ge=0, lt=2**32)
    """Seed of the synthetic market."""
    detector: Literal["hmm", "volatility_trend"] = "hmm"
    """Causal regime detector fitted on the training span."""
    n_regimes: StrictInt = Field(4, ge=1, le=16)
    """Regimes the detector distinguishes."""
    detector_seed: StrictInt | None = Field(None, ge=0, lt=2**32)
    """Seed of the HMM detector's fit; None = the run's seed. A hyperopt's best_config.yaml
    sets it: its trials share the market fitted with the search's seed, not the trial's."""
    train_fraction: StrictFloat = Field(0.7, gt=0.0, lt=1.0)
    """Chronological share of bars used for training (and for fitting features and regimes)."""
    validation_fraction: StrictFloat = Field(0.15, ge=0.0, lt=1.0)
    """Share of bars after the training span used for evaluation during training."""
    features: tuple[str, ...] | None = ()
    """Price-feature columns the agent observes besides position and regime probabilities.

    () (the default) = none: within a regime prices are close to a random walk, and on the
    synthetic market a network given raw price features memorises the training span instead of
    learning the regime policy (see BENCHMARKS.md). None = all of ``compute_features``' columns.
    """

    @model_validator(mode="after")
    def _leave_a_test_span(self) -> MarketSpec:
        total = self.train_fraction + self.validation_fraction
        if total >= 1.0:
            raise ValueError(
                "market.train_fraction + market.validation_fraction must be < 1 to leave a test "
                f"span, got {self.train_fraction} + {self.validation_fraction} = {total:g}"
            )
        if self.detector == "volatility_trend" and self.n_regimes not in (3, 4):
            raise ValueError(
                "market.n_regimes must be 3 or 4 with market.detector=volatility_trend (bull, "
                f"bear, sideways[, high volatility]), got {self.n_regimes}"
            )
        return self


class RunSpec(BaseModel):
    """Everything needed to rebuild a run's environments and agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str | None = None
    """A Gymnasium env id; None = the trading environment."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of ``gym.make`` for ``env`` (``map_name``, ``max_episode_steps``)."""
    market: MarketSpec = MarketSpec()
    """Market data and regimes (trading runs)."""
    trading: dict[str, Any] = Field(default_factory=dict)
    """TradingEnvConfig fields (trading runs)."""
    total_env_steps: StrictInt = Field(50_000, gt=0)
    """Environment steps to train for."""
    hyperparameters: DQNHyperparameters = DQNHyperparameters()
    """The agent's hyperparameters."""

    @property
    def is_trading(self) -> bool:
        return self.env is None

    def trading_config(self, **overrides: Any) -> TradingEnvConfig:
        return TradingEnvConfig(**{**self.trading, **overrides})

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        if not self.is_trading:  # market and trading sections mean nothing for a Gymnasium env
            del data["market"], data["trading"]
        if not self.env_kwargs:
            del data["env_kwargs"]
        return dump_yaml(data)


def default_preset(trading: bool) -> str:
    """The preset a run starts from when none is named. Every Gymnasium env takes the
    classic-control configuration: the plain defaults learned nothing on Acrobot or
    MountainCar in 100k steps, it solves both (BENCHMARKS §2)."""
    return "trading" if trading else "classic"


def preset(name: str, **overrides: Any) -> DQNHyperparameters:
    """Hyperparameters of a named preset."""
    if name == "default":
        return DQNHyperparameters(**overrides)
    if name == "conservative":
        return DQNHyperparameters.conservative(**overrides)
    if name == "rainbow":
        return DQNHyperparameters.rainbow(**overrides)
    if name in ("classic", "cartpole"):  # one configuration: tuned on CartPole, solves more
        return DQNHyperparameters.classic(**overrides)
    if name == "trading":
        return DQNHyperparameters.trading(**overrides)
    raise ConfigError(f"preset must be one of {', '.join(PRESETS)}, got: {name!r}")


_SECTIONS = RUN_KEYS | {"hyperparameters"}


def _split_sections(raw: dict[str, Any], config_file: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(hyperparameters, run sections) of a sectioned config file; every key is accounted for.

    Hyperparameter names may also sit at the top level next to the sections; any other key (a
    typo such as ``total_env_step``) is refused rather than silently ignored.
    """
    hp_names = set(DQNHyperparameters.model_fields)
    section = raw.get("hyperparameters")
    if section is not None and not isinstance(section, dict):
        raise ConfigError(
            f"{config_file}: hyperparameters must be a mapping of names to values, got: "
            f"{section!r:.60}"
        )
    file_hp = dict(section or {})
    file_run: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "hyperparameters":
            continue
        if (
            key in ("market", "trading", "env_kwargs")
            and value is not None
            and not isinstance(value, dict)
        ):
            raise ConfigError(f"{config_file}: {key} must be a mapping, got: {value!r:.60}")
        if key == "env" and value is not None and not isinstance(value, str):
            raise ConfigError(f"{config_file}: env must be a Gymnasium id, got: {value!r:.60}")
        if key in _SECTIONS:
            file_run[key] = value
        elif key in hp_names:
            if key in file_hp:
                raise ConfigError(
                    f"{config_file}: {key} is set both at the top level and under hyperparameters"
                )
            file_hp[key] = value
        else:
            close = did_you_mean(str(key), [*_SECTIONS, *hp_names])
            hint = close if close.startswith("; did you mean") else ""
            raise ConfigError(
                f"{config_file}: unknown key {key!r} (sections: {', '.join(sorted(_SECTIONS))}; "
                f"or a hyperparameter name){hint}"
            )
    return file_hp, file_run


def data_path(data: object, name: str = "data") -> str | None:
    """A market data argument as the path a run records: a str or a Path (the file is read, and
    a missing one refused, when the run builds its market)."""
    if data is None:
        return None
    if isinstance(data, str) and not data.strip():
        raise ConfigError(f"{name} must be a file path, got an empty string")
    if type(data).__name__ == "DataFrame":
        raise ConfigError(
            f"{name} must be a file path (a run records where its data came from, for resume "
            "and evaluate): save the DataFrame first, e.g. df.to_parquet('bars.parquet')"
        )
    if not isinstance(data, str | Path):
        raise ConfigError(f"{name} must be a file path, got {type(data).__name__}")
    return str(data)


def require_spec(spec: Any) -> RunSpec:
    """A public entry point's ``spec`` argument, refused by name unless it is a RunSpec (a
    DQNHyperparameters, an env id or a dict otherwise failed with an AttributeError)."""
    if not isinstance(spec, RunSpec):
        hint = (
            ": foxhunt.build_spec(env=..., overrides=hp.to_dict()) makes one from it"
            if type(spec).__name__ == "DQNHyperparameters"
            else ": make one with foxhunt.build_spec(env=..., data=..., overrides=...)"
        )
        raise ConfigError(f"spec must be a RunSpec, got: {type(spec).__name__}{hint}")
    return spec


def refuse_other_dir(run_dir: Path, python_call: str) -> None:
    """A Python entry point given an ensemble or a hyperparameter search's directory says what
    it holds and which call takes it (the CLI dispatches or explains these; Python said "no
    trained model" or "no checkpoint")."""
    if (run_dir / "study.json").is_file() and not (run_dir / "config.yaml").exists():
        raise ConfigError(
            f"{run_dir} holds a hyperparameter search's results, not a run: "
            f"foxhunt.build_spec(config_file='{run_dir / 'best_config.yaml'}', ...) and "
            "foxhunt.train_run train its best configuration"
        )
    if (run_dir / "ensemble.json").is_file():  # one stopped part way: load_spec says so
        raise ConfigError(
            f"{run_dir} is an ensemble: {python_call} (or use a member's run, "
            f"{run_dir / 'member-0'})"
        )


SPLITS = ("train", "validation", "test", "all")


def check_split(split: object) -> None:
    """Refuse a split name that is none of :data:`SPLITS`."""
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got: {split!r}")


def _absolute(path: Path) -> str:
    """``path`` resolved; a symlink loop (which ``resolve`` raises on) made absolute as it is,
    for the loader to name."""
    try:
        return str(path.resolve())
    except (RuntimeError, OSError):
        return os.path.abspath(path)


def build_spec(
    *,
    env: str | None = None,
    data: str | None = None,
    config_file: str | None = None,
    preset_name: str | None = None,
    overrides: dict[str, Any] | None = None,
    total_steps: int | None = None,
    seed: int | None = None,
) -> RunSpec:
    """Resolve CLI-style inputs into a validated RunSpec.

    Precedence (lowest first): preset, config file, ``--set`` overrides, ``--seed``. A config file
    holds either a flat mapping of hyperparameters or sections ``hyperparameters``, ``env``,
    ``env_kwargs``, ``market``, ``trading`` and ``total_env_steps``.
    """
    if env is not None and not isinstance(env, str):
        raise ConfigError(
            f"env must be a Gymnasium id (a string), got: {type(env).__name__}: a run directory "
            "rebuilds its env from the id (register yours with gymnasium.register); to train an "
            "env object directly, use foxhunt.DQNTrainer(hyperparameters, env)"
        )
    overrides = dict(overrides or {})
    data = data_path(data, "data")
    overrides, total_steps = _normalise_overrides(overrides, seed, total_steps)
    file_hp, file_run = _read_config_file(config_file)
    if env is None:
        env = file_run.get("env")
    trading = env is None
    _check_scope(env, data, overrides, file_run)
    if preset_name is None:
        preset_name = default_preset(trading)
    env_over = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("env_kwargs.")}
    trading_over = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("trading.")}
    market_over = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("market.")}
    hp_over = {k: v for k, v in overrides.items() if "." not in k}
    if seed is not None:
        hp_over["seed"] = seed
    if not trading and preset_name == "trading":
        raise ConfigError(
            f"--preset trading is for the trading environment (its network reads market "
            f"regimes), got it with --env {env!r}; use one of "
            f"{', '.join(p for p in PRESETS if p != 'trading')}"
        )
    hp = preset(preset_name, **{**file_hp, **hp_over})
    if not trading and hp.regime_conditional:
        source = "--set" if "regime_conditional" in hp_over else config_file
        raise ConfigError(
            f"regime_conditional: true (from {source}) needs the trading environment's market "
            f"regimes, got --env {env!r}"
        )
    if total_steps is not None:
        steps = total_steps
    elif "total_env_steps" in file_run:
        steps = file_run["total_env_steps"]  # RunSpec refuses 0, negatives, text and booleans
    else:
        steps = DEFAULT_TOTAL_STEPS["trading" if trading else "gym"]
    market_spec = _market_spec(file_run, market_over, data)
    try:
        spec = RunSpec(
            env=env,
            env_kwargs={**(file_run.get("env_kwargs") or {}), **env_over},
            market=market_spec,
            trading={**(file_run.get("trading") or {}), **trading_over},
            total_env_steps=steps,
            hyperparameters=hp,
        )
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None
    hp.check_new()
    if hp.n_envs > spec.total_env_steps:  # checked for new runs only: old ones still load
        raise ConfigError(
            f"n_envs ({hp.n_envs}) exceeds total_env_steps ({spec.total_env_steps}): one vector "
            "step takes a step in every env"
        )
    if trading:
        config = spec.trading_config()  # validate now, before anything is written
        config.check_new()
        given = spec.trading.get("random_start", True)
        if not isinstance(given, bool):  # lax for recorded runs, which stored 0.0 as written
            raise ConfigError(f"trading.random_start must be true or false, got: {given!r}")
    return spec


def _normalise_overrides(
    overrides: dict[str, Any], seed: int | None, total_steps: int | None
) -> tuple[dict[str, Any], int | None]:
    """``--set`` overrides as flat ``section.key`` names, the run-level ones checked against their
    flags; returns them without ``total_env_steps`` and the total it gave."""
    for section in ("env_kwargs", "market", "trading"):  # --set 'env_kwargs={map_name: 8x8}'
        whole = overrides.pop(section, None)
        if isinstance(whole, dict):
            for k, v in whole.items():
                overrides.setdefault(f"{section}.{k}", v)
        elif whole is not None:
            raise ConfigError(
                f"--set {section}={whole!r:.60}: {section} takes a mapping ({section}={{a: 1}}) "
                f"or one key at a time ({section}.a=1)"
            )
    if "market.data" in overrides:
        overrides["market.data"] = data_path(overrides["market.data"], "market.data")
    if "env" in overrides:  # a config file's key, but on the command line it has its flag
        raise ConfigError(
            f"--set env={overrides['env']!r:.60}: the environment is chosen with --env "
            "(or an env: key in a --config file)"
        )
    # The run-level settings a config file holds are --set-able too; each given twice must agree.
    for key, flag, value in (
        ("seed", "--seed", seed),
        ("total_env_steps", "--total-steps", total_steps),
    ):
        given = overrides.get(key)
        if value is not None and key in overrides and (given != value or type(given) is not int):
            raise ConfigError(
                f"{flag} {value!r} and --set {key}={overrides[key]!r} disagree; give one"
            )
    if overrides.get("total_env_steps", 0) is None:  # null would silently mean the default
        raise ConfigError("total_env_steps must be a positive integer, got: None")
    for k in overrides:  # 'market.=1': an empty name after the section
        if "." in k and not k.split(".", 1)[1].strip():
            raise ConfigError(f"--set {k}: give the setting's name after the dot ({k}NAME=VALUE)")
    if total_steps is None and "total_env_steps" in overrides:
        total_steps = overrides["total_env_steps"]
    overrides.pop("total_env_steps", None)
    return overrides, total_steps


def _read_config_file(config_file: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A config file's hyperparameters and its run-level sections (a relative market.data
    resolved against the file)."""
    file_hp: dict[str, Any] = {}
    file_run: dict[str, Any] = {}
    if config_file is not None:
        raw = load_config_dict(Path(config_file), flatten=False)
        # A flat file goes through the same split: an unknown key is then named with the file.
        file_hp, file_run = _split_sections(raw, config_file)
        if "market" in file_run:
            data_in_file = (file_run.get("market") or {}).get("data")
            if isinstance(data_in_file, str) and not data_in_file.strip():
                raise ConfigError(
                    f"{config_file}: market.data must be a file path, got an empty string"
                )
            if isinstance(data_in_file, str) and not Path(data_in_file).is_absolute():
                # Relative to the config file, so the run does not depend on the working dir.
                resolved = _absolute(Path(config_file).parent / data_in_file)
                file_run["market"] = {**file_run["market"], "data": resolved}
        _check_section_keys(file_run, config_file)
    return file_hp, file_run


def _check_scope(
    env: str | None, data: str | None, overrides: dict[str, Any], file_run: dict[str, Any]
) -> None:
    """Settings of the trading environment given with a Gymnasium env, and the reverse."""
    if env is not None and data is not None:
        raise ConfigError(f"--data applies to the trading environment, got it with --env {env!r}")
    trading = env is None
    env_over = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("env_kwargs.")}
    if trading and (env_over or file_run.get("env_kwargs")):
        what = next(iter(f"env_kwargs.{k}" for k in env_over), "an env_kwargs section")
        raise ConfigError(
            f"{what} applies to Gymnasium envs (--env); the trading environment takes trading.X"
        )
    if not trading:
        foreign = sorted(k for k in overrides if k.startswith(("trading.", "market.")))
        defaults = RunSpec().model_dump(mode="json")
        sections = [k for k in ("trading", "market") if file_run.get(k, defaults[k]) != defaults[k]]
        if foreign or sections:
            what = foreign[0] if foreign else "a trading/market section"
            raise ConfigError(
                f"{what} applies to the trading environment, got it with --env {env!r}"
            )
    for k in overrides:
        if "." in k and not k.startswith(("trading.", "market.", "env_kwargs.")):
            raise ConfigError(
                f"unknown setting {k!r} (use a hyperparameter name, trading.X, market.X or "
                "env_kwargs.X)"
            )


def _market_spec(
    file_run: dict[str, Any], market_over: dict[str, Any], data: str | None
) -> MarketSpec:
    """The market: the config file's section, then ``--set market.X``, then ``--data``."""
    market = {**(file_run.get("market") or {}), **market_over}
    if data is not None and market_over.get("data") not in (None, data):
        raise ConfigError(
            f"--data {data!r} and --set market.data={market_over['data']!r} disagree; give one"
        )
    if data is not None:
        market["data"] = data
    if isinstance(market.get("data"), str):
        if not market["data"].strip():
            raise ConfigError("market.data must be a file path, got an empty string")
        # Absolute (relative to where the command ran): `foxhunt evaluate` and `resume` may run
        # from another directory. A config file's own relative path was resolved against it above.
        market["data"] = _absolute(Path(market["data"]))
    try:
        market_spec = MarketSpec(**market)
    except ValidationError as err:
        known = MarketSpec.model_fields
        raise ConfigError(_format_validation_error(err, prefix="market.", known=known)) from None
    # --set market.synthetic_seed with a data file: the seed would do nothing. (A config file
    # may hold both: a walk-forward fold's records its parent's seed beside its data.)
    if market_spec.data is not None and "synthetic_seed" in market_over:
        raise ConfigError(
            f"market.synthetic_seed applies to the synthetic market and does nothing with "
            f"market.data {market_spec.data}, got: {market_spec.synthetic_seed} (drop one)"
        )
    return market_spec


def _check_section_keys(file_run: dict[str, Any], config_file: str | Path) -> None:
    """An unknown key in a config file's market or trading section, named with the file (an
    override given later could not fix it, unlike a value)."""
    for section, model in (("market", MarketSpec), ("trading", TradingEnvConfig)):
        body = file_run.get(section)
        if not isinstance(body, dict):
            continue
        unknown = sorted((k for k in body if k not in model.model_fields), key=str)
        if unknown:
            hint = did_you_mean(str(unknown[0]), model.model_fields)
            raise ConfigError(
                f"{config_file}: unknown setting '{section}.{unknown[0]}' (value "
                f"{shown(body[unknown[0]])}){hint}"
            )


def load_spec(run_dir: Path) -> RunSpec:
    """Read ``run_dir/config.yaml`` back into a RunSpec (errors name the file)."""
    path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise FoxhuntError(f"run directory not found: {run_dir}")
    if not path.is_file():
        if (run_dir / "ensemble-plan.json").is_file():
            raise FoxhuntError(
                f"{run_dir} is an ensemble whose training stopped part way: finish it with "
                f"`foxhunt ensemble resume {shell_quoted(run_dir)}`"
            )
        raise FoxhuntError(f"not a foxhunt run directory (no config.yaml): {run_dir}")
    data = load_config_dict(path, flatten=False)
    try:
        spec = RunSpec(**data)
        if spec.is_trading:  # the trading section is a plain dict until its env is built
            spec.trading_config()
    except (ValidationError, ConfigError) as err:
        msg = _format_validation_error(err) if isinstance(err, ValidationError) else str(err)
        raise ConfigError(f"{path}: {msg}") from None
    return spec


# --- environments
@dataclass
class TradingSetup:
    """The market split into spans and the env factories built on it."""

    market: Any  # MarketArrays over all bars
    train_end: int
    val_end: int
    config: TradingEnvConfig
    data_record: dict[str, Any] | None = None  # what DATA_FILE records about this market

    def bounds(self, split: str) -> tuple[int, int]:
        """(first bar, end) of ``split``'s own bars, without the warm-up :meth:`span` borrows."""
        n = len(self.market)
        bounds = {
            "train": (0, self.train_end),
            "validation": (self.train_end, self.val_end),
            "test": (self.val_end, n),
            "all": (0, n),
        }
        check_split(split)
        return bounds[split]

    def span(self, split: str, *, closing: bool = False) -> Any:
        """``split``'s bars as a market. ``closing`` (backtests) adds the next split's first
        bar, whose close ends the period decided at this split's last bar: without it, one
        return at every boundary belonged to no span. Training never sees it."""
        start, stop = self.bounds(split)
        # Evaluation spans start `window - 1` bars early so the first decision has a full window
        # of (causal) features; those warm-up bars are only observed, never traded.
        if split != "train":
            start = max(0, start - (self.config.window - 1))
        if closing:
            stop = min(stop + 1, len(self.market))
        return self.market.slice(start, stop)

    def train_env(self) -> gym.Env:
        from foxhunt.envs.trading import TradingEnv

        return TradingEnv(self.span("train"), self.config)

    def eval_env(self, split: str = "validation") -> gym.Env:
        from foxhunt.envs.trading import TradingEnv

        return TradingEnv(self.span(split), self.config, eval_mode=True)


def _starts_later(df: Any, first: str) -> bool:
    """Whether the run's first bar is in ``df`` after its first row (a walk-forward fold's
    run, given the whole file)."""
    import pandas as pd

    try:
        return bool(df.index[0] < pd.Timestamp(first) and pd.Timestamp(first) in df.index)
    except (ValueError, TypeError):
        return False


def load_market_frame(spec: RunSpec, data_override: str | None = None) -> Any:
    """The run's OHLCV frame as loaded (its file, or the synthetic market), before any fit."""
    from foxhunt.markets.data import load_ohlcv
    from foxhunt.markets.pipeline import default_market

    source = data_override if data_override is not None else spec.market.data
    if source is None:
        return default_market(seed=spec.market.synthetic_seed)
    return load_ohlcv(source)


def load_recorded_frame(
    spec: RunSpec, data_override: str | None, recorded: dict[str, Any]
) -> tuple[Any, bool]:
    """:func:`load_market_frame` for a run that has a data record, and whether its bars written
    at local midnight with a UTC offset (yfinance's daily bars) are read in UTC, as the run
    read them. Runs trained before such bars kept their dates recorded them in UTC (the day
    before east of Greenwich); read today, their unchanged file would be refused as moved bars.
    """
    df = load_market_frame(spec, data_override)
    source = data_override if data_override is not None else spec.market.data
    index = getattr(df, "index", None)
    rows = int(recorded["rows"])
    older = "index_sha256" not in recorded  # written before local dates: UTC times

    def same_bars(frame: Any) -> bool:  # the run's bars at the recorded times
        if len(frame) < rows:
            return False
        if older:  # only the values' hash (it covers the timestamps too)
            return _hash_rows(frame, rows) == recorded["sha256"]
        return _hash_index(frame, rows) == recorded["index_sha256"]

    if (
        source is None
        or len(df) == 0
        or not bool((index == index.normalize()).all())
        or same_bars(df)
    ):
        return df, False
    from foxhunt.markets._timestamps import midnight_offsets_in_utc

    with midnight_offsets_in_utc():
        legacy = load_market_frame(spec, data_override)
    stamps = legacy.index
    if stamps.equals(index):
        return df, False  # no offsets in the file: one reading
    import pandas as pd

    reproduces = same_bars(legacy)
    try:
        ends = [pd.Timestamp(recorded[k]) for k in ("first", "last")]
    except ValueError:
        ends = []
    # A local-date record is all midnight; only the run's own file (a --data file not holding
    # the run's bars is new data, and an intraday run's record is not at midnight either).
    utc_record = data_override is None and (older or any(t != t.normalize() for t in ends))
    holds_first = bool(ends) and ends[0] in stamps
    if not (reproduces or (utc_record and (holds_first or str(stamps[-1]) == recorded["last"]))):
        return df, False  # not that: the check says what changed
    log.warning(
        "%s: the run was trained when bars written at local midnight with a UTC offset were "
        "read in UTC; they are read so for this run (a new run dates them by their local date)",
        source,
    )
    return legacy, True


def check_same_data(spec: RunSpec, recorded: dict[str, Any]) -> bool:
    """Refuse, before anything trains, data that differs from ``recorded`` (a run's data.json):
    what resuming needs, without fitting the market. Returns whether the run reads its
    local-midnight bars in UTC (:func:`load_recorded_frame`): new runs beside it must too."""
    frame, in_utc = load_recorded_frame(spec, None, recorded)
    check_data_record(recorded, frame, data_identity(frame), _data_label(spec), "resume")
    return in_utc


def build_trading(
    spec: RunSpec,
    data_override: str | None = None,
    *,
    recorded: dict[str, Any] | None = None,
    purpose: Literal["evaluate", "resume"] = "evaluate",
    continuing: bool = False,
    frame: Any | None = None,
) -> TradingSetup:
    """Load (or synthesise) the market, fit features and regimes on the training span only.

    ``recorded`` is the run's :data:`DATA_FILE` record (None: a new run, or one from before the
    record existed): the run's own data is then checked against what it trained on, see
    :func:`check_data_record`. Data passed as ``data_override`` continues the run when it holds
    the run's bars at the same times (:func:`continues_record`: spans kept as trained);
    otherwise it is new data, split by the fractions like any file, unless ``continuing``
    (acting on new bars), which refuses it. ``frame``: the bars ``market.data`` will hold, not
    yet written (a walk-forward fold checked before any fold is written).
    """
    from foxhunt.markets.pipeline import prepare_market_with_detector, select_features

    m = spec.market
    config = spec.trading_config()
    source = data_override if data_override is not None else m.data
    min_rows = 3 * (config.window + 2)
    if frame is None:
        df = (
            load_market_frame(spec, data_override)
            if recorded is None
            else load_recorded_frame(spec, data_override, recorded)[0]
        )
    else:  # as the file will read: load_ohlcv's columns (a synthetic market's regime ids)
        from foxhunt.markets.data import load_ohlcv

        df = load_ohlcv(frame)
    n = len(df)
    if continuing and recorded is not None and n < int(recorded["rows"]):
        # Acting on new bars needs the whole history: say so before any other count.
        raise ConfigError(
            f"data {source} holds {n} bars, fewer than the {recorded['rows']} the run trained "
            "on: pass the run's data grown by the new bars (the whole history)"
        )
    if n < min_rows:
        raise ConfigError(
            f"trading.window={config.window} needs at least {min_rows} bars (3 x (window + 2)), "
            f"got {n} in {source or 'the synthetic market'}"
        )
    train_end, val_end = split_bounds(n, m.train_fraction, m.validation_fraction)
    identity = data_identity(df)  # hashed once: for the check and for the run's record
    bounds = None
    same_bars = False  # the run's bars at the same times (or refused): its detector stays too
    if recorded is not None and data_override is None:
        same_bars = True
        bounds = check_data_record(recorded, df, identity, _data_label(spec), purpose)
        if bounds is not None and n > int(recorded["rows"]):
            # The run's own file grown in place: its new bars checked as --data's are.
            _check_new_bars(df, int(recorded["rows"]), _data_label(spec))
    elif recorded is not None and continues_record(recorded, df, identity):
        # The run's own bars, then new ones: the spans stay where the run trained, so its
        # normalisation and regime detector are fitted on the same training bars.
        bounds = int(recorded["train_end"]), int(recorded["val_end"])
        same_bars = True
        added = n - int(recorded["rows"])
        if added:
            log.warning(
                "%s continues the data the run trained on (%d new bars): train and validation "
                "spans stay as trained; the test span runs on into the new bars",
                source,
                added,
            )
            _check_new_bars(df, int(recorded["rows"]), source)
    elif continuing and data_override is not None:  # (fewer bars were refused above)
        what = "does not start with the bars the run trained on, at the same times" + (
            f" (its first is {recorded['first']}; a walk-forward fold trains on a slice: "
            f"pass your file from that bar on, e.g. frame.loc['{recorded['first']}':])"
            if recorded is not None and _starts_later(df, recorded["first"])
            else ""
        )
        raise ConfigError(
            f"data {source} {what}: pass the run's data grown by the new bars (the whole history)"
        )
    if bounds is not None:  # the file grew: the spans stay where the run trained
        train_end, val_end = bounds
    else:
        check_split_sizes(n, train_end, val_end, m, config.window, source)
    from foxhunt.backtest import median_bar_seconds, periods_per_year_with_caveat

    ppy, caveat = periods_per_year_with_caveat(df.index)
    if caveat is not None and recorded is None:  # said once, when the run is trained
        log.warning("%s: %s", source or "the market", caveat)
    record = {
        **identity,
        "train_end": train_end,
        "val_end": val_end,
        # The last bar training or model selection saw: a backtest of another file on bars up
        # to it is in-sample (see session.backtest_run).
        "validated_last": str(df.index[val_end - 1]),
        # The bar frequency trained on: a backtest on bars of another says so.
        "periods_per_year": round(ppy, 1),
        "bar_seconds": median_bar_seconds(df.index),
    }
    try:
        market, fitted = prepare_market_with_detector(
            df,
            train_end=train_end,
            detector=m.detector,
            n_regimes=m.n_regimes,
            seed=spec.hyperparameters.seed if m.detector_seed is None else m.detector_seed,
            # The detector the run trained with, taken when its training rows are these.
            detector_state=recorded.get("detector") if recorded is not None else None,
            normalizer_state=recorded.get("normalizer") if recorded is not None else None,
            # The run's own bars: the detector and feature scale the policy was trained with,
            # even where their values were revised since (a refit can relabel the regimes the
            # policy reads, and rescales every observation).
            keep_fitted=same_bars,
        )
    except DataError as err:  # detectors see a frame; name the file the user gave
        where = source or "the synthetic market"
        raise DataError(
            str(err).replace("<DataFrame>", f"{where} (market.detector={m.detector})", 1)
        ) from None
    record["normalizer"] = fitted["normalizer"]
    if fitted["detector"] is not None:
        record["detector"] = fitted["detector"]
    if m.features is not None:
        market = select_features(market, m.features, field="market.features")
    return TradingSetup(
        market=market, train_end=train_end, val_end=val_end, config=config, data_record=record
    )


DATA_FILE = "data.json"
"""The identity of the market a run trained on (rows, first/last bar, a hash of the values), so
that evaluate and resume notice when the file behind ``market.data`` has changed since."""

_RECORD_KEYS = {"rows": int, "first": str, "last": str, "sha256": str, "train_end": int,
                "val_end": int}  # fmt: skip
# index_sha256 (the timestamps' own hash) is checked when present: records written before it
# was added do not have it.


_WEEK_NS = 7 * 86_400 * 10**9  # nights, weekends and holidays are shorter; a swapped date not


def _check_new_bar_times(index: Any, kept: int, source: str | None) -> None:
    """Warn when bars appended after the run's ``kept`` bars do not keep their spacing: a tool
    writing month-first dates into a day-first file gives 08/09/2023 as 8 September, which
    parses, and daily bars then jump a month (or land on a weekend) without an error."""
    import numpy as np

    ns = index.as_unit("ns").asi8
    gaps = np.diff(ns[:kept]) if kept > 1 else np.array([], dtype=np.int64)
    typical = float(np.median(gaps)) if gaps.size else 0.0
    longest = int(gaps.max()) if gaps.size else 0  # nights, weekends, holidays: already seen
    no_weekends = kept >= 100 and not (index[:kept].day_of_week >= 5).any()
    for i in range(max(kept, 1), len(index)):
        gap = int(ns[i] - ns[i - 1])
        far = gap > max(10 * typical, longest, _WEEK_NS)
        weekend = no_weekends and index[i].day_of_week >= 5
        if far or weekend:
            why = (
                f"{_duration(gap)} after the bar before it, where the run's bars are "
                f"{_duration(int(typical))} apart (median) and never more than "
                f"{_duration(longest)}"
                if far
                else "on a weekend, where the run's bars never are"
            )
            log.warning(
                "%s: new bar %s comes %s: check its date (a month-first date in a day-first "
                "file, 08/09 for 9 August, reads as 8 September)",
                source,
                index[i],
                why,
            )
            return


def _check_new_bars(df: Any, kept: int, source: str | None) -> None:
    """The checks on bars appended after the run's ``kept`` bars: their dates and prices."""
    _check_new_bar_times(df.index, kept, source)
    _check_new_bar_prices(df, kept, source)


def _check_new_bar_prices(df: Any, kept: int, source: str | None) -> None:
    """Warn when a bar appended after the run's ``kept`` bars moves the close far more than any
    bar the run trained on did: a shifted decimal (6934,57 for 69,3457) or another asset's
    price parses and validates, and a position would be decided on it without a word."""
    import numpy as np

    close = df["close"].to_numpy(dtype=np.float64)
    if kept < 2 or close.size <= kept:
        return
    moves = np.abs(np.diff(np.log(close)))
    largest = float(moves[: kept - 1].max())
    limit = max(3.0 * largest, math.log(2.0))
    for i in range(kept, close.size):
        if moves[i - 1] > limit:
            log.warning(
                "%s: new bar %s moves the close from %g to %g (x%.3g), more than 3 times the "
                "largest move of the bars the run trained on (x%.3g): check its prices (a "
                "shifted decimal, another asset's series)",
                source,
                df.index[i],
                close[i - 1],
                close[i],
                close[i] / close[i - 1],
                math.exp(largest),
            )
            return


def _duration(ns: int) -> str:
    """A duration in nanoseconds as pandas writes it (1 days 00:00:00 -> '1 days')."""
    import pandas as pd

    return str(pd.Timedelta(ns)).replace(" 00:00:00", "")


def _data_label(spec: RunSpec) -> str:
    m = spec.market
    return m.data if m.data is not None else f"the synthetic market (seed {m.synthetic_seed})"


def _hash_rows(df: Any, rows: int) -> str:
    """sha256 of the first ``rows`` bars as loaded: timestamps (int ns) and every column as
    float64, column by column. Hashing the loaded values, not the file's bytes, leaves the record
    indifferent to the file's format (CSV, Parquet) and spelling (quoting, number format)."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    h.update(np.ascontiguousarray(df.index[:rows].asi8, dtype="<i8").tobytes())
    for name in df.columns:
        h.update(str(name).encode() + b"\0")
        values = df[name].to_numpy(dtype=np.float64)[:rows]
        h.update(np.ascontiguousarray(values, dtype="<f8").tobytes())
    return h.hexdigest()


def data_identity(df: Any) -> dict[str, Any]:
    """Rows, first and last timestamp, the hash of the values and that of the timestamps alone
    (which tells revised prices on the same bars from bars moved, removed or inserted)."""
    return {
        "rows": len(df),
        "first": str(df.index[0]),
        "last": str(df.index[-1]),
        "sha256": _hash_rows(df, len(df)),
        "index_sha256": _hash_index(df, len(df)),
    }


def _hash_index(df: Any, rows: int) -> str:
    """sha256 of the first ``rows`` timestamps (int ns)."""
    import hashlib

    import numpy as np

    return hashlib.sha256(
        np.ascontiguousarray(df.index[:rows].asi8, dtype="<i8").tobytes()
    ).hexdigest()


def write_data_record(run_dir: Path, setup: TradingSetup | None) -> None:
    """Write :data:`DATA_FILE` for a trading run (atomically; nothing for Gymnasium runs)."""
    if setup is not None and setup.data_record is not None:
        text = json.dumps({"format": "foxhunt-data", **setup.data_record}, indent=2)
        atomic_write_text(run_dir / DATA_FILE, text + "\n")


def read_data_record(run_dir: Path) -> dict[str, Any] | None:
    """The run's :data:`DATA_FILE`, or None for a run from before it was written."""
    path = run_dir / DATA_FILE
    if not path.exists():
        return None
    record = read_json_object(path, "data record")
    if record.get("format") != "foxhunt-data":
        raise FoxhuntError(f"{path}: format must be 'foxhunt-data', got: {record.get('format')!r}")
    for key, kind in _RECORD_KEYS.items():
        if key not in record:
            raise FoxhuntError(f"{path}: {key} is missing")
        value = record[key]
        if type(value) is not kind:
            raise FoxhuntError(
                f"{path}: {key} must be {'an integer' if kind is int else 'a string'}, got: "
                f"{value!r:.60}"
            )
    for key in ("index_sha256", "validated_last"):  # absent from records written before them
        if key in record and type(record[key]) is not str:
            raise FoxhuntError(f"{path}: {key} must be a string, got: {record[key]!r:.60}")
    if not 0 < record["train_end"] <= record["val_end"] < record["rows"]:
        raise FoxhuntError(
            f"{path}: train_end {record['train_end']} / val_end {record['val_end']} do not "
            f"split {record['rows']} rows"
        )
    return record


def continues_record(recorded: dict[str, Any], df: Any, now: dict[str, Any]) -> bool:
    """Whether ``df`` (whose :func:`data_identity` is ``now``) starts with the bars a run
    trained on, at the same times: its data grown by new bars, the trained bars' values
    possibly revised (a vendor's corrected last bar, which is warned about), as the run's own
    file may be for evaluate."""
    times_kept, values_kept = _kept_bars(recorded, df, now)
    if times_kept and not values_kept:
        log.warning(
            "the values of the %d bars of the run's data (%s to %s) differ from when it trained "
            "(prices or volume, at the same times: a vendor's revision, or another series on "
            "the same dates; only a hash was kept, so which bars changed is unknown); the spans "
            "stay as trained, and the report is on this file's values",
            recorded["rows"],
            recorded["first"],
            recorded["last"],
        )
    return times_kept


def _kept_bars(recorded: dict[str, Any], df: Any, now: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the bars a run trained on are still the first of ``df`` (identity ``now``): at
    the same times, and with the same values."""
    rows, old_rows = now["rows"], recorded["rows"]
    covers = rows >= old_rows
    # The trained bars' hashes: the whole file's when it has as many rows (already computed).
    grown = rows > old_rows
    values_kept = (
        covers and (_hash_rows(df, old_rows) if grown else now["sha256"]) == recorded["sha256"]
    )
    if "index_sha256" in recorded:
        old_times = _hash_index(df, old_rows) if grown else now["index_sha256"]
        times_kept = covers and old_times == recorded["index_sha256"]
    else:  # a record from before the timestamps had their own hash: what it can tell
        same_ends = now["first"] == recorded["first"] and now["last"] == recorded["last"]
        times_kept = values_kept or (rows == old_rows and same_ends)
    return times_kept, values_kept


def check_data_record(
    recorded: dict[str, Any],
    df: Any,
    now: dict[str, Any],
    where: str,
    purpose: Literal["evaluate", "resume"],
) -> tuple[int, int] | None:
    """Compare the run's data now (``df``, whose :func:`data_identity` is ``now``) with what
    it trained on.

    Same data: None. Resume refuses any change (an exact continuation needs the same market).
    Evaluate accepts, with a warning, a file whose trained bars are still there at the same
    times: grown by new bars after them (it returns the trained (train end, validation end), so
    the test span starts where it did and runs on into the new bars), with revised values (a
    vendor's corrected last bar), or both. Bars removed, inserted or moved are refused, because
    the test span would no longer be the bars the run held out from training.
    """
    rows, old_rows = now["rows"], recorded["rows"]
    if now["sha256"] == recorded["sha256"] and rows == old_rows:
        return None
    times_kept, values_kept = _kept_bars(recorded, df, now)
    added = rows - old_rows
    if times_kept and added:
        revised = "" if values_kept else f" and values of the {old_rows} trained bars revised"
        what = f"{added} bars were appended{revised}"
    elif times_kept:
        what = f"the values differ (prices or volume) on the same {rows} bars"
    else:
        changes = [f"{old_rows} rows at training, {rows} now"] if added else []
        changes += [
            f"{key} bar {recorded[key]} at training, {now[key]} now"
            for key in ("first", "last")
            if now[key] != recorded[key]
        ]
        moved = "bars between the first and the last were moved, removed or inserted"
        what = "; ".join(changes) or moved
    if purpose == "resume":
        raise DataError(
            f"{where} has changed since the run trained ({what}): resuming continues exactly "
            "only on the same data; restore the file, or start a new run"
        )
    if not times_kept:
        raise DataError(
            f"{where} has changed since the run trained ({what}): its test span no longer lines "
            "up with the bars the run held out; restore the file, or pass it with --data to "
            "evaluate it as new data"
        )
    if added:
        log.warning(
            "%s: %s since the run trained; train and validation spans stay as trained (bars "
            "0..%d and %d..%d) and the test span runs from bar %d to the new last bar",
            where,
            what,
            recorded["train_end"] - 1,
            recorded["train_end"],
            recorded["val_end"] - 1,
            recorded["val_end"],
        )
        return recorded["train_end"], recorded["val_end"]
    log.warning(
        "%s: %s since the run trained; the backtest uses the file as it is now", where, what
    )
    return None


def split_bounds(n: int, train_fraction: float, validation_fraction: float) -> tuple[int, int]:
    """(train end, validation end) of ``n`` bars: ``int(n * fraction)`` per span.

    Kept exactly as runs were always split (``100 * 0.29`` is 28.999999999999996 and gives 28
    bars): a run trained before ``data.json`` recorded its split ends is resumed and evaluated
    by recomputing them, and any other rounding would move its spans by a bar.
    """
    train_end = int(n * train_fraction)
    val_end = min(n, train_end + int(n * validation_fraction))
    return train_end, val_end


# Below these a run trains and evaluates, with a warning (check_split_sizes).
_BARS_PER_REGIME, _THIN_TEST_SPAN = 50, 100


def check_split_sizes(
    n: int, train_end: int, val_end: int, market: MarketSpec, window: int, source: str | None
) -> None:
    """Refuse, at training time and naming the fraction responsible, a span too short to use.

    Training needs ``window + 2`` bars for one step and more than the feature warm-up; the
    validation and test spans borrow ``window - 1`` warm-up bars from before them, so each needs
    3 bars of its own for two decisions. Found later, a short test span would only fail
    ``foxhunt evaluate`` with an error about the window.
    """
    from foxhunt.markets.features import feature_warmup

    where = source or "the synthetic market"
    sizes = f"(train {train_end}, validation {val_end - train_end}, test {n - val_end})"
    need_train = max(window + 2, feature_warmup() + 1)
    if train_end < need_train:
        raise ConfigError(
            f"market.train_fraction={market.train_fraction} leaves {train_end} training bars of "
            f"{n} in {where} {sizes}; training needs at least {need_train} (trading.window="
            f"{window} + 2, and more than the {feature_warmup()}-bar feature warm-up)"
        )
    if val_end - train_end < 3:
        raise ConfigError(
            f"market.validation_fraction={market.validation_fraction} leaves "
            f"{val_end - train_end} validation bars of {n} in {where} {sizes}; the agent is "
            "evaluated there during training and needs at least 3"
        )
    if n - val_end < 3:
        raise ConfigError(
            f"market.train_fraction={market.train_fraction} + market.validation_fraction="
            f"{market.validation_fraction} leave {n - val_end} test bars of {n} in {where} "
            f"{sizes}; `foxhunt evaluate` backtests there and needs at least 3"
        )
    # Usable, but thin: said once here rather than discovered in a report's figures.
    if market.n_regimes > 1 and train_end < _BARS_PER_REGIME * market.n_regimes:
        log.warning(
            "%s %s: %d regime states fitted on %d training bars (fewer than %d a state): "
            "the detector's states rest on little data (lower market.n_regimes, or give more "
            "history)",
            where,
            sizes,
            market.n_regimes,
            train_end,
            _BARS_PER_REGIME,
        )
    if n - val_end < _THIN_TEST_SPAN:
        log.warning(
            "%s %s: the test span holds %d bars; backtest figures over fewer than %d bars are "
            "mostly noise (a per-bar Sharpe's standard error is about 1/sqrt(bars))",
            where,
            sizes,
            n - val_end,
            _THIN_TEST_SPAN,
        )


def make_envs(
    spec: RunSpec,
    *,
    recorded: dict[str, Any] | None = None,
    purpose: Literal["evaluate", "resume"] = "resume",
) -> tuple[Any, Any, TradingSetup | None]:
    """(training env or factory, evaluation env or factory, trading setup or None).

    ``recorded``: a resumed run's data record, which its data must still match exactly; for
    ``purpose="evaluate"`` (a checkpoint's weights read to act), grown or revised as
    :func:`check_data_record` allows an evaluate.
    """
    if spec.is_trading:
        setup = build_trading(spec, recorded=recorded, purpose=purpose)
        return setup.train_env, setup.eval_env("validation"), setup
    env_id = spec.env
    assert env_id is not None
    from foxhunt.envs.gym_envs import make_gym_env

    probe = make_gym_env(env_id, kwargs=spec.env_kwargs)
    space, obs_space = probe.action_space, probe.observation_space
    probe.close()
    from foxhunt.learner import check_spaces

    try:
        check_spaces(obs_space, space)  # the agent's own check, before anything is written
    except ConfigError as err:
        raise ConfigError(f"env {env_id!r}: {err}") from None
    if spec.env_kwargs:
        factory = functools.partial(make_gym_env, env_id, "env", spec.env_kwargs)
        return factory, factory, None
    return env_id, env_id, None


# --- the final model
def save_model(
    run_dir: Path,
    agent: Any,
    best_state: dict[str, torch.Tensor] | None = None,
    *,
    positions: Sequence[float] | None = None,
) -> None:
    """The greedy policy: final (and best-evaluated) online weights in safetensors + JSON meta.

    ``positions``: a trading run's target positions, the meaning of each action; an evaluation
    refuses a config.yaml edited to other positions of the same count (same shapes, other
    trades)."""
    from safetensors.torch import save as st_save

    tensors = {k: v.detach().cpu().contiguous() for k, v in agent.online_net.state_dict().items()}
    atomic_write_bytes(run_dir / "model.safetensors", st_save(tensors))
    if best_state is not None:
        best = {k: v.detach().cpu().contiguous() for k, v in best_state.items()}
        atomic_write_bytes(run_dir / "best_model.safetensors", st_save(best))
    else:  # an older save's best weights are not this model's
        (run_dir / "best_model.safetensors").unlink(missing_ok=True)
    meta = {
        "format": "foxhunt-model",
        "format_version": 1,
        "obs_dim": agent.obs_dim,
        "obs_shape": list(agent.obs_shape),
        "n_actions": agent.n_actions,
        "n_regimes": agent.online_net.n_regimes,
        # How the env's own observations and actions map to the network's (predict()).
        "env_interface": agent.env_interface.to_dict(),
        "hyperparameters": agent.hp.to_dict(),
    }
    if positions is not None:
        meta["trading_positions"] = [float(p) for p in positions]
    atomic_write_text(run_dir / "model.json", json.dumps(meta, indent=2))


def summary_env_steps(run_dir: Path) -> int | None:
    """The env steps ``summary.json`` says the run's model was trained for; None without a
    readable one."""
    try:
        done = json.loads((run_dir / "summary.json").read_text()).get("env_steps")
    except (OSError, ValueError, AttributeError):
        return None
    return done if isinstance(done, int) else None


def _warn_checkpoint_past_model(run_dir: Path) -> None:
    """Say when the run trained on past its model (``resume --total-steps`` stopped part way):
    the model is the earlier run's, and ``foxhunt resume`` finishes the longer one."""
    try:
        step = json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no checkpoint to compare (the loader checks what it needs)
    done = summary_env_steps(run_dir)
    if isinstance(step, int) and done is not None and step > done:
        log.warning(
            "%s: its latest checkpoint (env step %d) is past its model (env step %d): a resume "
            "stopped part way, and this is the model of env step %d (`foxhunt resume %s` "
            "finishes the run)",
            run_dir,
            step,
            done,
            done,
            shell_quoted(run_dir),
        )


_MODEL_DIMS = {"obs_dim": 1, "n_actions": 1, "n_regimes": 0}
"""model.json's integer fields and their smallest valid values."""


def halted_hint(run_dir: Path) -> str:
    """Why a run has neither model nor checkpoint, when a health monitor stopped it before any
    checkpoint was written (``checkpoint_interval`` 0, the default: only the end and a stop
    signal save one); empty otherwise."""
    halted = run_dir / HALTED_FILE
    if not halted.is_file():
        return ""
    return (
        f" (a health monitor stopped the run before any checkpoint: {halted} says why; "
        "checkpoint_interval keeps checkpoints to go back to)"
    )


def _is_positive_int(value: Any) -> bool:
    return type(value) is int and value >= 1  # bool is an int subclass


def _model_int(meta: dict[str, Any], name: str, meta_path: Path, low: int) -> int:
    """An integer field of model.json, refused by name when missing, not an integer or too small."""
    if name not in meta:
        raise FoxhuntError(f"{meta_path}: {name} is missing")
    value = meta[name]
    if type(value) is not int:  # bool is an int subclass; 5.7 must not become 5
        raise FoxhuntError(f"{meta_path}: {name} must be an integer, got: {value!r:.60}")
    if value < low:
        raise FoxhuntError(f"{meta_path}: {name} must be at least {low}, got: {value}")
    return value


def load_model(run_dir: str | Path, which: str = "final") -> Any:
    """Rebuild the greedy agent saved by :func:`save_model` (weights checked key by key).

    ``run_dir`` is a run directory of ``foxhunt train`` or one written by
    ``DQNTrainer.save``. ``which="best"`` takes the weights of the best evaluation when the run
    kept them (falling back to the final weights), ``"final"`` the weights at the end of
    training, ``"latest"`` those of the latest checkpoint of a ``foxhunt train`` run (one
    stopped part way, or still training: :func:`foxhunt.session.checkpoint_agent`).
    ``agent.predict(obs)`` then gives the greedy action in the env's terms (``act`` is the
    network's view: one-hot vectors for a Discrete observation, action indices from 0).
    """
    run_dir = Path(run_dir)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from foxhunt.learner import DQNAgent

    if which not in ("best", "final", "latest"):
        raise ConfigError(f"model must be 'best', 'final' or 'latest', got: {which!r}")
    if not run_dir.is_dir():
        what = "is a file, not a run directory" if run_dir.exists() else "run directory not found"
        raise FoxhuntError(f"{run_dir}: {what}")
    refuse_other_dir(run_dir, "foxhunt.QEnsemble.load(run_dir) loads it")
    if which == "latest":
        from foxhunt.session import checkpoint_agent

        return checkpoint_agent(run_dir)
    meta_path, weights = run_dir / "model.json", run_dir / "model.safetensors"
    if which == "best":
        if (run_dir / "best_model.safetensors").is_file():
            weights = run_dir / "best_model.safetensors"
        else:  # no evaluation ran, or training stopped early (best weights are saved at the end)
            log.warning(
                "%s has no best model (no evaluation ran, or training has not finished): using "
                "the final weights",
                run_dir,
            )
    for p in (meta_path, weights):
        if not p.is_file():
            unfinished = (run_dir / "checkpoints").is_dir()
            resume = f"foxhunt resume {shell_quoted(run_dir)}"
            hint = (
                f" (training stopped early: `{resume}`; --model latest takes its latest "
                "checkpoint's weights)"
                if unfinished
                else halted_hint(run_dir)
            )
            raise FoxhuntError(f"run directory has no trained model: {p} is missing{hint}")
    _warn_checkpoint_past_model(run_dir)
    meta = read_json_object(meta_path, "model description")
    if meta.get("format") != "foxhunt-model" or meta.get("format_version") != 1:
        raise FoxhuntError(
            f"{meta_path}: unknown model format {meta.get('format')!r} "
            f"version {meta.get('format_version')!r}"
        )
    dims = {name: _model_int(meta, name, meta_path, low) for name, low in _MODEL_DIMS.items()}
    if "hyperparameters" not in meta:
        raise FoxhuntError(f"{meta_path}: hyperparameters is missing")
    saved_hp = meta["hyperparameters"]
    if not isinstance(saved_hp, dict):
        raise FoxhuntError(
            f"{meta_path}: hyperparameters must be a mapping of names to values, got: "
            f"{saved_hp!r:.60}"
        )
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise FoxhuntError(f"{weights} is not a valid safetensors file: {err}") from None
    # Every dimension sizes some stored tensor, so none exceeds the weights' element count; an
    # edited obs_dim of 10**12 is refused here instead of failing to allocate the network.
    n_weights = sum(v.numel() for v in state.values())
    for name, value in dims.items():
        if value > n_weights:
            raise FoxhuntError(
                f"{meta_path}: {name}={value} cannot fit the {n_weights} values in {weights.name}"
            )
    # obs_shape (absent from models saved before it was recorded) lets the loaded agent tell
    # one image-shaped observation from a batch; it must flatten to obs_dim.
    obs_shape = meta.get("obs_shape", [dims["obs_dim"]])
    if (
        not isinstance(obs_shape, list)
        or not obs_shape
        or not all(_is_positive_int(d) for d in obs_shape)
        or math.prod(obs_shape) != dims["obs_dim"]
    ):
        raise FoxhuntError(
            f"{meta_path}: obs_shape must be a list of positive integers whose product is "
            f"obs_dim={dims['obs_dim']}, got: {obs_shape!r:.60}"
        )
    try:
        hp = DQNHyperparameters(**{**saved_hp, "device": "cpu", "compile": False})
        obs_space = gym.spaces.Box(-float("inf"), float("inf"), tuple(obs_shape))
        agent = DQNAgent(
            obs_space, gym.spaces.Discrete(dims["n_actions"]), hp, n_regimes=dims["n_regimes"]
        )
    except (ConfigError, ValueError) as err:  # QNetwork refuses n_regimes > obs_dim as ValueError
        raise ConfigError(f"{meta_path}: {err}") from None
    expected = agent.online_net.state_dict()
    for k, v in expected.items():
        if k not in state:
            raise FoxhuntError(f"{weights}: missing tensor {k!r}")
        if state[k].shape != v.shape or state[k].dtype != v.dtype:
            raise FoxhuntError(
                f"{weights}: tensor {k!r} has shape {tuple(state[k].shape)} "
                f"{state[k].dtype}, expected {tuple(v.shape)} {v.dtype}"
            )
    extra = set(state) - set(expected)
    if extra:
        raise FoxhuntError(f"{weights}: unexpected tensors {sorted(extra)}")
    for k, v in state.items():  # NaN weights would act "fine": argmax of all-NaN Q is action 0
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise FoxhuntError(f"{weights}: tensor {k!r} holds non-finite values (NaN or inf)")
    agent.online_net.load_state_dict(state)
    agent.online_net.eval()
    agent.env_interface = _env_interface(meta, meta_path, dims)
    return agent


def _env_interface(meta: dict[str, Any], meta_path: Path, dims: dict[str, int]) -> Any:
    """model.json's env_interface (absent from models saved before it was recorded: the env's
    terms were the network's), checked against the network it describes."""
    from foxhunt.envs.gym_envs import EnvInterface

    raw = meta.get("env_interface")
    if raw is None:
        return EnvInterface(known=False)
    one_hot = raw.get("one_hot_observation") if isinstance(raw, dict) else None
    start = raw.get("action_start") if isinstance(raw, dict) else None
    scale = raw.get("observation_scale") if isinstance(raw, dict) else None
    valid = (
        isinstance(raw, dict)
        and set(raw) - {"observation_scale"} == {"one_hot_observation", "action_start"}
        and type(start) is int
        and (scale is None or (type(scale) is float and math.isfinite(scale) and scale > 0))
        and (
            one_hot is None
            or (
                isinstance(one_hot, list)
                and len(one_hot) == 2
                and all(type(v) is int for v in one_hot)
                and one_hot[0] == dims["obs_dim"]
            )
        )
    )
    if not valid:
        raise FoxhuntError(
            f"{meta_path}: env_interface must be {{'one_hot_observation': null or [n, start] "
            f"with n = obs_dim ({dims['obs_dim']}), 'action_start': an integer[, "
            f"'observation_scale': a positive number]}}, got: {raw!r:.80}"
        )
    return EnvInterface(None if one_hot is None else (one_hot[0], one_hot[1]), start, scale)


def model_policy(agent: Any) -> Callable[[Any], int]:
    """A greedy ``obs -> action`` function for backtests (noise off)."""
    agent.online_net.eval()

    @torch.inference_mode()
    def act(obs: Any) -> int:
        return int(agent.greedy_actions(obs)[0])

    # A backtest scores many bars at once with it (backtest.batched_greedy).
    act.q_batch = agent.q_values  # type: ignore[attr-defined]
    return act
