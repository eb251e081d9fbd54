"""Health monitors: catch the failures that silently ruin long runs.

Each monitor has a policy: ``warn`` records an event and logs it, ``stop`` raises
:class:`~foxhunt.errors.TrainingHalted` (the trainer leaves the last good checkpoint in place).
Non-finite environment output is always an error, because no policy can learn from it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from foxhunt.config import DQNHyperparameters
from foxhunt.errors import EnvironmentStepError, TrainingHalted

log = logging.getLogger("foxhunt.health")

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


# State fields added after checkpoints were first written, at a fresh run's values.
NEWER_FIELDS: dict[str, object] = {"initial_q_abs_max": None, "divergent_run": 0}


@dataclass
class HealthEvent:
    """One monitor firing."""

    kind: str
    env_steps: int
    optimizer_steps: int
    message: str


@dataclass
class HealthMonitor:
    """Watches environment output and optimizer steps; counters are checkpointed with the run."""

    hp: DQNHyperparameters
    max_abs_reward: float = 0.0
    initial_q_abs_max: float | None = None  # max |Q| at the first optimizer step
    collapse_run: int = 0
    divergent_run: int = 0  # consecutive optimizer steps over the Q bound
    events: list[HealthEvent] = field(default_factory=list)

    def check_env_step(self, obs: np.ndarray, rewards: np.ndarray, env_steps: int) -> None:
        """Raise on non-finite observations or rewards, naming the env step and env index."""
        if not (np.isfinite(obs).all() and np.isfinite(rewards).all()):
            self._raise_non_finite(obs, rewards, env_steps)
        if rewards.size:
            peak = float(np.abs(rewards).max())
            if peak > _FLOAT32_MAX:  # finite here, inf once stored in the float32 replay
                env_i = int(np.argmax(np.abs(rewards)))
                raise EnvironmentStepError(
                    f"environment returned a reward too large for float32 at env step "
                    f"{env_steps} (env index {env_i}): {rewards[env_i]} (scale the rewards)"
                )
            self.max_abs_reward = max(self.max_abs_reward, peak)

    @staticmethod
    def _raise_non_finite(obs: np.ndarray, rewards: np.ndarray, env_steps: int) -> None:
        """Name the first env whose observation or reward is not finite (the slow path)."""
        bad_obs = ~np.isfinite(obs).reshape(obs.shape[0], -1).all(axis=1)
        bad_rew = ~np.isfinite(rewards)
        if bad_obs.any() or bad_rew.any():
            which = "observation" if bad_obs.any() else "reward"
            env_i = int(np.flatnonzero(bad_obs | bad_rew)[0])
            value = rewards[env_i] if which == "reward" else "non-finite entries"
            raise EnvironmentStepError(
                f"environment returned a non-finite {which} at env step {env_steps} "
                f"(env index {env_i}): {value}"
            )

    @property
    def q_bound(self) -> float:
        """|Q| beyond this is divergence, or the configured bound: margin times the larger of
        r_max / (1 - gamma), what the rewards can justify, and the network's max |Q| at its
        first update. That second term is the scale a fresh network starts at, which small
        rewards cannot bound: a market whose only rewards so far are 4 bp trading costs gave a
        bound of 0.2 that an untrained network's 0.26 already crossed."""
        hp = self.hp
        if hp.q_divergence_bound is not None:
            return hp.q_divergence_bound
        r_max = hp.reward_bound if hp.reward_bound is not None else self.max_abs_reward
        if r_max <= 0.0 or hp.gamma >= 1.0:
            return math.inf
        horizon = 1.0 / (1.0 - hp.gamma)
        scale = max(max(r_max, 1e-8) * horizon, self.initial_q_abs_max or 0.0)
        return scale * hp.q_divergence_margin

    def bound_origin(self) -> str:
        """Where ``q_bound`` comes from, in the words of the settings that change it."""
        hp = self.hp
        if hp.q_divergence_bound is not None:
            return "q_divergence_bound"
        reward = "reward_bound" if hp.reward_bound is not None else "largest |reward| so far"
        return (
            f"q_divergence_margin {hp.q_divergence_margin:g} x the larger of {reward} / "
            "(1 - gamma) and the fresh network's max |Q|"
        )

    def check_update(
        self,
        *,
        skipped: bool,
        consecutive_skips: int,
        pre_clip_norm: float,
        q_abs_max: float,
        env_steps: int,
        optimizer_steps: int,
    ) -> None:
        """Apply the non-finite, Q-divergence and gradient-collapse monitors to one step."""
        hp = self.hp
        if skipped:
            self._fire(
                "nonfinite_gradients",
                f"non-finite loss or gradients: optimizer step skipped "
                f"({consecutive_skips} in a row)",
                env_steps,
                optimizer_steps,
                "stop" if consecutive_skips >= hp.max_consecutive_nonfinite else "warn",
                detail=f"stopped after {consecutive_skips} consecutive non-finite steps "
                f"(max_consecutive_nonfinite={hp.max_consecutive_nonfinite}; look at "
                f"learning_rate {hp.learning_rate:g}, weight_decay {hp.weight_decay:g}, "
                + ("" if hp.optimizer == "sgd" else f"adam_eps {hp.adam_eps:g} ")
                + "and the env's rewards)",
            )
            return
        if self.initial_q_abs_max is None and math.isfinite(q_abs_max):
            self.initial_q_abs_max = q_abs_max
        bound = self.q_bound
        if (math.isfinite(q_abs_max) and q_abs_max > bound) or not math.isfinite(q_abs_max):
            self.divergent_run += 1
            # Said at the 1st, 10th, 100th, ... step of a divergent run: under the "warn" policy
            # one line per optimizer step buried the progress display.
            if _is_power_of_ten(self.divergent_run):
                run = f" ({self.divergent_run} steps in a row)" if self.divergent_run > 1 else ""
                self._fire(
                    "q_divergence",
                    f"Q divergence: max |Q| = {q_abs_max:.4g} exceeds bound {bound:.4g}{run}",
                    env_steps,
                    optimizer_steps,
                    hp.q_divergence_policy,
                    detail=f"Q divergence: max |Q| = {q_abs_max:.4g} exceeds bound "
                    f"{bound:.4g} ({self.bound_origin()}; lower learning_rate, or set "
                    "q_divergence_bound, or q_divergence_policy=warn to train on)",
                )
        else:
            self.divergent_run = 0
        if pre_clip_norm < hp.grad_collapse_threshold:
            self.collapse_run += 1
            if self.collapse_run == hp.grad_collapse_steps:
                self._fire(
                    "gradient_collapse",
                    f"gradient collapse: pre-clip norm below {hp.grad_collapse_threshold:g} for "
                    f"{hp.grad_collapse_steps} optimizer steps",
                    env_steps,
                    optimizer_steps,
                    hp.grad_collapse_policy,
                )
        else:
            self.collapse_run = 0

    def check_network(
        self, *, finite: bool, q_abs_max: float, env_steps: int, optimizer_steps: int
    ) -> None:
        """Judge the network a checkpoint is about to hold: non-finite weights always stop the
        run, and a max |Q| over the bound is Q divergence under its policy (``stop`` keeps the
        last checkpoint as it is; ``warn`` says so and saves)."""
        kept = "not checkpointed: the last checkpoint is kept"
        if not finite:
            self._fire(
                "nonfinite_weights",
                f"the network's weights are not finite ({kept}; look at learning_rate "
                f"{self.hp.learning_rate:g} and max_grad_norm {self.hp.max_grad_norm})",
                env_steps,
                optimizer_steps,
                "stop",
            )
        bound = self.q_bound
        if not math.isfinite(q_abs_max) or q_abs_max > bound:
            policy = self.hp.q_divergence_policy
            self._fire(
                "q_divergence",
                f"Q divergence: max |Q| = {q_abs_max:.4g} on the newest transitions exceeds "
                f"bound {bound:.4g} "
                + (f"({kept})" if policy == "stop" else "(checkpointed all the same: warn)"),
                env_steps,
                optimizer_steps,
                policy,
            )

    def _fire(
        self,
        kind: str,
        message: str,
        env_steps: int,
        optimizer_steps: int,
        policy: str,
        detail: str | None = None,
    ) -> None:
        self.events.append(HealthEvent(kind, env_steps, optimizer_steps, message))
        where = f"at env step {env_steps}, optimizer step {optimizer_steps}"
        if policy == "stop":
            raise TrainingHalted(f"training stopped by health monitor: {detail or message} {where}")
        log.warning("%s %s", message, where)

    def count(self, kind: str) -> int:
        """How many times ``kind`` fired."""
        return sum(e.kind == kind for e in self.events)

    def state_json(self) -> dict[str, object]:
        return {
            "max_abs_reward": self.max_abs_reward,
            "initial_q_abs_max": self.initial_q_abs_max,
            "collapse_run": self.collapse_run,
            "divergent_run": self.divergent_run,
            "events": [e.__dict__ for e in self.events],
        }

    def load_state(self, state: dict[str, object]) -> None:
        state = {**NEWER_FIELDS, **state}  # absent from older checkpoints: a fresh run's
        self.max_abs_reward = float(state["max_abs_reward"])  # type: ignore[arg-type]
        initial = state["initial_q_abs_max"]
        self.initial_q_abs_max = None if initial is None else float(initial)  # type: ignore[arg-type]
        self.collapse_run = int(state["collapse_run"])  # type: ignore[call-overload]
        self.divergent_run = int(state["divergent_run"])  # type: ignore[call-overload]
        self.events = [HealthEvent(**e) for e in state["events"]]  # type: ignore[union-attr]
