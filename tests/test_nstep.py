"""NStepAccumulator against hand-computed sequences: termination, truncation, parallel envs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from foxhunt.errors import ConfigError
from foxhunt.replay import NStepAccumulator, Transitions

G = 0.5


def _o(*values: float) -> np.ndarray:
    """Observations [n_envs, 1] whose single entry names the state."""
    return np.array(values, dtype=np.float32)[:, None]


def _push(acc: NStepAccumulator, obs, actions, rewards, next_obs, term, trunc) -> Transitions:
    return acc.push(
        _o(*obs),
        np.asarray(actions),
        np.asarray(rewards, np.float64),
        _o(*next_obs),
        np.asarray(term, bool),
        np.asarray(trunc, bool),
    )


def _rows(tr: Transitions) -> list[tuple[float, int, float, float, float, float]]:
    """(obs, action, return, next_obs, done, discount) per emitted transition."""
    return [
        (
            float(tr.obs[i, 0]),
            int(tr.actions[i]),
            float(tr.rewards[i]),
            float(tr.next_obs[i, 0]),
            float(tr.dones[i]),
            float(tr.discounts[i]),
        )
        for i in range(len(tr.actions))
    ]


def test_three_step_with_termination_then_truncation() -> None:
    acc = NStepAccumulator(3, G, 1)
    # Episode 1: states 0 -> 1 -> 2 -> 3 -> 4 (terminal), rewards 1, 2, 4, 8.
    assert _rows(_push(acc, [0], [0], [1.0], [1], [0], [0])) == []
    assert _rows(_push(acc, [1], [1], [2.0], [2], [0], [0])) == []
    # Full window: 1 + .5*2 + .25*4 = 3, bootstrap from state 3 with 0.5**3.
    assert _rows(_push(acc, [2], [2], [4.0], [3], [0], [0])) == [(0, 0, 3.0, 3, 0.0, 0.125)]
    # Termination flushes every pending start, done = 1 (discount irrelevant but g**k).
    assert _rows(_push(acc, [3], [0], [8.0], [4], [1], [0])) == [
        (1, 1, 2 + 0.5 * 4 + 0.25 * 8, 4, 1.0, 0.125),
        (2, 2, 4 + 0.5 * 8, 4, 1.0, 0.25),
        (3, 0, 8.0, 4, 1.0, 0.5),
    ]
    # Episode 2 (reset state 10): truncated after two steps -> bootstrap (done 0) from the final
    # observation 12 with the discount of the steps actually taken.
    assert _rows(_push(acc, [10], [1], [1.0], [11], [0], [0])) == []
    assert _rows(_push(acc, [11], [0], [1.0], [12], [0], [1])) == [
        (10, 1, 1.5, 12, 0.0, 0.25),
        (11, 0, 1.0, 12, 0.0, 0.5),
    ]
    assert all(len(q) == 0 for q in acc.queues)


def test_two_envs_with_different_episode_ends() -> None:
    acc = NStepAccumulator(2, G, 2)
    # t0: env0 0->1 r=1, env1 100->101 r=10
    assert _rows(_push(acc, [0, 100], [0, 1], [1.0, 10.0], [1, 101], [0, 0], [0, 0])) == []
    # t1: env0 terminates (1->2, r=2); env1 101->102 r=20 completes a 2-step window.
    assert _rows(_push(acc, [1, 101], [1, 0], [2.0, 20.0], [2, 102], [1, 0], [0, 0])) == [
        (0, 0, 1 + 0.5 * 2, 2, 1.0, 0.25),
        (1, 1, 2.0, 2, 1.0, 0.5),
        (100, 1, 10 + 0.5 * 20, 102, 0.0, 0.25),
    ]
    # t2: env0 restarted at 50 (50->51, r=3); env1 truncates (102->103, r=40).
    assert _rows(_push(acc, [50, 102], [0, 1], [3.0, 40.0], [51, 103], [0, 0], [0, 1])) == [
        (101, 0, 20 + 0.5 * 40, 103, 0.0, 0.25),
        (102, 1, 40.0, 103, 0.0, 0.5),
    ]
    # t3: env0 completes its window; env1 (restarted at 200) just starts one.
    assert _rows(_push(acc, [51, 200], [1, 0], [4.0, 5.0], [52, 201], [0, 0], [0, 0])) == [
        (50, 0, 3 + 0.5 * 4, 52, 0.0, 0.25),
    ]
    assert [len(q) for q in acc.queues] == [1, 1]


def _reference_nstep(episode: list[tuple[float, float]], final: float, terminated: bool, n: int):
    """Independent reference from a whole episode: list of (obs, reward) and the final obs."""
    obs = [o for o, _ in episode] + [final]
    rews = [r for _, r in episode]
    T = len(rews)
    out = []
    for t in range(T):
        k = min(n, T - t)
        ret = sum(G**j * rews[t + j] for j in range(k))
        done = 1.0 if (terminated and t + k == T) else 0.0
        out.append((obs[t], ret, obs[t + k], done, G**k))
    return out


@pytest.mark.parametrize("n", [2, 3, 5])
def test_random_episodes_match_reference(n: int) -> None:
    rng = np.random.default_rng(n)
    acc = NStepAccumulator(n, G, 1)
    state = 0.0
    got, want = [], []
    for _ in range(6):
        length = int(rng.integers(1, 8))
        terminated = bool(rng.random() < 0.5)
        episode = []
        for t in range(length):
            r = float(rng.integers(-5, 6))
            episode.append((state, r))
            last = t == length - 1
            tr = _push(
                acc,
                [state],
                [0],
                [r],
                [state + 1],
                [last and terminated],
                [last and not terminated],
            )
            got += [(o, ret, no, d, g) for o, _, ret, no, d, g in _rows(tr)]
            state += 1
        want += _reference_nstep(episode, state, terminated, n)
        state += 100  # reset
    assert len(got) == len(want)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6)


def test_n1_is_a_passthrough() -> None:
    acc = NStepAccumulator(1, 0.9, 2)
    obs, nxt = _o(1, 2), _o(3, 4)
    tr = acc.push(
        obs,
        np.array([1, 0]),
        np.array([0.5, -1.0]),
        nxt,
        np.array([True, False]),
        np.array([False, True]),
    )
    np.testing.assert_array_equal(tr.obs, obs)
    np.testing.assert_array_equal(tr.next_obs, nxt)
    np.testing.assert_array_equal(tr.actions, [1, 0])
    np.testing.assert_allclose(tr.rewards, [0.5, -1.0])
    np.testing.assert_array_equal(tr.dones, [1.0, 0.0])  # truncation bootstraps
    np.testing.assert_allclose(tr.discounts, [0.9, 0.9])
    assert tr.rewards.dtype == np.float32 and tr.actions.dtype == np.int64


def test_pending_obs_is_not_aliased_to_a_reused_buffer() -> None:
    """Vector envs may reuse their observation array; the accumulator must keep its own copy."""
    acc = NStepAccumulator(2, G, 1)
    buf = _o(0)
    acc.push(buf, np.array([0]), np.array([1.0]), _o(1), np.array([False]), np.array([False]))
    buf[:] = 1.0  # the env writes the next observation into the same array
    tr = acc.push(buf, np.array([0]), np.array([1.0]), _o(2), np.array([False]), np.array([False]))
    assert float(tr.obs[0, 0]) == 0.0


def test_state_round_trip_mid_episode() -> None:
    rng = np.random.default_rng(0)
    steps = [
        (
            _o(*rng.normal(size=2)),
            rng.integers(0, 3, 2),
            rng.normal(size=2),
            _o(*rng.normal(size=2)),
            np.array([t == 5, False]),
            np.array([False, t == 7]),
        )
        for t in range(12)
    ]
    a = NStepAccumulator(4, 0.9, 2)
    for s in steps[:3]:
        a.push(*s)
    assert [len(q) for q in a.queues] == [3, 3]
    tensors = {k: v.clone() for k, v in a.state_tensors().items()}
    b = NStepAccumulator(4, 0.9, 2)
    b.load_state(tensors, json.loads(json.dumps(a.state_json())))
    for s in steps[3:]:
        ta, tb = a.push(*s), b.push(*s)
        for fa, fb in zip(ta, tb, strict=True):
            np.testing.assert_array_equal(fa, fb)
    # An empty accumulator round-trips too.
    c = NStepAccumulator(4, 0.9, 2)
    c.load_state(NStepAccumulator(4, 0.9, 2).state_tensors(), {"lengths": [0, 0]})
    assert [len(q) for q in c.queues] == [0, 0]


def test_training_waits_for_the_first_n_step_transition() -> None:
    """learning_starts counts env steps, but 4 envs x 5-step returns hold their first 4 steps
    back each: at env step 8 the replay is still empty, and training must wait for it rather
    than sample nothing."""
    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    hp = DQNHyperparameters(
        hidden_sizes=(8,), n_envs=4, n_step=5, learning_starts=8, batch_size=8,
        train_freq=4, eval_interval=0, device="cpu", seed=0,
    )  # fmt: skip
    trainer = DQNTrainer(hp, "CartPole-v1")
    try:
        trainer.learn(8)
        assert trainer.replay.size == 0 and trainer.agent.optimizer_steps == 0
        trainer.learn(200)
        assert trainer.replay.size > 0 and trainer.agent.optimizer_steps > 0
        for bad in (0, -1, True, 2.5):  # 0 used to mean "the default", -1 gave NaN
            with pytest.raises(ConfigError, match="n_episodes must be a positive integer"):
                trainer.evaluate(bad)
    finally:
        trainer.close()


def test_trainer_arguments_are_checked_when_it_is_built() -> None:
    """A dict of hyperparameters is validated like the class; an eval env with other spaces is
    refused at construction, not at the first evaluation; learn() takes an integer budget."""
    from foxhunt.trainer import DQNTrainer

    small = {"hidden_sizes": (8,), "learning_starts": 32, "batch_size": 32, "device": "cpu"}
    trainer = DQNTrainer(small, "CartPole-v1")
    try:
        assert trainer.hp.batch_size == 32
        with pytest.raises(ConfigError, match="total_env_steps must be a positive integer"):
            trainer.learn(True)
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="unknown hyperparameter 'gama'"):
        DQNTrainer({"gama": 0.9}, "CartPole-v1")
    with pytest.raises(ConfigError, match="hyperparameters must be DQNHyperparameters or a"):
        DQNTrainer(None, "CartPole-v1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"logger must have a log\(row\) method, got: list"):
        DQNTrainer(small, "CartPole-v1", logger=[])  # failed at the first logged row before
    with pytest.raises(ConfigError, match="eval_env must have the training env's spaces"):
        DQNTrainer(small, "CartPole-v1", eval_env="MountainCar-v0")


def _chain_episode(env_id: int, episode: int) -> tuple[int, bool]:
    """Length (1-6) and whether it terminates (else it is truncated), fixed per episode."""
    return 1 + (episode * 7 + env_id * 3) % 6, (episode + env_id) % 3 != 0


@pytest.mark.parametrize(
    ("n_step", "n_envs", "capacity", "per"),
    [(3, 2, 2000, False), (3, 2, 60, True), (5, 3, 37, True), (1, 3, 2000, False)],
)
def test_trainer_stores_exactly_the_reference_transitions(
    n_step: int, n_envs: int, capacity: int, per: bool
) -> None:
    """End to end through DQNTrainer and its vector env: the replay holds, in order of emission,
    exactly the newest ``capacity`` n-step transitions of an independent reference built from
    the steps the envs logged (none lost at an episode end, none crossing one, truncation
    bootstrapping from the true final observation, gamma**k as the discount)."""
    import itertools

    import gymnasium as gym

    from foxhunt.config import DQNHyperparameters
    from foxhunt.trainer import DQNTrainer

    log: list[tuple[int, int, int, int, float]] = []  # env, episode, step, action, reward
    ids = itertools.count()

    class Chain(gym.Env):
        """Observation [env, episode, step, final]: every transition names itself."""

        observation_space = gym.spaces.Box(-1e6, 1e6, (4,), np.float32)
        action_space = gym.spaces.Discrete(3)

        def __init__(self) -> None:
            self.id, self.ep, self.t = next(ids), -1, 0

        def _obs(self, final: bool = False) -> np.ndarray:
            return np.array([self.id, self.ep, self.t, float(final)], np.float32)

        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            super().reset(seed=seed)
            self.ep, self.t = self.ep + 1, 0
            return self._obs(), {}

        def step(self, action):  # type: ignore[no-untyped-def]
            reward = 0.01 * (self.t + 1) + 0.1 * self.id + self.ep % 7 + 0.25 * int(action)
            log.append((self.id, self.ep, self.t, int(action), reward))
            self.t += 1
            length, terminates = _chain_episode(self.id, self.ep)
            end = self.t == length
            return self._obs(final=end), reward, end and terminates, end and not terminates, {}

    gamma = 0.9
    hp = DQNHyperparameters(
        n_step=n_step, n_envs=n_envs, gamma=gamma, buffer_capacity=capacity, batch_size=8,
        learning_starts=16, train_freq=4, eval_interval=0, hidden_sizes=(8,), device="cpu",
        prioritized_replay=per, seed=0, log_interval=10_000,
    )  # fmt: skip
    trainer = DQNTrainer(hp, Chain)
    try:
        trainer.learn(300)
        rb = trainer.replay
        stored = [
            (
                tuple(int(x) for x in rb.obs[j, :3].tolist()),
                int(rb.actions[j]),
                float(rb.rewards[j]),
                tuple(rb.next_obs[j].tolist()),
                float(rb.dones[j]),
                float(rb.discounts[j]),
            )
            for j in ((rb.pos + i) % capacity if rb.size == capacity else i for i in range(rb.size))
        ]  # oldest first
    finally:
        trainer.close()

    # The reference: one transition per step whose n-step window the run completed, in the
    # order the windows closed (their last logged step; ties, which end together, by start).
    steps = {(e, ep, t): (a, r, i) for i, (e, ep, t, a, r) in enumerate(log)}
    reference = []
    for e, ep, t in steps:
        length, terminates = _chain_episode(e, ep)
        k = min(n_step, length - t)
        if (e, ep, t + k - 1) not in steps:
            continue  # window still open when the run stopped (held back, checkpointed)
        end = t + k == length
        reference.append(
            (
                steps[(e, ep, t + k - 1)][2],
                t,
                (
                    (e, ep, t),
                    steps[(e, ep, t)][0],
                    sum(gamma**i * steps[(e, ep, t + i)][1] for i in range(k)),
                    (float(e), float(ep), float(t + k), float(end)),
                    float(end and terminates),
                    gamma**k,
                ),
            )
        )
    want = [row for *_, row in sorted(reference, key=lambda x: x[:2])][-capacity:]
    assert len(stored) == len(want) == min(capacity, len(reference))
    for got, ref in zip(stored, want, strict=True):
        assert got[:2] == ref[:2] and got[3:5] == ref[3:5], (got, ref)
        assert got[2] == pytest.approx(ref[2], rel=1e-5) and got[5] == pytest.approx(ref[5])
