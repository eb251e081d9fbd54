"""Pure loss functions: tensors in, per-sample losses and TD errors out.

Nothing here touches a network, an optimizer or the caller's batch. Per-sample losses let the
learner apply importance weights and the accumulation scale in one place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def td_target(
    rewards: torch.Tensor, discounts: torch.Tensor, dones: torch.Tensor, next_values: torch.Tensor
) -> torch.Tensor:
    """Bootstrapped target ``r + g^k (1 - done) Q'(s', a*)`` (Mnih et al. 2015, Eq. 3)."""
    return rewards + discounts * (1.0 - dones) * next_values


def scalar_td_loss(
    q_taken: torch.Tensor, target: torch.Tensor, kind: str = "huber", delta: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample Huber or squared TD loss (½·TD², Huber's quadratic part) and the signed TD
    error ``target - Q``."""
    td = target - q_taken
    if kind == "huber":
        loss = F.huber_loss(q_taken, target, reduction="none", delta=delta)
    elif kind == "mse":
        loss = 0.5 * td.pow(2)
    else:
        raise ValueError(f"unknown loss kind {kind!r}")
    return loss, td


def categorical_projection(
    next_probs: torch.Tensor,
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    dones: torch.Tensor,
    support: torch.Tensor,
) -> torch.Tensor:
    """Project ``r + g^k (1 - done) z`` onto the fixed support (Bellemare et al. 2017, Alg. 1).

    Vectorised with two ``scatter_add_`` calls. Atoms landing exactly on a support point
    (``l == u``) keep their whole mass there; atoms beyond the edges are clamped onto them.
    """
    n_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = rewards[:, None] + (discounts * (1.0 - dones))[:, None] * support[None, :]
    b = ((tz.clamp(v_min, v_max) - v_min) / delta_z).clamp(0, n_atoms - 1)
    # A NaN (a NaN reward) survives the clamps and would index as INT64_MIN: project it onto
    # atom 0 and make its row NaN afterwards, so the loss is NaN and the step is skipped, as
    # for the other heads.
    nan = torch.isnan(b)
    b = b.masked_fill(nan, 0.0)
    lower, upper = b.floor().long(), b.ceil().long()
    same = lower == upper
    w_lower = (upper.to(b.dtype) - b) + same.to(b.dtype)  # full mass to `lower` when exact
    w_upper = b - lower.to(b.dtype)
    out = torch.zeros_like(next_probs)
    out.scatter_add_(1, lower, next_probs * w_lower)
    out.scatter_add_(1, upper, next_probs * w_upper)
    return out.masked_fill(nan.any(dim=1, keepdim=True), float("nan"))


def categorical_loss(
    logits_taken: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample cross-entropy between the projected target and the predicted distribution.

    The same value is the priority signal, as in Dopamine's Rainbow. Hessel et al. 2018 (Sec. 3)
    prioritise by the KL divergence, which is this minus the target's entropy: the gradient is
    the same, but a sharp target (a terminal transition's, on one or two atoms) ranks a little
    lower here than it would by KL.
    """
    loss = -(target_probs * F.log_softmax(logits_taken, dim=-1)).sum(dim=-1)
    return loss, loss.detach()


def quantile_huber_loss(
    quantiles: torch.Tensor, target: torch.Tensor, kappa: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample quantile Huber loss (Dabney et al. 2018, Eq. 9-10).

    ``quantiles``: ``[B, N]`` predictions at midpoints ``tau_i = (2i + 1) / 2N``; ``target``:
    ``[B, N']`` target samples. Returns the loss summed over predicted quantiles and averaged over
    target samples, and the mean absolute pairwise TD error (for priorities).
    """
    n = quantiles.shape[1]
    tau = (torch.arange(n, device=quantiles.device, dtype=quantiles.dtype) + 0.5) / n
    u = target[:, None, :] - quantiles[:, :, None]  # [B, N, N']
    huber = F.huber_loss(
        quantiles[:, :, None].expand_as(u),
        target[:, None, :].expand_as(u),
        reduction="none",
        delta=kappa,
    )
    weight = (tau[None, :, None] - (u.detach() < 0).to(u.dtype)).abs()
    loss = (weight * huber / kappa).mean(dim=2).sum(dim=1)
    return loss, u.detach().abs().mean(dim=(1, 2))
