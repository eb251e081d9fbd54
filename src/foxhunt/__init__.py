"""foxhunt: exact DQN / Rainbow training for trading agents and any discrete Gymnasium env.

The public API is re-exported here and imported lazily, so ``foxhunt --help`` and user-error
messages do not wait for PyTorch to load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from foxhunt.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    EnvironmentStepError,
    FoxhuntError,
    TrainingHalted,
)

__version__ = "0.1.0"

_LAZY = {
    "Batch": "foxhunt.batch",
    "DQNHyperparameters": "foxhunt.config",
    "DQNAgent": "foxhunt.learner",
    "GradientStats": "foxhunt.learner",
    "QNetwork": "foxhunt.networks",
    "RegimeConditionalDQN": "foxhunt.networks",
    "PrioritizedReplayBuffer": "foxhunt.replay",
    "ReplayBuffer": "foxhunt.replay",
    "DQNTrainer": "foxhunt.trainer",
    "QEnsemble": "foxhunt.ensemble",
    "TradingEnv": "foxhunt.envs.trading",
    "TradingEnvConfig": "foxhunt.envs.trading",
    "run_hyperopt": "foxhunt.hyperopt",
    "load_model": "foxhunt.runs",
    "build_spec": "foxhunt.runs",
    "RunSpec": "foxhunt.runs",
    "train_run": "foxhunt.session",
    "resume_run": "foxhunt.session",
    "train_ensemble": "foxhunt.ensemble",
    "evaluate_ensemble": "foxhunt.ensemble",
    "resume_ensemble": "foxhunt.ensemble",
    "evaluate_run": "foxhunt.session",
    "next_position": "foxhunt.session",
    "walk_forward_runs": "foxhunt.session",
    "load_ohlcv": "foxhunt.markets.data",
    "prepare_market": "foxhunt.markets.pipeline",
    "MarketArrays": "foxhunt.markets.arrays",
}

if TYPE_CHECKING:
    from foxhunt.batch import Batch
    from foxhunt.config import DQNHyperparameters
    from foxhunt.ensemble import QEnsemble, evaluate_ensemble, resume_ensemble, train_ensemble
    from foxhunt.envs.trading import TradingEnv, TradingEnvConfig
    from foxhunt.hyperopt import run_hyperopt
    from foxhunt.learner import DQNAgent, GradientStats
    from foxhunt.markets.arrays import MarketArrays
    from foxhunt.markets.data import load_ohlcv
    from foxhunt.markets.pipeline import prepare_market
    from foxhunt.networks import QNetwork, RegimeConditionalDQN
    from foxhunt.replay import PrioritizedReplayBuffer, ReplayBuffer
    from foxhunt.runs import RunSpec, build_spec, load_model
    from foxhunt.session import (
        evaluate_run,
        next_position,
        resume_run,
        train_run,
        walk_forward_runs,
    )
    from foxhunt.trainer import DQNTrainer


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'foxhunt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "Batch",
    "CheckpointError",
    "ConfigError",
    "DQNAgent",
    "DQNHyperparameters",
    "DQNTrainer",
    "DataError",
    "EnvironmentStepError",
    "FoxhuntError",
    "GradientStats",
    "MarketArrays",
    "PrioritizedReplayBuffer",
    "QEnsemble",
    "QNetwork",
    "RegimeConditionalDQN",
    "ReplayBuffer",
    "RunSpec",
    "TradingEnv",
    "TradingEnvConfig",
    "TrainingHalted",
    "__version__",
    "build_spec",
    "evaluate_ensemble",
    "evaluate_run",
    "load_model",
    "load_ohlcv",
    "next_position",
    "prepare_market",
    "resume_ensemble",
    "resume_run",
    "run_hyperopt",
    "train_ensemble",
    "train_run",
    "walk_forward_runs",
]
