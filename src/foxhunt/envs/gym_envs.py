"""Gymnasium environments by id, made ready for a Q-network.

Every place that builds an env from an id (training, evaluation, ensembles, search) goes through
:func:`make_gym_env`, so an env trains and evaluates the same way everywhere.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from foxhunt.errors import ConfigError, first_line

log = logging.getLogger(__name__)

ONE_HOT_KEY = "foxhunt_one_hot_observation"
ACTION_START_KEY = "foxhunt_action_start"
SCALE_KEY = "foxhunt_observation_scale"
PIXEL_SCALE = 1.0 / 255.0


@dataclass(frozen=True)
class EnvInterface:
    """How the env's own observations and actions map to the Q-network's: a ``Discrete(n,
    start)`` observation becomes a one-hot vector, network action ``i`` is env action
    ``action_start + i``. Saved with a model, so a loaded policy acts on what the env gives and
    returns what the env takes (``DQNAgent.predict``)."""

    one_hot: tuple[int, int] | None = None
    """``(n, start)`` of a Discrete observation space the network sees one-hot; None: as is."""
    action_start: int = 0
    scale: float | None = None
    """Factor from the env's observations to the network's (1/255 for 0-255 uint8 ones)."""
    known: bool = True
    """False for a model saved before the interface was recorded: it acts as the identity, and
    an ensemble takes its members' recorded interface instead."""

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any] | None) -> EnvInterface:
        """The interface :func:`prepare_env`'s wrappers recorded in an env's (or a vector
        env's) metadata."""
        meta = metadata or {}
        one_hot, scale = meta.get(ONE_HOT_KEY), meta.get(SCALE_KEY)
        return cls(
            None if one_hot is None else (int(one_hot[0]), int(one_hot[1])),
            int(meta.get(ACTION_START_KEY, 0)),
            None if scale is None else float(scale),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "one_hot_observation": None if self.one_hot is None else list(self.one_hot),
            "action_start": self.action_start,
        }
        if self.scale is not None:
            out["observation_scale"] = self.scale
        return out

    def observations(self, observation: Any) -> Any:
        """The env's observation (or a batch of them) as the network takes it."""
        if self.scale is not None:
            try:
                return np.asarray(observation, dtype=np.float32) * np.float32(self.scale)
            except (TypeError, ValueError):
                return observation  # not numbers: the agent names what it got
        if self.one_hot is None:
            return observation  # the network's input already: checked by the agent
        n, start = self.one_hot
        try:
            index: np.ndarray | None = np.asarray(observation)
        except ValueError:  # ragged: (obs, info) from env.reset(), say
            index = None
        if index is None or index.dtype.kind not in "iu":
            # A float vector is likely the one-hot view the network takes: act()'s input.
            vector = index is not None and index.dtype.kind == "f" and index.ndim >= 1
            hint = " (act() takes the one-hot vector)" if vector else ""
            raise ValueError(
                f"observation must be the env's Discrete({n}, start={start}) state (an integer) "
                f"or an array of them, got: {_describe(observation)}{hint}"
            )
        cells = index.astype(np.int64) - start
        if index.ndim > 1 or ((cells < 0) | (cells >= n)).any():
            raise ValueError(
                f"observation must be in Discrete({n}, start={start}) ({start} to "
                f"{start + n - 1}), one or a 1-d array, got: {_describe(observation)}"
            )
        return np.eye(n, dtype=np.float32)[cells]

    def actions(self, indices: np.ndarray) -> np.ndarray:
        """Network action indices as the env's actions."""
        return indices + self.action_start if self.action_start else indices


def _describe(value: Any) -> str:
    """A value for an error line: arrays by dtype and shape (their repr spans lines)."""
    if isinstance(value, np.ndarray) and value.ndim:
        return f"a {value.dtype} array of shape {value.shape}"
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        return "a tuple (obs, info): env.reset() returns both, pass obs"
    return f"{value!r:.80}"


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
        # Recorded in the metadata, which vector envs (async ones too) pass on, so a saved model
        # can take the env's own observations: see EnvInterface.
        self.metadata = {**env.metadata, ONE_HOT_KEY: [self._n, self._start]}

    def observation(self, observation: Any) -> np.ndarray:
        out = np.zeros(self._n, dtype=np.float32)
        out[int(observation) - self._start] = 1.0
        return out


class PixelObservation(gym.ObservationWrapper):
    """A ``Box(0, 255)`` uint8 observation (pixels, an Atari RAM) as float32 in [0, 1]: fed to
    an MLP as 0-255 its first Q-values run into the hundreds, and the Q-divergence monitor
    stops the run within a few steps. Stable-Baselines3 divides images by 255 the same way."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not is_pixel_space(space):
            raise ConfigError(f"PixelObservation needs a Box(0, 255) uint8 space, got: {space}")
        self.observation_space = gym.spaces.Box(0.0, 1.0, space.shape, np.float32)
        self.metadata = {**env.metadata, SCALE_KEY: PIXEL_SCALE}

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32) * np.float32(PIXEL_SCALE)


def is_pixel_space(space: gym.Space) -> bool:
    """A uint8 Box spanning 0-255 in every entry: pixels or bytes, not quantities."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


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
        self.metadata = {**env.metadata, ACTION_START_KEY: int(space.start)}

    def action(self, action: Any) -> Any:
        return self._start + int(action)


def prepare_env(env: gym.Env) -> gym.Env:
    """The env as a Q-network needs it: Discrete observations one-hot encoded, 0-255 uint8 ones
    scaled to [0, 1], Discrete actions counted from 0. Applied to every env foxhunt steps (by
    id, instance or factory), so one trains and evaluates the same way however it was passed."""
    if isinstance(env.observation_space, gym.spaces.Discrete):
        env = OneHotObservation(env)
    elif is_pixel_space(env.observation_space):
        env = PixelObservation(env)
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        env = ActionIndex(env)
    return env


def make_gym_env(env_id: str, name: str = "env", kwargs: dict[str, Any] | None = None) -> gym.Env:
    """``gym.make(env_id, **kwargs)`` made ready by :func:`prepare_env`; errors name the
    argument (``name``), the id and a keyword argument the env refused. Gymnasium's own
    warnings (an outdated version, ANSI-coloured, two lines each) become one log line each, and
    none is shown before an error, which says it all in one line."""
    with warnings.catch_warnings(record=True) as caught:
        env = _make(env_id, name, kwargs)
    for w in caught:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(w.message)).strip()
        line = text.splitlines()[0] if text else w.category.__name__
        if (env_id, line) not in _WARNED:  # once a process, as Python shows a warning
            _WARNED.add((env_id, line))
            log.warning("%s %r: %s", name, env_id, line)
    return prepare_env(env)


_WARNED: set[tuple[str, str]] = set()


def _make(env_id: str, name: str, kwargs: dict[str, Any] | None) -> gym.Env:
    steps = (kwargs or {}).get("max_episode_steps")
    if steps is not None and (type(steps) is not int or steps < 1):
        # gym.make takes -1 or True and wraps the env in a time limit that never (or at once) ends.
        raise ConfigError(
            f"env_kwargs.max_episode_steps must be a positive integer or null, got: {steps!r}"
        )
    try:
        return gym.make(env_id, **(kwargs or {}))
    except (gym.error.DependencyNotInstalled, ImportError) as err:
        # ImportError: an env id naming a module to import first ("pkg:Env-v0"), or an env
        # whose implementation imports an optional package (phys2d/ needs jax).
        raise ConfigError(
            f"{name} {env_id!r} needs a package that is not installed: {first_line(err)}"
        ) from None
    except gym.error.DeprecatedEnv as err:
        raise ConfigError(f"{name} {env_id!r}: {first_line(err)}") from None
    except gym.error.Error as err:
        # A run is rebuilt from its id in a new process (resume, evaluate), where a script's
        # gym.register call has not run: Gymnasium's "module:Id" form imports the module first.
        hint = (
            ""
            if ":" in env_id
            else (
                "; an env your code registers: give it as 'your_module:YourEnv-v0' so the module "
                "is imported wherever the run is rebuilt"
            )
        )
        raise ConfigError(
            f"{name} must be a registered Gymnasium id, got: {env_id!r} ({first_line(err)}){hint}"
        ) from None
    except (TypeError, ValueError, LookupError, AssertionError) as err:
        # With keyword arguments given, the errors a constructor raises on a bad argument are
        # about them (FrozenLake's map_name='9x9' is a KeyError); without, they are the env's
        # own, and anything else (an AttributeError, an OSError) is a bug shown whole.
        if not kwargs:
            raise
        kind = "" if isinstance(err, TypeError | ValueError) else f"{type(err).__name__} "
        why = f"{kind}{first_line(err)}"
        raise ConfigError(f"env_kwargs {kwargs!r} for {env_id!r}: {why}") from None
