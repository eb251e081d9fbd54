"""Shared fixtures for the core-trainer tests: small configs, twin agents, batches, a toy env.

Everything here is deliberately tiny (32-unit nets, a 6-feature observation) so the numerical
tests run in seconds on one CPU thread. Factories are handed out as fixtures so test modules do
not import this file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from foxhunt.batch import Batch
from foxhunt.config import DQNHyperparameters
from foxhunt.learner import DQNAgent

torch.set_num_threads(1)

OBS_DIM = 6
N_ACTIONS = 3


@pytest.fixture
def hmm_fits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The training-span lengths of every GaussianHMMDetector fit from here on (fits still run)."""
    from foxhunt.markets.regimes import GaussianHMMDetector

    fits: list[int] = []
    real_fit = GaussianHMMDetector.fit

    def counting_fit(self: GaussianHMMDetector, train: Any) -> GaussianHMMDetector:
        fits.append(len(train))
        return real_fit(self, train)

    monkeypatch.setattr(GaussianHMMDetector, "fit", counting_fit)
    return fits


def make_hp(**overrides: Any) -> DQNHyperparameters:
    """A small, CPU-only config; ``learning_starts`` defaults to the effective batch size."""
    base: dict[str, Any] = dict(
        hidden_sizes=(32, 32),
        batch_size=64,
        gradient_accumulation_steps=1,
        buffer_capacity=2048,
        device="cpu",
        seed=0,
        target_update_interval=1000,
    )
    base.update(overrides)
    if "learning_starts" not in base:
        base["learning_starts"] = base["batch_size"] * base["gradient_accumulation_steps"]
    return DQNHyperparameters(**base)


def make_agent(
    hp: DQNHyperparameters,
    obs_dim: int = OBS_DIM,
    n_actions: int = N_ACTIONS,
    n_regimes: int = 0,
) -> DQNAgent:
    """An agent on a Box(obs_dim) / Discrete(n_actions) space pair.

    DQNAgent seeds its initial weights from ``hp.seed``, so two calls with the same config build
    identical twins (the accumulation tests rely on it and check it).
    """
    obs_space = gym.spaces.Box(-np.inf, np.inf, shape=(obs_dim,), dtype=np.float32)
    return DQNAgent(obs_space, gym.spaces.Discrete(n_actions), hp, n_regimes=n_regimes)


def random_obs(
    n: int, obs_dim: int, rng: np.random.Generator, n_regimes: int = 0, soft: bool = True
) -> np.ndarray:
    """Observations whose last ``n_regimes`` entries are regime probabilities (soft or one-hot)."""
    obs = rng.normal(size=(n, obs_dim)).astype(np.float32)
    if n_regimes:
        if soft:
            probs = rng.dirichlet(np.ones(n_regimes), size=n)
        else:
            probs = np.eye(n_regimes)[rng.integers(0, n_regimes, size=n)]
        obs[:, -n_regimes:] = probs.astype(np.float32)
    return obs


def random_batch(
    n: int,
    obs_dim: int = OBS_DIM,
    n_actions: int = N_ACTIONS,
    *,
    seed: int = 0,
    n_regimes: int = 0,
    soft: bool = True,
    gamma: float = 0.99,
    vary_discounts: bool = False,
    reward_scale: float = 1.0,
) -> Batch:
    """A batch of random transitions with some terminations (and n-step-like discounts)."""
    rng = np.random.default_rng(seed)
    k = rng.integers(1, 4, size=n) if vary_discounts else np.ones(n, dtype=np.int64)
    return Batch(
        obs=torch.from_numpy(random_obs(n, obs_dim, rng, n_regimes, soft)),
        actions=torch.from_numpy(rng.integers(0, n_actions, size=n).astype(np.int64)),
        rewards=torch.from_numpy((reward_scale * rng.normal(size=n)).astype(np.float32)),
        next_obs=torch.from_numpy(random_obs(n, obs_dim, rng, n_regimes, soft)),
        dones=torch.from_numpy((rng.random(n) < 0.2).astype(np.float32)),
        discounts=torch.from_numpy((gamma**k).astype(np.float32)),
    )


class ToyEnv(gym.Env):
    """A tiny deterministic-given-seed env: Gaussian observations, reward = +1 if action matches
    the sign of the first feature, else -1; optional NaN reward at a given step; optional
    regime probabilities appended to the observation (exposed as ``n_regimes``)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012

    def __init__(
        self,
        obs_dim: int = 4,
        episode_len: int = 20,
        nan_reward_at: int | None = None,
        n_regimes: int = 0,
        reward_scale: float = 1.0,
    ) -> None:
        self.obs_dim, self.episode_len = obs_dim, episode_len
        self.nan_reward_at = nan_reward_at
        self.n_regimes = n_regimes
        self.reward_scale = reward_scale
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._total = 0
        self._obs = np.zeros(obs_dim, np.float32)

    def _draw(self) -> np.ndarray:
        return random_obs(1, self.obs_dim, self.np_random, self.n_regimes)[0]

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        self._t = 0
        self._obs = self._draw()
        return self._obs.copy(), {}

    def step(self, action: int):  # type: ignore[override]
        self._t += 1
        self._total += 1
        reward = self.reward_scale * (1.0 if (self._obs[0] > 0) == bool(action) else -1.0)
        if self.nan_reward_at is not None and self._total == self.nan_reward_at:
            reward = float("nan")
        self._obs = self._draw()
        truncated = self._t >= self.episode_len
        return self._obs.copy(), reward, False, truncated, {}


@pytest.fixture
def hp_factory() -> Callable[..., DQNHyperparameters]:
    return make_hp


@pytest.fixture
def agent_factory() -> Callable[..., DQNAgent]:
    return make_agent


@pytest.fixture
def batch_factory() -> Callable[..., Batch]:
    return random_batch


@pytest.fixture
def toy_env_cls() -> type[ToyEnv]:
    return ToyEnv
