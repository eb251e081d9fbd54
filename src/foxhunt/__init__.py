"""foxhunt: exact DQN / Rainbow training for trading agents and any discrete Gymnasium env.

The public API is re-exported here; submodules hold the details.
"""

from foxhunt.batch import Batch
from foxhunt.config import DQNHyperparameters
from foxhunt.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    EnvironmentStepError,
    FoxhuntError,
    TrainingHalted,
)
from foxhunt.learner import DQNAgent, GradientStats
from foxhunt.networks import QNetwork, RegimeConditionalDQN
from foxhunt.replay import PrioritizedReplayBuffer, ReplayBuffer
from foxhunt.trainer import DQNTrainer

__version__ = "0.1.0"

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
    "PrioritizedReplayBuffer",
    "QNetwork",
    "RegimeConditionalDQN",
    "ReplayBuffer",
    "TrainingHalted",
    "__version__",
]
