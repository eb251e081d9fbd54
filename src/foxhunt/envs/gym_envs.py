"""Gymnasium environments by id, made ready for a Q-network.

Every place that builds an env from an id (training, evaluation, ensembles, search) goes through
:func:`make_gym_env`, so an env trains and evaluates the same way everywhere.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from foxhunt.errors import ConfigError


class OneHotObservation(gym.ObservationWrapper):
    """A ``Discrete(n)`` observation (FrozenLake's cell, Taxi's state index) as a one-hot
    ``Box(0, 1, (n,))`` vector: an index fed to an MLP as one number would imply an order and a
    distance between states that do not exist."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ConfigError(f"OneHotObservation needs a Discrete observation space, got: {space}")
        self._n, self._start = int(space.n), int(space.start)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self._n,), np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        out = np.zeros(self._n, dtype=np.float32)
        out[int(observation) - self._start] = 1.0
        return out


def make_gym_env(env_id: str) -> gym.Env:
    """``gym.make(env_id)``, with Discrete observations one-hot encoded; errors name the env."""
    try:
        env = gym.make(env_id)
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        # ImportError: an env id naming a module to import first ("pkg:Env-v0"), or an env
        # whose implementation imports an optional package (phys2d/ needs jax).
        first = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"env {env_id!r} needs a package that is not installed: {first}"
        ) from None
    except gym.error.Error as err:
        raise ConfigError(
            f"env must be a registered Gymnasium id, got: {env_id!r} ({str(err).splitlines()[0]})"
        ) from None
    if isinstance(env.observation_space, gym.spaces.Discrete):
        env = OneHotObservation(env)
    return env
