"""The training loop: collect -> store -> learn -> update priorities -> evaluate / log / save.

The trainer owns counters and schedules (epsilon and PER beta in environment steps); the agent owns
the optimization step (LR and target sync in optimizer steps). All loop state lives on ``self`` so
a checkpoint can capture it and a resumed run continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
import re
import signal
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
import torch

from foxhunt import distributed
from foxhunt.batch import split_sizes
from foxhunt.config import DQNHyperparameters
from foxhunt.envs.gym_envs import EnvInterface
from foxhunt.errors import (
    ConfigError,
    EnvironmentStepError,
    FoxhuntError,
    TrainingHalted,
    TrainingInterrupted,
    first_line,
    stop_signals,
)
from foxhunt.health import HealthMonitor
from foxhunt.learner import DQNAgent
from foxhunt.networks import image_layout
from foxhunt.replay import NStepAccumulator, PrioritizedReplayBuffer, ReplayBuffer
from foxhunt.replay.nstep import Counterfactuals

log = logging.getLogger("foxhunt.trainer")

EnvLike = str | gym.Env | Callable[[], gym.Env]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy's global RNG and torch (foxhunt's own RNGs are seeded separately)."""
    import random

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _env_factory(env: EnvLike, name: str = "env") -> Callable[[], gym.Env]:
    """A zero-argument maker of the env made ready by ``prepare_env`` (one-hot Discrete
    observations, actions counted from 0) however it was passed; ``name`` is the argument
    errors name."""
    from foxhunt.envs.gym_envs import make_gym_env, prepare_env

    if isinstance(env, str):
        env_id = env
        return lambda: make_gym_env(env_id, name)
    if isinstance(env, gym.Env):
        prepared = prepare_env(env)
        return lambda: prepared
    if callable(env):
        factory = env

        def make() -> gym.Env:
            made = factory()
            if not isinstance(made, gym.Env):
                raise ConfigError(
                    f"{name} factory must return a Gymnasium env, got: {type(made).__name__}"
                )
            return prepare_env(made)

        return make
    raise ConfigError(
        f"{name} must be a Gymnasium env, env id or factory, got: {type(env).__name__}"
    )


def _separate_env(env: gym.Env) -> gym.Env:
    """A second env like ``env`` (an instance the training loop steps) for evaluation.

    Evaluating on the training instance would reset it mid-episode and hand the loop an env
    that had already terminated: transitions that jump across the evaluation, and wrong episode
    returns. The copy is a deep copy (it keeps any attribute the user changed after making the
    env), else ``gym.make(env.spec)`` (wrappers included); an env that allows neither needs
    ``eval_env``.
    """
    try:
        return copy.deepcopy(env)
    except Exception as err:  # a handle that cannot be copied (a socket, a subprocess, ...)
        reason = f"{type(err).__name__}: {err}"
    if env.spec is not None:
        try:
            rebuilt = gym.make(env.spec)
        except Exception as err:  # a wrapper that cannot be rebuilt from the spec, and so on
            reason = f"{reason}; gym.make(env.spec): {type(err).__name__}: {err}"
        else:
            log.warning(
                "env: evaluating on gym.make(%r), a fresh env built from the training "
                "instance's spec (deep-copying it failed: %s); attributes changed on the "
                "instance after it was made are not in it (pass eval_env= to choose)",
                env.spec.id,
                reason,
            )
            return rebuilt
    raise ConfigError(
        f"env: evaluation needs an env separate from the training instance, but {env} can be "
        f"neither copied nor rebuilt from its spec ({reason}); pass eval_env=, an env id or a "
        "factory"
    )


def make_vector_env(env: EnvLike, n_envs: int, backend: str = "sync") -> gym.vector.VectorEnv:
    """A vector env that autoresets in the same step, exposing the true final observation."""
    factory = _env_factory(env)
    if isinstance(env, gym.Env) and n_envs > 1:
        raise ConfigError(
            f"n_envs must be 1 when passing an env instance, got: {n_envs} "
            "(pass an env id or a factory to run environments in parallel)"
        )
    mode = gym.vector.AutoresetMode.SAME_STEP
    fns = [factory for _ in range(n_envs)]
    if backend == "async" and n_envs > 1:
        with _worker_signals():
            return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)


@contextlib.contextmanager
def _worker_signals() -> Iterator[None]:
    """Signal handling that env workers inherit (forked, or spawned: an ignored signal stays
    ignored across exec): the stop signals sent to a whole process group (Ctrl-C; SIGTERM from
    Slurm, systemd or ``kill -- -PGID``; SIGHUP from a closed terminal) are ignored, since the
    trainer stops its workers after its checkpoint. A worker that died first broke the pipe
    mid-save or while closing (a SIGTERM run then ended as "error: Broken pipe"), and one that
    ran the CLI's handler printed a KeyboardInterrupt traceback. A worker whose trainer is gone
    meets the closed pipe and ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in stop_signals()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def n_regimes_of(env: gym.Env | gym.vector.VectorEnv) -> int:
    """The number of regime probabilities an environment appends to its observation (0 = none)."""
    if isinstance(env, gym.vector.VectorEnv):
        # SyncVectorEnv: ask the first sub-env, like a single env. AsyncVectorEnv: its copy of
        # the first sub-env's metadata (TradingEnv puts its count there); get_attr is not used,
        # because a missing attribute kills the async workers.
        subs = getattr(env, "envs", None)
        if subs:
            return n_regimes_of(subs[0])
        return int((env.metadata or {}).get("n_regimes", 0) or 0)
    return int(getattr(env.unwrapped, "n_regimes", 0) or 0)


def final_env_steps(done: int, total: int, n_envs: int) -> int:
    """The env step count a run that has ``done`` steps ends at when asked for ``total``: every
    vector step adds ``n_envs``, so it stops at the first multiple past the total."""
    if total <= done:
        return done
    return done + -(-(total - done) // n_envs) * n_envs


def planned_updates(
    done: int, total: int, hp: DQNHyperparameters, first_fill: int | None = None
) -> int:
    """The optimizer steps a run from ``done`` env steps to ``total`` takes, by the loop's rule:
    after each vector step at or past ``learning_starts``, ``gradient_steps`` per ``train_freq``
    boundary crossed since the step before (boundaries crossed before it are not made up), once
    the replay holds a transition. So a run can end past ``learning_starts`` without one update:
    1000 steps, starts 1000, every 256. Exact unless an episode ends within its first ``n_step``
    steps (its shorter transition then arrives sooner): never more than the loop runs.
    ``first_fill``: for a run continued at ``done > 0`` with its replay still empty, the env
    step its first transition arrives at (see ``DQNTrainer``)."""
    reached = final_env_steps(done, total, hp.n_envs)
    n = hp.n_envs
    first = done + max(1, -(-(hp.learning_starts - done) // n)) * n  # first vector step to train
    if done == 0:  # and the replay's first transition: each env holds its first n - 1 steps
        first = max(first, n * hp.n_step)  # back (fewer if an episode ends sooner: a floor)
    elif first_fill is not None:  # continued with the replay still empty: the same floor
        first = max(first, first_fill)
    if first > reached:
        return 0
    return (reached // hp.train_freq - (first - n) // hp.train_freq) * hp.gradient_steps


# Evaluation episodes of an env without a time limit (CliffWalking, or a user's instance with no
# TimeLimit) stop here: a greedy policy that loops would otherwise never end one, and training
# would hang in its first evaluation. ``env_kwargs.max_episode_steps`` or a TimeLimit wrapper
# sets the env's own limit instead.
UNLIMITED_EVAL_STEPS = 1000
NO_STEP_LIMIT = 1_000_000  # an env that ends its own episodes: a guard, never reached in practice
_CUT_WARNED: weakref.WeakSet[gym.Env] = weakref.WeakSet()


def evaluation_step_limit(env: gym.Env) -> int:
    """Steps after which an evaluation episode is cut: 1000 for an env without a time limit
    (registered without one, or an instance with no TimeLimit wrapper); otherwise effectively
    none (the env's own limit, or a trading span, ends it)."""
    from foxhunt.envs.trading import TradingEnv

    if isinstance(env.unwrapped, TradingEnv):
        return NO_STEP_LIMIT  # an episode ends with its span
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, gym.wrappers.TimeLimit):
            return NO_STEP_LIMIT
        layer = layer.env
    spec = env.spec
    if spec is None or spec.max_episode_steps is None:
        return UNLIMITED_EVAL_STEPS
    return NO_STEP_LIMIT


def episode_returns(
    env: gym.Env,
    act: Callable[[np.ndarray], int],
    seeds: list[int],
    max_steps: int | None = None,
    *,
    counts: dict[str, int] | None = None,
) -> list[float]:
    """Undiscounted return of one episode per seed, acting with ``act`` (float32 observations).

    Every greedy evaluation in foxhunt (training, ``foxhunt evaluate``, ensembles) goes through
    here, so their numbers are comparable. ``max_steps`` (default
    :func:`evaluation_step_limit`) cuts an episode that does not end; ``counts["cut"]``, when
    given, receives how many were.
    """
    if max_steps is None:
        max_steps = evaluation_step_limit(env)
    returns, cut = [], 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done, steps = 0.0, False, 0
        while not done and steps < max_steps:
            obs, reward, terminated, truncated, _ = env.step(act(np.asarray(obs, np.float32)))
            total += float(reward)
            done = bool(terminated or truncated)
            steps += 1
        cut += not done
        returns.append(total)
    if counts is not None:
        counts["cut"] = cut
    if cut:
        # Once per env: a training run evaluates the same env every eval_interval steps.
        first = env not in _CUT_WARNED
        _CUT_WARNED.add(env)
        (log.warning if first else log.info)(
            "%d of %d evaluation episodes cut off after %d steps without ending: their returns "
            "count only those steps (the env has no registered time limit and no TimeLimit "
            "wrapper: wrap an instance in gymnasium.wrappers.TimeLimit(env, N); for an env id, "
            "--set env_kwargs.max_episode_steps=N)",
            cut,
            len(seeds),
            max_steps,
        )
    return returns


# What numpy and Gymnasium's stacking of the sub-envs' observations say (sync or async) when an
# observation does not fit the space: another shape, None, a dict, text, a ragged list.
_MISFIT_OBSERVATION = (
    "wrong shape",
    "wrong dimensionality",
    "could not broadcast",
    "inhomogeneous",
    "setting an array element",
    "could not convert",
    "must be a string or a real number",
    "Cannot cast array data",
)


@dataclass
class MetricsWindow:
    """Running sums between two metrics rows (kept as floats; cheap, deterministic)."""

    updates: int = 0
    loss: float = 0.0
    pre: float = 0.0
    post: float = 0.0
    stepped: int = 0  # updates whose gradient norm was finite (skipped steps have none)
    clipped: int = 0
    q_mean: float = 0.0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)
    env_steps0: int = 0
    # Where the rates' count starts, when not at env_steps0 and no update (not checkpointed):
    # learn() starts the clock, so a window begun before it (by a resumed checkpoint, or an
    # earlier learn call) counts only the steps and updates timed since.
    rate_env_steps0: int | None = None
    rate_updates0: int = 0


class DQNTrainer:
    """Trains a :class:`DQNAgent` on any discrete-action Gymnasium environment.

    Parts are injected, not inherited: pass ``logger`` (anything with ``log(row)``) and
    ``eval_env`` to replace the defaults. :meth:`save` writes the trained policy for
    :func:`foxhunt.load_model`; ``foxhunt train`` adds checkpoints, metrics and exact resume.
    ``torch_threads`` holds only inside :meth:`learn` and :meth:`evaluate`: the caller's torch
    thread count is theirs again after each (a notebook's other work is not made single-threaded).
    """

    def __init__(
        self,
        hyperparameters: DQNHyperparameters | Mapping[str, Any],
        env: EnvLike,
        *,
        eval_env: EnvLike | None = None,
        logger: Any | None = None,
        progress: bool = False,
    ) -> None:
        if isinstance(hyperparameters, Mapping):  # {"gamma": 0.9, ...}: validated the same way
            hyperparameters = DQNHyperparameters(**hyperparameters)
        if not isinstance(hyperparameters, DQNHyperparameters):
            raise ConfigError(
                "hyperparameters must be DQNHyperparameters or a mapping of its fields, got: "
                f"{type(hyperparameters).__name__}"
            )
        if logger is not None and not callable(getattr(logger, "log", None)):
            raise ConfigError(  # else an AttributeError at the first logged row, mid-training
                f"logger must have a log(row) method, got: {type(logger).__name__}"
            )
        hp = hyperparameters
        self.hp = hp
        seed_everything(hp.seed)  # as SB3 does: Python's, NumPy's and torch's global RNGs
        self.logger = logger
        self.progress = progress
        self.envs = make_vector_env(env, hp.n_envs, hp.vector_env)
        self._eval_env: gym.Env | None = None
        self._owns_eval_env = False
        try:
            self._setup(hp, env, eval_env)
        except BaseException:  # a refused setting must not leave env workers running
            self.close()
            raise

    def _setup(self, hp: DQNHyperparameters, env: EnvLike, eval_env: EnvLike | None) -> None:
        """Everything after the training envs exist: evaluation env, agent, replay, state."""
        obs_space = self.envs.single_observation_space
        act_space = self.envs.single_action_space
        self._setup_eval_env(hp, env, eval_env)
        self.agent = DQNAgent(obs_space, act_space, hp, n_regimes=n_regimes_of(self.envs))
        self.agent.env_interface = EnvInterface.from_metadata(self.envs.metadata)
        shape, layout = self.agent.obs_shape, image_layout(self.agent.obs_shape)
        pixels = self.agent.env_interface.scale is not None  # uint8 Box(0, 255)
        if hp.torso == "mlp" and layout and min(layout[1:3]) >= 36 and (len(shape) == 3 or pixels):
            log.warning(
                "observations of shape %s go flattened into the MLP's first layer (%d inputs): "
                "for images, torso=cnn reads them with the Nature DQN convolutions",
                self.agent.obs_shape,
                self.agent.obs_dim,
            )
        self.device = self.agent.device
        self._counterfactual_envs = self._augmentation_envs() if hp.action_augmentation else None
        self.dist = distributed.current()
        if self.dist.enabled:
            # Each rank explores and samples differently; the model starts identical (DDP
            # broadcasts rank 0's weights) and every rank applies the same averaged gradient.
            self.agent.rng = np.random.default_rng([hp.seed, self.dist.rank, 104729])
            ids = [self.dist.local_rank] if self.device.type == "cuda" else None
            self.agent.enable_data_parallel(device_ids=ids)
        self.replay = self._make_replay(hp, obs_space)
        self._warn_memory()
        self.nstep = NStepAccumulator(hp.n_step, hp.gamma, hp.n_envs)
        self.health = HealthMonitor(hp)
        # Loop state (all checkpointed).
        self.env_steps = 0
        self.episodes = 0
        self.total_env_steps = 0
        self.last_eval_return: float | None = None
        self.best_eval_return: float | None = None
        self.eval_history: list[tuple[int, float]] = []
        self._eval_seconds = 0.0  # in periodic evaluations, during the current learn()
        self._loop_iterations = 0  # data-parallel ranks share stop requests every 16 of them
        self._callback_stop = False  # a learn() callback asked to end (data parallel)
        self._obs: np.ndarray | None = None
        self._stale_obs: np.ndarray | None = None  # where envs stood before a fresh-reset resume
        self._ep_return = np.zeros(hp.n_envs, dtype=np.float64)
        self._ep_length = np.zeros(hp.n_envs, dtype=np.int64)
        self._window = MetricsWindow()
        self._train_rounds = 0
        self._next_log = hp.log_interval
        self._next_eval = hp.eval_interval if hp.eval_interval else math.inf
        self._next_ckpt = hp.checkpoint_interval if hp.checkpoint_interval else math.inf
        self._checkpointer: Any | None = None
        # The last save: (checkpointer, env steps, optimizer steps) and the path it returned.
        self._saved_at: tuple[tuple[Any, int, int], Path | None] | None = None
        self._pending_eval: float | None = None
        self._interrupt_requested = 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self._t_origin: float | None = None  # the first learn() call's start: time_s's 0
        self._t_paused: float | None = None  # when the last learn() call returned
        log.info(
            "effective batch size %d (batch_size %d x gradient_accumulation_steps %d)",
            hp.effective_batch_size,
            hp.batch_size,
            hp.gradient_accumulation_steps,
        )

    def _setup_eval_env(
        self, hp: DQNHyperparameters, env: EnvLike, eval_env: EnvLike | None
    ) -> None:
        """The evaluation env (made now, or its maker for the first evaluation), refused where
        it would share the training instance or has other spaces."""
        obs_space = self.envs.single_observation_space
        act_space = self.envs.single_action_space
        if eval_env is env and isinstance(env, gym.Env):
            eval_env = None  # the training instance itself: evaluate on a copy, as below
        elif (
            isinstance(eval_env, gym.Env)
            and isinstance(env, gym.Env)
            and eval_env.unwrapped is env.unwrapped
        ):
            raise ConfigError(
                "eval_env wraps the training env instance (the same unwrapped "
                f"{type(env.unwrapped).__name__}): evaluating would reset it mid-episode; "
                "pass a separate env, or leave eval_env out to evaluate on a copy"
            )
        # Evaluation runs on an env of its own. An eval_env is made now (a bad one is refused at
        # once, not at the first evaluation hours later), and so is the copy of a training
        # instance; an id or factory is made at the first evaluation, as the training envs are
        # (a factory is called once per env it makes). A user's instance is theirs to close.
        self._eval_maker: Callable[[], gym.Env] | None = None
        self._owns_eval_env = not isinstance(eval_env, gym.Env)
        self._eval_error: ConfigError | None = None
        try:
            if eval_env is not None:
                self._eval_env = _env_factory(eval_env, "eval_env")()
            elif isinstance(env, gym.Env):
                self._eval_env = _env_factory(_separate_env(env))()
            else:
                self._eval_maker = _env_factory(env)
        except ConfigError as err:
            if eval_env is not None or hp.eval_interval:
                raise
            self._eval_error = err  # raised by evaluate(), if it is ever called
        if self._eval_env is not None:
            ev_obs, ev_act = self._eval_env.observation_space, self._eval_env.action_space
            if ev_obs.shape != obs_space.shape or ev_act != act_space:
                raise ConfigError(
                    f"eval_env must have the training env's spaces: observations {obs_space} "
                    f"and actions {act_space}, got {ev_obs} and {ev_act}"
                )

    def _make_replay(self, hp: DQNHyperparameters, obs_space: gym.Space) -> ReplayBuffer:
        """The replay buffer (prioritized or uniform), each rank seeded apart."""
        replay_device = self.device if hp.replay_on_device else torch.device("cpu")
        obs_shape = tuple(obs_space.shape)
        # Pixels are stored as their uint8 levels (a quarter of the memory, the same values).
        obs_scale = self.agent.env_interface.scale
        if obs_space != gym.spaces.Box(0.0, 1.0, obs_space.shape, np.float32):
            obs_scale = None  # a wrapper reshaped the scaled pixels: store what it gives
        if hp.prioritized_replay:
            return PrioritizedReplayBuffer(
                hp.buffer_capacity,
                obs_shape,
                obs_scale=obs_scale,
                alpha=hp.per_alpha,
                eps=hp.per_eps,
                device=replay_device,
                seed=hp.seed + 7 * self.dist.rank,
            )
        return ReplayBuffer(
            hp.buffer_capacity,
            obs_shape,
            obs_scale=obs_scale,
            device=replay_device,
            seed=hp.seed + 7 * self.dist.rank,
        )

    # --- schedules (environment steps)
    @property
    def epsilon(self) -> float:
        """Exploration rate now; always 0 with noisy nets (they explore by themselves)."""
        hp = self.hp
        if hp.noisy_nets:
            return 0.0
        span = hp.exploration_fraction * max(self.total_env_steps, 1)
        frac = 1.0 if span <= 0 else min(1.0, self.env_steps / span)
        return hp.exploration_initial_eps + frac * (
            hp.exploration_final_eps - hp.exploration_initial_eps
        )

    @property
    def beta(self) -> float:
        """PER importance-sampling exponent now (annealed linearly in environment steps)."""
        hp = self.hp
        span = hp.per_beta_fraction * max(self.total_env_steps, 1)
        frac = 1.0 if span <= 0 else min(1.0, self.env_steps / span)
        return hp.per_beta_start + frac * (hp.per_beta_end - hp.per_beta_start)

    def _warn_memory(self) -> None:
        """Warn before training when replay would not fit in free memory (SB3 does the same)."""
        need = self.replay.nbytes
        try:
            import os

            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return
        if need > 0.8 * avail:
            log.warning(
                "replay buffer needs %.2f GB but only %.2f GB of memory is free",
                need / 1e9,
                avail / 1e9,
            )

    def _augmentation_envs(self) -> list[Any]:
        """The sub-envs whose ``counterfactual_transitions`` feed ``action_augmentation``."""
        subs = getattr(self.envs, "envs", None)
        if subs is None:
            raise ConfigError(
                f"vector_env must be 'sync' with action_augmentation, got: {self.hp.vector_env!r} "
                "(the counterfactuals are computed by the env objects in this process)"
            )
        envs = [e.unwrapped for e in subs]
        if not all(hasattr(e, "counterfactual_transitions") for e in envs):
            raise ConfigError(
                "action_augmentation must be false for this environment, got: true "
                f"({type(envs[0]).__name__} has no counterfactual_transitions; the actions not "
                "taken have unknown outcomes)"
            )
        for env in subs:  # the counterfactuals come from the bare env: nothing may reshape it
            layer = env
            while isinstance(layer, gym.Wrapper):
                if isinstance(
                    layer, gym.ObservationWrapper | gym.RewardWrapper | gym.ActionWrapper
                ):
                    raise ConfigError(
                        f"action_augmentation must be false with a {type(layer).__name__} around "
                        "the environment, got: true (counterfactuals would bypass the wrapper)"
                    )
                layer = layer.env
        return envs

    def _counterfactuals(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        real_next: np.ndarray,
        terminated: np.ndarray,
        ended: np.ndarray,
        infos: dict[str, Any],
    ) -> list[Counterfactuals]:
        """Every env's one-step outcomes of the actions it did not take at this step."""
        assert self._counterfactual_envs is not None
        final = infos.get("final_info", {})
        out = []
        for i, env in enumerate(self._counterfactual_envs):
            source = final if ended[i] else infos
            # Per-env arrays only: an env that did not end still sees the others' final_* dicts.
            info = {k: v[i] for k, v in source.items() if not k.startswith(("_", "final_"))}
            c = Counterfactuals(
                *env.counterfactual_transitions(
                    obs[i], int(actions[i]), real_next[i], bool(terminated[i]), info
                )
            )
            self._check_counterfactual(c, i)
            out.append(c)
        return out

    def _check_counterfactual(self, c: Counterfactuals, env_i: int) -> None:
        """The outcomes of the actions not taken go into replay as real ones do, so they are
        checked alike: a non-finite one stops the run naming its env and action (stored, it
        kept PER's top priority and halted the run as "non-finite gradients" much later), and
        their rewards count towards the Q-divergence bound's largest reward."""
        rewards = np.asarray(c.rewards, dtype=np.float64)
        next_obs = np.asarray(c.next_obs, dtype=np.float32)
        if not len(rewards):
            return
        step = self.env_steps + self.hp.n_envs
        try:
            self.health.check_env_step(next_obs, rewards, step)
        except EnvironmentStepError:
            obs_ok = np.isfinite(next_obs.reshape(len(rewards), -1)).all(1)
            finite = np.isfinite(rewards) & obs_ok
            k = int(np.argmin(finite)) if not finite.all() else int(np.argmax(np.abs(rewards)))
            what = (
                "a non-finite observation"
                if not obs_ok[k]
                else f"a non-finite or too large reward: {rewards[k]}"
            )
            raise EnvironmentStepError(
                f"environment's counterfactual outcome (action_augmentation) of action "
                f"{int(c.actions[k])} at env step {step} (env index {env_i}) has {what}"
            ) from None

    # --- one optimizer step
    def train_step(self) -> dict[str, float]:
        """Sample the effective batch once, accumulate its micro-batches, take one optimizer step.

        PER weights are normalised over the whole effective batch at sampling time and priorities
        are updated once, from the TD errors of every micro-batch of the window.
        """
        hp, agent = self.hp, self.agent
        eff = hp.effective_batch_size
        per = isinstance(self.replay, PrioritizedReplayBuffer)
        if self.dist.enabled and per:
            # Normalise IS weights by the maximum over every rank's batch, as one process
            # sampling all of them would.
            slots, weights = self.replay.sample_slots(eff, beta=self.beta, normalize=False)
            w_max = weights.max().to(self.device)
            torch.distributed.all_reduce(w_max, op=torch.distributed.ReduceOp.MAX)
            weights = weights / w_max.to(weights.device)
        else:
            slots, weights = self.replay.sample_slots(eff, beta=self.beta)
        # Slots (and weights) are drawn for the whole window at once; rows are gathered one
        # micro-batch at a time, so only one micro-batch of inputs and graph is alive at once.
        sizes = split_sizes(eff, hp.gradient_accumulation_steps)
        bounds = [0, *itertools.accumulate(sizes)]
        if len(sizes) == 1:  # a window of one: the agent may run the step as one graph
            mb = self.replay.gather(slots, weights).to(self.device, non_blocking=True)
            result, stats = agent.update(mb)
            results = [result]
            del mb
        else:
            results = []
            for i, (a, b) in enumerate(itertools.pairwise(bounds)):
                mb = self.replay.gather(slots[a:b], None if weights is None else weights[a:b])
                mb = mb.to(self.device, non_blocking=True)
                last = i == len(sizes) - 1
                results.append(agent.backward_micro_batch(mb, (b - a) / eff, sync=last))
                del mb
            stats = agent.optimizer_step()
        if len(results) == 1:
            r = results[0]
            summary = torch.stack([r.loss, r.q_mean, r.q_abs_max])
        else:
            share = torch.tensor(sizes, dtype=torch.float32, device=results[0].loss.device) / eff
            summary = torch.stack(
                [
                    (torch.stack([r.loss for r in results]) * share).sum(),
                    (torch.stack([r.q_mean for r in results]) * share).sum(),
                    torch.stack([r.q_abs_max for r in results]).max(),
                ]
            )
        if self.dist.enabled:
            summary = self._combined_summary(summary)
        loss, q_mean, q_abs_max = summary.tolist()  # one host transfer for all three
        if per and not stats.skipped:
            td = torch.cat([r.td_errors for r in results]).float().cpu().numpy()
            self.replay.update_priorities(slots, td)
        metrics = {
            "loss": loss,
            "grad_norm_pre_clip": stats.pre_clip_norm,
            "grad_norm_post_clip": stats.post_clip_norm,
            "clipped": float(stats.clipped),
            "skipped": float(stats.skipped),
            "effective_batch_size": float(eff),
            "lr": stats.lr,
            "q_mean": q_mean,
            "q_abs_max": q_abs_max,
            "optimizer_steps": float(stats.optimizer_steps),
        }
        self.health.check_update(
            skipped=stats.skipped,
            consecutive_skips=agent.consecutive_skips,
            pre_clip_norm=stats.pre_clip_norm,
            q_abs_max=metrics["q_abs_max"],
            env_steps=self.env_steps,
            optimizer_steps=agent.optimizer_steps,
        )
        return metrics

    # --- collection
    def _raise_env_error(self, exc: Exception, when: str) -> NoReturn:
        """Raise an error out of the envs' reset or step that breaks Gymnasium's env API as one
        line naming the env step and what the API asks for; any other error is the env's own
        and is raised as it is, with its traceback. (Gymnasium's stacking of the sub-envs'
        observations says "Output array is the wrong shape", with no word of the space or the
        step.)"""
        message = first_line(exc)
        frames = traceback.extract_tb(exc.__traceback__)
        in_info = any(f.name == "_add_info" for f in frames)  # Gymnasium reading info dicts
        api = (
            "a Gymnasium env's reset returns (obs, info) and its step (obs, reward, terminated, "
            "truncated, info)"
        )
        if isinstance(exc, ValueError) and "values to unpack" in message:
            hint = f"{api}; an old Gym env returns other tuples"
        elif message.startswith("rewards of shape") or any(
            "_rewards[" in (f.line or "") for f in frames
        ):
            hint = "a step's reward must be one number (a float), not an array"
        elif in_info and isinstance(exc, AttributeError) and "attribute 'items'" in message:
            # Only there: the same error inside the env's own code is its bug, raised as it is.
            hint = f"{api}, info a dict; an old Gym env returns other tuples"
        elif in_info:
            hint = (
                "raised where Gymnasium gathers the sub-envs' info dicts: an info value whose "
                "shape or type differs between sub-envs or steps fails this way; give each info "
                "key one shape, or a scalar"
            )
        elif any(sign in message for sign in _MISFIT_OBSERVATION):
            space = self.envs.single_observation_space
            hint = f"an observation that does not fit the observation space {space} fails this way"
        elif re.search(r"unexpected keyword argument '(seed|options)'", message):
            hint = "a Gymnasium env's reset takes the keywords seed and options"
        elif isinstance(exc, gym.error.Error):  # a missing dependency (render_mode=human) ...
            hint = "raised by Gymnasium: check the env's settings, env_kwargs"
        else:
            raise exc
        raise EnvironmentStepError(
            f"environment {when} failed at env step {self.env_steps}: "
            f"{type(exc).__name__}: {message} ({hint})"
        ) from exc

    def _reset_envs(self) -> None:
        if self._stale_obs is not None and any(self.nstep.queues):
            # n-step starts of the episodes this reset abandons (a resume that could not restore
            # the envs): stored as truncated where their env stood, never continued into the
            # new episodes' rewards and states.
            tr = self.nstep.flush(self._stale_obs)
            self.replay.add(tr.obs, tr.actions, tr.rewards, tr.next_obs, tr.dones, tr.discounts)
        self._stale_obs = None
        seed = self.hp.seed + 100_003 * self.dist.rank
        if self.env_steps:  # a restart mid-run: not the first episodes of the run again
            seed = int(np.random.SeedSequence([seed, self.env_steps]).generate_state(1)[0])
        try:
            obs, _ = self.envs.reset(seed=seed)
            self._obs = np.asarray(obs, dtype=np.float32)
        except FoxhuntError:
            raise
        except (ValueError, TypeError, AttributeError, gym.error.Error) as exc:
            self._raise_env_error(exc, "reset")
        self.health.check_env_step(self._obs, np.zeros(self.hp.n_envs), self.env_steps)

    def collect_step(self) -> None:
        """One vector step: act, step, store (n-step) transitions, track episodes."""
        hp = self.hp
        if self._obs is None:
            self._reset_envs()
        obs = self._obs
        assert obs is not None
        if self.env_steps < hp.learning_starts:
            actions = self.agent.rng.integers(0, self.agent.n_actions, size=hp.n_envs)
        else:
            actions = np.asarray(self.agent.act(obs, self.epsilon))
        try:
            next_obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            next_obs = np.asarray(next_obs, dtype=np.float32)
            rewards = np.asarray(rewards, dtype=np.float64)
            if rewards.shape != (hp.n_envs,):  # async envs stack an array reward per env
                raise ValueError(f"rewards of shape {rewards.shape} from {hp.n_envs} env(s)")
            ended = np.logical_or(terminated, truncated)
            any_ended = bool(ended.any())
            real_next = next_obs
            if any_ended:
                real_next = next_obs.copy()
                final = infos["final_obs"]
                for i in np.flatnonzero(ended):
                    real_next[i] = np.asarray(final[i], dtype=np.float32)
        except FoxhuntError:
            raise
        except (ValueError, TypeError, AttributeError, gym.error.Error) as exc:
            self._raise_env_error(exc, "step")
        self.health.check_env_step(real_next, rewards, self.env_steps + hp.n_envs)
        if any_ended:  # the autoreset observations start the next episodes: check them too
            self.health.check_env_step(next_obs, rewards, self.env_steps + hp.n_envs)
        cf = None
        if self._counterfactual_envs is not None:
            cf = self._counterfactuals(obs, actions, real_next, terminated, ended, infos)
        tr = self.nstep.push(obs, actions, rewards, real_next, terminated, truncated, cf)
        if len(tr.actions):
            self.replay.add(tr.obs, tr.actions, tr.rewards, tr.next_obs, tr.dones, tr.discounts)
        self._ep_return += rewards
        self._ep_length += 1
        for i in np.flatnonzero(ended) if any_ended else ():
            self._window.returns.append(float(self._ep_return[i]))
            self._window.lengths.append(int(self._ep_length[i]))
            self._ep_return[i] = 0.0
            self._ep_length[i] = 0
            self.episodes += 1
        self._obs = next_obs
        self.env_steps += hp.n_envs

    # --- evaluation
    def evaluate(self, n_episodes: int | None = None, *, max_steps: int | None = None) -> float:
        """Mean greedy return (noise off) over fixed-seed episodes, so evals are comparable."""
        n = self.hp.eval_episodes if n_episodes is None else n_episodes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"n_episodes must be a positive integer, got: {n_episodes!r}")
        if self._eval_env is None:
            if self._eval_maker is None:
                assert self._eval_error is not None
                raise ConfigError(str(self._eval_error))
            self._eval_env = self._eval_maker()
        env = self._eval_env
        seeds = [self.hp.seed + 1_000_003 + k for k in range(n)]
        with self._torch_threads(), self.agent.evaluation():
            returns = episode_returns(
                env, lambda obs: int(self.agent.greedy_actions(obs)[0]), seeds, max_steps
            )
        return float(np.mean(returns))

    # --- the loop
    def learn(self, total_env_steps: int, *, callback: Callable[[dict], Any] | None = None) -> dict:
        """Train until ``total_env_steps`` environment steps; returns a summary.

        ``callback`` receives every metrics row; returning ``False`` stops training early.
        """
        bad = isinstance(total_env_steps, bool) or not isinstance(total_env_steps, int)
        if bad or total_env_steps <= 0:
            raise ConfigError(
                f"total_env_steps must be a positive integer, got: {total_env_steps!r}"
            )
        hp = self.hp
        reached = final_env_steps(self.env_steps, total_env_steps, hp.n_envs)
        if total_env_steps <= self.env_steps:
            log.warning(
                "learn(%d): the total counts from the start of training and %d env steps are "
                "done, so there is nothing to train (for n more steps: learn(trainer.env_steps "
                "+ n))",
                total_env_steps,
                self.env_steps,
            )
        elif planned_updates(self.env_steps, total_env_steps, hp, self._first_fill()) == 0:
            done = self.agent.optimizer_steps  # a resumed run keeps what it learned
            log.warning(
                "%s: the %d env steps this run reaches end before a train_freq boundary (every "
                "%d env steps) at or after learning_starts %d (raise the total, or lower "
                "learning_starts or train_freq)",
                f"no further optimizer step will run (the model keeps its {done})"
                if done
                else "no optimizer step will run and the model stays untrained",
                reached,
                hp.train_freq,
                hp.learning_starts,
            )
        self.total_env_steps = total_env_steps
        self.agent.plan_lr_decay(planned_updates(0, total_env_steps, hp))
        progress = self._make_progress(total_env_steps)
        t_start = time.perf_counter()
        steps_start, updates_start = self.env_steps, self.agent.optimizer_steps
        if self._t_origin is None:
            self._t_origin = t_start
        elif self._t_paused is not None:  # time_s counts training: not the pause between calls
            self._t_origin += t_start - self._t_paused
        w = self._window  # its rates count from here: not setup, a checkpoint's load, a pause
        w.t0, w.rate_env_steps0, w.rate_updates0 = t_start, self.env_steps, w.updates
        self._eval_seconds = 0.0
        self._callback_stop = False
        try:
            with self._torch_threads(), self._deferred_sigint():
                self._loop(total_env_steps, progress, callback)
        finally:
            self._t_paused = time.perf_counter()
        elapsed = self._t_paused - t_start
        summary = self.summary(elapsed, self.env_steps - steps_start, updates_start)
        self._save_once()
        return summary

    def _first_fill(self) -> int | None:
        """The env step an empty replay gets its first n-step transition at (no episode ending
        sooner), or None when it holds one already."""
        if self.replay.size:
            return None
        held = max((len(q) for q in self.nstep.queues), default=0)
        return self.env_steps + self.hp.n_envs * (self.hp.n_step - held)

    def _save_once(self, *, off_schedule: bool = False) -> Path | None:
        """``_checked_save``, unless a periodic checkpoint at this very step (checkpoint_interval
        dividing the total, or an interrupt at a checkpoint's step) already holds this state:
        writing it again replaced it with an identical copy, twice the I/O, and a replace needs
        room for both copies (a disk the run just fit on then failed it at its last step)."""
        if self._saved_here():
            return self._saved_at[1]  # type: ignore[index]
        return self._checked_save(off_schedule=off_schedule)

    def _saved_here(self) -> bool:
        """Whether the last save was of this very state, to this checkpointer."""
        return self._saved_at is not None and self._saved_at[0] == self._save_key()

    def _save_key(self) -> tuple[Any, int, int]:
        return (self._checkpointer, self.env_steps, self.agent.optimizer_steps)

    def summary(
        self, elapsed: float = 0.0, env_steps_done: int = 0, updates_start: int | None = None
    ) -> dict[str, Any]:
        """What ``learn`` returns (and ``summary.json`` holds): the run's counts, its
        evaluations and, for the last ``learn`` call, its time and rates."""
        hp = self.hp
        if updates_start is None:
            updates_start = self.agent.optimizer_steps
        summary = {
            "env_steps": self.env_steps,
            "optimizer_steps": self.agent.optimizer_steps,
            "episodes": self.episodes,
            "effective_batch_size": hp.effective_batch_size,
            "last_eval_return": self.last_eval_return,
            "best_eval_return": self.best_eval_return,
            # When it was reached (the weights best_model.safetensors holds): the first
            # evaluation with the best return, as _run_eval keeps only a strictly better one.
            "best_eval_env_steps": next(
                (step for step, ret in self.eval_history if ret == self.best_eval_return), None
            ),
            "skipped_steps": self.agent.skipped_steps,
            "health_events": len(self.health.events),
            "wall_time_s": elapsed,
            # Of which the periodic greedy evaluations (for a like-for-like time against a
            # library that evaluates nothing while training).
            "eval_time_s": self._eval_seconds,
            "env_steps_per_s": env_steps_done / max(elapsed, 1e-9),
            "updates_per_s": (self.agent.optimizer_steps - updates_start) / max(elapsed, 1e-9),
            # How the learner ran (with compile: true, whether the whole step was one graph).
            "learner_path": self.agent.learner_path,
        }
        if self.dist.enabled:
            # Every count above is this process's; the job collected world_size times the env
            # steps, and each optimizer step averaged world_size times the effective batch.
            summary["world_size"] = self.dist.world_size
        return summary

    def _loop(
        self, total_env_steps: int, progress: Any, callback: Callable[[dict], Any] | None
    ) -> None:
        hp = self.hp
        try:
            while self.env_steps < total_env_steps:
                self.collect_step()
                rounds = self.env_steps // hp.train_freq
                # learning_starts counts env steps; with n-step returns across many envs the
                # replay can still be empty then (each env holds its first n-1 steps back).
                if self.env_steps >= hp.learning_starts and self.replay.size > 0:
                    for _ in range(rounds - self._train_rounds):
                        for _ in range(hp.gradient_steps):
                            self._accumulate(self.train_step())
                self._train_rounds = rounds
                evaluated = self.env_steps >= self._next_eval
                if evaluated:
                    self._run_eval()
                # An evaluation is logged on a row at its own step: held for the next log
                # boundary, it was plotted at another step, and a second evaluation before that
                # boundary replaced it (the best one could be missing from metrics.csv).
                due = self.env_steps >= self._next_log or self.env_steps >= total_env_steps
                if evaluated or due:
                    row = self._emit_row()
                    if progress is not None:
                        progress.update(self.env_steps, row)
                    if callback is not None and callback(row) is False:
                        # The caller asked to stop (e.g. a target return was reached). Under
                        # data parallel every rank stops at the next shared boundary instead:
                        # one rank leaving alone would strand the others in an all-reduce.
                        if not self.dist.enabled:
                            break
                        self._callback_stop = True
                if self.env_steps >= self._next_ckpt:
                    self._next_ckpt += hp.checkpoint_interval
                    self._checked_save()
                if self.dist.enabled:
                    stop, ended = self._agreed_stops()
                    if ended and not stop:
                        break
                else:
                    stop = self._interrupt_requested
                if stop:
                    # Ctrl-C lands here, between two loop iterations, never mid-update: the
                    # checkpoint is the same state a periodic one would hold, so resume is exact.
                    if self._checkpointer is not None:
                        log.warning(
                            "interrupted at env step %d: %s",
                            self.env_steps,
                            "its checkpoint was just written"
                            if self._saved_here()
                            else "saving a checkpoint",
                        )
                    raise TrainingInterrupted(
                        self.env_steps, self._save_once(off_schedule=True), stop
                    )
        except TrainingHalted:
            if self._window.updates:
                # The steps since the last row, up to the halt (skipped ones counted): the
                # metrics show what the monitor stopped on. A resume drops the row again.
                self._emit_row()
            raise
        finally:
            if progress is not None:
                progress.close()

    def _combined_summary(self, summary: torch.Tensor) -> torch.Tensor:
        """Loss and mean Q over every rank's batch, and the largest |Q| and reward of any rank:
        the health monitors then decide on the same numbers everywhere (one rank halting alone
        left the others waiting in the next all-reduce), and metrics describe the whole step."""
        mine = torch.cat([summary, summary.new_tensor([self.health.max_abs_reward])])
        ranks = [torch.empty_like(mine) for _ in range(self.dist.world_size)]
        torch.distributed.all_gather(ranks, mine)  # one collective for means and maxima
        every = torch.stack(ranks)
        means, peaks = every[:, :2].mean(dim=0), every[:, 2:].amax(dim=0)
        self.health.max_abs_reward = float(peaks[1])
        return torch.cat([means, peaks[:1]])

    def _agreed_stops(self) -> tuple[int, bool]:
        """Data-parallel ranks stop together: every 16 loop iterations (they run in lockstep)
        the ranks share whether any was asked to stop, and all act on it at that boundary, so
        a signal to one worker (kill, a scheduler) stops every rank with rank 0's checkpoint
        instead of leaving the others in an all-reduce with a peer gone. Returns the signal
        number asking (the largest, when several did; 0 for none) and whether any rank's
        ``learn`` callback asked to end."""
        self._loop_iterations += 1
        if self._loop_iterations % 16:
            return 0, False
        flags = torch.tensor(
            [self._interrupt_requested, int(self._callback_stop)],
            dtype=torch.int64,
            device=self.device,
        )
        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
        signum, ended = flags.tolist()
        return int(signum), bool(ended)

    @contextlib.contextmanager
    def _torch_threads(self) -> Iterator[None]:
        """``torch_threads`` for this block, then the caller's count again."""
        threads = torch.get_num_threads()
        if self.hp.torch_threads and self.hp.torch_threads != threads:
            torch.set_num_threads(self.hp.torch_threads)
        try:
            yield
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    _REPEAT_S = 1.0  # the same stop signal again this soon is one request delivered twice

    @contextlib.contextmanager
    def _deferred_sigint(self) -> Iterator[None]:
        """Turn the first Ctrl-C, SIGTERM (kill, docker stop, Slurm) or SIGHUP (a closed
        terminal; not under nohup) into a request honoured at the next loop boundary, so the run
        stops with a checkpoint to resume.

        A second signal interrupts at once (no checkpoint), for a loop stuck in a slow env;
        a SIGTERM or SIGHUP again within ``_REPEAT_S`` of the first is that one delivered twice
        (Slurm's scancel, systemd and ``kill`` of a job's pids signal torchrun's workers
        directly, and torchrun forwards its own copy a millisecond later), not a second ask.
        """
        self._interrupt_requested = 0  # the signal number asking to stop; 0 while none did
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        first = [0.0]

        def request(signum: int, frame: Any) -> None:
            if self._interrupt_requested:
                if signum == self._interrupt_requested != signal.SIGINT and (
                    time.monotonic() - first[0] < self._REPEAT_S
                ):
                    return  # one stop request delivered twice (a double Ctrl-C still forces)
                raise KeyboardInterrupt
            self._interrupt_requested = signum
            first[0] = time.monotonic()

        previous = {sig: signal.signal(sig, request) for sig in stop_signals()}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_eval(self) -> None:
        t0 = time.perf_counter()
        ret = self.evaluate()
        self._eval_seconds += time.perf_counter() - t0
        self.last_eval_return = ret
        if self.best_eval_return is None or ret > self.best_eval_return:
            # Keep the weights of the best evaluation (model selection on the eval env, e.g. the
            # validation span of a market), as SB3's EvalCallback keeps best_model.
            self.best_eval_return = ret
            self.best_state = {
                k: v.detach().cpu().clone() for k, v in self.agent.online_net.state_dict().items()
            }
        self.eval_history.append((self.env_steps, ret))
        while self._next_eval <= self.env_steps:
            self._next_eval += self.hp.eval_interval
        self._pending_eval = ret

    def _accumulate(self, m: dict[str, float]) -> None:
        w = self._window
        w.updates += 1
        w.loss += m["loss"]
        if math.isfinite(m["grad_norm_pre_clip"]) and math.isfinite(m["grad_norm_post_clip"]):
            # The norms average over the steps that had one: a skipped (non-finite) step adds
            # neither a zero nor a count, so it cannot drag the reported norm down.
            w.stepped += 1
            w.pre += m["grad_norm_pre_clip"]
            w.post += m["grad_norm_post_clip"]
        w.clipped += int(m["clipped"])
        w.q_mean += m["q_mean"]

    def _emit_row(self) -> dict[str, Any]:
        hp, w = self.hp, self._window
        now = time.perf_counter()
        dt = max(now - w.t0, 1e-9)
        u = w.updates
        steps0 = w.env_steps0 if w.rate_env_steps0 is None else w.rate_env_steps0
        origin = w.t0 if self._t_origin is None else self._t_origin
        row: dict[str, Any] = {
            "time_s": round(now - origin, 3),
            "env_steps": self.env_steps,
            "optimizer_steps": self.agent.optimizer_steps,
            "episodes": self.episodes,
            "episode_return": float(np.mean(w.returns)) if w.returns else None,
            "episode_length": float(np.mean(w.lengths)) if w.lengths else None,
            "loss": w.loss / u if u else None,
            "grad_norm_pre_clip": (w.pre / w.stepped if w.stepped else math.nan) if u else None,
            "grad_norm_post_clip": (w.post / w.stepped if w.stepped else math.nan) if u else None,
            "clipped": w.clipped,
            "clip_rate": w.clipped / u if u else None,
            "q_mean": w.q_mean / u if u else None,
            "lr": float(self.agent.optimizer.param_groups[0]["lr"]),
            "epsilon": self.epsilon,
            "beta": self.beta if hp.prioritized_replay else None,
            "effective_batch_size": hp.effective_batch_size,
            "env_steps_per_s": (self.env_steps - steps0) / dt,
            "updates_per_s": (u - w.rate_updates0) / dt,
            "skipped_steps": self.agent.skipped_steps,
            "eval_return": self._pending_eval,
        }
        self._pending_eval = None
        self._window = MetricsWindow(t0=now, env_steps0=self.env_steps)
        while self._next_log <= self.env_steps:
            self._next_log += hp.log_interval
        if self.logger is not None:
            self.logger.log(row)
        return row

    def _make_progress(self, total: int) -> Any | None:
        if not self.progress:
            return None
        from foxhunt.logging import ProgressDisplay

        return ProgressDisplay(total)

    def save(self, directory: str | Path) -> Path:
        """Write the greedy policy (``model.safetensors`` + ``model.json``, and
        ``best_model.safetensors`` when evaluations kept one) into ``directory``, for
        :func:`foxhunt.load_model`. Weights only: exact resume needs ``foxhunt train``'s
        checkpoints."""
        from foxhunt.runs import save_model

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_model(out, self.agent, best_state=self.best_state)
        return out

    # --- checkpoints (wired by foxhunt.checkpoint)
    def save_checkpoint(self) -> Path | None:
        """Save a checkpoint when a checkpointer is attached (the CLI attaches one per run)."""
        if self._checkpointer is None:
            return None
        return self._checkpointer.save(self)

    def _checked_save(self, *, off_schedule: bool = False) -> Path | None:
        """``save_checkpoint`` for the training loop, after the health monitors have seen the
        network it would hold.

        The Q monitor reads max |Q| off each update's forward pass, which runs before the
        update: a step that blows the weights up is seen at the next step, and a checkpoint
        written in between held the blown-up network as ``latest`` (finite, so it loaded, and
        evaluated to a number). Here the network is scored on the newest stored transitions,
        without random draws (a resumed run stays exact) and on every data-parallel rank alike
        (all of them reach each save in lockstep)."""
        if (self._checkpointer is not None or self.dist.enabled) and self.agent.optimizer_steps:
            finite, q_abs_max = self._network_health()
            # A save the uninterrupted run does not make (a stop signal's) judges the network
            # all the same, but records its warning in a copy: the checkpoint, and the resumed
            # run's health events, stay those of the uninterrupted run (exact resume).
            monitor = self.health
            if off_schedule:
                monitor = copy.copy(self.health)
                monitor.events = list(self.health.events)
            try:
                monitor.check_network(
                    finite=finite,
                    q_abs_max=q_abs_max,
                    env_steps=self.env_steps,
                    optimizer_steps=self.agent.optimizer_steps,
                )
            except TrainingHalted:
                self.health.events = monitor.events  # a halt: its record (halted.json) says why
                raise
        path = self.save_checkpoint()
        # on every rank alike (they save in lockstep)
        self._saved_at = (self._save_key(), path)
        return path

    @torch.inference_mode()
    def _network_health(self, rows: int = 256) -> tuple[bool, float]:
        """(every weight finite, max |Q(s, a)| over the newest ``rows`` stored transitions),
        the largest over data-parallel ranks, which also share their largest reward."""
        net = self.agent.online_net
        finite = all(bool(torch.isfinite(p).all()) for p in net.parameters())
        q_abs_max = 0.0
        if finite and self.replay.size:
            k = min(rows, self.replay.size)
            slots = (self.replay.pos - 1 - np.arange(k)) % self.replay.capacity
            batch = self.replay.gather(slots).to(self.device)
            with self.agent._autocast():
                q = net.q_values(net(batch.obs))
            taken = q.float().gather(1, batch.actions.long()[:, None])
            q_abs_max = float(taken.abs().max())
        if self.dist.enabled:
            # The bound too: rewards collected since the last update are still rank-local, and
            # a rank judging by a smaller bound would halt alone (the others then wait forever).
            reward = self.health.max_abs_reward
            mine = torch.tensor([0.0 if finite else 1.0, q_abs_max, reward], dtype=torch.float64)
            mine = torch.nan_to_num(mine, nan=math.inf)
            torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
            finite, q_abs_max = bool(mine[0] == 0.0), float(mine[1])
            self.health.max_abs_reward = float(mine[2])
        return finite, q_abs_max

    def planned_checkpoints(self, total_env_steps: int) -> set[int]:
        """The env steps at which ``learn(total_env_steps)`` from here saves checkpoints, by the
        loop's rule (a stop signal saves wherever it lands, too): after the vector step that
        reaches each ``checkpoint_interval`` boundary, and at the end."""
        n, done = self.hp.n_envs, self.env_steps
        final = final_env_steps(done, total_env_steps, n)
        steps, previous, boundary = {final}, done, self._next_ckpt
        while math.isfinite(boundary):
            at = max(previous + n, done + -(-(int(boundary) - done) // n) * n)
            if at > final:
                break
            steps.add(at)
            previous, boundary = at, boundary + self.hp.checkpoint_interval
        return steps

    def close(self) -> None:
        """Close the environments (a logger passed in is its owner's to close). Async envs
        left waiting on a call that failed in this process (Gymnasium gathering their infos) are
        terminated: a plain close would wait for that call's answer, already received, forever."""
        from gymnasium.vector.async_vector_env import AsyncState, AsyncVectorEnv

        vec = self.envs.unwrapped
        if isinstance(vec, AsyncVectorEnv) and vec._state != AsyncState.DEFAULT:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "Calling `close` while waiting ...": we know
                vec.close(terminate=True)
        self.envs.close()
        if self._eval_env is not None and self._owns_eval_env:
            self._eval_env.close()
