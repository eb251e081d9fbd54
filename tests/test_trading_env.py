"""TradingEnv: Gymnasium compliance, hand-checked accounting, no look-ahead, episode handling."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from foxhunt.envs.trading import BANKRUPTCY_REWARD, TradingEnv, TradingEnvConfig
from foxhunt.errors import ConfigError, DataError
from foxhunt.markets.arrays import MarketArrays


def make_market(
    n: int = 120, n_features: int = 3, n_regimes: int = 2, seed: int = 0, close=None
) -> MarketArrays:
    """A seeded random-walk market with arbitrary (but valid) features and regime probabilities."""
    rng = np.random.default_rng(seed)
    if close is None:
        close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n)))
    close = np.asarray(close, dtype=np.float64)
    n = close.size
    probs = rng.dirichlet(np.ones(n_regimes), size=n).astype(np.float32)
    return MarketArrays(
        timestamps=np.datetime64("2020-01-01", "ns") + np.arange(n) * np.timedelta64(1, "D"),
        close=close,
        features=rng.normal(size=(n, n_features)).astype(np.float32),
        regime_probs=probs,
        feature_names=tuple(f"f{i}" for i in range(n_features)),
        regime_names=tuple(f"r{i}" for i in range(n_regimes)),
        true_regimes=rng.integers(0, n_regimes, size=n),
    )


def run_actions(env: TradingEnv, actions, **reset_kwargs):
    obs, info = env.reset(**reset_kwargs)
    observations, rewards, infos = [obs], [], [info]
    for a in actions:
        obs, reward, terminated, truncated, info = env.step(a)
        observations.append(obs)
        rewards.append(reward)
        infos.append(info)
        if terminated or truncated:
            break
    return observations, rewards, infos


@pytest.mark.parametrize(
    ("positions", "eval_mode"),
    [((-1.0, 0.0, 1.0), False), ((0.0, 1.0), False), ((0.0, 1.0), True), ((-1.0, 1.0), False)],
)
def test_passes_gymnasium_env_checker(positions, eval_mode):
    env = TradingEnv(
        make_market(),
        TradingEnvConfig(window=8, positions=positions, episode_length=30),
        eval_mode=eval_mode,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning (bounds, dtype, determinism) fails
        check_env(env, skip_render_check=True)
    assert env.action_space.n == len(positions)


def test_observation_layout_regimes_last():
    market = make_market(n=50, n_features=3, n_regimes=4)
    env = TradingEnv(market, TradingEnvConfig(window=5, random_start=False), eval_mode=False)
    obs, info = env.reset(seed=0)
    t = info["bar"]
    assert t == 4  # first bar with a full window
    assert obs.dtype == np.float32
    assert obs.shape == (5 * 3 + 3 + 4,)
    np.testing.assert_array_equal(obs[:15], market.features[0:5].ravel())
    np.testing.assert_array_equal(obs[15:18], [0.0, 1.0, 0.0])  # starts flat
    assert env.n_regimes == 4 and env.regime_slice == slice(18, 22)
    np.testing.assert_array_equal(obs[-4:], market.regime_probs[t])
    obs, *_ = env.step(2)  # go long: one-hot moves, window slides by one bar
    np.testing.assert_array_equal(obs[15:18], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(obs[:15], market.features[1:6].ravel())
    np.testing.assert_array_equal(obs[env.regime_slice], market.regime_probs[5])


def test_cost_accounting_matches_hand_computation():
    # 6 prices -> 5 steps with window 1; positions long, long, flat, short, short.
    close = [100.0, 110.0, 99.0, 99.0, 90.0, 81.0]
    cfg = TradingEnvConfig(window=1, cost_bps=10.0, slippage_bps=5.0, episode_length=None)
    env = TradingEnv(make_market(close=close), cfg, eval_mode=True)
    _, rewards, infos = run_actions(env, [2, 2, 1, 0, 0])
    c = 0.0015  # (10 + 5) bps per unit of position changed
    growth = [
        (1 - c) * (1 + 0.10),  # flat -> long, price +10%
        1 - 0.10,  # hold long, price -10%
        (1 - c) * 1.0,  # long -> flat, price unchanged
        (1 - c) * (1 + 9 / 99),  # flat -> short, price 99 -> 90
        1 + 0.10,  # hold short, price 90 -> 81
    ]
    np.testing.assert_allclose(rewards, np.log(growth), rtol=1e-12)
    np.testing.assert_allclose([i["cost"] for i in infos[1:]], [c, 0, c, c, 0], rtol=1e-12)
    np.testing.assert_allclose([i["equity"] for i in infos[1:]], np.cumprod(growth), rtol=1e-12)
    assert [i["position"] for i in infos[1:]] == [1.0, 1.0, 0.0, -1.0, -1.0]
    assert [i["bar"] for i in infos[1:]] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(
        [i["market_return"] for i in infos[1:]], [0.1, -0.1, 0.0, 90 / 99 - 1, -0.1]
    )
    np.testing.assert_allclose(
        [i["portfolio_return"] for i in infos[1:]], np.asarray(growth) - 1, rtol=1e-12
    )
    assert math.isclose(infos[-1]["equity"], 1.09835 * 0.9 * 0.9985 * 0.9985 * 12 / 11 * 1.1)


def test_no_look_ahead_in_rewards_or_observations():
    market = make_market(n=60, seed=3)
    cfg = TradingEnvConfig(window=4)
    actions = np.random.default_rng(1).integers(0, 3, size=100)
    obs_a, rew_a, _ = run_actions(TradingEnv(market, cfg, eval_mode=True), actions)

    t = 30  # decision bar; everything after t + 1 (prices) / after t (inputs) is rewritten
    close = market.close.copy()
    close[t + 2 :] *= np.linspace(0.5, 3.0, close.size - t - 2)
    feats = market.features.copy()
    feats[t + 1 :] += 7.0
    probs = market.regime_probs.copy()
    probs[t + 1 :] = probs[t + 1 :, ::-1]
    changed = MarketArrays(
        market.timestamps, close, feats, probs, market.feature_names, market.regime_names
    )
    obs_b, rew_b, _ = run_actions(TradingEnv(changed, cfg, eval_mode=True), actions)

    k = t - (cfg.window - 1)  # step index of decision bar t (eval starts at bar window - 1)
    np.testing.assert_array_equal(rew_a[: k + 1], rew_b[: k + 1])
    for i in range(k + 1):
        np.testing.assert_array_equal(obs_a[i], obs_b[i])
    assert rew_a[k + 1] != rew_b[k + 1]  # the rewrite really reaches later rewards
    assert not np.array_equal(obs_a[k + 1], obs_b[k + 1])


def test_eval_mode_covers_whole_span_and_terminates():
    market = make_market(n=40)
    env = TradingEnv(market, TradingEnvConfig(window=6, episode_length=5), eval_mode=True)
    _, info = env.reset(seed=123)
    assert info["bar"] == 5
    bars, flags = [], []
    while True:
        _, _, terminated, truncated, info = env.step(1)
        bars.append(info["bar"])
        flags.append((terminated, truncated))
        if terminated or truncated:
            break
    assert bars == list(range(5, 39))  # decision bars 5 .. T-2 ignore episode_length
    assert flags[-1] == (True, False) and all(f == (False, False) for f in flags[:-1])
    assert info["timestamp"] == int(market.timestamps[38].astype(np.int64))
    with pytest.raises(RuntimeError, match="reset"):
        env.step(1)


def test_random_start_is_seeded_and_episodes_truncate():
    market = make_market(n=200)
    cfg = TradingEnvConfig(window=10, episode_length=25)
    env = TradingEnv(market, cfg)
    starts = [env.reset(seed=s)[1]["bar"] for s in (7, 7, 8, 9, 10, 11)]
    assert starts[0] == starts[1]
    assert len(set(starts)) > 2
    other = TradingEnv(market, cfg)
    assert other.reset(seed=7)[1]["bar"] == starts[0]
    # the unseeded sequence after a seeded reset is reproducible too
    env.reset(seed=42)
    seq_a = [env.reset()[1]["bar"] for _ in range(5)]
    env.reset(seed=42)
    assert [env.reset()[1]["bar"] for _ in range(5)] == seq_a
    for s in range(20):
        _, info = env.reset(seed=s)
        assert 9 <= info["bar"] <= 199 - 25
    _, rewards, _ = run_actions(env, [2] * 100, seed=3)
    assert len(rewards) == 25


def test_episode_truncation_flags_and_fixed_start():
    env = TradingEnv(make_market(n=100), TradingEnvConfig(window=5, episode_length=10))
    env.reset(seed=0, options={"start": 20})
    flags = [env.step(1)[2:4] for _ in range(10)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])
    with pytest.raises(ConfigError, match="start"):
        env.reset(options={"start": 95})


def test_episode_length_longer_than_span_uses_whole_span():
    env = TradingEnv(make_market(n=30), TradingEnvConfig(window=5, episode_length=1000))
    _, info = env.reset(seed=1)
    assert info["bar"] == 4 and env.episode_length == 25


def test_initial_position_defaults_to_flat_or_explicit():
    market = make_market(n=30)
    assert TradingEnvConfig(positions=(1.0, 0.0)).initial_index == 1
    assert TradingEnvConfig(positions=(-1.0, 0.5, 1.0)).initial_index == 1
    env = TradingEnv(market, TradingEnvConfig(window=3, initial_position=2), eval_mode=True)
    _, info = env.reset()
    assert info["position"] == 1.0
    _, _, _, _, info = env.step(2)
    assert info["cost"] == 0.0  # already long: no trade


def test_bankruptcy_terminates_with_large_negative_reward():
    close = [100.0, 100.0, 210.0, 220.0, 230.0]  # +110% while short 1x wipes out the account
    env = TradingEnv(make_market(close=close), TradingEnvConfig(window=1), eval_mode=False)
    env.reset(options={"start": 0})
    env.step(0)
    _, r1, terminated, truncated, info = env.step(0)
    assert terminated and not truncated and info["bankrupt"]
    assert r1 == BANKRUPTCY_REWARD and info["equity"] == 0.0


def test_a_move_too_large_for_a_float_is_refused_by_row():
    """1e-200 -> 1e200 overflows the bar's return to inf, and a flat position's 0 * inf (NaN)
    read as a wipe-out: refuse the market instead of bankrupting a flat account."""
    close = [1.0, 1e-200, 1e200, 1.0, 1.0]
    with pytest.raises(DataError, match=r"close: row 2 .* too large"):
        TradingEnv(make_market(close=close), TradingEnvConfig(window=1))


@pytest.mark.parametrize("fall", [0.5, 0.499999, 0.49999999])
def test_a_near_wipe_out_is_never_rewarded_below_bankruptcy(fall):
    """2x long through a ~50% fall keeps a sliver of equity at most: its reward must not be
    worse than going bust (log(2e-6) = -13 < -10 paid the agent for bankruptcy)."""
    close = [100.0, 100.0, 100.0 * (1 - fall), 50.0, 60.0]
    config = TradingEnvConfig(window=1, positions=(0.0, 2.0), cost_bps=0.0, slippage_bps=0.0)
    env = TradingEnv(make_market(close=close), config, eval_mode=True)
    env.reset()
    env.step(1)
    _, reward, terminated, _, info = env.step(1)
    assert reward >= BANKRUPTCY_REWARD
    assert terminated and info["bankrupt"] and info["equity"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"window": 0}, "window"),
        ({"positions": ()}, "positions"),
        ({"positions": (0.0, 6.0)}, "6.0"),
        ({"positions": (0.0, float("nan"))}, "nan"),
        ({"positions": (1.0, 1.0)}, "distinct"),
        ({"cost_bps": -1.0}, "cost_bps"),
        ({"episode_length": 0}, "episode_length"),
        ({"initial_position": 3}, r"initial_position: must be an index .* \(got 3\)"),
        ({"windw": 3}, "windw"),
    ],
)
def test_config_errors_name_field_and_value(kwargs, needle):
    with pytest.raises(ConfigError, match=needle) as exc:
        TradingEnvConfig(**kwargs)
    assert "\n" not in str(exc.value)


def test_short_span_and_bad_data_are_rejected():
    with pytest.raises(ConfigError, match=r"11 bars.*window=10.*at least 12"):
        TradingEnv(make_market(n=11), TradingEnvConfig(window=10))
    TradingEnv(make_market(n=12), TradingEnvConfig(window=10))  # exactly window + 2 is fine
    m = make_market(n=20)
    close = m.close.copy()
    close[7] = -1.0
    with pytest.raises(DataError, match="row 7"):
        TradingEnv(
            MarketArrays(m.timestamps, close, m.features, m.regime_probs, (), ()),
            TradingEnvConfig(window=4),
        )


def test_invalid_actions_are_rejected():
    env = TradingEnv(make_market(), TradingEnvConfig(window=4))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action"):
        env.step(3)
    with pytest.raises(ValueError, match="action"):
        env.step(1.5)
    env.step(np.array([1]))  # a one-element integer array is accepted


@pytest.mark.parametrize(
    ("positions", "close", "eval_mode"),
    [
        ((-1.0, 0.0, 1.0), None, False),
        ((0.0, 0.5, 1.0, 2.0), None, True),
        ((-1.0, 0.0, 1.0), [100.0, 100.0, 210.0, 220.0, 230.0], False),  # short 1x goes bust
    ],
)
def test_counterfactual_transitions_equal_stepping_a_copy(positions, close, eval_mode):
    """Each not-taken action's reward, next observation and termination equal what a copy of the
    env returns when it really takes that action at the same bar."""
    import copy

    market = make_market(close=close) if close is not None else make_market(n=40)
    env = TradingEnv(market, TradingEnvConfig(window=1, positions=positions), eval_mode=eval_mode)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(1)
    done = False
    while not done:
        taken = int(rng.integers(env.n_positions))
        twins = {a: copy.deepcopy(env) for a in range(env.n_positions) if a != taken}
        next_obs, _, terminated, truncated, info = env.step(taken)
        alt, rewards, nxt, dones = env.counterfactual_transitions(
            obs, taken, next_obs, terminated, info
        )
        assert sorted(alt.tolist()) == sorted(twins)
        for a, r, o, d in zip(alt, rewards, nxt, dones, strict=True):
            o2, r2, te2, _, _ = twins[int(a)].step(int(a))
            assert r == pytest.approx(r2, rel=1e-12, abs=1e-15)
            np.testing.assert_array_equal(o, o2)
            assert bool(d) == te2
        obs, done = next_obs, terminated or truncated


def test_action_augmentation_stores_every_action_and_is_validated():
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    def factory() -> TradingEnv:
        return TradingEnv(make_market(n=200), TradingEnvConfig(window=2, episode_length=50))

    hp = DQNHyperparameters(
        action_augmentation=True, n_envs=2, batch_size=8, learning_starts=8, hidden_sizes=(8,)
    )
    for n_step in (3, 1):
        trainer = DQNTrainer(hp.replace(n_step=n_step), factory)
        for _ in range(60):  # crosses episode ends: counterfactuals of final steps use final info
            trainer.collect_step()
        pending = sum(len(q) for q in trainer.nstep.queues)
        assert len(trainer.replay) == 3 * (trainer.env_steps - pending)
        trainer.close()
    trainer = DQNTrainer(hp, factory)
    for _ in range(60):
        trainer.collect_step()
    n = len(trainer.replay)
    actions = trainer.replay.actions[:n].numpy()
    next_obs = trainer.replay.next_obs[:n].numpy()
    ps = trainer._counterfactual_envs[0].position_slice
    assert (next_obs[:, ps].argmax(axis=1) == actions).all()
    assert np.bincount(actions, minlength=3).min() > 0
    trainer.close()

    with pytest.raises(ConfigError, match="CartPoleEnv has no counterfactual_transitions"):
        DQNTrainer(DQNHyperparameters(action_augmentation=True), "CartPole-v1")
    with pytest.raises(ConfigError, match="vector_env must be 'sync' with action_augmentation"):
        DQNTrainer(hp.replace(vector_env="async"), factory)


def test_counterfactuals_are_one_step_transitions_beside_the_real_n_step_one():
    """With n-step returns the real action's row is its n-step return, and each alternative's
    row is what a copy of the env that took the alternative saw in one step (reward, next
    observation, termination, discount gamma). Not an n-step return: the actions that followed
    were chosen holding the taken position, and replaying them after the alternative charges it
    the cost of switching back."""
    import copy

    from foxhunt.replay.nstep import Counterfactuals, NStepAccumulator

    n, gamma = 3, 0.9
    env = TradingEnv(make_market(n=60), TradingEnvConfig(window=1, episode_length=25, cost_bps=30))
    acc = NStepAccumulator(n, gamma, 1)
    rng = np.random.default_rng(3)
    obs, _ = env.reset(seed=0)
    snapshots, taken, rewards, emitted = [], [], [], {}
    done = False
    while not done:
        a = int(rng.integers(env.n_positions))
        snapshots.append((obs, copy.deepcopy(env)))
        taken.append(a)
        next_obs, r, terminated, truncated, info = env.step(a)
        rewards.append(r)
        cf = Counterfactuals(*env.counterfactual_transitions(obs, a, next_obs, terminated, info))
        tr = acc.push(
            obs[None],
            np.array([a]),
            np.array([r]),
            next_obs[None],
            np.array([terminated]),
            np.array([truncated]),
            [cf],
        )
        for row in zip(*tr, strict=True):
            emitted[(row[0].tobytes(), int(row[1]))] = row
        obs, done = next_obs, terminated or truncated
    assert len(emitted) == 3 * len(taken)
    for t, (o, snap) in enumerate(snapshots):
        for alt in range(env.n_positions):
            _, _, r_row, next_row, done_row, g_row = emitted[(o.tobytes(), alt)]
            if alt == taken[t]:
                m = min(n, len(taken) - t)
                expected = sum(gamma**k * rewards[t + k] for k in range(m))
                assert r_row == pytest.approx(expected, rel=1e-5, abs=1e-7)
                assert g_row == pytest.approx(gamma**m)
                continue
            twin = copy.deepcopy(snap)
            nxt, r, te, _, _ = twin.step(alt)
            assert r_row == pytest.approx(r, rel=1e-6, abs=1e-8)
            np.testing.assert_array_equal(next_row, nxt)
            assert done_row == float(te)
            assert g_row == pytest.approx(gamma)


def test_counterfactual_queue_survives_a_checkpoint_round_trip():
    from foxhunt.config import DQNHyperparameters
    from foxhunt.replay.nstep import NStepAccumulator
    from foxhunt.trainer import DQNTrainer

    def factory() -> TradingEnv:
        return TradingEnv(make_market(n=200), TradingEnvConfig(window=2, episode_length=50))

    hp = DQNHyperparameters(
        action_augmentation=True, n_step=4, batch_size=8, learning_starts=8, hidden_sizes=(8,)
    )
    trainer = DQNTrainer(hp, factory)
    for _ in range(10):
        trainer.collect_step()
    assert len(trainer.nstep.queues[0]) == 3  # n - 1 starts wait for their n-th step
    restored = NStepAccumulator(hp.n_step, hp.gamma, 1)
    restored.load_state(trainer.nstep.state_tensors(), trainer.nstep.state_json())
    for a, b in zip(trainer.nstep.queues[0], restored.queues[0], strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:3] == b[1:3]
        for x, y in zip(a[3], b[3], strict=True):
            np.testing.assert_array_equal(x, y)
    trainer.close()


def test_augmentation_with_envs_ending_at_different_steps_and_wrappers():
    import gymnasium as gym

    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    lengths = iter([5, 7])

    def factory() -> TradingEnv:  # two envs whose episodes end on different steps
        cfg = TradingEnvConfig(window=1, episode_length=next(lengths))
        return TradingEnv(make_market(n=100), cfg)

    hp = DQNHyperparameters(
        action_augmentation=True,
        n_envs=2,
        n_step=2,
        batch_size=8,
        learning_starts=8,
        hidden_sizes=(8,),
    )
    trainer = DQNTrainer(hp, factory)
    for _ in range(30):
        trainer.collect_step()
    pending = sum(len(q) for q in trainer.nstep.queues)
    assert len(trainer.replay) == 3 * (trainer.env_steps - pending)
    trainer.close()

    def wrapped() -> gym.Env:
        return gym.wrappers.TransformReward(TradingEnv(make_market(n=100)), lambda r: 10 * r)

    with pytest.raises(ConfigError, match="with a TransformReward around the environment"):
        DQNTrainer(hp.replace(n_envs=1), wrapped)


def test_state_round_trip_continues_the_episode_exactly():
    """get_state/set_state (with the RNG, via foxhunt.envstate) continue mid-episode: the copy
    steps exactly like the original, through the next random-start reset; bad states are refused
    naming the field, leaving the env unchanged."""
    import json

    from foxhunt.envstate import get_env_state, set_env_state
    from foxhunt.errors import CheckpointError

    cfg = TradingEnvConfig(window=5, episode_length=15)
    market = make_market(n=150)
    env, copy = TradingEnv(market, cfg), TradingEnv(market, cfg)
    env.reset(seed=3)
    for a in (2, 0, 1, 2, 2, 0):
        env.step(a)
    copy.reset(seed=99)
    state = json.loads(json.dumps(get_env_state(env)))  # through JSON, as in a checkpoint
    set_env_state(copy, state)
    for a in [1, 2, 0, 2] * 10:  # past the episode end: the next reset draws from the RNG
        out_a, out_b = env.step(a), copy.step(a)
        assert np.array_equal(out_a[0], out_b[0]) and out_a[1:4] == out_b[1:4]
        if out_a[2] or out_a[3]:
            assert env.reset()[1]["bar"] == copy.reset()[1]["bar"]
    before = copy.get_state()
    for field, value in (
        ("t", 10_000),
        ("position_index", 3),
        ("equity", float("nan")),
        ("done", 1),
    ):
        bad = {**before, field: value}
        with pytest.raises(CheckpointError, match=f"state {field} must be"):
            copy.set_state(bad)
        assert copy.get_state() == before
    with pytest.raises(CheckpointError, match="must have keys"):
        copy.set_state({"t": 1})


@pytest.mark.parametrize("regimes", [False, True])
def test_async_vector_envs_train_with_and_without_regimes(regimes):
    """An AsyncVectorEnv over envs without regimes (CartPole) used to lose its workers to a
    get_attr('n_regimes'); the regime count now travels in the envs' metadata."""
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        vector_env="async", n_envs=2, batch_size=8, learning_starts=8, hidden_sizes=(8,),
        regime_conditional=regimes, eval_interval=0, device="cpu",
    )  # fmt: skip
    market = make_market(n=150, n_regimes=3)
    env = (lambda: TradingEnv(market, TradingEnvConfig(window=5))) if regimes else "CartPole-v1"
    trainer = DQNTrainer(hp, env)
    try:
        assert trainer.agent.online_net.n_regimes == (3 if regimes else 0)
        for _ in range(30):
            trainer.collect_step()
        assert trainer.env_steps == 60
    finally:
        trainer.close()


def test_an_evaluation_episode_is_the_whole_span_however_long():
    """A TradingEnv instance has no spec and no TimeLimit, yet its evaluation is never cut at
    the 1000 steps an endless env gets: its episode ends with its span."""
    from foxhunt.trainer import NO_STEP_LIMIT, episode_returns, evaluation_step_limit

    env = TradingEnv(make_market(n=1500), TradingEnvConfig(window=5), eval_mode=True)
    assert evaluation_step_limit(env) == NO_STEP_LIMIT
    counts: dict[str, int] = {}
    episode_returns(env, lambda obs: 1, [0], counts=counts)
    assert counts == {"cut": 0} and env._t == 1499


def test_a_dataframe_is_pointed_to_prepare_market() -> None:
    """A user's first try, TradingEnv(df), names the function that builds its arrays causally."""
    import pandas as pd

    import foxhunt

    rng = np.random.default_rng(0)
    close = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, 400)))
    df = pd.DataFrame(
        {"open": close, "high": close * 1.01, "low": close * 0.99, "close": close},
        index=pd.date_range("2020-01-01", periods=400, freq="D"),
    )
    with pytest.raises(DataError, match=r"takes MarketArrays, got DataFrame: .*prepare_market"):
        TradingEnv(df)  # type: ignore[arg-type]
    env = foxhunt.TradingEnv(foxhunt.prepare_market(df, train_end=300, n_regimes=2))
    check_env(env, skip_render_check=True)


def test_a_mapping_is_taken_for_the_config():
    market = make_market(n=60)
    env = TradingEnv(market, {"cost_bps": 2.0, "window": 4})
    assert env.config == TradingEnvConfig(cost_bps=2.0, window=4)
    with pytest.raises(ConfigError, match=r"trading\.window"):
        TradingEnv(market, {"window": 0})
    with pytest.raises(ConfigError, match="config must be a TradingEnvConfig or a mapping"):
        TradingEnv(market, 4)  # type: ignore[arg-type]
