"""n-step returns built on the fly, one queue per parallel environment."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch


class Transitions(NamedTuple):
    """Completed (possibly n-step) transitions ready for replay, stacked on axis 0."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray
    discounts: np.ndarray


class Counterfactuals(NamedTuple):
    """One-step outcomes of the actions not taken at one step of one env (see TradingEnv)."""

    actions: np.ndarray  # [k] int64
    rewards: np.ndarray  # [k]
    next_obs: np.ndarray  # [k, *obs_shape]
    dones: np.ndarray  # [k] bool: the alternative itself terminated (e.g. went bankrupt)


class NStepAccumulator:
    """Turns one-step experience into n-step transitions (Sutton & Barto Eq. 7.1).

    ``R = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}`` bootstrapped with discount ``g^k`` from the
    observation after the k-th step. At an episode end every pending start is flushed with ``k < n``
    steps: termination sets ``done`` (no bootstrap); truncation leaves ``done`` unset and bootstraps
    from the final observation, because the time limit is not part of the MDP.

    With ``counterfactuals`` (action augmentation) each step also carries the one-step outcomes of
    the actions not taken, stored as one-step transitions beside the real n-step one (emitted with
    it). Not as n-step ones: the rewards after an alternative would be those of the actions the
    behaviour policy chose while holding the *taken* position, which pay to switch back (for a
    trading agent that holds its position, about one switching cost per alternative: as large as
    the per-bar edge it learns from). Measured on the default synthetic market (BENCHMARKS §6).
    """

    def __init__(self, n: int, gamma: float, n_envs: int) -> None:
        self.n, self.gamma, self.n_envs = int(n), float(gamma), int(n_envs)
        self.queues: list[deque[tuple[np.ndarray, int, float, Counterfactuals | None]]] = [
            deque() for _ in range(n_envs)
        ]

    def push(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        counterfactuals: Sequence[Counterfactuals] | None = None,
    ) -> Transitions:
        """Feed one vector step (``next_obs`` must be the true final obs at episode ends)."""
        if self.n == 1:  # fast path: nothing to accumulate (the replay copies what it stores)
            real = Transitions(
                obs,
                np.asarray(actions, np.int64),
                np.asarray(rewards, np.float32),
                next_obs,
                np.asarray(terminated, np.float32),
                np.full(len(actions), self.gamma, np.float32),
            )
            if counterfactuals is None:
                return real
            out1 = [self._one_step(obs[i], cf) for i, cf in enumerate(counterfactuals)]
            return _stack([real, *out1], obs)
        out: list[Transitions] = []
        for i in range(self.n_envs):
            q = self.queues[i]
            cf = None if counterfactuals is None else counterfactuals[i]
            # Copy: vector envs may reuse their observation array between steps.
            q.append((np.array(obs[i], copy=True), int(actions[i]), float(rewards[i]), cf))
            ended = bool(terminated[i] or truncated[i])
            if len(q) == self.n or ended:
                while q:
                    out.append(self._emit(q, next_obs[i], float(terminated[i])))
                    q.popleft()
                    if not ended:
                        break
        return _stack(out, obs)

    def flush(self, next_obs: np.ndarray) -> Transitions:
        """Emit every pending start as a truncated transition bootstrapping from ``next_obs[i]``
        (the observation its env stood at) and empty the queues: for a stream that cannot go on
        (a resume whose envs restart from a fresh reset). Without it the next ``push`` would
        splice the old episode's pending steps onto the new episode's rewards and states."""
        out: list[Transitions] = []
        for i, q in enumerate(self.queues):
            while q:
                out.append(self._emit(q, next_obs[i], 0.0))
                q.popleft()
        return _stack(out, next_obs)

    def _emit(self, q: deque[Any], next_obs: np.ndarray, done: float) -> Transitions:
        """The n-step transition starting at ``q[0]`` (and those of its counterfactuals)."""
        ret = 0.0
        for k, (_, _, r, _) in enumerate(q):
            ret += (self.gamma**k) * r
        o, a, _, cf = q[0]
        rows = [(o, a, ret, next_obs, done, self.gamma ** len(q))]
        if cf is not None:
            for alt, r_alt, nxt_alt, d_alt in zip(*cf, strict=True):
                rows.append((o, int(alt), float(r_alt), nxt_alt, float(d_alt), self.gamma))
        oo, aa, rr, nn, dd, gg = zip(*rows, strict=True)
        return Transitions(
            np.stack(oo),
            np.asarray(aa, np.int64),
            np.asarray(rr, np.float32),
            np.stack(nn),
            np.asarray(dd, np.float32),
            np.asarray(gg, np.float32),
        )

    def _one_step(self, obs: np.ndarray, cf: Counterfactuals) -> Transitions:
        k = len(cf.actions)
        return Transitions(
            np.repeat(np.asarray(obs)[None], k, axis=0),
            np.asarray(cf.actions, np.int64),
            np.asarray(cf.rewards, np.float32),
            np.asarray(cf.next_obs, dtype=np.asarray(obs).dtype),
            np.asarray(cf.dones, np.float32),
            np.full(k, self.gamma, np.float32),
        )

    # --- checkpointing ------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Pending partial returns, so a resumed run emits exactly the same transitions."""
        out: dict[str, torch.Tensor] = {}
        for i, q in enumerate(self.queues):
            if q:
                out[f"nstep.{i}.obs"] = torch.from_numpy(np.stack([e[0] for e in q]).copy())
                out[f"nstep.{i}.actions"] = torch.tensor([e[1] for e in q], dtype=torch.int64)
                out[f"nstep.{i}.rewards"] = torch.tensor([e[2] for e in q], dtype=torch.float64)
                if q[0][3] is not None:
                    for name, dtype in _CF_FIELDS:
                        arr = np.stack([np.asarray(getattr(e[3], name)) for e in q])
                        out[f"nstep.{i}.cf_{name}"] = torch.from_numpy(arr.astype(dtype))
        return out

    def state_json(self) -> dict[str, Any]:
        return {"lengths": [len(q) for q in self.queues]}

    def load_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        self.queues = [deque() for _ in range(self.n_envs)]
        for i, length in enumerate(state["lengths"]):
            if length:
                obs = tensors[f"nstep.{i}.obs"].numpy()
                acts = tensors[f"nstep.{i}.actions"].tolist()
                rews = tensors[f"nstep.{i}.rewards"].tolist()
                cfs: list[Counterfactuals | None] = [None] * length
                if f"nstep.{i}.cf_actions" in tensors:
                    parts = [tensors[f"nstep.{i}.cf_{name}"].numpy() for name, _ in _CF_FIELDS]
                    cfs = [Counterfactuals(*(p[j].copy() for p in parts)) for j in range(length)]
                for j in range(length):
                    self.queues[i].append((obs[j].copy(), int(acts[j]), float(rews[j]), cfs[j]))


_CF_FIELDS = (
    ("actions", np.int64),
    ("rewards", np.float64),
    ("next_obs", np.float32),
    ("dones", np.bool_),
)


def _stack(parts: list[Transitions], obs: np.ndarray) -> Transitions:
    """Concatenate transition batches (an empty batch of the right shapes when there are none)."""
    parts = [p for p in parts if len(p.actions)]
    if not parts:
        shape = obs.shape[1:]
        return Transitions(
            np.zeros((0, *shape), obs.dtype),
            np.zeros(0, np.int64),
            np.zeros(0, np.float32),
            np.zeros((0, *shape), obs.dtype),
            np.zeros(0, np.float32),
            np.zeros(0, np.float32),
        )
    if len(parts) == 1:
        return parts[0]
    return Transitions(*(np.concatenate(f) for f in zip(*parts, strict=True)))
