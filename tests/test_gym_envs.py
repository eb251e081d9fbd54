"""Gymnasium envs by id: Discrete observations are one-hot encoded, errors name the env."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from foxhunt.envs.gym_envs import OneHotObservation, make_gym_env
from foxhunt.envstate import get_env_state, set_env_state
from foxhunt.errors import ConfigError


def test_discrete_observations_become_one_hot_vectors() -> None:
    env = make_gym_env("FrozenLake-v1")
    assert env.observation_space == gym.spaces.Box(0.0, 1.0, (16,), np.float32)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.sum() == 1.0 and obs[0] == 1.0  # the start cell
    obs, *_ = env.step(2)  # right (or a slip): one cell lit, the one the env reports
    assert obs.sum() == 1.0 and int(np.argmax(obs)) == int(env.unwrapped.s)
    assert isinstance(make_gym_env("CartPole-v1").observation_space, gym.spaces.Box)  # untouched
    shifted = OneHotObservation(gym.make("FrozenLake-v1"))
    shifted._start = -3  # a Discrete(n, start=-3) space indexes from its start
    assert shifted.observation(-3)[0] == 1.0


def test_toy_text_state_round_trips_for_exact_resume() -> None:
    env, copy = make_gym_env("FrozenLake-v1"), make_gym_env("FrozenLake-v1")
    env.reset(seed=4)
    for a in (1, 2, 2):
        env.step(a)
    copy.reset(seed=99)
    state = get_env_state(env)
    assert state is not None
    set_env_state(copy, json.loads(json.dumps(state)))
    for a in [1, 2, 1, 2, 0, 3] * 4:
        a_out, b_out = env.step(a), copy.step(a)
        assert np.array_equal(a_out[0], b_out[0]) and a_out[1:4] == b_out[1:4]
        if a_out[2] or a_out[3]:
            assert np.array_equal(env.reset()[0], copy.reset()[0])


@pytest.mark.parametrize(
    ("env_id", "needle"),
    [
        ("NoSuchEnv-v0", "env must be a registered Gymnasium id, got: 'NoSuchEnv-v0'"),
        ("Taxi-v3", "'Taxi-v3'"),
        ("no_such_module:Env-v0", "needs a package that is not installed: No module named"),
    ],
)
def test_bad_ids_name_the_env(env_id: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_gym_env(env_id)


def test_frozen_lake_trains() -> None:
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        batch_size=16, learning_starts=32, hidden_sizes=(16,), eval_interval=0, device="cpu"
    )
    trainer = DQNTrainer(hp, "FrozenLake-v1")
    try:
        summary = trainer.learn(300)
        assert trainer.agent.obs_dim == 16 and summary["optimizer_steps"] > 0
    finally:
        trainer.close()
