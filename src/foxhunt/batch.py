"""The value type handed from replay to the learner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch


@dataclass(frozen=True)
class Batch:
    """A batch of transitions as tensors on one device.

    ``dones`` marks *termination* only: a time-limit truncation still bootstraps. ``discounts`` is
    the per-sample bootstrap discount (``gamma ** k`` for an n-step return that ran ``k`` steps);
    None means ``gamma``. ``weights`` are importance-sampling weights already normalised over the
    whole sampled batch (so splitting the batch does not change them); ``indices`` are replay slots
    for priority updates.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    dones: torch.Tensor
    discounts: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    indices: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def _map(self, fn) -> Batch:  # type: ignore[no-untyped-def]
        return Batch(
            **{
                f.name: None if getattr(self, f.name) is None else fn(getattr(self, f.name))
                for f in fields(self)
            }
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch on ``device`` (itself when already there)."""
        device = torch.device(device)
        if self.obs.device == device:
            return self
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop`` as views."""
        return self._map(lambda t: t[start:stop])

    def split(self, sizes: Sequence[int]) -> list[Batch]:
        """Consecutive micro-batches of the given sizes (views, no copies)."""
        if sum(sizes) != len(self) or any(s <= 0 for s in sizes):
            raise ValueError(
                f"micro-batch sizes {list(sizes)} must be positive and sum to {len(self)}"
            )
        out, start = [], 0
        for s in sizes:
            out.append(self.slice(start, start + s))
            start += s
        return out

    def with_weights(self, weights: torch.Tensor | None) -> Batch:
        """A copy carrying other importance weights."""
        return replace(self, weights=weights)

    @staticmethod
    def cat(batches: Sequence[Batch]) -> Batch:
        """Concatenate batches (used to build reference big batches in tests and DDP checks).

        An optional field (discounts, weights, indices) must be set in all of them or in none:
        dropping some batches' importance weights would silently change the reference loss.
        """
        if not batches:
            raise ValueError("Batch.cat needs at least one batch")
        out: dict[str, torch.Tensor | None] = {}
        for f in fields(batches[0]):
            values = [getattr(b, f.name) for b in batches]
            present = [v is not None for v in values]
            if any(present) and not all(present):
                raise ValueError(
                    f"Batch.cat: field {f.name!r} is None in batch {present.index(False)} "
                    f"but set in batch {present.index(True)}; set it in all or none"
                )
            out[f.name] = torch.cat(values) if all(present) else None
        return Batch(**out)  # type: ignore[arg-type]


def split_sizes(total: int, parts: int) -> list[int]:
    """Split ``total`` samples into ``parts`` near-equal micro-batch sizes (larger ones first)."""
    if parts <= 0 or parts > total:
        raise ValueError(f"cannot split {total} samples into {parts} micro-batches")
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]
