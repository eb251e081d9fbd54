"""n-step returns built on the fly, one queue per parallel environment."""

from __future__ import annotations

from collections import deque
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


class NStepAccumulator:
    """Turns one-step experience into n-step transitions (Sutton & Barto Eq. 7.1).

    ``R = r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}`` bootstrapped with discount ``g^k`` from the
    observation after the k-th step. At an episode end every pending start is flushed with ``k < n``
    steps: termination sets ``done`` (no bootstrap); truncation leaves ``done`` unset and bootstraps
    from the final observation, because the time limit is not part of the MDP.
    """

    def __init__(self, n: int, gamma: float, n_envs: int) -> None:
        self.n, self.gamma, self.n_envs = int(n), float(gamma), int(n_envs)
        self.queues: list[deque[tuple[np.ndarray, int, float]]] = [deque() for _ in range(n_envs)]

    def push(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> Transitions:
        """Feed one vector step (``next_obs`` must be the true final obs at episode ends)."""
        if self.n == 1:  # fast path: nothing to accumulate
            return Transitions(
                obs,
                actions.astype(np.int64),
                rewards.astype(np.float32),
                next_obs,
                terminated.astype(np.float32),
                np.full(len(actions), self.gamma, np.float32),
            )
        out: list[tuple[np.ndarray, int, float, np.ndarray, float, float]] = []
        for i in range(self.n_envs):
            q = self.queues[i]
            # Copy: vector envs may reuse their observation array between steps.
            q.append((np.array(obs[i], copy=True), int(actions[i]), float(rewards[i])))
            ended = bool(terminated[i] or truncated[i])
            if len(q) == self.n or ended:
                while q:
                    ret = 0.0
                    for k, (_, _, r) in enumerate(q):
                        ret += (self.gamma**k) * r
                    o, a, _ = q[0]
                    out.append((o, a, ret, next_obs[i], float(terminated[i]), self.gamma ** len(q)))
                    q.popleft()
                    if not ended:
                        break
        if not out:
            shape = obs.shape[1:]
            return Transitions(
                np.zeros((0, *shape), obs.dtype),
                np.zeros(0, np.int64),
                np.zeros(0, np.float32),
                np.zeros((0, *shape), obs.dtype),
                np.zeros(0, np.float32),
                np.zeros(0, np.float32),
            )
        o, a, r, no, d, g = zip(*out, strict=True)
        return Transitions(
            np.stack(o),
            np.asarray(a, np.int64),
            np.asarray(r, np.float32),
            np.stack(no),
            np.asarray(d, np.float32),
            np.asarray(g, np.float32),
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
                for j in range(length):
                    self.queues[i].append((obs[j].copy(), int(acts[j]), float(rews[j])))
