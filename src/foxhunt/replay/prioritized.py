"""Proportional prioritized experience replay (Schaul et al. 2016, Sec. 3.3)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from foxhunt.batch import Batch
from foxhunt.errors import ConfigError
from foxhunt.replay.sum_tree import SumTree
from foxhunt.replay.uniform import ReplayBuffer, check_batch_size


class PrioritizedReplayBuffer(ReplayBuffer):
    """Replay that samples transition ``i`` with probability ``p_i^alpha / sum_k p_k^alpha``.

    The trainer draws the *whole effective batch* in one call, so importance weights
    ``w_i = (N * P(i))^-beta`` are normalised by their maximum over that whole batch (Schaul et al.
    Alg. 1, line 10). Normalising per micro-batch instead would make the update depend on how the
    batch is split, which is exactly what gradient accumulation must not do.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        *,
        alpha: float = 0.6,
        eps: float = 1e-6,
        obs_dtype: torch.dtype = torch.float32,
        obs_scale: float | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        super().__init__(
            capacity, obs_shape, obs_dtype=obs_dtype, obs_scale=obs_scale, device=device, seed=seed
        )
        for name, value in (("alpha", alpha), ("eps", eps)):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not (ok and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be a finite number >= 0, got: {value!r}")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.tree = SumTree(capacity)
        self.max_priority = 1.0  # stored as p^alpha-free "raw" priority

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        dones: np.ndarray,
        discounts: np.ndarray,
    ) -> np.ndarray:
        """Store transitions; new ones enter with the current maximum priority."""
        slots = super().add(obs, actions, rewards, next_obs, dones, discounts)
        self.tree.update(slots, np.full(len(slots), self.max_priority**self.alpha))
        return slots

    def sample_slots(
        self, batch_size: int, beta: float | None = 0.4, *, normalize: bool = True
    ) -> tuple[np.ndarray, torch.Tensor]:
        """Stratified prioritized slots and importance weights normalised over all of them.

        ``normalize=False`` returns raw weights, for a caller that normalises over a larger batch
        (data-parallel ranks all-reduce the maximum first).
        """
        check_batch_size(batch_size)
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        beta = 0.4 if beta is None else float(beta)
        slots = self.tree.sample_stratified(batch_size, self.rng, self.size)
        probs = self.tree.get(slots) / self.tree.total
        weights = (self.size * probs) ** (-beta)
        if normalize:
            weights /= weights.max()
        return slots, torch.as_tensor(weights, dtype=torch.float32).to(self.device)

    def sample(self, batch_size: int, beta: float | None = 0.4, *, normalize: bool = True) -> Batch:
        """Draw a stratified prioritized batch with importance weights normalised over it."""
        return self.gather(*self.sample_slots(batch_size, beta, normalize=normalize))

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Set priorities to ``(|td| + eps)^alpha`` for the sampled slots."""
        raw = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps
        if not np.all(np.isfinite(raw)):
            raise ValueError("TD errors passed to update_priorities must be finite")
        self.tree.update(np.asarray(indices, dtype=np.int64), raw**self.alpha)
        self.max_priority = max(self.max_priority, float(raw.max()))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = super().state_tensors()
        out["replay.priorities"] = torch.from_numpy(self.tree.get(np.arange(self.size)).copy())
        return out

    def state_json(self) -> dict[str, Any]:
        return {**super().state_json(), "max_priority": self.max_priority}

    def load_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        super().load_state(tensors, state)
        self.tree = SumTree(self.capacity)
        self.tree.update(np.arange(self.size), tensors["replay.priorities"].double().numpy())
        self.max_priority = float(state["max_priority"])
