"""Gymnasium envs by id: Discrete observations are one-hot encoded, errors name the env."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
import torch

from foxhunt.config import DQNHyperparameters
from foxhunt.envs.gym_envs import OneHotObservation, make_gym_env
from foxhunt.envstate import get_env_state, set_env_state
from foxhunt.errors import CheckpointError, ConfigError
from foxhunt.trainer import DQNTrainer

# The installed Gymnasium's ids: 1.3 made Taxi-v4 current (Taxi-v3 is a deprecated id there,
# which raises), 1.2 CliffWalking-v1. What only a deprecated id shows is tested where one is.
TAXI = "Taxi-v4" if "Taxi-v4" in gym.registry else "Taxi-v3"
CLIFF = "CliffWalking-v1" if "CliffWalking-v1" in gym.registry else "CliffWalking-v0"
needs_deprecated_taxi = pytest.mark.skipif(
    TAXI == "Taxi-v3", reason="Gymnasium before 1.3: Taxi-v3 is current, not deprecated"
)


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


def _stepped_and_restored(env_id: str, actions: tuple[int, ...]) -> tuple[gym.Env, gym.Env, dict]:
    """An env stepped by ``actions`` from seed 4, another reset with seed 99 then given the
    first's state through JSON (what a checkpoint holds), and that state."""
    env, copy = make_gym_env(env_id), make_gym_env(env_id)
    env.reset(seed=4)
    for a in actions:
        env.step(a)
    copy.reset(seed=99)
    state = get_env_state(env)
    assert state is not None
    set_env_state(copy, json.loads(json.dumps(state)))
    return env, copy, state


def test_toy_text_state_round_trips_for_exact_resume() -> None:
    env, copy, _ = _stepped_and_restored("FrozenLake-v1", (1, 2, 2))
    for a in [1, 2, 1, 2, 0, 3] * 4:
        a_out, b_out = env.step(a), copy.step(a)
        assert np.array_equal(a_out[0], b_out[0]) and a_out[1:4] == b_out[1:4]
        if a_out[2] or a_out[3]:
            assert np.array_equal(env.reset()[0], copy.reset()[0])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", TAXI])
def test_classic_control_state_round_trips_mid_episode(env_id: str) -> None:
    """Acrobot keeps its state float32 after reset and float64 after a step, MountainCar an
    array after reset and a tuple after a step: a mid-episode checkpoint of either was refused
    on resume (exit 2), as the fresh env's value had the other kind."""
    env, copy, state = _stepped_and_restored(env_id, (0, 1, 0))
    before = env.unwrapped.state if hasattr(env.unwrapped, "state") else env.unwrapped.s
    after = copy.unwrapped.state if hasattr(copy.unwrapped, "state") else copy.unwrapped.s
    assert type(after) is type(before) and np.array_equal(np.asarray(after), np.asarray(before))
    assert np.asarray(after).dtype == np.asarray(before).dtype  # restored as it was held
    for a in [1, 0, 1, 1, 0] * 4:
        a_out, b_out = env.step(a), copy.step(a)
        assert np.array_equal(a_out[0], b_out[0]) and a_out[1:4] == b_out[1:4]
    # The kind still has to match: a state of another size or of booleans is refused.
    bad = json.loads(json.dumps(state))
    attrs = bad["base"]["attrs"]
    key = "state" if "state" in attrs else "s"
    attrs[key] = {"__ndarray__": [True] * 7, "dtype": "bool", "shape": [7]}
    with pytest.raises(CheckpointError, match=f"base.{key} must be"):
        set_env_state(copy, bad)


def test_a_users_env_with_a_state_attribute_is_not_captured_by_guess() -> None:
    # Its step counter was lost on resume, silently: an episode capped at 50 ran 70 steps.
    class Stateful(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = gym.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):  # type: ignore[override]
            super().reset(seed=seed)
            self.t, self.state = 0, np.zeros(3, np.float32)
            return self.state.copy(), {}

        def step(self, action):  # type: ignore[override]
            self.t += 1
            return self.state.copy(), 0.0, self.t >= 50, False, {}

    env = Stateful()
    env.reset(seed=0)
    assert get_env_state(env) is None  # resumed from a fresh reset, and said so
    # Gymnasium's own envs still are captured, a fickle Taxi passenger's step included (v4).
    taxi = make_gym_env(TAXI, kwargs={"fickle_passenger": True} if TAXI == "Taxi-v4" else {})
    taxi.reset(seed=1)
    state = get_env_state(taxi)
    assert state is not None and "s" in state["base"]["attrs"]
    assert "fickle_step" in state["base"]["attrs"] or TAXI == "Taxi-v3"


class _Tagged(gym.Env):
    """obs = [step in episode, tag, episode number]; reward 1 a step; no capturable state."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, tag: float) -> None:
        self.tag, self.episode, self.t = tag, -1, 0

    def reset(self, *, seed=None, options=None):  # type: ignore[override]
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.tag, self.episode], np.float32)

    def step(self, action):  # type: ignore[override]
        self.t += 1
        return self._obs(), 1.0, False, False, {}


def test_a_fresh_reset_resume_does_not_splice_n_step_returns_across_episodes() -> None:
    """n-step starts pending at the checkpoint end where their env stood then (bootstrapped,
    as truncated); before, the new episode's first rewards and states were appended to them."""
    from foxhunt.trainstate import capture_state, restore_state

    hp = DQNHyperparameters(
        n_step=3, gamma=0.5, learning_starts=10_000, hidden_sizes=(8,), eval_interval=0
    )
    before = DQNTrainer(hp, lambda: _Tagged(0.0))
    for _ in range(7):  # 7 steps into the episode: starts t=5 and t=6 pending
        before.collect_step()
    tensors, state = capture_state(before)
    after = DQNTrainer(hp, lambda: _Tagged(1.0))
    restore_state(after, {k: v.clone() for k, v in tensors.items()}, state)
    assert get_env_state(after.envs.envs[0]) is None  # the fresh-reset path
    stored = after.replay.size
    for _ in range(4):
        after.collect_step()
    r = after.replay
    obs, next_obs = r.obs[stored : r.size].numpy(), r.next_obs[stored : r.size].numpy()
    rewards, discounts = r.rewards[stored : r.size].numpy(), r.discounts[stored : r.size].numpy()
    assert np.array_equal(obs[:, 1], next_obs[:, 1])  # never from one episode into another
    assert obs[:2, :2].tolist() == [[5, 0], [6, 0]] and (next_obs[:2, 0] == 7).all()
    assert rewards[:2].tolist() == [1.5, 1.0] and discounts[:2].tolist() == [0.25, 0.5]
    assert r.dones[stored : stored + 2].sum() == 0  # truncated: they bootstrap
    assert obs[2].tolist() == [0, 1, 0] and rewards[2] == 1.75  # the new episode, from t=0
    # and the new episode is not the run's first one again: the restart reseeds the envs
    assert after.envs.envs[0].np_random_seed != before.envs.envs[0].np_random_seed


@pytest.mark.parametrize(
    ("env_id", "needle"),
    [
        ("NoSuchEnv-v0", "env must be a registered Gymnasium id, got: 'NoSuchEnv-v0'"),
        pytest.param("Taxi-v3", "'Taxi-v3'", marks=needs_deprecated_taxi),
        ("no_such_module:Env-v0", "needs a package that is not installed: No module named"),
    ],
)
def test_bad_ids_name_the_env(env_id: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        make_gym_env(env_id)


def test_an_env_registered_by_user_code_is_rebuilt_through_module_colon_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume/evaluate rebuild the env from its id in a new process, where the script's
    gym.register never ran: the error says to give 'module:Id', and that form works."""
    from foxhunt.runs import build_spec

    (tmp_path / "foxhunt_user_envs.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('FoxhuntUserCartPole-v0', entry_point='gymnasium.envs.classic_control:"
        "CartPoleEnv', max_episode_steps=50)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"give it as 'your_module:YourEnv-v0'"):
        make_gym_env("FoxhuntUserCartPole-v0")
    env = make_gym_env("foxhunt_user_envs:FoxhuntUserCartPole-v0")
    assert env.spec is not None and env.spec.max_episode_steps == 50
    with pytest.raises(ConfigError, match=r"env must be a Gymnasium id \(a string\), got: "):
        build_spec(env=env)  # type: ignore[arg-type]
    env.close()


def test_an_attribute_error_in_the_envs_own_code_is_raised_as_it_is() -> None:
    """The info-dict hint is for Gymnasium's reading of info; the same error inside the env's
    step is the env's own bug, and its traceback must reach the user."""
    from foxhunt.trainer import DQNTrainer

    class Buggy(_Counter):
        def step(self, action):  # type: ignore[no-untyped-def]
            settings = None
            settings.items()  # type: ignore[attr-defined]  # the user's bug
            return super().step(action)

    trainer = DQNTrainer(_hp(), Buggy())
    try:
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'items'"):
            trainer.learn(20)
    finally:
        trainer.close()


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


# --- envs passed as instances or factories, unusual spaces (a probe's findings) --------------


class _Counter(gym.Env):
    """Observation = steps since reset; ends after ``horizon`` steps (never when None)."""

    def __init__(self, horizon: int | None = 15, actions: gym.spaces.Discrete | None = None):
        self.observation_space = gym.spaces.Box(0.0, 1e6, (1,), np.float32)
        self.action_space = actions or gym.spaces.Discrete(2)
        self.horizon = horizon
        self.received: list[int] = []
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):  # type: ignore[no-untyped-def]
        assert self.action_space.contains(action), action
        self.received.append(int(action))
        self.t += 1
        ended = self.horizon is not None and self.t >= self.horizon
        return np.array([self.t], np.float32), 1.0, ended, False, {}


def _hp(**kw: object):  # type: ignore[no-untyped-def]
    from foxhunt.config import DQNHyperparameters

    base: dict = dict(
        batch_size=8, learning_starts=8, hidden_sizes=(8,), eval_interval=0, eval_episodes=1
    )
    return DQNHyperparameters(**{**base, **kw})


def test_an_env_instance_is_not_stepped_by_evaluation() -> None:
    """Evaluating on the training instance reset it mid-episode: stored transitions jumped."""
    from foxhunt.trainer import DQNTrainer

    env = _Counter(horizon=15)
    trainer = DQNTrainer(_hp(eval_interval=20), env)
    try:
        trainer.learn(100)
        assert trainer.eval_history, "evaluations ran"
        r = trainer.replay
        obs, nxt = r.obs[: r.size, 0].numpy(), r.next_obs[: r.size, 0].numpy()
        np.testing.assert_array_equal(nxt, obs + 1)  # every stored step is one real step
        assert trainer.episodes == 100 // 15
        assert trainer._eval_env is not None and trainer._eval_env.unwrapped is not env
    finally:
        trainer.close()


class _SeedLog(gym.Wrapper):
    """Records every reset's seed and every episode's undiscounted return."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.seeds: list[int | None] = []
        self.returns: list[float] = []

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def, override]
        self.seeds.append(seed)
        self.returns.append(0.0)
        return self.env.reset(seed=seed, options=options)

    def step(self, action):  # type: ignore[no-untyped-def]
        out = self.env.step(action)
        self.returns[-1] += float(out[1])
        return out


@pytest.mark.parametrize("n", [1, 3])
def test_evaluate_plays_n_fixed_seed_episodes_and_returns_their_mean(n: int) -> None:
    log = _SeedLog(gym.make("CartPole-v1"))
    trainer = DQNTrainer(_hp(seed=4), "CartPole-v1", eval_env=log)
    try:
        value = trainer.evaluate(n)
        assert log.seeds == [4 + 1_000_003 + k for k in range(n)]
        assert value == pytest.approx(np.mean(log.returns))
        trainer.evaluate(n)  # the same episodes again: evaluations are comparable
        assert log.seeds[n:] == log.seeds[:n] and log.returns[n:] == log.returns[:n]
    finally:
        trainer.close()


def test_actions_of_a_discrete_space_with_a_start_are_offset() -> None:
    from foxhunt.trainer import DQNTrainer

    space = gym.spaces.Discrete(3, start=-1)
    env = _Counter(horizon=10, actions=space)
    trainer = DQNTrainer(_hp(), env)  # the env asserts that every action is in its space
    try:
        trainer.learn(60)
        assert set(env.received) <= {-1, 0, 1} and {-1, 1} <= set(env.received)
        assert trainer.agent.n_actions == 3
        assert trainer.evaluate(1) == 10.0
    finally:
        trainer.close()


def test_discrete_observations_are_one_hot_for_instances_and_factories() -> None:
    from foxhunt.trainer import DQNTrainer

    for env in (gym.make("FrozenLake-v1"), lambda: gym.make("FrozenLake-v1")):
        trainer = DQNTrainer(_hp(), env, eval_env=gym.make("FrozenLake-v1"))
        try:
            trainer.learn(40)
            assert trainer.agent.obs_shape == (16,)
        finally:
            trainer.close()


class _Cells(gym.Env):
    """Discrete(5, start=10) states, Discrete(3, start=1) actions; action 2 pays 1."""

    observation_space = gym.spaces.Discrete(5, start=10)
    action_space = gym.spaces.Discrete(3, start=1)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        self.s = 10
        return self.s, {}

    def step(self, action):  # type: ignore[no-untyped-def]
        assert self.action_space.contains(action), action
        self.s = 10 + (self.s - 9) % 5
        return self.s, float(action == 2), False, self.s == 14, {}


class _RaggedInfo(gym.Env):
    """An info value whose length changes from call to call."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def,override]
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {"arr": np.zeros(int(self.np_random.integers(1, 4)))}

    def step(self, action):  # type: ignore[no-untyped-def]
        return np.zeros(3, np.float32), 0.0, False, False, {"arr": np.zeros(1)}


class _ArrayReward(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def,override]
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):  # type: ignore[no-untyped-def]
        return np.zeros(3, np.float32), np.array([1.0, 2.0]), False, False, {}


@pytest.mark.parametrize("vector_env", ["sync", "async"])
def test_an_array_reward_is_named(vector_env: str) -> None:
    # Blamed on the observation (sync); a traceback from the replay buffer (async).
    from foxhunt.errors import EnvironmentStepError
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(n_envs=2, vector_env=vector_env), _ArrayReward)
    try:
        with pytest.raises(EnvironmentStepError, match="reward must be one number"):
            trainer.learn(50)
    finally:
        trainer.close()


@pytest.mark.parametrize("vector_env", ["sync", "async"])
def test_ragged_infos_are_named_and_async_envs_close(vector_env: str) -> None:
    """Gymnasium failed to stack the infos and the error blamed the observation; async envs
    then hung for ever in close(), waiting for an answer already received."""
    import threading

    from foxhunt.errors import EnvironmentStepError
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(n_envs=4, vector_env=vector_env), _RaggedInfo)
    with pytest.raises(EnvironmentStepError, match="gathers the sub-envs' info dicts"):
        trainer.learn(50)
    closing = threading.Thread(target=trainer.close, daemon=True)
    closing.start()
    closing.join(timeout=60)
    assert not closing.is_alive()


@pytest.mark.parametrize("vector_env", ["sync", "async"])
def test_a_loaded_policy_takes_and_returns_the_envs_own_terms(tmp_path, vector_env: str) -> None:  # type: ignore[no-untyped-def]
    """act() is the network's view (one-hot in, index out); predict() is the env's, and a saved
    model keeps it, however the env was passed (async workers included)."""
    import foxhunt
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(n_envs=2, vector_env=vector_env), _Cells)
    try:
        trainer.learn(200)
        trainer.save(tmp_path / "model")
        trained = trainer.agent
        states = np.arange(10, 15)
        one_hot = np.eye(5, dtype=np.float32)
        expected = trained.greedy_actions(one_hot) + 1  # network index i is env action 1 + i
        np.testing.assert_array_equal(trained.predict(states), expected)
    finally:
        trainer.close()
    policy = foxhunt.load_model(tmp_path / "model")
    np.testing.assert_array_equal(policy.predict(states), expected)
    for s in states:
        action = policy.predict(int(s))
        assert isinstance(action, int) and _Cells.action_space.contains(action)
        assert action == policy.act(one_hot[s - 10]) + 1
    assert policy.predict(np.int64(12)) == expected[2]
    with pytest.raises(ValueError, match=r"Discrete\(5, start=10\) \(10 to 14\).*got: 9"):
        policy.predict(9)
    with pytest.raises(ValueError, match=r"float32 array of shape \(5,\).*act\(\) takes"):
        policy.predict(one_hot[0])  # the network's one-hot view is act()'s, not predict()'s
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["env_interface"] == {"one_hot_observation": [5, 10], "action_start": 1}


def test_models_saved_before_the_env_interface_act_as_before(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import foxhunt
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(), "CartPole-v1")
    try:
        trainer.learn(40)
        trainer.save(tmp_path)
    finally:
        trainer.close()
    meta_path = tmp_path / "model.json"
    meta = json.loads(meta_path.read_text())
    assert meta["env_interface"] == {"one_hot_observation": None, "action_start": 0}
    del meta["env_interface"]
    meta_path.write_text(json.dumps(meta))
    policy = foxhunt.load_model(tmp_path)
    obs = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_array_equal(policy.predict(obs), policy.act(obs))


class _Image(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (3, 4, 4), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 255, (3, 4, 4), dtype=np.uint8), {}

    def step(self, action):  # type: ignore[no-untyped-def]
        self.t += 1
        obs = self.np_random.integers(0, 255, (3, 4, 4), dtype=np.uint8)
        return obs, float(action), self.t >= 5, False, {}


def test_image_observations_act_evaluate_save_and_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import foxhunt
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(eval_interval=30), _Image())
    try:
        trainer.learn(60)
        one = _Image().reset(seed=0)[0]
        batch = np.stack([one, one, one])
        agent = trainer.agent
        assert isinstance(agent.act(one), int)  # one (3, 4, 4) image is one observation
        assert agent.act(batch).shape == (3,)
        with pytest.raises(ValueError, match=r"shape \(3, 4, 4\).*got: \(4, 4\)"):
            agent.act(one[0])
        # 0-255 pixels reach the network as [0, 1] (as 0-255, an MLP's first Q-values ran
        # into the hundreds and the divergence monitor stopped the run): replay hands out the
        # scaled values, and predict() takes the env's own uint8 observation.
        assert agent.env_interface.scale == pytest.approx(1 / 255)
        stored = trainer.replay.sample(32).obs
        assert float(stored.max()) <= 1.0 and float(stored.max()) > 0.5
        scaled = batch.astype(np.float32) * np.float32(1 / 255)
        np.testing.assert_array_equal(agent.predict(batch), agent.act(scaled))
        trainer.save(tmp_path / "model")
    finally:
        trainer.close()
    loaded = foxhunt.load_model(str(tmp_path / "model"))
    assert loaded.obs_shape == (3, 4, 4)
    assert loaded.env_interface == agent.env_interface
    np.testing.assert_array_equal(loaded.greedy_actions(batch), agent.greedy_actions(batch))
    np.testing.assert_array_equal(loaded.predict(batch), agent.predict(batch))


class _Side(gym.Env):
    """RGB frames (H, W, 3) lit on the left or the right half; the action naming the lit side
    earns 1. One step per episode: a bandit an agent solves only by reading the image."""

    observation_space = gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        return self._frame(), {}

    def _frame(self) -> np.ndarray:
        self.side = int(self.np_random.integers(2))
        frame = self.np_random.integers(0, 60, (40, 40, 3), dtype=np.uint8)
        frame[:, 20 * self.side : 20 * self.side + 20] += 150
        return frame

    def step(self, action):  # type: ignore[no-untyped-def]
        reward = float(int(action) == self.side)
        return self._frame(), reward, True, False, {}


def test_the_nature_cnn_torso_learns_from_pixels_and_reloads(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """torso=cnn reads (H, W, C) frames with the Nature DQN convolutions; trained, saved and
    loaded, it names the lit side of unseen frames. An MLP given images is told about it."""
    import foxhunt
    from foxhunt.trainer import DQNTrainer

    DQNTrainer(_hp(), _Side()).close()
    assert "observations of shape (40, 40, 3) go flattened into the MLP" in caplog.text
    caplog.clear()
    gray = gym.wrappers.TransformObservation(
        _Side(), lambda o: o[..., 0], gym.spaces.Box(0, 255, (40, 40), np.uint8)
    )
    DQNTrainer(_hp(), gray).close()  # grayscale uint8 frames too; not 2-D floats, not tiny ones
    assert "observations of shape (40, 40) go flattened into the MLP" in caplog.text
    caplog.clear()
    DQNTrainer(_hp(), _Image()).close()  # (3, 4, 4): smaller than the convolutions take
    assert "go flattened" not in caplog.text
    hp = _hp(torso="cnn", hidden_sizes=(32,), batch_size=32, learning_starts=100, train_freq=1,
             exploration_fraction=0.3, learning_rate=5e-4, target_update_interval=100)  # fmt: skip
    trainer = DQNTrainer(hp, _Side())
    try:
        trainer.learn(1200)
        assert "go flattened" not in caplog.text
        trainer.save(tmp_path / "model")
    finally:
        trainer.close()
    env = _Side()
    env.reset(seed=123)
    frames, sides = zip(*((env._frame(), env.side) for _ in range(200)), strict=True)
    loaded = foxhunt.load_model(str(tmp_path / "model"))
    actions = loaded.predict(np.stack(frames))
    assert np.mean(actions == np.array(sides)) > 0.95
    np.testing.assert_array_equal(actions, trainer.agent.predict(np.stack(frames)))


class _ScaledImage(_Image):
    """_Image's pixels as PixelObservation would give them: float32 in [0, 1]."""

    observation_space = gym.spaces.Box(0.0, 1.0, (3, 4, 4), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        obs, info = super().reset(seed=seed, options=options)
        return obs.astype(np.float32) * np.float32(1 / 255), info

    def step(self, action):  # type: ignore[no-untyped-def]
        obs, *rest = super().step(action)
        return obs.astype(np.float32) * np.float32(1 / 255), *rest


def test_pixel_replay_stores_uint8_and_trains_bit_for_bit_as_float32_storage() -> None:
    """Replay keeps 0-255 pixels as uint8 (a quarter of the memory); training is the same to the
    last bit as with the same pixels handed over already scaled, which replay stores as float32
    (prioritized replay, 3-step returns, two envs)."""
    from foxhunt.trainer import DQNTrainer

    hp = _hp(prioritized_replay=True, n_step=3, n_envs=2, buffer_capacity=64, seed=4)
    runs = {}
    for env in (_Image, _ScaledImage):
        trainer = DQNTrainer(hp, env)
        try:
            trainer.learn(120)
            runs[env] = (trainer.replay, list(trainer.agent.online_net.parameters()))
        finally:
            trainer.close()
    (pix, pix_params), (flt, flt_params) = runs[_Image], runs[_ScaledImage]
    assert pix.obs.dtype == torch.uint8 and flt.obs.dtype == torch.float32
    assert pix.nbytes < flt.nbytes * 0.3
    assert pix.size == flt.size == 64  # wrapped around
    for a, b in zip(pix_params, flt_params, strict=True):
        assert torch.equal(a, b)


class _StatefulImage(_Image):
    """_Image whose mid-episode state a checkpoint captures (the opt-in of foxhunt.envstate)."""

    def get_state(self) -> dict:
        return {"t": getattr(self, "t", 0), "rng": self.np_random.bit_generator.state}

    def set_state(self, state: dict) -> None:
        self.t = state["t"]
        self.np_random.bit_generator.state = state["rng"]


@pytest.mark.parametrize("saved_as", ["uint8", "float32"])
def test_a_pixel_run_resumes_exactly_from_either_replay_storage(saved_as: str) -> None:
    """A checkpoint resumes bit for bit, also one written when replay kept pixels as float32:
    its scaled values load into the uint8 levels and pass the round-trip check."""
    from foxhunt.trainstate import capture_state, restore_state

    hp = _hp(prioritized_replay=True, n_step=3, n_envs=2, buffer_capacity=64, seed=4)
    straight, resumed = DQNTrainer(hp, _StatefulImage), DQNTrainer(hp, _StatefulImage)
    try:
        straight.learn(60)
        tensors, state = capture_state(straight)
        tensors = {k: v.clone() for k, v in tensors.items()}
        assert tensors["replay.obs"].dtype == torch.uint8
        if saved_as == "float32":
            for key in ("replay.obs", "replay.next_obs"):
                tensors[key] = tensors[key].float() * np.float32(1 / 255)
        restore_state(resumed, tensors, state)
        assert torch.equal(resumed.replay.obs, straight.replay.obs)
        straight.learn(120)
        resumed.learn(120)
        pairs = zip(
            straight.agent.online_net.parameters(),
            resumed.agent.online_net.parameters(),
            strict=True,
        )
        for a, b in pairs:
            assert torch.equal(a, b)
    finally:
        straight.close()
        resumed.close()


class _NumpyState(_Image):
    """An env whose get_state() holds NumPy values, as user envs naturally do."""

    seen: ClassVar[list[dict]] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        out = super().reset(seed=seed, options=options)
        self.t = np.int64(0)
        self.level = np.float32(0.1)
        self.trail = np.zeros(3, np.float32)
        return out

    def step(self, action):  # type: ignore[no-untyped-def]
        self.level = np.float32(self.level * np.float32(1.1))
        self.trail = np.roll(self.trail, 1) + self.level
        return super().step(action)

    t, level, trail = np.int64(0), np.float32(0.1), np.zeros(3, np.float32)  # before reset

    def get_state(self) -> dict:
        return {"t": self.t, "level": self.level, "trail": self.trail, "flags": (np.bool_(1),)}

    def set_state(self, state: dict) -> None:
        type(self).seen.append(state)
        self.t, self.level, self.trail = state["t"], state["level"], state["trail"]


def test_numpy_values_in_a_custom_env_state_come_back_as_they_were() -> None:
    """get_state() may hold NumPy scalars and arrays: a checkpoint keeps their dtypes, so the
    env's set_state gets back exactly what it gave (a np.int64 crashed the checkpoint writer);
    a value JSON cannot hold is refused in one line that says where it is."""
    from foxhunt.errors import EnvironmentStepError
    from foxhunt.trainstate import capture_state, restore_state

    hp = _hp(n_envs=2, seed=3)
    straight, resumed = DQNTrainer(hp, _NumpyState), DQNTrainer(hp, _NumpyState)
    try:
        straight.learn(23)
        tensors, state = capture_state(straight)
        _NumpyState.seen.clear()
        restore_state(resumed, {k: v.clone() for k, v in tensors.items()}, state)
        originals = [e.unwrapped.get_state() for e in straight.envs.envs]
        assert len(_NumpyState.seen) == 2
        for got, want in zip(_NumpyState.seen, originals, strict=True):
            assert type(got["t"]) is np.int64 and got["t"] == want["t"]
            assert type(got["level"]) is np.float32 and got["level"] == want["level"]
            assert got["trail"].dtype == np.float32 and np.array_equal(got["trail"], want["trail"])
            assert got["flags"] == [np.bool_(True)] and type(got["flags"][0]) is np.bool_
        straight.learn(60)
        resumed.learn(60)
        for a, b in zip(straight.envs.envs, resumed.envs.envs, strict=True):
            assert a.unwrapped.level == b.unwrapped.level and a.unwrapped.t == b.unwrapped.t
        # A dict that looks like a tag stays a dict; what JSON cannot hold is refused by name.
        env = straight.envs.envs[1].unwrapped
        lookalike = {"__ndarray__": [1, 2], "dtype": "int64", "shape": [2]}
        env.trail = {"__npscalar__": 3, "dtype": "int8", "x": lookalike, 0: 2}
        env.level = np.zeros((0, 3), np.float32)  # an empty buffer keeps its shape
        tensors, state = capture_state(straight)
        _NumpyState.seen.clear()
        restore_state(resumed, {k: v.clone() for k, v in tensors.items()}, state)
        # Keys JSON writes as strings (ints: as checkpoints always did) come back as strings.
        want = {"__npscalar__": 3, "dtype": "int8", "x": lookalike, "0": 2}
        assert _NumpyState.seen[1]["trail"] == want
        assert _NumpyState.seen[1]["level"].shape == (0, 3)
        loop: list = []
        loop.append(loop)
        for bad, what in (
            ({np.int64(1): 2}, r"\['trail'\] is a dict with the key (np.int64\()?1\b"),
            (np.longdouble(1), r"\['trail'\] is a (longdouble|float128) of dtype float128"),
            ([0, loop], r"\['trail'\]\[1\]\[0\] is the container it sits in"),
        ):
            env.trail = bad
            with pytest.raises(EnvironmentStepError, match=what):
                capture_state(straight)
        straight.envs.envs[1].unwrapped.trail = {"a": {1, 2}}
        where = r"_NumpyState.get_state\(\)\['trail'\]\['a'\] is a set"
        with pytest.raises(EnvironmentStepError, match=where):
            capture_state(straight)
    finally:
        straight.close()
        resumed.close()


def test_forged_numpy_tags_in_a_custom_env_state_are_refused_in_one_line() -> None:
    from foxhunt.envstate import get_env_state, set_env_state
    from foxhunt.errors import CheckpointError

    env = _NumpyState()
    env.reset(seed=0)
    good = json.loads(json.dumps(get_env_state(env)))
    forged = [
        {"__npscalar__": 1, "dtype": "O"},
        {"__npscalar__": 1.5, "dtype": "int64"},
        {"__npscalar__": "12", "dtype": "int64"},
        {"__ndarray__": [[1]], "dtype": "float32", "shape": [1]},
        {"__ndarray__": ["a"] * 8, "dtype": "S2000000000", "shape": [8]},
        {"__ndarray__": [1], "dtype": "x" * 100_000, "shape": [1]},
        {"__dict__": [1]},
        {"__ndarray__": [1.5, 2.7], "dtype": "int64", "shape": [2]},
        {"__ndarray__": ["1.5", "2"], "dtype": "float64", "shape": [2]},
        {"__ndarray__": [0.5, 7], "dtype": "bool", "shape": [2]},
        {"__ndarray__": None, "dtype": "float64", "shape": []},
        {"__ndarray__": [], "dtype": "float64", "shape": [-1, 0]},
    ]
    for tag in forged:
        state = {**good, "base": {**good["base"], "custom": {**good["base"]["custom"], "t": tag}}}
        with pytest.raises(CheckpointError, match=r"base.custom is malformed") as err:
            set_env_state(env, state)
        assert len(str(err.value)) < 300 and "\n" not in str(err.value)
    assert env.t == 0


def test_a_cut_off_evaluation_episode_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(), lambda: _Counter(horizon=None))
    try:
        with caplog.at_level("WARNING", logger="foxhunt.trainer"):
            assert trainer.evaluate(1, max_steps=50) == 50.0
        assert "cut off after 50 steps" in caplog.text
    finally:
        trainer.close()


def test_learn_with_a_total_already_reached_says_so(caplog: pytest.LogCaptureFixture) -> None:
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(), _Counter())
    try:
        trainer.learn(40)
        with caplog.at_level("WARNING", logger="foxhunt.trainer"):
            trainer.learn(30)
        assert trainer.env_steps == 40 and "nothing to train" in caplog.text
        caplog.clear()
        with caplog.at_level("WARNING", logger="foxhunt.trainer"):
            trainer.learn(50)
        assert trainer.env_steps == 50 and not caplog.text
    finally:
        trainer.close()


def test_a_reward_beyond_float32_is_refused_by_name() -> None:
    from foxhunt.errors import EnvironmentStepError
    from foxhunt.trainer import DQNTrainer

    class Huge(_Counter):
        def step(self, action):  # type: ignore[no-untyped-def]
            obs, _, term, trunc, info = super().step(action)
            return obs, 1e39, term, trunc, info

    trainer = DQNTrainer(_hp(), Huge())
    try:
        with pytest.raises(EnvironmentStepError, match=r"too large for float32.*1e\+39"):
            trainer.learn(20)
        assert trainer.replay.size == 0
    finally:
        trainer.close()


@pytest.mark.parametrize("when", ["reset", "step"])
def test_an_observation_that_does_not_fit_the_space_is_one_line(when: str) -> None:
    """Gymnasium's stacking fails on it with no word of the env step or the space."""
    from foxhunt.errors import EnvironmentStepError
    from foxhunt.trainer import DQNTrainer

    class Misshapen(_Counter):
        def reset(self, **kwargs):  # type: ignore[no-untyped-def]
            obs, info = super().reset(**kwargs)
            return (np.zeros(7, np.float32) if when == "reset" else obs), info

        def step(self, action):  # type: ignore[no-untyped-def]
            _, reward, term, trunc, info = super().step(action)
            return np.zeros(7, np.float32), reward, term, trunc, info

    trainer = DQNTrainer(_hp(), Misshapen())
    try:
        with pytest.raises(EnvironmentStepError) as info:
            trainer.learn(20)
        message = str(info.value)
        assert f"environment {when} failed at env step 0" in message and "\n" not in message
        assert "an observation that does not fit the observation space Box(" in message
        assert trainer.replay.size == 0
    finally:
        trainer.close()


@pytest.mark.parametrize(
    ("broken", "needle"),
    [
        ("four_tuple", "(obs, reward, terminated, truncated, info)"),
        ("obs_only_reset", "reset returns (obs, info)"),
        ("text_obs", "does not fit the observation space"),
        ("none_obs", "wrong dimensionality (an observation that does not fit the observation"),
        ("ragged_obs", "inhomogeneous shape after 1 dimensions"),
        ("old_reset", "takes the keywords seed and options"),
        ("gym_error", "DependencyNotInstalled: pygame is not installed (raised by Gymnasium"),
        ("none_info_reset", "info a dict"),  # Gymnasium's AttributeError: no attribute 'items'
        ("none_info_step", "info a dict"),
    ],
)
def test_an_env_that_breaks_the_gymnasium_api_is_one_line(broken: str, needle: str) -> None:
    from foxhunt.errors import EnvironmentStepError
    from foxhunt.trainer import DQNTrainer

    class Broken(_Counter):
        def reset(self, seed=None, options=None):  # type: ignore[no-untyped-def]
            if broken == "gym_error":  # what env_kwargs.render_mode=human does without pygame
                raise gym.error.DependencyNotInstalled("pygame is not installed")
            obs, info = super().reset(seed=seed)
            return obs if broken == "obs_only_reset" else (obs, None if "reset" in broken else info)

        def step(self, action):  # type: ignore[no-untyped-def]
            obs, reward, term, trunc, info = super().step(action)
            if broken == "four_tuple":
                return obs, reward, term or trunc, info
            if broken == "none_info_step":
                return obs, reward, term, trunc, None
            bad = {
                "text_obs": np.array(["x"] * len(obs)),
                "none_obs": None,
                "ragged_obs": [[0], []],
            }
            return bad.get(broken, obs), reward, term, trunc, info

    class OldReset(_Counter):
        def reset(self):  # type: ignore[no-untyped-def,override]
            return super().reset()

    trainer = DQNTrainer(_hp(), OldReset() if broken == "old_reset" else Broken())
    try:
        with pytest.raises(EnvironmentStepError) as info:
            trainer.learn(20)
        assert needle in str(info.value) and "\n" not in str(info.value)
    finally:
        trainer.close()


def test_an_envs_own_error_keeps_its_type_and_traceback() -> None:
    """A ValueError the env raises itself (a price feed's) is its bug, not an API mismatch."""
    from foxhunt.trainer import DQNTrainer

    class Feed(_Counter):
        def step(self, action):  # type: ignore[no-untyped-def]
            raise ValueError("price feed returned a negative price")

    trainer = DQNTrainer(_hp(), Feed())
    try:
        with pytest.raises(ValueError, match=r"^price feed returned a negative price$"):
            trainer.learn(20)
    finally:
        trainer.close()


def test_bad_eval_env_arguments_name_eval_env() -> None:
    from foxhunt.trainer import DQNTrainer

    with pytest.raises(ConfigError, match="eval_env must be a registered Gymnasium id"):
        DQNTrainer(_hp(), "CartPole-v1", eval_env="Nope-v0")
    with pytest.raises(ConfigError, match="eval_env must be a Gymnasium env, env id or factory"):
        DQNTrainer(_hp(), "CartPole-v1", eval_env=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="eval_env factory must return a Gymnasium env"):
        DQNTrainer(_hp(), "CartPole-v1", eval_env=lambda: 5)  # type: ignore[arg-type,return-value]


def test_a_replay_buffer_too_large_to_allocate_names_buffer_capacity() -> None:
    from foxhunt.replay import ReplayBuffer

    with pytest.raises(ConfigError, match=r"buffer_capacity 10000000000000 with .* \(4,\) needs"):
        ReplayBuffer(10**13, (4,))
    # A shape so large its element count wraps around in NumPy still names the true size.
    with pytest.raises(ConfigError, match=r"shape \(1099511627776, 1099511627776\) needs [1-9]"):
        ReplayBuffer(10, (2**40, 2**40))


def test_learning_starts_warning_only_when_no_update_can_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from foxhunt.trainer import DQNTrainer, final_env_steps

    assert final_env_steps(0, 62, 4) == 64 and final_env_steps(10, 5, 4) == 10
    from foxhunt.trainer import planned_updates

    cases = [  # (n_envs, learning_starts, total, train_freq, gradient_steps, warned, n_step)
        (1, 16, 16, 1, 1, False, 1),  # trains at step 16 itself
        (4, 16, 14, 1, 1, False, 1),  # 4 envs step past 14 to 16
        (1, 17, 16, 1, 1, True, 1),
        # Past learning_starts but before the next train_freq boundary: no update either (a
        # CartPole run of 1000 steps, learning_starts 1000, train_freq 256 trained nothing).
        (4, 40, 40, 16, 2, True, 1),
        (4, 40, 48, 16, 2, False, 1),
        (3, 10, 50, 8, 3, False, 1),  # n_envs not dividing train_freq: boundaries crossed mid-step
        (4, 8, 30, 6, 1, False, 1),
        # 3-step returns over 8 envs: the replay's first transition comes at env step 24.
        (8, 8, 16, 8, 1, True, 3),
        (8, 8, 24, 8, 1, False, 3),
    ]
    for n_envs, starts, total, freq, grad_steps, warned, n_step in cases:
        hp = _hp(
            n_envs=n_envs,
            learning_starts=starts,
            train_freq=freq,
            gradient_steps=grad_steps,
            n_step=n_step,
        )
        trainer = DQNTrainer(hp, lambda: _Counter())
        try:
            caplog.clear()
            with caplog.at_level("WARNING", logger="foxhunt.trainer"):
                trainer.learn(total)
            assert ("no optimizer step will run" in caplog.text) is warned
            assert (trainer.agent.optimizer_steps == 0) is warned
            # The count the warning rests on is the loop's own, case by case.
            assert planned_updates(0, total, hp) == trainer.agent.optimizer_steps
            mid = 20 - 20 % n_envs  # a vector step the run passed through
            if total > mid:  # counted from part way, as a resumed or continued run counts it
                assert planned_updates(mid, total, hp) == trainer.agent.optimizer_steps - (
                    planned_updates(0, mid, hp)
                )
        finally:
            trainer.close()
    # Continued while the replay is still empty (3-step returns over 8 envs fill it at step 24):
    # the count from there was taken for a filled replay, and the warning went unsaid.
    hp = _hp(n_envs=8, learning_starts=8, train_freq=8, gradient_steps=1, n_step=3)
    trainer = DQNTrainer(hp, lambda: _Counter())
    try:
        trainer.learn(8)
        caplog.clear()
        with caplog.at_level("WARNING", logger="foxhunt.trainer"):
            trainer.learn(16)
        assert trainer.replay.size == 0 and trainer.agent.optimizer_steps == 0
        assert "no optimizer step will run" in caplog.text
        caplog.clear()
        with caplog.at_level("WARNING", logger="foxhunt.trainer"):
            trainer.learn(24)  # the first transitions arrive, and an update runs
        assert trainer.agent.optimizer_steps == 1 and "no optimizer step" not in caplog.text
    finally:
        trainer.close()


def test_a_continued_run_that_trains_no_further_is_not_called_untrained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(n_envs=1, train_freq=16, learning_starts=8), lambda: _Counter())
    try:
        trainer.learn(40)  # updates at env steps 16 and 32
        done = trainer.agent.optimizer_steps
        assert done == 2
        caplog.clear()
        with caplog.at_level("WARNING", logger="foxhunt.trainer"):
            trainer.learn(45)  # no boundary before 48
        assert f"no further optimizer step will run (the model keeps its {done})" in caplog.text
        assert "untrained" not in caplog.text and trainer.agent.optimizer_steps == done
    finally:
        trainer.close()


def test_planned_checkpoints_are_where_the_loop_saves() -> None:
    """What a resume checks before training (nothing in the way of its saves) rests on this."""
    from foxhunt.trainer import DQNTrainer

    for n_envs, interval, first, total in [(1, 30, 45, 130), (4, 30, 44, 150), (3, 10, 30, 61)]:
        trainer = DQNTrainer(_hp(n_envs=n_envs, checkpoint_interval=interval), lambda: _Counter())
        saved: list[int] = []
        try:
            trainer.learn(first)
            trainer._checkpointer = type(
                "Record", (), {"save": lambda _, t, saved=saved: saved.append(t.env_steps)}
            )()
            planned = trainer.planned_checkpoints(total)
            trainer.learn(total)
            assert planned == set(saved), (n_envs, interval)
        finally:
            trainer.close()


def test_evaluation_env_forms_and_their_failures(caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from foxhunt.trainer import DQNTrainer

    # An eval_env wrapping the very instance being trained is refused.
    env = gym.make("CartPole-v1")
    with pytest.raises(ConfigError, match="eval_env wraps the training env instance"):
        DQNTrainer(_hp(), env, eval_env=gym.wrappers.RecordEpisodeStatistics(env))

    # A factory is called once per env it makes: once for training, once at the first evaluation.
    calls: list[int] = []

    def factory() -> gym.Env:
        calls.append(1)
        return _Counter()

    trainer = DQNTrainer(_hp(), factory)
    try:
        assert len(calls) == 1
        trainer.evaluate(1)
        trainer.evaluate(1)
        assert len(calls) == 2
    finally:
        trainer.close()

    # An instance that cannot be deep-copied: rebuilt from its spec, out loud.
    locked = gym.make("CartPole-v1")
    locked.unwrapped.lock = threading.Lock()  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger="foxhunt.trainer"):
        trainer = DQNTrainer(_hp(), locked)
    try:
        assert "deep-copying it failed" in caplog.text
        assert trainer._eval_env is not None and trainer._eval_env.unwrapped is not locked
    finally:
        trainer.close()

    # Neither copied nor rebuilt (no spec): refused when evaluations are due, else at evaluate().
    bare = _Counter()
    bare.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="can be neither copied nor rebuilt"):
        DQNTrainer(_hp(eval_interval=10), bare)
    trainer = DQNTrainer(_hp(), bare)
    try:
        trainer.learn(20)
        for _ in range(2):
            with pytest.raises(ConfigError, match="pass eval_env="):
                trainer.evaluate(1)
    finally:
        trainer.close()


def test_an_ensemble_predicts_in_the_envs_terms_and_members_must_agree_on_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import foxhunt
    from foxhunt.ensemble import QEnsemble
    from foxhunt.envs.gym_envs import EnvInterface
    from foxhunt.trainer import DQNTrainer

    for seed in (0, 1):
        trainer = DQNTrainer(_hp(seed=seed), _Cells)
        try:
            trainer.learn(120)
            trainer.save(tmp_path / f"m{seed}")
        finally:
            trainer.close()
    ensemble = QEnsemble.from_run_dirs([tmp_path / "m0", tmp_path / "m1"])
    states = np.arange(10, 15)
    expected = ensemble.greedy_actions(np.eye(5, dtype=np.float32)) + 1
    np.testing.assert_array_equal(ensemble.predict(states), expected)
    assert ensemble.predict(12) == expected[2] and isinstance(ensemble.predict(12), int)
    assert ensemble.predict([12, 13]).tolist() == expected[2:4].tolist()  # lists, like numpy
    other = foxhunt.load_model(tmp_path / "m1")
    other.env_interface = EnvInterface((5, 10), action_start=0)
    with pytest.raises(ConfigError, match="member-1: its env's observations and actions map"):
        QEnsemble([foxhunt.load_model(tmp_path / "m0"), other])
    # A model saved before the interface was recorded takes its fellow members'.
    meta_path = tmp_path / "m1" / "model.json"
    meta = json.loads(meta_path.read_text())
    del meta["env_interface"]
    meta_path.write_text(json.dumps(meta))
    mixed = QEnsemble([foxhunt.load_model(tmp_path / "m1"), foxhunt.load_model(tmp_path / "m0")])
    assert mixed.env_interface == EnvInterface((5, 10), action_start=1)
    np.testing.assert_array_equal(mixed.predict(states), expected)


def test_observations_of_the_wrong_kind_are_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import foxhunt
    from foxhunt.trainer import DQNTrainer

    trainer = DQNTrainer(_hp(), "CartPole-v1")
    try:
        trainer.learn(40)
        trainer.save(tmp_path / "cartpole")
    finally:
        trainer.close()
    policy = foxhunt.load_model(tmp_path / "cartpole")
    reset = gym.make("CartPole-v1").reset(seed=0)
    with pytest.raises(ValueError, match=r"got: tuple \(env.reset\(\) returns \(obs, info\)"):
        policy.predict(reset)
    with pytest.raises(ValueError, match=r"array of numbers of shape \(4,\).*got: str"):
        policy.act("abc")
    with pytest.raises(ValueError, match=r"got: \(\)$"):  # no one-hot hint: a Box env
        policy.predict(3)
    cells = DQNTrainer(_hp(), _Cells)
    try:
        with pytest.raises(ValueError, match=r"got: a tuple \(obs, info\)"):
            cells.agent.predict((10, {}))
    finally:
        cells.close()


def test_evaluation_episodes_of_an_env_without_a_time_limit_end(caplog):
    # CliffWalking registers no time limit: an untrained greedy policy walks into a wall for
    # ever, and the first evaluation never returned (training hung).
    from foxhunt.trainer import UNLIMITED_EVAL_STEPS

    hp = DQNHyperparameters(hidden_sizes=(16,), torch_threads=1, eval_interval=0)
    trainer = DQNTrainer(hp, CLIFF)
    first = trainer.evaluate(2)
    # Every step costs -1 (a cliff -100): a cut episode returns at most -1000.
    assert first <= -UNLIMITED_EVAL_STEPS
    assert "cut off after 1000 steps" in caplog.text
    assert "env_kwargs.max_episode_steps" in caplog.text and "TimeLimit(env, N)" in caplog.text
    caplog.clear()
    trainer.evaluate(2)
    assert "cut off" not in caplog.text  # said once per env, not at every evaluation
    from foxhunt.trainer import episode_returns

    counts: dict[str, int] = {}
    episode_returns(trainer._eval_env, lambda obs: 0, [0, 1], 50, counts=counts)  # 0 = up
    assert counts == {"cut": 2}


def test_an_env_instance_without_a_time_limit_is_cut_like_a_registered_one():
    """A user's instance has no spec: without a TimeLimit wrapper its evaluation episodes are
    cut at 1000 steps (they ran up to a million before, each evaluation for minutes)."""
    from foxhunt.trainer import NO_STEP_LIMIT, UNLIMITED_EVAL_STEPS, evaluation_step_limit

    endless = _Counter(horizon=None)
    assert endless.spec is None
    assert evaluation_step_limit(endless) == UNLIMITED_EVAL_STEPS
    assert evaluation_step_limit(gym.wrappers.TimeLimit(endless, 50)) == NO_STEP_LIMIT
    trainer = DQNTrainer(_hp(eval_interval=0), endless)
    try:
        assert trainer.evaluate(1) == UNLIMITED_EVAL_STEPS  # one reward per step, cut at 1000
    finally:
        trainer.close()


@needs_deprecated_taxi
def test_a_deprecated_env_id_names_its_successor():
    with pytest.raises(ConfigError) as err:
        DQNTrainer(DQNHyperparameters(), "Taxi-v3")
    assert "'Taxi-v3'" in str(err.value) and "Taxi-v4" in str(err.value)


def test_a_tuple_observation_space_is_refused_with_the_wrapper_that_flattens_it():
    with pytest.raises(ConfigError, match=r"got: Tuple\(.*FlattenObservation"):
        DQNTrainer(_hp(), "Blackjack-v1")
    # ... and the wrapper it names makes the env train.
    env = gym.wrappers.FlattenObservation(gym.make("Blackjack-v1"))
    trainer = DQNTrainer(_hp(), env)
    try:
        trainer.learn(30)
        assert trainer.env_steps == 30 and trainer.agent.obs_dim == 32 + 11 + 2
    finally:
        trainer.close()


class _JointActions(gym.Env):
    """Two discrete choices at once: a DQN needs them as one Discrete(6)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}


def test_a_run_refuses_a_space_as_the_agent_does_before_writing_anything(tmp_path):
    """The env probe run before a run directory is written had rules and words of its own: no
    joint-action hint, and a CLI flag named to a Python caller."""
    from foxhunt.runs import build_spec
    from foxhunt.session import train_run

    gym.register("FoxhuntJointActions-v0", entry_point=_JointActions)
    try:
        with pytest.raises(ConfigError) as by_agent:
            DQNTrainer(_hp(), "FoxhuntJointActions-v0")
        spec = build_spec(env="FoxhuntJointActions-v0", total_steps=100)
        with pytest.raises(ConfigError) as by_run:
            train_run(spec, tmp_path / "run", progress=False, verbose=False)
    finally:
        gym.registry.pop("FoxhuntJointActions-v0")
    assert "Discrete(6)" in str(by_agent.value)
    assert str(by_run.value) == f"env 'FoxhuntJointActions-v0': {by_agent.value}"
    assert not (tmp_path / "run").exists()


def test_an_env_constructor_bug_is_not_blamed_on_env_kwargs():
    """A bad argument's errors (TypeError, ValueError, KeyError...) name env_kwargs in one line;
    a bug in the constructor (AttributeError) is the env's own and keeps its traceback."""

    class Buggy(_Counter):
        def __init__(self, size: int = 1) -> None:
            super().__init__()
            self.missing.attribute  # noqa: B018 - the bug under test

    gym.register("foxhunt-test/Buggy-v0", entry_point=Buggy)
    try:
        with pytest.raises(AttributeError):
            make_gym_env("foxhunt-test/Buggy-v0", kwargs={"size": 4})
        with pytest.raises(ConfigError, match=r"env_kwargs \{'map_name': '9x9'\}.*KeyError"):
            make_gym_env("FrozenLake-v1", kwargs={"map_name": "9x9"})
    finally:
        gym.registry.pop("foxhunt-test/Buggy-v0")


def test_torch_threads_hold_inside_learn_and_evaluate_only() -> None:
    """A notebook that builds a trainer keeps its own thread count for everything else."""
    import torch

    from foxhunt.trainer import DQNTrainer

    before = torch.get_num_threads()
    mine = before + 1
    seen: list[int] = []
    trainer = DQNTrainer(_hp(torch_threads=mine, log_interval=10), _Counter())
    try:
        assert torch.get_num_threads() == before
        trainer.learn(30, callback=lambda row: seen.append(torch.get_num_threads()))
        assert seen and set(seen) == {mine} and torch.get_num_threads() == before
        trainer.evaluate(1, max_steps=5)
        assert torch.get_num_threads() == before
    finally:
        trainer.close()
        torch.set_num_threads(before)


class _Warns(_Counter):
    def __init__(self) -> None:
        import warnings

        warnings.warn("\x1b[33mWARN: this env is out of date\x1b[0m\n(second line)", stacklevel=2)
        super().__init__()


def test_gymnasium_warnings_are_one_log_line_and_none_precede_an_error(caplog, recwarn):
    from foxhunt.envs.gym_envs import make_gym_env

    gym.register("FoxhuntWarns-v0", entry_point=_Warns)
    try:
        make_gym_env("FoxhuntWarns-v0").close()
        make_gym_env("FoxhuntWarns-v0").close()  # once a process, as Python shows a warning
    finally:
        gym.registry.pop("FoxhuntWarns-v0")
    lines = [r.getMessage() for r in caplog.records if "out of date" in r.getMessage()]
    assert lines == ["env 'FoxhuntWarns-v0': WARN: this env is out of date"]
    assert not [w for w in recwarn if "out of date" in str(w.message)]
    caplog.clear()
    if TAXI == "Taxi-v3":
        return  # no deprecated id in this Gymnasium
    with pytest.raises(ConfigError, match=r"^env 'Taxi-v3': Environment version v3 .* deprecated"):
        make_gym_env("Taxi-v3")  # gymnasium warns, then raises: the one line says it all
    assert not caplog.records and not [w for w in recwarn if "Taxi" in str(w.message)]


def test_a_checkpoint_taken_before_the_fresh_reset_keeps_the_pending_starts_apart() -> None:
    """Restored from a fresh-reset checkpoint and saved again before a step (a library
    save_checkpoint, or learn(total) with nothing to train): the pending n-step starts are still
    flushed where their env stood, not spliced onto the episodes of the resume after."""
    from foxhunt.trainstate import capture_state, restore_state

    hp = DQNHyperparameters(
        n_step=3, gamma=0.5, learning_starts=10_000, hidden_sizes=(8,), eval_interval=0
    )
    before = DQNTrainer(hp, lambda: _Tagged(0.0))
    for _ in range(7):
        before.collect_step()
    tensors, state = capture_state(before)
    mid = DQNTrainer(hp, lambda: _Tagged(1.0))
    restore_state(mid, {k: v.clone() for k, v in tensors.items()}, state)
    tensors, state = capture_state(mid)  # before any step
    after = DQNTrainer(hp, lambda: _Tagged(2.0))
    restore_state(after, {k: v.clone() for k, v in tensors.items()}, state)
    stored = after.replay.size
    for _ in range(4):
        after.collect_step()
    r = after.replay
    obs, next_obs = r.obs[stored : r.size].numpy(), r.next_obs[stored : r.size].numpy()
    assert np.array_equal(obs[:, 1], next_obs[:, 1])  # never from one episode into another
    assert obs[:2, :2].tolist() == [[5, 0], [6, 0]] and (next_obs[:2, 0] == 7).all()
