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


class ActionIndex(gym.ActionWrapper):
    """A ``Discrete(n, start=s)`` action space seen as ``Discrete(n)``: the Q-network's action
    index ``i`` is the env's action ``s + i``. Without it, index 0 would be sent as action 0,
    which is not even in the space when ``s > 0``."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ConfigError(f"ActionIndex needs a Discrete action space, got: {space}")
        self._start = space.start
        self.action_space = gym.spaces.Discrete(int(space.n))

    def action(self, action: Any) -> Any:
        return self._start + int(action)


def prepare_env(env: gym.Env) -> gym.Env:
    """The env as a Q-network needs it: Discrete observations one-hot encoded, Discrete actions
    counted from 0. Applied to every env foxhunt steps (by id, instance or factory), so one
    trains and evaluates the same way however it was passed."""
    if isinstance(env.observation_space, gym.spaces.Discrete):
        env = OneHotObservation(env)
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        env = ActionIndex(env)
    return env


def make_gym_env(env_id: str, name: str = "env") -> gym.Env:
    """``gym.make(env_id)`` made ready by :func:`prepare_env`; errors name the argument
    (``name``) and the id."""
    try:
        env = gym.make(env_id)
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        # ImportError: an env id naming a module to import first ("pkg:Env-v0"), or an env
        # whose implementation imports an optional package (phys2d/ needs jax).
        first = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            f"{name} {env_id!r} needs a package that is not installed: {first}"
        ) from None
    except gym.error.Error as err:
        raise ConfigError(
            f"{name} must be a registered Gymnasium id, got: {env_id!r} "
            f"({str(err).splitlines()[0]})"
        ) from None
    return prepare_env(env)
