"""Uniform experience replay over preallocated, contiguous storage."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from foxhunt.batch import Batch
from foxhunt.errors import ConfigError

log = logging.getLogger(__name__)


def check_batch_size(batch_size: int) -> None:
    """A positive integer (draws are with replacement, so it may exceed the stored rows)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ConfigError(f"batch_size must be an integer, got: {batch_size!r}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got: {batch_size}")


class ReplayBuffer:
    """A ring buffer of transitions stored as preallocated torch tensors.

    Storage is allocated once (``capacity`` rows) so memory use is known before training starts,
    and sampling is a single ``index_select`` per field with no Python loop. Indices are drawn by a
    NumPy generator owned by the buffer, so sampling is reproducible and its state checkpointable.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        *,
        obs_dtype: torch.dtype = torch.float32,
        obs_scale: float | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ) -> None:
        """``obs_scale``: the observations are 0-255 levels times this factor (pixels that
        :class:`~foxhunt.envs.gym_envs.PixelObservation` scaled to [0, 1]); they are then stored
        as uint8 levels, a quarter of float32's memory (replay dominates an image agent's
        memory), and gathered back as the identical float32 values."""
        if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
            raise ConfigError(f"capacity must be a positive integer, got: {capacity!r}")
        self.capacity = int(capacity)
        self.obs_shape = tuple(obs_shape)
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self._pixel_scale = None if obs_scale is None else float(obs_scale)
        self.obs_scale: float | None = None
        """The factor of the uint8 levels replay holds now; None while it holds float32."""
        if self._pixel_scale is not None:
            if not (math.isfinite(self._pixel_scale) and self._pixel_scale > 0):
                raise ConfigError(f"obs_scale must be a finite number > 0, got: {obs_scale!r}")
            obs_dtype = torch.uint8
            self.obs_scale = self._pixel_scale
            self._scale32 = np.float32(self._pixel_scale)
            self._inverse32 = np.float32(1.0 / self._pixel_scale)
            # A CPU scalar: it multiplies CPU and CUDA tensors alike.
            self._scale = torch.tensor(self._scale32, dtype=torch.float32)
        kw: dict[str, Any] = dict(device=self.device)
        try:
            self.obs = torch.zeros((capacity, *obs_shape), dtype=obs_dtype, **kw)
            self.next_obs = torch.zeros((capacity, *obs_shape), dtype=obs_dtype, **kw)
            self.actions = torch.zeros(capacity, dtype=torch.int64, **kw)
            self.rewards = torch.zeros(capacity, dtype=torch.float32, **kw)
            self.dones = torch.zeros(capacity, dtype=torch.float32, **kw)
            self.discounts = torch.zeros(capacity, dtype=torch.float32, **kw)
        except (RuntimeError, MemoryError, TypeError) as err:
            # The CPU allocator refuses with a RuntimeError ("can't allocate memory"), CUDA with
            # torch.OutOfMemoryError (a RuntimeError); a size past int64 overflows (RuntimeError
            # or, past long long, TypeError); any other failure is not about the size.
            oom = isinstance(err, MemoryError | torch.OutOfMemoryError)
            if not (oom or "allocate" in str(err) or "overflow" in str(err).lower()):
                raise
            # Python ints: np.prod of a huge shape wraps around (to 0 GiB).
            item = torch.empty((), dtype=obs_dtype).element_size()
            row = 2 * math.prod(int(d) for d in obs_shape) * item
            need = int(capacity) * (row + 8 + 3 * 4)
            raise ConfigError(
                f"out of memory: buffer_capacity {int(capacity)} with observations of shape "
                f"{tuple(int(d) for d in obs_shape)} needs {need / 2**30:,.1f} GiB of replay "
                f"storage on {self.device}, which cannot be allocated (lower buffer_capacity)"
            ) from None
        self.pos = 0
        self.size = 0
        self._np_views = (
            [t.numpy() for t in self._storage().values()] if self.device.type == "cpu" else []
        )

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        """Bytes held by the storage tensors."""
        return sum(t.numel() * t.element_size() for t in self._storage().values())

    def _storage(self) -> dict[str, torch.Tensor]:
        return {
            "obs": self.obs,
            "next_obs": self.next_obs,
            "actions": self.actions,
            "rewards": self.rewards,
            "dones": self.dones,
            "discounts": self.discounts,
        }

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        dones: np.ndarray,
        discounts: np.ndarray,
    ) -> np.ndarray:
        """Store ``k`` transitions (leading axis ``k``); returns the slots written."""
        k = len(actions)
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        slots = (self.pos + np.arange(k)) % self.capacity
        if self.obs_scale is not None:
            obs_levels, next_levels = self.encode_obs(obs), self.encode_obs(next_obs)
            if obs_levels is None or next_levels is None:
                self._store_floats(obs if obs_levels is None else next_obs)
            else:
                obs, next_obs = obs_levels, next_levels
        values = (obs, next_obs, actions, rewards, dones, discounts)
        if self.device.type == "cpu":
            # CPU storage: write through NumPy views of the tensors (no per-field tensor copies),
            # by slice unless the rows wrap around (a slice is a few times cheaper than a fancy
            # index, and this runs on every env step).
            where: slice | np.ndarray = slots
            if self.pos + k <= self.capacity:
                where = slice(self.pos, self.pos + k)
            for dst, value in zip(self._np_views, values, strict=True):
                dst[where] = value
        else:
            idx = torch.from_numpy(slots).to(self.device)
            for dst, value in zip(self._storage().values(), values, strict=True):
                src = torch.as_tensor(np.asarray(value)).to(self.device, dst.dtype)
                dst[idx] = src
        self.pos = int((self.pos + k) % self.capacity)
        self.size = int(min(self.size + k, self.capacity))
        return slots

    def encode_obs(self, values: np.ndarray) -> np.ndarray | None:
        """Observations as their uint8 levels, or None unless every value is exactly a level
        times the scale in float32 (what :class:`~foxhunt.envs.gym_envs.PixelObservation`
        gives; a near miss, -0.0 or NaN would not come back bit for bit)."""
        _, levels, exact = self._levels(values)
        return levels if exact.all() else None

    def _levels(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``values`` as float32, their nearest uint8 levels, and where a level times the scale
        gives the value back bit for bit."""
        assert self._pixel_scale is not None
        v = np.asarray(values, dtype=np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # out of range: not exact below
            levels = (v * self._inverse32 + np.float32(0.5)).astype(np.uint8)
        back = levels.astype(np.float32) * self._scale32
        return v, levels, back.view(np.uint32) == v.view(np.uint32)

    def _use_levels(self, levels: bool, *, convert: bool = False) -> None:
        """Hold observations as uint8 levels or as float32 (reallocated when the mode changes;
        ``convert`` keeps the stored values, else the caller writes them)."""
        if (self.obs_scale is not None) == levels:
            return
        assert self._pixel_scale is not None
        dtype = torch.uint8 if levels else torch.float32
        old = (self.obs, self.next_obs)
        self.obs_scale = self._pixel_scale if levels else None
        if convert:
            assert not levels
            self.obs, self.next_obs = (self._decoded(t) for t in old)
        else:
            self.obs, self.next_obs = (torch.zeros_like(t, dtype=dtype) for t in old)
        if self.device.type == "cpu":
            self._np_views = [t.numpy() for t in self._storage().values()]

    def _store_floats(self, values: np.ndarray) -> None:
        """Turn level storage into float32 for good, values kept: a wrapper after the pixel
        scaling handed over values that are not exactly levels."""
        v, _, exact = self._levels(values)
        bad = v[~exact]
        log.warning(
            "replay stores observations as float32 from now on (4x the memory): observation "
            "value %r is not a 0-255 pixel level times %g (a wrapper changed the scaled pixels)",
            float(bad[0]) if bad.size else float("nan"),
            self._pixel_scale,
        )
        self._use_levels(False, convert=True)

    def _decoded(self, levels: torch.Tensor) -> torch.Tensor:
        return levels.to(torch.float32).mul_(self._scale)

    def decode_obs(self, stored: torch.Tensor) -> torch.Tensor:
        """Stored observations as the float32 values the env gave (the wrapper's arithmetic)."""
        return stored if self.obs_scale is None else self._decoded(stored)

    def gather(self, slots: np.ndarray, weights: torch.Tensor | None = None) -> Batch:
        """The transitions stored in ``slots`` as a Batch (one ``index_select`` per field)."""
        idx = torch.from_numpy(np.ascontiguousarray(slots)).to(self.device)
        return Batch(
            obs=self.decode_obs(self.obs.index_select(0, idx)),
            actions=self.actions.index_select(0, idx),
            rewards=self.rewards.index_select(0, idx),
            next_obs=self.decode_obs(self.next_obs.index_select(0, idx)),
            dones=self.dones.index_select(0, idx),
            discounts=self.discounts.index_select(0, idx),
            weights=weights,
            indices=idx,
        )

    def sample_slots(
        self, batch_size: int, beta: float | None = None
    ) -> tuple[np.ndarray, torch.Tensor | None]:
        """Draw slots uniformly with replacement (no importance weights; ``beta`` is ignored).

        Sampling slots and gathering rows are separate so the trainer can draw a whole
        effective batch at once but materialise one micro-batch at a time.
        """
        check_batch_size(batch_size)
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        return self.rng.integers(0, self.size, size=batch_size), None

    def sample(self, batch_size: int, beta: float | None = None) -> Batch:
        """Draw ``batch_size`` transitions uniformly with replacement (``beta`` is ignored)."""
        return self.gather(*self.sample_slots(batch_size, beta))

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """No-op: uniform replay has no priorities (keeps the trainer free of special cases)."""

    # --- checkpointing ------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Filled storage as CPU tensors (only ``size`` rows, so checkpoints stay small)."""
        n = self.size
        return {f"replay.{k}": v[:n].cpu() for k, v in self._storage().items()}

    def state_json(self) -> dict[str, Any]:
        """Counters and the sampling RNG state."""
        return {"pos": self.pos, "size": self.size, "rng": self.rng.bit_generator.state}

    def load_state(self, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        """Restore from :meth:`state_tensors` / :meth:`state_json` output."""
        n = int(state["size"])
        for k, v in self._storage().items():
            src = tensors[f"replay.{k}"]
            if src.shape[0] != n or tuple(src.shape[1:]) != tuple(v.shape[1:]):
                raise ValueError(
                    f"replay.{k} has shape {tuple(src.shape)}, expected {n} rows "
                    f"of {tuple(v.shape[1:])}"
                )
        sources = {k: tensors[f"replay.{k}"] for k in self._storage()}
        if self._pixel_scale is not None:
            # Levels if the checkpoint holds levels, or floats that are all exactly levels (a
            # checkpoint from before pixels were kept as uint8); float32 as the run that wrote
            # it had switched to otherwise.
            pixels = {}
            for k in ("obs", "next_obs"):
                src = sources[k]
                if src.dtype == torch.uint8:
                    pixels[k] = src
                elif src.is_floating_point():
                    levels = self.encode_obs(src.numpy())
                    pixels[k] = None if levels is None else torch.from_numpy(levels)
                else:
                    pixels[k] = None
            as_levels = all(p is not None for p in pixels.values())
            self._use_levels(as_levels)
            if as_levels:
                sources.update(pixels)
            else:  # one field of levels beside floats: keep both as float32 values
                sources.update(
                    {
                        k: self._decoded(sources[k])
                        for k in pixels
                        if sources[k].dtype == torch.uint8
                    }
                )
        for k, v in self._storage().items():
            v[:n] = sources[k].to(v.device, v.dtype)
        self.pos, self.size = int(state["pos"]), n
        self.rng.bit_generator.state = state["rng"]
