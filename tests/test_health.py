"""Health monitors fire on injected faults: NaN env output, Q divergence, gradient collapse and
repeated non-finite steps, each with its warn / stop policy."""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from foxhunt.errors import EnvironmentStepError, TrainingHalted
from foxhunt.health import HealthMonitor
from foxhunt.trainer import DQNTrainer


def _trainer(hp_factory, env_factory, **overrides: Any) -> DQNTrainer:
    hp = hp_factory(
        **{
            "batch_size": 8,
            "learning_starts": 16,
            "buffer_capacity": 128,
            "train_freq": 1,
            "eval_interval": 0,
            "log_interval": 10_000,
            **overrides,
        }
    )
    return DQNTrainer(hp, env_factory)


def _ready(trainer: DQNTrainer, steps: int = 16) -> DQNTrainer:
    for _ in range(steps):
        trainer.collect_step()
    return trainer


# --- environment output -----------------------------------------------------------------------
def test_nan_reward_from_env_names_the_step(hp_factory, toy_env_cls) -> None:
    trainer = _trainer(hp_factory, lambda: toy_env_cls(nan_reward_at=5))
    try:
        for _ in range(4):
            trainer.collect_step()
        with pytest.raises(EnvironmentStepError) as info:
            trainer.collect_step()
        msg = str(info.value)
        assert "non-finite reward at env step 5" in msg and "env index 0" in msg
        assert "nan" in msg and "\n" not in msg
        assert len(trainer.replay) == 4  # nothing from the bad step was stored
    finally:
        trainer.close()


def test_nan_reward_in_second_parallel_env(hp_factory, toy_env_cls) -> None:
    made: list[int] = []

    def factory():  # type: ignore[no-untyped-def]
        made.append(1)
        return toy_env_cls(nan_reward_at=3 if len(made) == 2 else None)

    trainer = _trainer(hp_factory, factory, n_envs=2)
    try:
        trainer.collect_step()
        trainer.collect_step()
        with pytest.raises(EnvironmentStepError, match=r"env step 6 \(env index 1\)"):
            trainer.collect_step()
    finally:
        trainer.close()


class _Alternatives(gym.Env):
    """A three-action env whose outcomes of the actions not taken (action_augmentation) are
    ``bad`` from its third step on: replay stores them as it stores real ones."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, bad: float | str) -> None:
        self.bad, self.t = bad, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.zeros(2, np.float32), 0.01, self.t >= 10, False, {}

    def counterfactual_transitions(self, obs, action, next_obs, terminated, info):  # type: ignore[no-untyped-def]
        others = np.array([a for a in range(3) if a != action])
        bad_obs = isinstance(self.bad, str)  # "inf": the alternatives' observation is bad
        rewards = np.full(len(others), self.bad if self.t >= 3 and not bad_obs else 0.01)
        seen = np.repeat(next_obs[None], len(others), 0)
        if bad_obs and self.t >= 3:
            seen[1, 0] = float(self.bad)
        return others, rewards, seen, np.zeros(2, bool)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e39, "inf"])
def test_counterfactual_outcomes_are_checked_as_real_ones(hp_factory, bad: float | str) -> None:
    """A non-finite outcome of an action not taken went into replay unchecked (under PER it
    kept the top priority and halted the run much later as 'non-finite gradients')."""
    trainer = _trainer(hp_factory, lambda: _Alternatives(bad), action_augmentation=True)
    try:
        trainer.collect_step()
        trainer.collect_step()
        stored = len(trainer.replay)
        with pytest.raises(EnvironmentStepError) as info:
            trainer.collect_step()
        msg = str(info.value)
        assert "counterfactual outcome (action_augmentation) of action" in msg
        assert "env step 3 (env index 0)" in msg and "\n" not in msg
        # What is bad is named: a finite reward was blamed for an infinite observation.
        assert msg.endswith("has a non-finite observation") == (bad == "inf"), msg
        assert len(trainer.replay) == stored  # nothing from the bad step was stored
    finally:
        trainer.close()


def test_counterfactual_rewards_count_towards_the_q_bound(hp_factory) -> None:
    """The Q-divergence bound's largest reward: alternatives' rewards are stored and learned
    from, so a large one (a bankruptcy's -10) left out gave a bound too low to hold."""
    trainer = _trainer(hp_factory, lambda: _Alternatives(-10.0), action_augmentation=True)
    try:
        for _ in range(4):
            trainer.collect_step()
        assert trainer.health.max_abs_reward == 10.0
    finally:
        trainer.close()


def test_check_env_step_non_finite_observation(hp_factory) -> None:
    mon = HealthMonitor(hp_factory())
    obs = np.zeros((2, 3), np.float32)
    obs[1, 2] = np.inf
    with pytest.raises(EnvironmentStepError, match="non-finite observation at env step 42"):
        mon.check_env_step(obs, np.zeros(2), 42)
    mon.check_env_step(np.zeros((2, 3)), np.array([0.5, -3.0]), 43)
    assert mon.max_abs_reward == 3.0


# --- Q divergence -------------------------------------------------------------------------------
def test_exploding_q_with_stop_policy_halts(hp_factory, toy_env_cls) -> None:
    trainer = _ready(
        _trainer(hp_factory, toy_env_cls, q_divergence_bound=1e-6, q_divergence_policy="stop")
    )
    try:
        with pytest.raises(
            TrainingHalted, match=r"Q divergence: max \|Q\| = .* exceeds bound 1e-06"
        ):
            trainer.train_step()
        assert trainer.health.count("q_divergence") == 1
    finally:
        trainer.close()


def test_exploding_q_with_warn_policy_records_events(hp_factory, toy_env_cls, caplog) -> None:
    trainer = _ready(
        _trainer(hp_factory, toy_env_cls, q_divergence_bound=1e-6, q_divergence_policy="warn")
    )
    try:
        with caplog.at_level(logging.WARNING, logger="foxhunt.health"):
            for _ in range(12):
                trainer.train_step()
        # Said at the 1st and 10th step of the divergent run, not at every step.
        assert trainer.health.count("q_divergence") == 2
        assert caplog.text.count("Q divergence") == 2 and "(10 steps in a row)" in caplog.text
        event = trainer.health.events[0]
        assert (event.kind, event.optimizer_steps, event.env_steps) == ("q_divergence", 1, 16)
        assert trainer.health.events[1].optimizer_steps == 10
        assert trainer.agent.optimizer_steps == 12  # warn does not stop training
    finally:
        trainer.close()


def test_q_divergence_via_learn_loop(hp_factory, toy_env_cls) -> None:
    trainer = _trainer(hp_factory, toy_env_cls, q_divergence_bound=1e-6)
    try:
        with pytest.raises(TrainingHalted, match="training stopped by health monitor") as err:
            trainer.learn(64)
        assert trainer.env_steps == 16  # stopped at the very first update
        # What sets the bound, and what to change.
        assert "(q_divergence_bound; lower learning_rate" in str(err.value)
        assert "q_divergence_policy=warn" in str(err.value)
    finally:
        trainer.close()


class _Recorder:
    """A checkpointer that keeps, per save, the env step and the largest |weight| saved."""

    def __init__(self) -> None:
        self.saves: list[tuple[int, float]] = []

    def save(self, trainer: DQNTrainer) -> Path:
        params = trainer.agent.online_net.parameters()
        self.saves.append((trainer.env_steps, max(float(p.detach().abs().max()) for p in params)))
        return Path(f"step-{trainer.env_steps}")


def _blow_up_after(trainer: DQNTrainer, optimizer_step: int, factor: float) -> None:
    """Scale every weight by ``factor`` right after the given optimizer step: an update that
    blows the network up (as SGD at a learning rate of 1e36 did) while its loss was finite."""
    real = trainer.train_step

    def train_step() -> dict[str, float]:
        metrics = real()
        if trainer.agent.optimizer_steps == optimizer_step:
            with torch.no_grad():
                for p in trainer.agent.online_net.parameters():
                    p.mul_(factor)
        return metrics

    trainer.train_step = train_step  # type: ignore[method-assign]


@pytest.mark.parametrize("policy", ["stop", "warn"])
def test_a_blown_up_network_is_not_checkpointed_under_stop(
    policy: str, hp_factory, toy_env_cls, caplog
) -> None:
    """The Q monitor sees an update's damage only at the next update; the checkpoint written in
    between (here at the same env step) must not become latest with the damaged weights."""
    trainer = _trainer(hp_factory, toy_env_cls, checkpoint_interval=4, q_divergence_policy=policy)
    recorder = _Recorder()
    trainer._checkpointer = recorder
    _blow_up_after(trainer, optimizer_step=5, factor=1e3)  # env step 20, a checkpoint step
    try:
        if policy == "stop":
            with pytest.raises(TrainingHalted, match=r"Q divergence: .*not checkpointed"):
                trainer.learn(40)
            assert [step for step, _ in recorder.saves] == [4, 8, 12, 16]
            assert max(peak for _, peak in recorder.saves) < 10
            assert trainer.health.events[-1].env_steps == 20
        else:
            with (
                caplog.at_level(logging.WARNING, logger="foxhunt.health"),
                contextlib.suppress(TrainingHalted),
            ):
                trainer.learn(40)
            saved = dict(recorder.saves)
            assert saved[16] < 10 and saved[20] > 10  # warn: the user asked to keep going
            assert "checkpointed all the same" in caplog.text
    finally:
        trainer.close()


@pytest.mark.parametrize("policy", ["stop", "warn"])
def test_non_finite_weights_are_never_checkpointed(policy: str, hp_factory, toy_env_cls) -> None:
    trainer = _trainer(hp_factory, toy_env_cls, checkpoint_interval=4, q_divergence_policy=policy)
    recorder = _Recorder()
    trainer._checkpointer = recorder
    _blow_up_after(trainer, optimizer_step=5, factor=math.nan)
    try:
        with pytest.raises(TrainingHalted, match=r"weights are not finite \(not checkpointed"):
            trainer.learn(40)
        assert [step for step, _ in recorder.saves] == [4, 8, 12, 16]
    finally:
        trainer.close()


def test_an_interrupts_save_judges_the_network_without_recording_it(
    hp_factory, toy_env_cls, caplog
) -> None:
    """The checkpoint a stop signal takes is one the uninterrupted run never takes: under
    q_divergence_policy=warn its check logged a Q-divergence event into that checkpoint, so the
    resumed run's summary held one event more than the uninterrupted run's."""
    import signal

    from foxhunt.errors import TrainingInterrupted

    def stopped_at(step: int | None) -> tuple[list[tuple[str, int]], str]:
        trainer = _trainer(
            hp_factory,
            toy_env_cls,
            checkpoint_interval=20,
            q_divergence_policy="warn",
            q_divergence_bound=1e-9,  # every check of the network fires
        )
        trainer._checkpointer = _Recorder()
        real = trainer.collect_step

        def collect_step() -> None:
            real()
            if trainer.env_steps == step:
                trainer._interrupt_requested = signal.SIGINT

        trainer.collect_step = collect_step  # type: ignore[method-assign]
        caplog.clear()
        try:
            with contextlib.suppress(TrainingInterrupted):
                trainer.learn(50)
            events = [
                (e.kind, e.env_steps) for e in trainer.health.events if e.kind == "q_divergence"
            ]
            return events, caplog.text
        finally:
            trainer.close()

    straight, _ = stopped_at(None)
    interrupted, said = stopped_at(33)
    assert ("q_divergence", 20) in straight and ("q_divergence", 40) in straight
    assert interrupted == [e for e in straight if e[1] <= 33]  # none at 33
    assert "Q divergence" in said and "at env step 33" in said  # judged and said all the same

    # A halt there is recorded, though: the run ends on it, and halted.json lists why.
    trainer = _trainer(hp_factory, toy_env_cls, checkpoint_interval=20)
    trainer._checkpointer = _Recorder()
    real = trainer.collect_step

    def interrupted_step() -> None:
        real()
        if trainer.env_steps == 33:
            trainer._interrupt_requested = signal.SIGINT
            trainer._network_health = lambda: (False, 0.0)  # type: ignore[method-assign]

    trainer.collect_step = interrupted_step  # type: ignore[method-assign]
    try:
        with pytest.raises(TrainingHalted):
            trainer.learn(50)
        assert [(e.kind, e.env_steps) for e in trainer.health.events] == [("nonfinite_weights", 33)]
    finally:
        trainer.close()


def test_checking_the_network_before_each_save_draws_nothing(hp_factory, toy_env_cls) -> None:
    """The check runs only where a checkpoint is saved; a run with it must train exactly as one
    without (no random draws, no change to the network or the replay)."""
    weights = []
    for checkpointer in (None, _Recorder()):
        trainer = _trainer(hp_factory, toy_env_cls, checkpoint_interval=3, noisy_nets=True)
        trainer._checkpointer = checkpointer
        try:
            trainer.learn(60)
            weights.append([p.clone() for p in trainer.agent.online_net.parameters()])
        finally:
            trainer.close()
    # 20 periodic saves; the last, at step 60, holds the final state too (not saved twice)
    assert checkpointer is not None and len(checkpointer.saves) == 20
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_q_bound_derivation(hp_factory) -> None:
    mon = HealthMonitor(hp_factory(gamma=0.9, reward_bound=2.0, q_divergence_margin=10.0))
    assert mon.q_bound == pytest.approx(2.0 / 0.1 * 10.0)
    tracked = HealthMonitor(hp_factory(gamma=0.99, q_divergence_margin=5.0))
    assert tracked.q_bound == math.inf  # no reward seen yet
    tracked.check_env_step(np.zeros((1, 2)), np.array([-0.5]), 1)
    assert tracked.q_bound == pytest.approx(0.5 * 100 * 5.0)
    fixed = HealthMonitor(hp_factory(q_divergence_bound=7.0, reward_bound=1.0))
    assert fixed.q_bound == 7.0


def test_q_bound_is_never_below_the_fresh_networks_scale(hp_factory) -> None:
    """Rewards of a few basis points (a market's trading costs) gave a bound an untrained
    network already crossed: the first update's max |Q| sets a floor, times the margin."""
    mon = HealthMonitor(
        hp_factory(gamma=0.99, q_divergence_margin=10.0, q_divergence_policy="stop")
    )
    mon.check_env_step(np.zeros((1, 2)), np.array([-2e-4]), 1)
    assert mon.q_bound == pytest.approx(2e-4 * 100 * 10.0)  # 0.2
    kw: dict[str, Any] = dict(
        skipped=False, consecutive_skips=0, pre_clip_norm=1.0, env_steps=200, optimizer_steps=1
    )
    mon.check_update(q_abs_max=0.26, **kw)  # a fresh network: not divergence
    assert mon.initial_q_abs_max == 0.26 and mon.q_bound == pytest.approx(2.6)
    mon.check_update(q_abs_max=2.5, **kw)
    with pytest.raises(TrainingHalted, match=r"max \|Q\| = 2.7 exceeds bound 2.6"):
        mon.check_update(q_abs_max=2.7, **kw)  # ten times the starting scale: divergence
    restored = HealthMonitor(mon.hp)
    restored.load_state(mon.state_json())
    assert restored.q_bound == mon.q_bound
    old = {k: v for k, v in mon.state_json().items() if k != "initial_q_abs_max"}
    restored.load_state(old)  # a checkpoint from before the floor: set again at the next step
    assert restored.initial_q_abs_max is None


def test_check_update_q_divergence_bounds(hp_factory) -> None:
    mon = HealthMonitor(hp_factory(q_divergence_bound=10.0, q_divergence_policy="warn"))
    kw: dict[str, Any] = dict(
        skipped=False, consecutive_skips=0, pre_clip_norm=1.0, env_steps=1, optimizer_steps=1
    )
    mon.check_update(q_abs_max=9.99, **kw)
    assert mon.count("q_divergence") == 0
    mon.check_update(q_abs_max=10.01, **kw)
    mon.check_update(q_abs_max=9.0, **kw)  # back under the bound: the next run is reported
    mon.check_update(q_abs_max=float("nan"), **kw)
    assert mon.count("q_divergence") == 2


# --- gradient collapse --------------------------------------------------------------------------
def _zero_network(trainer: DQNTrainer) -> None:
    """All-zero weights and zero rewards: Q = target = 0, so every gradient is exactly zero."""
    with torch.no_grad():
        for p in trainer.agent.online_net.parameters():
            p.zero_()
    trainer.agent.sync_target(1.0)


@pytest.mark.parametrize("policy", ["warn", "stop"])
def test_zero_gradients_fire_gradient_collapse(policy: str, hp_factory, toy_env_cls) -> None:
    trainer = _ready(
        _trainer(
            hp_factory,
            lambda: toy_env_cls(reward_scale=0.0),
            grad_collapse_steps=3,
            grad_collapse_policy=policy,
        )
    )
    try:
        _zero_network(trainer)
        for _ in range(2):
            m = trainer.train_step()
            assert m["grad_norm_pre_clip"] == 0.0
        assert trainer.health.count("gradient_collapse") == 0
        if policy == "stop":
            with pytest.raises(TrainingHalted, match="gradient collapse"):
                trainer.train_step()
            return
        for _ in range(3):
            trainer.train_step()
        assert trainer.health.count("gradient_collapse") == 1  # once per collapsed run
        assert trainer.health.events[0].optimizer_steps == 3
    finally:
        trainer.close()


def test_collapse_run_resets_on_a_healthy_step(hp_factory) -> None:
    mon = HealthMonitor(hp_factory(grad_collapse_steps=3, grad_collapse_threshold=1e-3))
    kw: dict[str, Any] = dict(
        skipped=False, consecutive_skips=0, q_abs_max=0.0, env_steps=0, optimizer_steps=0
    )
    for norm in (0.0, 1e-4, 1.0, 0.0, 0.0):
        mon.check_update(pre_clip_norm=norm, **kw)
    assert mon.collapse_run == 2 and mon.count("gradient_collapse") == 0
    mon.check_update(pre_clip_norm=0.0, **kw)
    assert mon.count("gradient_collapse") == 1


# --- non-finite steps -----------------------------------------------------------------------------
def test_consecutive_nonfinite_steps_stop_training(hp_factory, toy_env_cls) -> None:
    trainer = _ready(_trainer(hp_factory, toy_env_cls, max_consecutive_nonfinite=3))
    try:
        before = [p.detach().clone() for p in trainer.agent.params]
        trainer.replay.rewards[:] = float("nan")  # poison every stored transition
        for k in (1, 2):
            m = trainer.train_step()
            assert m["skipped"] == 1.0 and trainer.agent.skipped_steps == k
            assert trainer.health.count("nonfinite_gradients") == k
        # The message names the settings that usually cause it (a learning rate of 1e308 did).
        with pytest.raises(
            TrainingHalted,
            match=r"stopped after 3 consecutive non-finite steps .*look at learning_rate \S+, "
            r"weight_decay \S+, adam_eps \S+ and the env's rewards",
        ):
            trainer.train_step()
        assert trainer.agent.skipped_steps == 3 and trainer.agent.optimizer_steps == 0
        assert all(torch.equal(p, b) for p, b in zip(trainer.agent.params, before, strict=True))
    finally:
        trainer.close()


def test_health_state_round_trip(hp_factory) -> None:
    mon = HealthMonitor(hp_factory(q_divergence_bound=1.0, q_divergence_policy="warn"))
    mon.check_env_step(np.zeros((1, 2)), np.array([4.0]), 1)
    mon.check_update(
        skipped=False,
        consecutive_skips=0,
        pre_clip_norm=0.0,
        q_abs_max=5.0,
        env_steps=1,
        optimizer_steps=1,
    )
    other = HealthMonitor(mon.hp)
    other.load_state(mon.state_json())
    assert other.state_json() == mon.state_json()
    assert other.count("q_divergence") == 1 and other.max_abs_reward == 4.0
    assert other.divergent_run == 1  # the 1st/10th/100th cadence carries on after a resume


def test_skipped_steps_do_not_drag_the_logged_gradient_norm(hp_factory, toy_env_cls) -> None:
    """A metrics row averages the norms of the steps that had one: skipped (non-finite) steps
    neither count as 0 nor enter the divisor; a window of only skipped steps reads nan."""
    trainer = _trainer(hp_factory, toy_env_cls)
    try:
        step = {"loss": 1.0, "clipped": 0.0, "q_mean": 0.0}
        for pre, post in ((4.0, 2.0), (math.nan, math.nan), (8.0, 4.0), (math.inf, math.nan)):
            trainer._accumulate({**step, "grad_norm_pre_clip": pre, "grad_norm_post_clip": post})
        row = trainer._emit_row()
        assert row["grad_norm_pre_clip"] == 6.0 and row["grad_norm_post_clip"] == 3.0
        trainer._accumulate({**step, "grad_norm_pre_clip": math.nan, "grad_norm_post_clip": 1.0})
        row = trainer._emit_row()
        assert math.isnan(row["grad_norm_pre_clip"]) and math.isnan(row["grad_norm_post_clip"])
    finally:
        trainer.close()


def test_the_non_finite_hint_names_adam_eps_only_for_optimizers_that_have_it(hp_factory) -> None:
    for optimizer, named in (("sgd", False), ("adam", True), ("rmsprop", True)):
        mon = HealthMonitor(hp_factory(optimizer=optimizer, max_consecutive_nonfinite=1))
        with pytest.raises(TrainingHalted, match="and the env's rewards") as err:
            mon.check_update(
                skipped=True,
                consecutive_skips=1,
                pre_clip_norm=math.nan,
                q_abs_max=math.nan,
                env_steps=1,
                optimizer_steps=0,
            )
        assert ("adam_eps" in str(err.value)) is named, optimizer


def test_a_halt_logs_the_steps_since_the_last_row(hp_factory, toy_env_cls, tmp_path) -> None:
    """metrics.csv ends where the monitor stopped, skipped steps counted, not at the last row
    before it."""
    import pandas as pd

    from foxhunt.logging import MetricLogger

    trainer = _trainer(hp_factory, toy_env_cls, max_consecutive_nonfinite=3, log_interval=10)
    trainer.logger = MetricLogger(tmp_path)
    real = trainer.train_step

    def poisoned() -> dict[str, float]:
        if trainer.agent.optimizer_steps == 2:
            trainer.replay.rewards[:] = float("nan")
        return real()

    trainer.train_step = poisoned  # type: ignore[method-assign]
    try:
        with pytest.raises(TrainingHalted, match="3 consecutive non-finite"):
            trainer.learn(100)
    finally:
        trainer.logger.close()
        trainer.close()
    rows = pd.read_csv(tmp_path / "metrics.csv")
    # Steps at env steps 16 and 17, skipped at 18, 19 and 20, where the monitor stops: the
    # row of env step 20 is written by the halt (the loop would have written it after the step).
    assert trainer.env_steps == 20 and rows["env_steps"].tolist() == [10, 20]
    assert rows["skipped_steps"].iloc[-1] == 3 and rows["optimizer_steps"].iloc[-1] == 2


def test_a_halted_run_keeps_why_and_its_report_says_so(tmp_path: Path) -> None:
    """The stop's one line on stderr is gone with the terminal: halted.json keeps it beside the
    metrics, the run report puts it at the top, and a resume that finishes removes it."""
    import json

    from foxhunt.report import write_run_report
    from foxhunt.runs import build_spec
    from foxhunt.session import resume_training, run_training

    overrides = {
        "hidden_sizes": [16],
        "learning_starts": 64,
        "batch_size": 16,
        "train_freq": 4,
        "log_interval": 50,
        "checkpoint_interval": 50,
        "eval_interval": 0,
        "q_divergence_bound": 1e-6,
    }
    spec = build_spec(env="CartPole-v1", overrides=overrides, total_steps=200)
    run = tmp_path / "run"
    with pytest.raises(TrainingHalted) as err:
        run_training(spec, run, progress=False)
    record = json.loads((run / "halted.json").read_text())
    assert record["message"] == str(err.value) and record["env_steps"] == 64
    assert [e["kind"] for e in record["health"]] == ["q_divergence"]
    page = write_run_report(run)["index"].read_text()
    assert "training stopped by health monitor: Q divergence" in page
    kept = (run / "halted.json").read_text()
    (run / "halted.json").write_text("[" * 100_000)  # damaged: said, never a traceback
    assert "halted.json is unreadable." in write_run_report(run)["index"].read_text()
    (run / "halted.json").write_text(kept)
    # Finished short of the halt (the checkpoint is at env step 52): the model is saved, the
    # record goes.
    resume_training(run, total_steps=60, progress=False)
    assert (run / "summary.json").is_file() and not (run / "halted.json").exists()


def test_a_run_halted_before_any_checkpoint_says_why_it_has_nothing(tmp_path: Path) -> None:
    """With checkpoint_interval 0 (the default) a run halted part way keeps no checkpoint and no
    model: resume and evaluate said only that those were missing, not why, nor what keeps one."""
    from foxhunt.errors import FoxhuntError
    from foxhunt.runs import build_spec
    from foxhunt.session import evaluate_run, resume_training, run_training

    overrides = {"hidden_sizes": [16], "learning_starts": 64, "batch_size": 16, "train_freq": 4,
                 "log_interval": 50, "eval_interval": 0, "q_divergence_bound": 1e-6}  # fmt: skip
    spec = build_spec(env="CartPole-v1", overrides=overrides, total_steps=200)
    run = tmp_path / "run"
    with pytest.raises(TrainingHalted):
        run_training(spec, run, progress=False)
    assert not (run / "checkpoints").exists() and (run / "halted.json").is_file()
    why = r"\(a health monitor stopped the run before any checkpoint: .*halted\.json says why; "
    with pytest.raises(FoxhuntError, match=r"no checkpoint to resume from .*" + why):
        resume_training(run, total_steps=300, progress=False)
    with pytest.raises(
        FoxhuntError, match=r"model\.json is missing " + why + "checkpoint_interval"
    ):
        evaluate_run(run)
